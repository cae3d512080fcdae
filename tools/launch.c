/* launch.c: `kiln train --nproc N` and `kiln bench train --nproc N` start their ranks here (launch.h): N copies of
 * this executable, all stopped when one fails. Plain POSIX processes, no threads: the launcher is one waitpid loop.
 * tests/test_dist.c runs it with /bin/sh ranks. */
#include "kiln.h"
#include "tools/launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

extern char **environ;

#define MAX_RANKS 4096 /* far above one host's GPUs: a guard against a garbage count, not a real limit */

/* ---------------------------------------------------------------- the launcher */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Removes the rendezvous directory: the id, and any temp file a rank that died mid-write left. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        char path[PATH_MAX];
        for (struct dirent *e; (e = readdir(d));) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Rank r's environment: ours without any KILN_RANK, KILN_WORLD_SIZE, KILN_LOCAL_RANK, KILN_DIST_DIR, then the four
 * for r. Built before fork, so the child only calls execve (a forked child may call async-signal-safe functions
 * alone). vars holds the four strings; env their pointers after the copied ones. */
enum { N_RANK_VARS = 4, RANK_VAR_BYTES = 600 };
static bool is_rank_var(const char *e) {
    static const char *names[N_RANK_VARS] = {"KILN_RANK=", "KILN_WORLD_SIZE=", "KILN_LOCAL_RANK=", "KILN_DIST_DIR="};
    for (int i = 0; i < N_RANK_VARS; i++)
        if (strncmp(e, names[i], strlen(names[i])) == 0) return true;
    return false;
}

typedef struct rank_proc {
    pid_t pid; /* 0 once reaped */
} rank_proc;

/* Sends sig to every rank still running. */
static void signal_all(const rank_proc *procs, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (procs[r].pid > 0) kill(procs[r].pid, sig);
}

static int rank_of(const rank_proc *procs, int n, pid_t pid) {
    for (int r = 0; r < n; r++)
        if (procs[r].pid == pid) return r;
    return -1;
}

/* Reaps every started rank. *failed: the first rank that exited non-zero or died on a signal (-1 when none), its
 * wait status in *failed_status. Once one has failed (or at once when stop), the rest get SIGTERM, and SIGKILL
 * grace_s later. */
static void wait_all(rank_proc *procs, int n, int n_live, double grace_s, bool stop, int *failed, int *failed_status) {
    bool stopping = stop;
    double kill_at = 0;
    *failed = -1;
    if (stopping) {
        signal_all(procs, n, SIGTERM);
        kill_at = now_s() + grace_s;
    }
    bool killed = false;
    while (n_live > 0) {
        int ws;
        pid_t pid = waitpid(-1, &ws, stopping && !killed ? WNOHANG : 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: someone else reaped them; nothing is left to wait for */
        }
        if (pid == 0) { /* stopping, nobody exited yet: the grace period */
            if (now_s() >= kill_at) {
                signal_all(procs, n, SIGKILL);
                killed = true;
            } else {
                nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
            }
            continue;
        }
        int r = rank_of(procs, n, pid);
        if (r < 0) continue; /* not a rank of ours */
        procs[r].pid = 0;
        n_live--;
        bool ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
        if (!ok && !stopping) {
            *failed = r, *failed_status = ws;
            stopping = true;
            signal_all(procs, n, SIGTERM);
            kill_at = now_s() + grace_s;
        }
    }
}

