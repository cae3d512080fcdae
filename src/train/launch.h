/* launch.h: one process per GPU for `kiln train --nproc N` (issue #9), and the rendezvous of their NCCL id.
 *
 * kiln_launch_ranks starts N copies of a command, rank r with KILN_RANK=r, KILN_WORLD_SIZE=N, KILN_LOCAL_RANK=r
 * (its GPU) and KILN_DIST_DIR=DIR (a fresh private directory) in its environment, waits for all of them, and
 * stops all of them as soon as one fails: the first rank to exit non-zero or die on a signal gets the others
 * SIGTERM, then SIGKILL after a grace period, so a dead rank never leaves its peers hanging in a collective. The
 * status says which rank failed and how ("rank 1 of 4 exited with status 3", "... was killed by signal 9").
 *
 * The rendezvous: rank 0 writes the id to DIR/nccl_id (a temporary file renamed into place, so a reader sees all
 * 128 bytes or nothing); the others poll for it up to a timeout. With mpirun instead of --nproc, the ranks come
 * from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK (or PMI_RANK / PMI_SIZE) and DIR
 * must be given (a shared directory) through KILN_DIST_DIR.
 *
 * tests/test_dist.c runs these with /bin/sh children: the environment each rank sees, a failing rank stopping a
 * hanging one within the grace period, a rank killed by a signal, and the id round trip with its timeout. */
#ifndef KILN_TRAIN_LAUNCH_H
#define KILN_TRAIN_LAUNCH_H

#include "kiln.h"
#include "cuda/dist.h"

typedef struct kiln_rank_info {
    int rank, world, local_rank; /* world 1: not distributed */
    char dir[512];               /* the rendezvous directory ("" when world is 1) */
} kiln_rank_info;

/* This process's place, from the environment (kiln's own variables, else MPI's); world 1 when none is set.
 * KILN_ERR_INVALID for inconsistent values (rank outside [0, world), a missing KILN_DIST_DIR with world > 1). */
kiln_status kiln_rank_from_env(kiln_rank_info *out);

/* Runs argv (argv[0] a path; the list NULL-terminated) as n ranks and waits for them (see above); grace_s is the
 * time between SIGTERM and SIGKILL. KILN_OK when every rank exited 0. The rendezvous directory is made under
 * $TMPDIR (or /tmp) and removed at the end. */
kiln_status kiln_launch_ranks(char *const argv[], int n, double grace_s);
/* kiln_launch_ranks of this executable (/proc/self/exe) with the arguments `cmd` (e.g. {"train"} or {"bench",
 * "train"}, n_cmd of them) followed by argv without its element skip (and the one after it: an option and its
 * value; skip < 0 keeps all), as n ranks with a grace of 10 s. */
kiln_status kiln_launch_self(const char *const cmd[], int n_cmd, int argc, char **argv, int skip, int n);

/* Rank 0: writes id into dir. The others: waits up to timeout_s for it (KILN_ERR_IO naming the file on timeout). */
kiln_status kiln_rendezvous_put(const char *dir, const uint8_t id[KILN_DIST_ID_BYTES]);
kiln_status kiln_rendezvous_get(const char *dir, double timeout_s, uint8_t id[KILN_DIST_ID_BYTES]);

/* The whole join for a rank of ri (world > 1): rank 0 makes the id and puts it, the others get it (waiting up to
 * timeout_s), then kiln_dist_init on GPU local_rank. (dist_join.c) */
kiln_status kiln_dist_join(const kiln_rank_info *ri, double timeout_s, kiln_dist **out);

#endif
