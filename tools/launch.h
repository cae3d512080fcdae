/* launch.h: one process per GPU for `kiln train --nproc N` and `kiln bench train --nproc N` (issue #9).
 *
 * kiln_launch_ranks starts N copies of a command, rank r with KILN_RANK=r, KILN_WORLD_SIZE=N, KILN_LOCAL_RANK=r
 * (its GPU) and KILN_DIST_DIR=DIR (a fresh private directory) in its environment, the variables a rank reads back
 * with src/train/rendezvous.h; waits for all of them, and stops all of them as soon as one fails: the first rank to
 * exit non-zero or die on a signal gets the others SIGTERM, then SIGKILL after a grace period, so a dead rank never
 * leaves its peers hanging in a collective. The status says which rank failed and how ("rank 1 of 4 exited with
 * status 3", "... was killed by signal 9"). tests/test_dist.c runs it with /bin/sh children: the environment each
 * rank sees, a failing rank stopping a hanging one within the grace period, a rank killed by a signal. */
#ifndef KILN_TOOLS_LAUNCH_H
#define KILN_TOOLS_LAUNCH_H

#include "kiln.h"

/* Runs argv (argv[0] a path; the list NULL-terminated) as n ranks and waits for them (see above); grace_s is the
 * time between SIGTERM and SIGKILL. KILN_OK when every rank exited 0. The rendezvous directory is made under
 * $TMPDIR (or /tmp) and removed at the end. */
kiln_status kiln_launch_ranks(char *const argv[], int n, double grace_s);
/* kiln_launch_ranks of this executable (/proc/self/exe) with the arguments `cmd` (e.g. {"train"} or {"bench",
 * "train"}, n_cmd of them) followed by argv without its element skip (and the one after it: an option and its
 * value; skip < 0 keeps all), as n ranks with a grace of 10 s. */
kiln_status kiln_launch_self(const char *const cmd[], int n_cmd, int argc, char **argv, int skip, int n);

#endif
