/* test_cuda_dist.c: the NCCL collectives of src/cuda/dist.cu on two GPUs, one forked process each: allreduce (f32
 * and f64), reduce_scatter (also in place), allgather (also in place), broadcast, reduce and a group of
 * broadcasts, checked against sums computed on the host. The data are small integers (and halves), so every sum
 * is exact whatever order NCCL adds in. Skips with a reason unless kiln was built with NCCL and sees 2 GPUs.
 *
 * CUDA cannot be used in a child forked after the parent touched it, so the parent never does: it counts the GPUs
 * in a throwaway child, forks the two ranks first and then makes the NCCL id (whose bootstrap listener stays in the
 * parent, alive until both have joined) and hands it to them through pipes. */
#include "test.h"
#include "cuda/cuda.h"
#include "cuda/dist.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { WORLD = 2, N = 4099 /* odd: no collective sees only whole vectors */ };

__attribute__((format(printf, 2, 3))) static int rank_fail(int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test_cuda_dist: rank %d: ", rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

/* Uploads host (bytes) into a fresh device buffer *d. */
static kiln_status to_device(void **d, const void *host, size_t bytes) {
    kiln_status s = kiln_cuda_alloc(d, bytes);
    return s ? s : kiln_cuda_upload(*d, host, bytes);
}

/* One rank's work: every collective, each result against the host's. Returns the number of failures (0 or 1). */
static int run_rank(int rank, const uint8_t id[KILN_DIST_ID_BYTES]) {
    kiln_dist *d = NULL;
    if (kiln_dist_init(id, rank, WORLD, rank, &d)) return rank_fail(rank, "init: %s", kiln_last_error());
    if (kiln_dist_rank(d) != rank || kiln_dist_world(d) != WORLD) return rank_fail(rank, "rank/world mismatch");
    int bad = 0;
    float *hf = malloc(WORLD * N * sizeof *hf), *gf = malloc(WORLD * N * sizeof *gf);
    double *hd = malloc(N * sizeof *hd);
    uint8_t *hb = malloc(WORLD * N), *gb = malloc(WORLD * N);
    void *df = NULL, *dd = NULL, *din = NULL, *db = NULL, *dbin = NULL;
#define RANK_TRY(call)                                                      \
    do {                                                               \
        if (call) {                                                    \
            bad = rank_fail(rank, "%s: %s", #call, kiln_last_error()); \
            goto done;                                                 \
        }                                                              \
    } while (0)
#define EXPECT(cond, ...)                      \
    do {                                       \
        if (!(cond)) {                         \
            bad = rank_fail(rank, __VA_ARGS__); \
            goto done;                         \
        }                                      \
    } while (0)
    EXPECT(hf && gf && hd && hb && gb, "out of host memory");

    /* allreduce f32: rank r holds (i % 97) + 100 r; the sum is 2 (i % 97) + 100 */
    for (int i = 0; i < N; i++) hf[i] = (float)(i % 97 + 100 * rank);
    RANK_TRY(to_device(&df, hf, N * sizeof(float)));
    RANK_TRY(kiln_dist_allreduce_f32(d, df, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gf, df, N * sizeof(float)));
    for (int i = 0; i < N; i++) EXPECT(gf[i] == (float)(2 * (i % 97) + 100), "allreduce f32 [%d] = %g", i, gf[i]);

    /* allreduce f64: rank r holds i/2 + r; the sum is i + 1 */
    for (int i = 0; i < N; i++) hd[i] = 0.5 * i + rank;
    RANK_TRY(to_device(&dd, hd, N * sizeof(double)));
    RANK_TRY(kiln_dist_allreduce_f64(d, dd, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(hd, dd, N * sizeof(double)));
    for (int i = 0; i < N; i++) EXPECT(hd[i] == i + 1.0, "allreduce f64 [%d] = %g", i, hd[i]);

    /* reduce_scatter: rank r holds j % 53 + 7 r for j < WORLD N and gets element r N + i of the sum,
     * 2 ((r N + i) % 53) + 7; into df, then in place (out = in + r N) */
    for (int j = 0; j < WORLD * N; j++) hf[j] = (float)(j % 53 + 7 * rank);
    RANK_TRY(to_device(&din, hf, WORLD * N * sizeof(float)));
    RANK_TRY(kiln_dist_reduce_scatter_f32(d, din, df, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gf, df, N * sizeof(float)));
    for (int i = 0; i < N; i++) EXPECT(gf[i] == (float)(2 * ((rank * N + i) % 53) + 7), "reduce_scatter [%d] = %g", i, gf[i]);
    float *din_r = (float *)din + (size_t)rank * N;
    RANK_TRY(kiln_dist_reduce_scatter_f32(d, din, din_r, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gf, din_r, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        EXPECT(gf[i] == (float)(2 * ((rank * N + i) % 53) + 7), "reduce_scatter in place [%d] = %g", i, gf[i]);

    /* allgather: rank r contributes N bytes (31 r + i) & 255; every rank gets both, in rank order */
    for (int i = 0; i < N; i++) hb[i] = (uint8_t)((rank * 31 + i) & 255);
    RANK_TRY(to_device(&dbin, hb, N));
    RANK_TRY(kiln_cuda_alloc(&db, WORLD * N));
    RANK_TRY(kiln_dist_allgather(d, dbin, db, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gb, db, WORLD * N));
    for (int j = 0; j < WORLD * N; j++)
        EXPECT(gb[j] == (uint8_t)(((j / N) * 31 + j % N) & 255), "allgather [%d] = %d", j, gb[j]);
    /* in place: this rank's part already at db + r N, the others' zeroed first so their arrival shows */
    memset(gb, 0, WORLD * N);
    memcpy(gb + (size_t)rank * N, hb, N);
    RANK_TRY(kiln_cuda_upload(db, gb, WORLD * N));
    RANK_TRY(kiln_dist_allgather(d, (uint8_t *)db + (size_t)rank * N, db, N, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gb, db, WORLD * N));
    for (int j = 0; j < WORLD * N; j++)
        EXPECT(gb[j] == (uint8_t)(((j / N) * 31 + j % N) & 255), "allgather in place [%d] = %d", j, gb[j]);

    /* broadcast from rank 1: every rank ends with rank 1's bytes */
    for (int i = 0; i < N; i++) hb[i] = (uint8_t)(rank == 1 ? (i * 7 + 3) & 255 : 0xEE);
    RANK_TRY(kiln_cuda_upload(db, hb, N));
    RANK_TRY(kiln_dist_broadcast(d, db, N, 1, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(hb, db, N));
    for (int i = 0; i < N; i++) EXPECT(hb[i] == (uint8_t)((i * 7 + 3) & 255), "broadcast [%d] = %d", i, hb[i]);

    /* reduce into rank 1, in place: rank r holds (i % 89) + 10 r; rank 1 gets 2 (i % 89) + 10, rank 0 keeps its own */
    for (int i = 0; i < N; i++) hf[i] = (float)(i % 89 + 10 * rank);
    RANK_TRY(kiln_cuda_upload(df, hf, N * sizeof(float)));
    RANK_TRY(kiln_dist_reduce_f32(d, df, N, 1, NULL));
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(gf, df, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        EXPECT(gf[i] == (float)(rank == 1 ? 2 * (i % 89) + 10 : i % 89), "reduce into rank 1 [%d] = %g", i, gf[i]);

    /* a grouped gather of unequal parts, as ZeRO-1 makes one: bytes [0, 1000) from rank 0, [1000, N) from rank 1,
     * each rank starting from its own (i + 50 r) & 255 */
    for (int i = 0; i < N; i++) hb[i] = (uint8_t)((i + 50 * rank) & 255);
    RANK_TRY(kiln_cuda_upload(db, hb, N));
    RANK_TRY(kiln_dist_group_begin());
    RANK_TRY(kiln_dist_broadcast(d, db, 1000, 0, NULL));
    RANK_TRY(kiln_dist_broadcast(d, (uint8_t *)db + 1000, N - 1000, 1, NULL));
    RANK_TRY(kiln_dist_group_end());
    RANK_TRY(kiln_cuda_sync());
    RANK_TRY(kiln_cuda_download(hb, db, N));
    for (int i = 0; i < N; i++) EXPECT(hb[i] == (uint8_t)((i + (i < 1000 ? 0 : 50)) & 255), "grouped broadcasts [%d] = %d", i, hb[i]);
    RANK_TRY(kiln_dist_check(d));
#undef RANK_TRY
#undef EXPECT
done:
    kiln_cuda_free(df);
    kiln_cuda_free(dd);
    kiln_cuda_free(din);
    kiln_cuda_free(db);
    kiln_cuda_free(dbin);
    free(hf), free(gf), free(hd), free(hb), free(gb);
    if (bad) kiln_dist_abort(d);
    else kiln_dist_free(d);
    return bad;
}

/* GPUs as a child process sees them, so CUDA is never initialized in this one (see the top). */
static int gpu_count_in_child(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        int n = kiln_cuda_device_count();
        _exit(n > 100 ? 100 : n);
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_collectives(void) {
    if (!kiln_dist_available()) SKIP("kiln was built without NCCL");
    int n_gpu = gpu_count_in_child();
    if (n_gpu < WORLD) SKIP("needs %d GPUs, found %d", WORLD, n_gpu);

    int pipes[WORLD][2];
    pid_t pids[WORLD];
    fflush(NULL);
    for (int r = 0; r < WORLD; r++) {
        CHECK(pipe(pipes[r]) == 0);
        pids[r] = fork();
        CHECK(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) {
            uint8_t id[KILN_DIST_ID_BYTES];
            close(pipes[r][1]);
            size_t got = 0;
            while (got < sizeof id) {
                ssize_t k = read(pipes[r][0], id + got, sizeof id - got);
                if (k <= 0) _exit(rank_fail(r, "no NCCL id from the parent"));
                got += (size_t)k;
            }
            fflush(NULL);
            _exit(run_rank(r, id));
        }
        close(pipes[r][0]);
    }
    uint8_t id[KILN_DIST_ID_BYTES];
    kiln_status s = kiln_dist_new_id(id);
    for (int r = 0; r < WORLD; r++) {
        /* on failure the children read EOF and exit 1 */
        if (!s && write(pipes[r][1], id, sizeof id) != (ssize_t)sizeof id) s = KILN_ERR_IO;
        close(pipes[r][1]);
    }
    /* a hung collective must not hang the test suite: 120 s, then the ranks are killed */
    int status[WORLD] = {-1, -1};
    double deadline = now_s() + 120;
    for (int left = WORLD; left > 0;) {
        int ws;
        pid_t pid = waitpid(-1, &ws, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < WORLD; r++)
                if (pids[r] == pid) status[r] = ws, left--;
        } else if (pid < 0 && errno != EINTR) {
            break;
        } else if (now_s() > deadline) {
            for (int r = 0; r < WORLD; r++)
                if (status[r] == -1) kill(pids[r], SIGKILL);
            deadline = 1e300;
        } else {
            nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
        }
    }
    CHECK(s == KILN_OK, "kiln_dist_new_id: %s", kiln_last_error());
    for (int r = 0; r < WORLD; r++)
        CHECK(status[r] != -1 && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
              "rank %d: %s %d (its stderr says why)", r, status[r] != -1 && WIFSIGNALED(status[r]) ? "signal" : "exit status",
              status[r] == -1 ? -1 : WIFSIGNALED(status[r]) ? WTERMSIG(status[r]) : WEXITSTATUS(status[r]));
}

int main(void) {
    RUN(test_collectives);
    TEST_EXIT();
}
