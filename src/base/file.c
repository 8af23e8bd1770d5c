/* File helpers: bounded whole-file reads, atomic writes (temp + fsync + rename),
 * read-only shared mappings, and the monotonic clock. */
#include "difflet/base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Open `path` read-only and check it is a regular file; fills *fd and *size. */
static dl_status open_regular(const char *path, int *fd, size_t *size) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return dl_fail(DL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return dl_fail(DL_ERR_IO, "%s is not a regular file", path);
    }
    *size = (size_t)st.st_size;
    return DL_OK;
}

dl_status dl_file_read(const char *path, size_t max_bytes, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd;
    size_t n;
    dl_status s = open_regular(path, &fd, &n);
    if (s != DL_OK) return s;
    if (n > max_bytes) {
        close(fd);
        return dl_fail(DL_ERR_INVALID, "%s is %zu bytes, more than the %zu allowed", path, n, max_bytes);
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return dl_fail(DL_ERR_NOMEM, "cannot allocate %zu bytes for %s", n, path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return dl_fail(DL_ERR_IO, "read %s: %s", path, r < 0 ? strerror(e) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return DL_OK;
}

static int write_all(int fd, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* the process umask, read once (umask() can only be read by setting it) */
static mode_t g_umask;
static pthread_once_t g_umask_once = PTHREAD_ONCE_INIT;
static void read_umask(void) {
    g_umask = umask(022);
    umask(g_umask);
}

dl_status dl_atomic_open(dl_atomic_file *f, const char *path) {
    size_t plen = strlen(path);
    f->fd = -1;
    f->path = strdup(path);
    f->tmp = malloc(plen + 16);
    if (!f->path || !f->tmp) {
        free(f->path), free(f->tmp);
        f->path = f->tmp = NULL;
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    snprintf(f->tmp, plen + 16, "%s.tmpXXXXXX", path);
    f->fd = mkstemp(f->tmp);
    if (f->fd < 0) {
        dl_status s = dl_fail(DL_ERR_IO, "cannot create a temporary file beside %s: %s", path, strerror(errno));
        free(f->path), free(f->tmp);
        f->path = f->tmp = NULL;
        return s;
    }
    /* mkstemp makes 0600: the finished file gets the mode open(2) would give it */
    pthread_once(&g_umask_once, read_umask);
    if (fchmod(f->fd, 0666 & ~g_umask) != 0) DL_DEBUG("cannot set the mode of %s: %s", f->tmp, strerror(errno));
    return DL_OK;
}

dl_status dl_atomic_write(dl_atomic_file *f, const void *data, size_t len) {
    if (write_all(f->fd, data, len) != 0) return dl_fail(DL_ERR_IO, "write %s: %s", f->tmp, strerror(errno));
    return DL_OK;
}

void dl_atomic_abort(dl_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->tmp) unlink(f->tmp);
    free(f->tmp), free(f->path);
    f->fd = -1;
    f->tmp = f->path = NULL;
}

dl_status dl_atomic_commit(dl_atomic_file *f) {
    if (fsync(f->fd) != 0) {
        dl_status s = dl_fail(DL_ERR_IO, "fsync %s: %s", f->tmp, strerror(errno));
        dl_atomic_abort(f);
        return s;
    }
    close(f->fd);
    f->fd = -1;
    if (rename(f->tmp, f->path) != 0) {
        dl_status s = dl_fail(DL_ERR_IO, "rename %s to %s: %s", f->tmp, f->path, strerror(errno));
        dl_atomic_abort(f);
        return s;
    }
    /* fsync the directory so the rename itself survives a power loss */
    char *dcopy = strdup(f->path);
    if (dcopy) {
        int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dcopy);
    }
    free(f->tmp), free(f->path);
    f->tmp = f->path = NULL;
    return DL_OK;
}

dl_status dl_file_write_atomic(const char *path, const void *data, size_t len) {
    dl_atomic_file f;
    dl_status s = dl_atomic_open(&f, path);
    if (s != DL_OK) return s;
    if ((s = dl_atomic_write(&f, data, len)) != DL_OK) {
        dl_atomic_abort(&f);
        return s;
    }
    return dl_atomic_commit(&f);
}

dl_status dl_mkdir_p(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return dl_fail(DL_ERR_INVALID, "mkdir: bad path");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return dl_fail(DL_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
        buf[i] = c;
    }
    return DL_OK;
}

int dl_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

dl_status dl_mmap_open(dl_mmap *m, const char *path) {
    m->data = NULL;
    m->len = 0;
    int fd;
    size_t n;
    dl_status s = open_regular(path, &fd, &n);
    if (s != DL_OK) return s;
    if (n == 0) { /* mmap of length 0 fails; an empty file is a valid empty map */
        close(fd);
        return DL_OK;
    }
    void *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return dl_fail(DL_ERR_IO, "mmap %s: %s", path, strerror(errno));
    m->data = p;
    m->len = n;
    return DL_OK;
}

void dl_mmap_close(dl_mmap *m) {
    if (m->data) munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

double dl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dl_rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) dl_rm_rf(p);
            else unlink(p);
        }
        closedir(d);
    }
    if (rmdir(path) != 0) unlink(path);
}
