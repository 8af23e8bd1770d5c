/* The API <-> model process protocol: frames of a u32 little-endian length and that
 * many bytes of JSON, over a Unix socket pair. Frames are capped at 64 MiB. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "serve/serve_impl.h"

enum { MAX_FRAME = 64u << 20 };

static int full_write(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

/* timeout_ms < 0: wait as long as it takes */
static int full_read(int fd, void *p, size_t n, int timeout_ms) {
    char *c = p;
    while (n) {
        if (timeout_ms >= 0) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int pr = poll(&pf, 1, timeout_ms);
            if (pr < 0 && errno == EINTR) continue;
            if (pr <= 0) return -1; /* a frame stuck half-way: the sender stopped */
        }
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

dl_status dl_msg_send(int fd, const cJSON *msg) {
    char *txt = cJSON_PrintUnformatted(msg);
    if (!txt) return dl_fail(DL_ERR_NOMEM, "out of memory");
    size_t n = strlen(txt);
    uint8_t *frame = malloc(n + 4); /* one write: a sender stopped mid-frame leaves no half frame */
    if (!frame) {
        free(txt);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    frame[0] = (uint8_t)n, frame[1] = (uint8_t)(n >> 8), frame[2] = (uint8_t)(n >> 16), frame[3] = (uint8_t)(n >> 24);
    memcpy(frame + 4, txt, n);
    int bad = full_write(fd, frame, n + 4);
    free(frame);
    free(txt);
    return bad ? dl_fail(DL_ERR_IO, "model process socket: %s", strerror(errno)) : DL_OK;
}

dl_status dl_msg_recv(int fd, cJSON **out) { return dl_msg_recv_within(fd, out, -1); }

dl_status dl_msg_recv_within(int fd, cJSON **out, int timeout_ms) {
    *out = NULL;
    uint8_t hdr[4];
    if (full_read(fd, hdr, 4, timeout_ms)) return dl_fail(DL_ERR_IO, "model process socket closed");
    uint32_t n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    if (n > MAX_FRAME) return dl_fail(DL_ERR_FORMAT, "model process sent a %u-byte frame", n);
    char *buf = malloc((size_t)n + 1);
    if (!buf) return dl_fail(DL_ERR_NOMEM, "out of memory");
    if (full_read(fd, buf, n, timeout_ms)) {
        free(buf);
        return dl_fail(DL_ERR_IO, "model process socket closed");
    }
    *out = cJSON_ParseWithLength(buf, n);
    free(buf);
    return *out ? DL_OK : dl_fail(DL_ERR_FORMAT, "model process sent malformed JSON");
}

int dl_unix_connect(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return -1;
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}