kiln_status kiln_launch_ranks(char *const argv[], int n, double grace_s) {
    if (!argv || !argv[0]) return kiln_fail(KILN_ERR_INVALID, "launch: no command");
    if (n < 1 || n > MAX_RANKS) return kiln_fail(KILN_ERR_INVALID, "launch: %d ranks (1 to %d)", n, MAX_RANKS);
    if (!(grace_s >= 0) || !isfinite(grace_s)) return kiln_fail(KILN_ERR_INVALID, "launch: a grace period of %g s", grace_s);

    const char *tmp = getenv("TMPDIR");
    char dir[512];
    if (snprintf(dir, sizeof dir, "%s/kiln-dist-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)sizeof dir)
        return kiln_fail(KILN_ERR_INVALID, "launch: TMPDIR is too long");
    if (!mkdtemp(dir)) return kiln_fail(KILN_ERR_IO, "launch: cannot make the rendezvous directory %s: %s", dir, strerror(errno));

    size_t n_env = 0;
    while (environ && environ[n_env]) n_env++;
    char **env = malloc((n_env + N_RANK_VARS + 1) * sizeof *env);
    char(*vars)[RANK_VAR_BYTES] = malloc(N_RANK_VARS * sizeof *vars);
    rank_proc *procs = calloc((size_t)n, sizeof *procs);
    kiln_status st = KILN_OK;
    if (!env || !vars || !procs) {
        st = kiln_fail(KILN_ERR_NOMEM, "launch: out of memory for %d ranks", n);
        goto done;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (!is_rank_var(environ[i])) env[k++] = environ[i];
    for (int i = 0; i < N_RANK_VARS; i++) env[k + (size_t)i] = vars[i];
    env[k + N_RANK_VARS] = NULL;

    int failed, failed_status = 0, n_live = 0;
    char exec_error[300] = "";
    pid_t self = getpid();
    for (int r = 0; r < n; r++) {
        snprintf(vars[0], RANK_VAR_BYTES, "KILN_RANK=%d", r);
        snprintf(vars[1], RANK_VAR_BYTES, "KILN_WORLD_SIZE=%d", n);
        snprintf(vars[2], RANK_VAR_BYTES, "KILN_LOCAL_RANK=%d", r);
        snprintf(vars[3], RANK_VAR_BYTES, "KILN_DIST_DIR=%s", dir);
        /* a close-on-exec pipe carries execve's errno back, so a bad path is named rather than seen as exit 127 */
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            st = kiln_fail(KILN_ERR_IO, "launch: pipe for rank %d: %s", r, strerror(errno));
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            st = kiln_fail(KILN_ERR_IO, "launch: cannot start rank %d of %d: fork: %s", r, n, strerror(errno));
            close(p[0]), close(p[1]);
            break;
        }
        if (pid == 0) {
            close(p[0]);
#ifdef __linux__
            /* the launcher killed outright (SIGKILL, OOM) must not leave ranks waiting in a collective */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != self) _exit(127);
#endif
            execve(argv[0], argv, env);
            int e = errno;
            if (write(p[1], &e, sizeof e) < 0) _exit(127);
            _exit(127);
        }
        close(p[1]);
        procs[r].pid = pid;
        n_live++;
        int e = 0;
        ssize_t got;
        while ((got = read(p[0], &e, sizeof e)) < 0 && errno == EINTR) {}
        close(p[0]);
        if (got == (ssize_t)sizeof e) {
            snprintf(exec_error, sizeof exec_error, "launch: cannot execute %s: %s", argv[0], strerror(e));
            break;
        }
    }
    /* after a failed start, the ranks already running are stopped as after a failed rank */
    wait_all(procs, n, n_live, grace_s, st || exec_error[0], &failed, &failed_status);
    if (st) goto done;
    if (exec_error[0]) {
        st = kiln_fail(KILN_ERR_IO, "%s", exec_error);
    } else if (failed >= 0) {
        if (WIFSIGNALED(failed_status))
            st = kiln_fail(KILN_ERR_IO, "rank %d of %d was killed by signal %d (%s); the other ranks were stopped", failed, n,
                           WTERMSIG(failed_status), strsignal(WTERMSIG(failed_status)));
        else
            st = kiln_fail(KILN_ERR_IO, "rank %d of %d exited with status %d; the other ranks were stopped", failed, n,
                           WEXITSTATUS(failed_status));
    }
done:
    remove_dir(dir);
    free(procs);
    free(vars);
    free(env);
    return st;
}

kiln_status kiln_launch_self(const char *const cmd[], int n_cmd, int argc, char **argv, int skip, int n) {
    char exe[4096];
    const ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0 || k >= (ssize_t)sizeof exe - 1) return kiln_fail(KILN_ERR_IO, "launch: cannot find this executable (/proc/self/exe)");
    exe[k] = 0;
    char **rank_argv = malloc(((size_t)argc + (size_t)n_cmd + 2) * sizeof *rank_argv);
    if (!rank_argv) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    int m = 0;
    rank_argv[m++] = exe;
    for (int i = 0; i < n_cmd; i++) rank_argv[m++] = (char *)cmd[i];
    for (int i = 0; i < argc; i++)
        if (skip < 0 || (i != skip && i != skip + 1)) rank_argv[m++] = argv[i];
    rank_argv[m] = NULL;
    const kiln_status s = kiln_launch_ranks(rank_argv, n, 10.0);
    free(rank_argv);
    return s;
}
