/* safetensors.h: the tensors of a Hugging Face checkpoint folder (model.safetensors, or the shards that
 * model.safetensors.index.json names), mmap'd and checked, for kiln convert hf (convert_hf.c). */
#ifndef KILN_MODEL_SAFETENSORS_H
#define KILN_MODEL_SAFETENSORS_H

#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

#define KILN_ST_MAX_DIMS 4

typedef enum { KILN_ST_F32, KILN_ST_F16, KILN_ST_BF16 } kiln_st_dtype;

typedef struct kiln_st_tensor {
    char *name;                     /* as the checkpoint spells it */
    kiln_st_dtype dtype;
    int n_dims;                     /* 1..KILN_ST_MAX_DIMS */
    int64_t shape[KILN_ST_MAX_DIMS]; /* PyTorch order: shape[0] is the outermost (rows) */
    int64_t numel;
    const uint8_t *data;            /* numel elements of dtype, inside the mapping */
    const char *file;               /* the shard it lives in, for messages */
    bool used;                      /* set by the converter once written */
} kiln_st_tensor;

typedef struct kiln_st_set {
    kiln_st_tensor *t; /* n tensors */
    size_t n, cap;
    struct kiln_st_map {
        void *map;
        size_t size;
        char *path;
    } *maps;
    size_t n_maps;
} kiln_st_set;

/* Maps every shard of dir. A header that is not JSON, an offset outside the file, a size that is not the shape's,
 * a dtype other than F32/F16/BF16 or a name seen twice is KILN_ERR_FORMAT/UNSUPPORTED naming the file and tensor. */
kiln_status kiln_st_open_dir(const char *dir, kiln_st_set *out);
void kiln_st_close(kiln_st_set *s); /* accepts a zeroed set */
kiln_st_tensor *kiln_st_find(const kiln_st_set *s, const char *name); /* NULL when absent */
/* Element i of t as a float. */
float kiln_st_get(const kiln_st_tensor *t, int64_t i);

#endif
