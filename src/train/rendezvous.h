/* rendezvous.h: a rank's place in a data-parallel run (issue #9) and the rendezvous of the NCCL id. The ranks are
 * started by `kiln train --nproc N` (tools/launch.h), or by mpirun.
 *
 * kiln's launcher gives rank r KILN_RANK=r, KILN_WORLD_SIZE=N, KILN_LOCAL_RANK=r (its GPU) and KILN_DIST_DIR=DIR
 * (a fresh private directory). With mpirun instead, the ranks come from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE
 * / OMPI_COMM_WORLD_LOCAL_RANK (or PMI_RANK / PMI_SIZE) and DIR must be given (a shared directory) through
 * KILN_DIST_DIR.
 *
 * The rendezvous: rank 0 writes the id to DIR/nccl_id (a temporary file renamed into place, so a reader sees all
 * 128 bytes or nothing); the others poll for it up to a timeout. tests/test_dist.c tests the environment parsing
 * and the id round trip with its timeout. */
#ifndef KILN_TRAIN_RENDEZVOUS_H
#define KILN_TRAIN_RENDEZVOUS_H

#include "kiln.h"
#include "cuda/dist.h"

typedef struct kiln_rank_info {
    int rank, world, local_rank; /* world 1: not distributed */
    char dir[512];               /* the rendezvous directory ("" when world is 1) */
} kiln_rank_info;

/* This process's place, from the environment (kiln's own variables, else MPI's); world 1 when none is set.
 * KILN_ERR_INVALID for inconsistent values (rank outside [0, world), a missing KILN_DIST_DIR with world > 1). */
kiln_status kiln_rank_from_env(kiln_rank_info *out);

/* Rank 0: writes id into dir. The others: waits up to timeout_s for it (KILN_ERR_IO naming the file on timeout). */
kiln_status kiln_rendezvous_put(const char *dir, const uint8_t id[KILN_DIST_ID_BYTES]);
kiln_status kiln_rendezvous_get(const char *dir, double timeout_s, uint8_t id[KILN_DIST_ID_BYTES]);

/* The whole join for a rank of ri (world > 1): rank 0 makes the id and puts it, the others get it (waiting up to
 * timeout_s), then kiln_dist_init on GPU local_rank. (dist_join.c) */
kiln_status kiln_dist_join(const kiln_rank_info *ri, double timeout_s, kiln_dist **out);

#endif
