/* test_dist.c: what multi-GPU training does without a GPU (tools/launch.c, src/train/rendezvous.c): the rank from kiln's and MPI's
 * environment; the launcher with /bin/sh ranks (their environment, a failing rank stopping hanging ones within
 * the grace period, a rank that ignores SIGTERM, a rank killed by a signal, no child left behind); and the NCCL
 * id's rendezvous file (round trip, timeout, a half-written file never read). Waits are bounded, not timed
 * benchmarks: the whole program takes about 3 s. */
#include "test.h"
#include "train/rendezvous.h"
#include "tools/launch.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every variable kiln_rank_from_env reads, unset between cases. */
static void clear_rank_env(void) {
    static const char *names[] = {"KILN_RANK", "KILN_WORLD_SIZE", "KILN_LOCAL_RANK", "KILN_DIST_DIR",
                                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

/* A fresh directory for one test's files; rm_tree removes it (flat: files only). */
static void make_tmp_dir(char *dir, size_t n) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/kiln-test-dist-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) dir[0] = 0;
}
static void rm_tree(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_dist: could not remove %s\n", dir);
}

static long read_pid(const char *dir, int rank) {
    char path[600];
    snprintf(path, sizeof path, "%s/pid%d", dir, rank);
    FILE *f = fopen(path, "r");
    long pid = -1;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1) pid = -1;
        fclose(f);
    }
    return pid;
}

static bool pid_gone(long pid) { return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH; }

/* ---------------------------------------------------------------- kiln_rank_from_env */

static void test_rank_env_none(void) {
    clear_rank_env();
    kiln_rank_info ri;
    CHECK(kiln_rank_from_env(&ri) == KILN_OK, "%s", kiln_last_error());
    CHECK(ri.rank == 0 && ri.world == 1 && ri.local_rank == 0 && ri.dir[0] == 0);
}

static void test_rank_env_kiln(void) {
    clear_rank_env();
    setenv("KILN_RANK", "2", 1), setenv("KILN_WORLD_SIZE", "4", 1), setenv("KILN_LOCAL_RANK", "1", 1);
    setenv("KILN_DIST_DIR", "/tmp/kiln-dist-abc", 1);
    kiln_rank_info ri;
    kiln_status s = kiln_rank_from_env(&ri);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    CHECK(ri.rank == 2 && ri.world == 4 && ri.local_rank == 1, "%d %d %d", ri.rank, ri.world, ri.local_rank);
    CHECK(strcmp(ri.dir, "/tmp/kiln-dist-abc") == 0, "%s", ri.dir);
    /* kiln's variables win over MPI's */
    setenv("OMPI_COMM_WORLD_RANK", "0", 1), setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    CHECK(kiln_rank_from_env(&ri) == KILN_OK && ri.rank == 2 && ri.world == 4);
    /* a single rank needs no directory */
    clear_rank_env();
    setenv("KILN_RANK", "0", 1), setenv("KILN_WORLD_SIZE", "1", 1);
    CHECK(kiln_rank_from_env(&ri) == KILN_OK && ri.world == 1 && ri.dir[0] == 0, "%s", kiln_last_error());
    clear_rank_env();
}

static void test_rank_env_mpi(void) {
    clear_rank_env();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1), setenv("OMPI_COMM_WORLD_SIZE", "8", 1), setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("KILN_DIST_DIR", "/shared/run1", 1);
    kiln_rank_info ri;
    CHECK(kiln_rank_from_env(&ri) == KILN_OK, "%s", kiln_last_error());
    CHECK(ri.rank == 5 && ri.world == 8 && ri.local_rank == 1 && strcmp(ri.dir, "/shared/run1") == 0);
    clear_rank_env();
    setenv("PMI_RANK", "3", 1), setenv("PMI_SIZE", "4", 1), setenv("KILN_DIST_DIR", "/shared/run2", 1);
    CHECK(kiln_rank_from_env(&ri) == KILN_OK, "%s", kiln_last_error());
    CHECK(ri.rank == 3 && ri.world == 4 && ri.local_rank == 3); /* no local rank in PMI: one host */
    clear_rank_env();
}

