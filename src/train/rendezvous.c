/* rendezvous.c: where this process stands in a data-parallel run (rendezvous.h), from kiln's or MPI's
 * environment, and the NCCL id passed from rank 0 to the others through a file. tests/test_dist.c tests both. */
#include "train/rendezvous.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ID_FILE "nccl_id"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------- this process's rank */

/* *out = the variable's value when it is set and not empty (returns 1), 0 when unset, -1 (with the error) when it
 * is not a whole number in [0, INT_MAX]. */
static int env_int(const char *name, int *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < 0 || x > INT_MAX) {
        kiln_fail(KILN_ERR_INVALID, "%s=%s is not a rank or a count", name, v);
        return -1;
    }
    *out = (int)x;
    return 1;
}

kiln_status kiln_rank_from_env(kiln_rank_info *out) {
    *out = (kiln_rank_info){.rank = 0, .world = 1, .local_rank = 0};
    /* kiln's own (set by kiln_launch_ranks), else Open MPI's, else the PMI names of MPICH, Intel MPI and Slurm.
     * PMI has no local rank: MPI_LOCALRANKID (MPICH's Hydra) when set, else the global rank (one host). */
    static const struct {
        const char *rank, *world, *local;
    } sources[] = {
        {"KILN_RANK", "KILN_WORLD_SIZE", "KILN_LOCAL_RANK"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    };
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        int rank = 0, world = 0, local = 0;
        int has_rank = env_int(sources[i].rank, &rank), has_world = env_int(sources[i].world, &world);
        if (has_rank < 0 || has_world < 0) return KILN_ERR_INVALID;
        if (!has_rank && !has_world) continue;
        if (!has_rank || !has_world)
            return kiln_fail(KILN_ERR_INVALID, "%s is set without %s", has_rank ? sources[i].rank : sources[i].world,
                             has_rank ? sources[i].world : sources[i].rank);
        int has_local = env_int(sources[i].local, &local);
        if (has_local < 0) return KILN_ERR_INVALID;
        if (!has_local) local = rank;
        if (world < 1 || rank >= world)
            return kiln_fail(KILN_ERR_INVALID, "%s=%d is outside a world of %s=%d", sources[i].rank, rank, sources[i].world, world);
        if (local >= world)
            return kiln_fail(KILN_ERR_INVALID, "local rank %d (%s) is outside a world of %d", local, sources[i].local, world);
        out->rank = rank, out->world = world, out->local_rank = local;
        break;
    }
    if (out->world == 1) return KILN_OK;
    const char *dir = getenv("KILN_DIST_DIR");
    if (!dir || !*dir)
        return kiln_fail(KILN_ERR_INVALID, "rank %d of %d: KILN_DIST_DIR is not set (a directory every rank can read, for the NCCL id)",
                         out->rank, out->world);
    if (strlen(dir) >= sizeof out->dir)
        return kiln_fail(KILN_ERR_INVALID, "KILN_DIST_DIR is longer than %zu bytes", sizeof out->dir - 1);
    strcpy(out->dir, dir);
    return KILN_OK;
}

/* ---------------------------------------------------------------- the NCCL id through a file */

kiln_status kiln_rendezvous_put(const char *dir, const uint8_t id[KILN_DIST_ID_BYTES]) {
    char path[PATH_MAX], tmp[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/" ID_FILE, dir) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/" ID_FILE ".tmp.%ld", dir, (long)getpid()) >= (int)sizeof tmp)
        return kiln_fail(KILN_ERR_INVALID, "rendezvous: directory name too long: %s", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < KILN_DIST_ID_BYTES) {
        ssize_t w = write(fd, id + done, KILN_DIST_ID_BYTES - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return kiln_fail(KILN_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        }
        done += (size_t)w;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_fail(KILN_ERR_IO, "%s: close failed: %s", tmp, strerror(e));
    }
    /* rename is atomic: a reader opens the old name (nothing) or all 128 bytes */
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kiln_fail(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return KILN_OK;
}

kiln_status kiln_rendezvous_get(const char *dir, double timeout_s, uint8_t id[KILN_DIST_ID_BYTES]) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/" ID_FILE, dir) >= (int)sizeof path)
        return kiln_fail(KILN_ERR_INVALID, "rendezvous: directory name too long: %s", dir);
    if (!(timeout_s >= 0) || !isfinite(timeout_s)) return kiln_fail(KILN_ERR_INVALID, "rendezvous: a timeout of %g s", timeout_s);
    double deadline = now_s() + timeout_s;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            uint8_t buf[KILN_DIST_ID_BYTES + 1]; /* one more: a longer file is not an id either */
            size_t got = 0;
            for (;;) {
                ssize_t r = read(fd, buf + got, sizeof buf - got);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0) {
                    int e = errno;
                    close(fd);
                    return kiln_fail(KILN_ERR_IO, "%s: read failed: %s", path, strerror(e));
                }
                if (r == 0 || (got += (size_t)r) == sizeof buf) break;
            }
            close(fd);
            if (got != KILN_DIST_ID_BYTES)
                return kiln_fail(KILN_ERR_FORMAT, "%s: %zu%s bytes, an NCCL id has %d", path, got, got == sizeof buf ? " or more" : "",
                                 KILN_DIST_ID_BYTES);
            memcpy(id, buf, KILN_DIST_ID_BYTES);
            return KILN_OK;
        }
        if (errno != ENOENT) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        if (now_s() >= deadline)
            return kiln_fail(KILN_ERR_IO, "%s: no NCCL id from rank 0 after %.1f s", path, timeout_s);
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL); /* 20 ms: rank 0's start-up takes seconds */
    }
}
