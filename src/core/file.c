/* file.c: opening an input file without blocking, and only when it is a regular file (file.h).
 * tests/test_gguf.c (test_open_not_regular) covers a FIFO, a directory and a missing file. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status kiln_open_regular(const char *path, int *fd) {
    *fd = -1;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        if (errno == EISDIR) return kiln_fail(KILN_ERR_IO, "%s: is a directory", path);
        return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    kiln_status s = KILN_OK;
    if (fstat(f, &st) != 0) s = kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode)) s = kiln_fail(KILN_ERR_IO, "%s: is a directory", path);
    else if (!S_ISREG(st.st_mode)) s = kiln_fail(KILN_ERR_IO, "%s: is not a regular file", path);
    else {
        /* reads of a regular file never block anyway; clearing the flag keeps later readers' usual semantics */
        int flags = fcntl(f, F_GETFL);
        if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) < 0)
            s = kiln_fail(KILN_ERR_IO, "%s: fcntl failed: %s", path, strerror(errno));
    }
    if (s) {
        close(f);
        return s;
    }
    *fd = f;
    return KILN_OK;
}

kiln_status kiln_fopen_regular(const char *path, FILE **f) {
    *f = NULL;
    int fd;
    kiln_status s = kiln_open_regular(path, &fd);
    if (s) return s;
    if (!(*f = fdopen(fd, "rb"))) {
        s = kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return s;
}

kiln_status kiln_check_regular(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return kiln_fail(KILN_ERR_IO, "%s: is a directory", path);
    if (!S_ISREG(st.st_mode)) return kiln_fail(KILN_ERR_IO, "%s: is not a regular file", path);
    return KILN_OK;
}