/* Each case: the variables, and a word the error must contain. */
static void test_rank_env_invalid(void) {
    static const struct {
        const char *vars[4][2];
        const char *says;
    } cases[] = {
        {{{"KILN_RANK", "4"}, {"KILN_WORLD_SIZE", "4"}, {"KILN_DIST_DIR", "/tmp/d"}}, "KILN_RANK=4"},
        {{{"KILN_RANK", "-1"}, {"KILN_WORLD_SIZE", "4"}, {"KILN_DIST_DIR", "/tmp/d"}}, "KILN_RANK=-1"},
        {{{"KILN_RANK", "1x"}, {"KILN_WORLD_SIZE", "4"}, {"KILN_DIST_DIR", "/tmp/d"}}, "KILN_RANK=1x"},
        {{{"KILN_RANK", "0"}, {"KILN_WORLD_SIZE", "0"}, {"KILN_DIST_DIR", "/tmp/d"}}, "KILN_WORLD_SIZE=0"},
        {{{"KILN_RANK", "1"}}, "KILN_WORLD_SIZE"},
        {{{"KILN_WORLD_SIZE", "2"}}, "KILN_RANK"},
        {{{"KILN_RANK", "1"}, {"KILN_WORLD_SIZE", "2"}}, "KILN_DIST_DIR"},
        {{{"KILN_RANK", "1"}, {"KILN_WORLD_SIZE", "2"}, {"KILN_LOCAL_RANK", "2"}, {"KILN_DIST_DIR", "/tmp/d"}}, "local rank 2"},
        {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"KILN_DIST_DIR", "/tmp/d"}}, "OMPI_COMM_WORLD_RANK=2"},
        {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "KILN_DIST_DIR"},
        {{{"PMI_RANK", "0"}}, "PMI_SIZE"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        clear_rank_env();
        for (int v = 0; v < 4 && cases[c].vars[v][0]; v++) setenv(cases[c].vars[v][0], cases[c].vars[v][1], 1);
        kiln_rank_info ri;
        kiln_status s = kiln_rank_from_env(&ri);
        CHECK(s == KILN_ERR_INVALID, "case %zu: status %d", c, (int)s);
        CHECK(strstr(kiln_last_error(), cases[c].says), "case %zu: '%s' lacks '%s'", c, kiln_last_error(), cases[c].says);
    }
    clear_rank_env();
}

/* ---------------------------------------------------------------- kiln_launch_ranks */

static kiln_status launch_sh(const char *script, int n, double grace_s) {
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    return kiln_launch_ranks(argv, n, grace_s);
}

/* 3 ranks report their environment; each also drops a file into the rendezvous directory, which must go too. */
static void test_launch_env(void) {
    char dir[512], script[2048];
    make_tmp_dir(dir, sizeof dir);
    CHECK(dir[0]);
    snprintf(script, sizeof script,
             "test -d \"$KILN_DIST_DIR\" || exit 9; echo x > \"$KILN_DIST_DIR/nccl_id.tmp.$$\" || exit 8; "
             "echo \"$KILN_RANK $KILN_WORLD_SIZE $KILN_LOCAL_RANK $KILN_DIST_DIR\" > '%s'/rank$KILN_RANK",
             dir);
    setenv("KILN_RANK", "7", 1); /* the launcher's own rank variables must not leak into its ranks */
    kiln_status s = launch_sh(script, 3, 1.0);
    unsetenv("KILN_RANK");
    if (s) rm_tree(dir);
    CHECK(s == KILN_OK, "%s", kiln_last_error());
    char dist_dir[3][512] = {{0}};
    bool ok = true;
    for (int r = 0; r < 3 && ok; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/rank%d", dir, r);
        FILE *f = fopen(path, "r");
        int rank = -1, world = -1, local = -1;
        ok = f && fscanf(f, "%d %d %d %511s", &rank, &world, &local, dist_dir[r]) == 4 && rank == r && world == 3 && local == r;
        if (f) fclose(f);
    }
    rm_tree(dir);
    CHECK(ok, "a rank's file is missing or wrong");
    CHECK(strcmp(dist_dir[0], dist_dir[1]) == 0 && strcmp(dist_dir[0], dist_dir[2]) == 0, "%s %s %s", dist_dir[0], dist_dir[1],
          dist_dir[2]);
    CHECK(strstr(dist_dir[0], "kiln-dist-"), "%s", dist_dir[0]);
    struct stat st;
    CHECK(stat(dist_dir[0], &st) != 0 && errno == ENOENT, "%s was not removed", dist_dir[0]);
}

/* Rank 1 exits 3 once ranks 0 and 2 sleep; they are stopped in well under their 30 s. */
static void test_launch_failure_stops_all(void) {
    char dir[512], script[2048];
    make_tmp_dir(dir, sizeof dir);
    CHECK(dir[0]);
    snprintf(script, sizeof script,
             "cd '%s' || exit 9; "
             "if [ \"$KILN_RANK\" = 1 ]; then "
             "  i=0; while { [ ! -s pid0 ] || [ ! -s pid2 ]; } && [ $i -lt 300 ]; do sleep 0.01; i=$((i+1)); done; exit 3; "
             "fi; echo $$ > pid$KILN_RANK; exec sleep 30",
             dir);
    double t0 = now_s();
    kiln_status s = launch_sh(script, 3, 1.0);
    double dt = now_s() - t0;
    long pid0 = read_pid(dir, 0), pid2 = read_pid(dir, 2);
    rm_tree(dir);
    CHECK(s == KILN_ERR_IO, "status %d", (int)s);
    CHECK(strstr(kiln_last_error(), "rank 1 of 3 exited with status 3"), "%s", kiln_last_error());
    CHECK(dt < 5.0, "took %.2f s", dt);
    CHECK(pid_gone(pid0) && pid_gone(pid2), "pids %ld %ld", pid0, pid2);
}

