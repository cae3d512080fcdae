/* file.h: opening an input file. Every reader of a path kiln is given (GGUF, token text, llama2.c checkpoints and
 * tokenizers) opens it here, so a FIFO, a device or a directory is refused with a clear message before anything
 * blocks on it or reads it. tests/test_gguf.c (test_open_not_regular) checks each kind. */
#ifndef KILN_FILE_H
#define KILN_FILE_H

#include "kiln.h"

#include <stdio.h>

/* *fd = path opened read-only (close-on-exec), once fstat says it is a regular file. The open itself does not
 * block (O_NONBLOCK, cleared after the check): a FIFO with no writer would otherwise hang the open. A directory is
 * KILN_ERR_IO "PATH: is a directory", anything else not regular "PATH: is not a regular file"; *fd is -1 on error. */
kiln_status kiln_open_regular(const char *path, int *fd);

/* The same as a stdio stream ("rb"); *f is NULL on error. */
kiln_status kiln_fopen_regular(const char *path, FILE **f);

/* The same refusal from stat alone, which opens nothing: for checking every input of a run before the first one is
 * read (kiln data, kiln tokenizer train). */
kiln_status kiln_check_regular(const char *path);

#endif
