/* dist_join.c: a rank's way into the data-parallel world (rendezvous.h): the NCCL id through the rendezvous folder,
 * then the communicator. Used by `kiln train` (train.c) and `kiln bench train --nproc` (bench/bench_train.c);
 * tests/test_train.c's data-parallel test runs it on two GPUs. */
#include "train/rendezvous.h"
#include "status.h"

#include <stdio.h>
#include <unistd.h>

kiln_status kiln_dist_join(const kiln_rank_info *ri, double timeout_s, kiln_dist **out) {
    *out = NULL;
    if (ri->world <= 1) return kiln_fail(KILN_ERR_INVALID, "dist: a world of %d rank(s) has nothing to join", ri->world);
    uint8_t id[KILN_DIST_ID_BYTES];
    kiln_status s = KILN_OK;
    if (ri->rank == 0) s = kiln_dist_new_id(id);
    if (!s) s = ri->rank == 0 ? kiln_rendezvous_put(ri->dir, id) : kiln_rendezvous_get(ri->dir, timeout_s, id);
    if (!s) s = kiln_dist_init(id, ri->rank, ri->world, ri->local_rank, out);
    /* every rank has joined (init returns only then): rank 0 removes the id, so a later job that reuses the folder
     * (mpirun with a fixed KILN_DIST_DIR) cannot read this one's stale id */
    if (!s && ri->rank == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/nccl_id", ri->dir);
        unlink(path);
    }
    return s;
}