/* Rank 0 ignores SIGTERM: it is killed after the 1 s grace. */
static void test_launch_sigkill_after_grace(void) {
    char dir[512], script[2048];
    make_tmp_dir(dir, sizeof dir);
    CHECK(dir[0]);
    snprintf(script, sizeof script,
             "cd '%s' || exit 9; "
             "if [ \"$KILN_RANK\" = 1 ]; then "
             "  i=0; while [ ! -s pid0 ] && [ $i -lt 300 ]; do sleep 0.01; i=$((i+1)); done; exit 3; "
             "fi; trap '' TERM; echo $$ > pid0; exec sleep 30",
             dir);
    double t0 = now_s();
    kiln_status s = launch_sh(script, 2, 1.0);
    double dt = now_s() - t0;
    long pid0 = read_pid(dir, 0);
    rm_tree(dir);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "rank 1 of 2 exited with status 3"), "%s", kiln_last_error());
    CHECK(dt >= 0.9 && dt < 5.0, "took %.2f s: SIGKILL should follow SIGTERM by the 1 s grace", dt);
    CHECK(pid_gone(pid0), "pid %ld", pid0);
}

static void test_launch_killed_by_signal(void) {
    double t0 = now_s();
    kiln_status s = launch_sh("if [ \"$KILN_RANK\" = 0 ]; then kill -9 $$; fi; exec sleep 30", 2, 1.0);
    double dt = now_s() - t0;
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "rank 0 of 2 was killed by signal 9"), "%s", kiln_last_error());
    CHECK(dt < 5.0, "took %.2f s", dt);
}

static void test_launch_bad_command(void) {
    char *argv[] = {"/nonexistent/kiln", "train", NULL};
    kiln_status s = kiln_launch_ranks(argv, 2, 1.0);
    CHECK(s == KILN_ERR_IO && strstr(kiln_last_error(), "cannot execute /nonexistent/kiln"), "%s", kiln_last_error());
    CHECK(launch_sh("exit 0", 0, 1.0) == KILN_ERR_INVALID);
}

/* ---------------------------------------------------------------- the rendezvous */

static void test_rendezvous(void) {
    char dir[512];
    make_tmp_dir(dir, sizeof dir);
    CHECK(dir[0]);
    uint8_t id[KILN_DIST_ID_BYTES], back[KILN_DIST_ID_BYTES];
    for (int i = 0; i < KILN_DIST_ID_BYTES; i++) id[i] = (uint8_t)(i * 37 + 11);

    /* nothing there yet: a timeout naming the file */
    double t0 = now_s();
    kiln_status s = kiln_rendezvous_get(dir, 0.2, back);
    double dt = now_s() - t0;
    bool names_file = strstr(kiln_last_error(), dir) && strstr(kiln_last_error(), "nccl_id");
    /* a half-written id under another name is never read */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s/nccl_id.tmp.1234", dir);
    FILE *f = fopen(tmp, "wb");
    bool wrote = f && fwrite(id, 1, 10, f) == 10;
    if (f) fclose(f);
    kiln_status s_partial = kiln_rendezvous_get(dir, 0.2, back);
    kiln_status s_put = kiln_rendezvous_put(dir, id);
    kiln_status s_get = kiln_rendezvous_get(dir, 0.2, back);
    rm_tree(dir);
    CHECK(s == KILN_ERR_IO && names_file, "status %d: %s", (int)s, kiln_last_error());
    CHECK(dt >= 0.2 && dt < 2.0, "timed out after %.2f s", dt);
    CHECK(wrote && s_partial == KILN_ERR_IO, "a partial file was read (status %d)", (int)s_partial);
    CHECK(s_put == KILN_OK && s_get == KILN_OK, "put %d get %d", (int)s_put, (int)s_get);
    CHECK(memcmp(id, back, sizeof id) == 0);
}

static void test_dist_none(void) {
    if (kiln_dist_available()) SKIP("built with NCCL (tests/test_cuda_dist.c runs the collectives)");
    uint8_t id[KILN_DIST_ID_BYTES];
    kiln_dist *d = (kiln_dist *)1;
    CHECK(kiln_dist_new_id(id) == KILN_ERR_UNSUPPORTED && strstr(kiln_last_error(), "without NCCL"), "%s", kiln_last_error());
    CHECK(kiln_dist_init(id, 0, 2, 0, &d) == KILN_ERR_UNSUPPORTED && d == NULL);
    kiln_dist_free(NULL);
    kiln_dist_abort(NULL);
}

int main(void) {
    RUN(test_rank_env_none);
    RUN(test_rank_env_kiln);
    RUN(test_rank_env_mpi);
    RUN(test_rank_env_invalid);
    RUN(test_launch_env);
    RUN(test_launch_failure_stops_all);
    RUN(test_launch_sigkill_after_grace);
    RUN(test_launch_killed_by_signal);
    RUN(test_launch_bad_command);
    RUN(test_rendezvous);
    RUN(test_dist_none);
    TEST_EXIT();
}
