/* The listener of `difflet serve`'s API process: it accepts connections itself and
 * checks each request before libmicrohttpd sees it.
 *
 * Why: libmicrohttpd 0.9.75 answers some malformed requests itself, in HTML, with no
 * hook to change it (a request line or headers past its per-connection memory: 414,
 * 431; a missing or bad HTTP version, a header line without a colon, a bad
 * Content-Length or chunk: 400, 413, 505), and closes the connection on others without
 * a word (a request line without a space or starting with one, a line starting with
 * NUL, an unknown Transfer-Encoding). So a connection's bytes stay in its socket
 * (MSG_PEEK; SO_RCVLOWAT wakes the thread when more came) until the request head, and
 * a chunked body or a Content-Length body of at most 64 KiB (every JSON body), are
 * complete, and are checked against a grammar stricter than
 * libmicrohttpd's, within smaller limits: a bad request gets the JSON error object
 * (server.c's) from here and its connection closes; a good one goes to libmicrohttpd
 * (MHD_add_connection), which reads the same bytes and finds nothing to refuse. Every
 * response closes its connection (server.c), so every request passes here.
 *
 * The connection limits are kept here too: a connection counts from its accept until
 * libmicrohttpd has closed it (its connection notifications). The listener's thread
 * takes no lock but its own count lock, so it answers (and hands /health over) whatever
 * the rest of the server waits for. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "serve/api_impl.h"

enum {
    URI_MAX = 8192,                 /* the request target; longer: 414 */
    HEAD_MAX = 32768,               /* request line and header fields; larger: 431 */
    FIELDS_MAX = 128,               /* header fields; more: 431 (libmicrohttpd's per-connection memory holds each) */
    CHUNKED_BODY = 64 * 1024,       /* a chunked body waits here whole: its data; more: 413 (send Content-Length) */
    CHUNKED_MAX = CHUNKED_BODY + 16384, /* ... and with its framing */
    PEEK_MAX = HEAD_MAX + CHUNKED_MAX,
};
_Static_assert(DL_LISTEN_MHD_POOL >= 2 * HEAD_MAX, "libmicrohttpd's memory must hold any head the listener passes");
static const double k_linger_s = 2.0; /* after an error reply, the client's rest is read (then EOF) this long */

typedef struct {
    int fd;
    struct sockaddr_in addr;
    double deadline; /* for the request (idle_timeout_s after the accept), or the linger's end */
    double retry;    /* woken without new bytes: not polled before this */
    size_t seen;     /* bytes in the socket at the last look */
    int closing;     /* answered: read and dropped until EOF or the deadline */
    int continued;   /* 100 Continue sent (a chunked body that waits for it) */
} pending;

struct dl_listener {
    int lfd, stop[2], port;
    struct MHD_Daemon *d;
    int max_conns, per_ip;
    double timeout_s;
    pthread_t th;
    pthread_mutex_t mu; /* the counts below: this thread and libmicrohttpd's notifications */
    int total, nips;
    struct {
        uint32_t ip;
        int n;
    } *ips;             /* connections per client address (IPv4, network order) */
    pending *p;         /* connections not yet handed over (this thread's) */
    int np;
    double accept_retry; /* accept failed (out of descriptors): the listening socket rests until then */
    char *buf;           /* PEEK_MAX + 1 */
};
typedef dl_listener listener;

/* One connection more from ip (d 1; 0 when it would pass a limit, unless forced) or
 * one fewer (d -1). */
static int lst_count(listener *l, uint32_t ip, int d, int force) {
    pthread_mutex_lock(&l->mu);
    int k = 0, ok = 1;
    while (k < l->nips && l->ips[k].ip != ip) k++;
    if (d > 0 && !force && (l->total >= l->max_conns || (k < l->nips && l->ips[k].n >= l->per_ip))) ok = 0;
    else if (d > 0) {
        if (k == l->nips) l->ips[l->nips++].ip = ip, l->ips[k].n = 0;
        l->ips[k].n++, l->total++;
    } else if (k < l->nips) {
        l->total--;
        if (--l->ips[k].n == 0) l->ips[k] = l->ips[--l->nips];
    }
    pthread_mutex_unlock(&l->mu);
    return ok;
}

/* libmicrohttpd's connection notifications: it holds a connection from STARTED (inside
 * MHD_add_connection, on the listener's thread) until CLOSED */
void dl_listener_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    (void)socket_context;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    uint32_t ip = ci && ci->client_addr && ci->client_addr->sa_family == AF_INET ? ((const struct sockaddr_in *)ci->client_addr)->sin_addr.s_addr : 0;
    lst_count(cls, ip, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1, 1);
}

/* what a refusal says: status, OpenAI-style string code, message */
typedef struct {
    int status;
    const char *code;
    char msg[240];
    int expect_continue; /* the head asks for 100 Continue before a chunked body, and no body came yet */
} verdict;

#define REFUSE(v, st, cd, ...) (snprintf((v)->msg, sizeof (v)->msg, __VA_ARGS__), (v)->status = (st), (v)->code = (cd), -1)

/* a token byte (RFC 9110 5.6.2): a method's, a header name's */
static int is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}
/* a request-target byte: visible ASCII, or beyond ASCII (taken as it comes) */
static int is_target(unsigned char c) { return c > 0x20 && c != 0x7f; }
/* a field value byte: visible, space, tab, or beyond ASCII (obs-text) */
static int is_field(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* the line end at s[i] (CRLF, or a bare LF as libmicrohttpd takes it): its length, 0
 * when s ends first, -1 when there is none */
static int eol(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    if (s[i] == '\n') return 1;
    if (s[i] != '\r') return -1;
    if (i + 1 >= n) return 0;
    return s[i + 1] == '\n' ? 2 : -1;
}

/* up to n bytes of s for a message, each one outside printable ASCII as '?' */
static void excerpt(char *out, size_t on, const char *s, size_t n) {
    size_t k = 0;
    for (; k < n && k + 1 < on; k++) out[k] = s[k] >= 0x20 && s[k] < 0x7f ? s[k] : '?';
    out[k] = 0;
}

/* One header (or trailer) field line at s[*i]: 1 with its name and its value (white
 * space trimmed) and *i past its line end, 0 when s ends first, -1 refused. */
static int field_line(const char *s, size_t n, size_t *i, const char **name, size_t *nl, const char **val, size_t *vl, verdict *v) {
    size_t k = *i, h0 = k;
    if (s[k] == ' ' || s[k] == '\t')
        return REFUSE(v, 400, "malformed_request", "a header line starts with white space (obsolete line folding is not accepted)");
    while (k < n && is_tchar((unsigned char)s[k])) k++;
    if (k == n) return 0;
    if (k == h0 || s[k] != ':')
        return REFUSE(v, 400, "malformed_request", "a header line is not `Name: value` (%s)", k == h0 ? "no name" : "no colon after the name");
    *name = s + h0, *nl = k - h0;
    for (k++; k < n && (s[k] == ' ' || s[k] == '\t'); k++) {}
    const size_t v0 = k;
    while (k < n && is_field((unsigned char)s[k])) k++;
    int e = eol(s, n, k);
    if (e == 0) return 0;
    if (e < 0) return REFUSE(v, 400, "malformed_request", "the header `%.*s` has a control character in its value", (int)(*nl < 60 ? *nl : 60), *name);
    size_t v1 = k;
    while (v1 > v0 && (s[v1 - 1] == ' ' || s[v1 - 1] == '\t')) v1--;
    *val = s + v0, *vl = v1 - v0;
    *i = k + (size_t)e;
    return 1;
}

/* -1: a chunked body past what the listener holds (413) */
static int chunked_too_big(verdict *v) {
    return REFUSE(v, 413, "request_too_large", "a chunked body is taken up to %d bytes (a larger one needs Content-Length)", CHUNKED_BODY);
}

/* a chunked body that has not all come: 0, or 413 when it already passed the limit */
static int chunked_more(size_t n, verdict *v) { return n > CHUNKED_MAX ? chunked_too_big(v) : 0; }

/* A chunked body at s[0, n) (RFC 9112 7.1: chunks of a hex size, optional extensions,
 * data and a line end; the last of size 0; trailer fields; an empty line): 1 when it is
 * complete and well-formed, 0 well-formed so far, -1 refused. */
static int chunked_check(const char *s, size_t n, verdict *v) {
    size_t i = 0, payload = 0;
    for (;;) {
        const size_t h0 = i;
        uint64_t size = 0;
        for (; i < n && isxdigit((unsigned char)s[i]); i++) {
            size = size * 16 + (uint64_t)(isdigit((unsigned char)s[i]) ? s[i] - '0' : (tolower((unsigned char)s[i]) - 'a' + 10));
            if (payload + size > CHUNKED_BODY) return chunked_too_big(v);
        }
        if (i == n) return chunked_more(n, v);
        if (i == h0) return REFUSE(v, 400, "malformed_request", "malformed chunked body: a chunk does not start with its size in hex");
        if (s[i] == ';') /* a chunk extension: ignored */
            for (i++; i < n && is_field((unsigned char)s[i]); i++) {}
        int e = eol(s, n, i);
        if (e == 0) return chunked_more(n, v);
        if (e < 0) return REFUSE(v, 400, "malformed_request", "malformed chunked body: a chunk size line has more than the size");
        i += (size_t)e;
        if (size == 0) break;
        payload += (size_t)size;
        if (n - i < size) return chunked_more(n, v);
        i += size;
        if ((e = eol(s, n, i)) == 0) return chunked_more(n, v);
        if (e < 0) return REFUSE(v, 400, "malformed_request", "malformed chunked body: a chunk's data is longer than its size");
        i += (size_t)e;
    }
    for (int fields = 0;; fields++) { /* trailer fields (counted as the head's are), then an empty line */
        const char *name, *val;
        size_t nl, vl;
        int e = eol(s, n, i);
        if (e > 0) return 1;
        if (e == 0) return chunked_more(n, v);
        if (fields >= FIELDS_MAX) return REFUSE(v, 431, "request_header_fields_too_large", "more than %d trailer fields", FIELDS_MAX);
        int r = field_line(s, n, &i, &name, &nl, &val, &vl, v);
        if (r <= 0) return r < 0 ? -1 : chunked_more(n, v);
    }
}

/* The request at s[0, n) (RFC 9112: empty lines, `METHOD SP target SP HTTP/1.x`, header
 * fields, an empty line, and a chunked body when it has one): 1 when complete and
 * well-formed within the limits, 0 well-formed so far, -1 refused (*v says how). A
 * Content-Length body of at most 64 KiB is waited for whole (so one cut short is this
 * listener's 400 or 408); a larger one (image uploads) is libmicrohttpd's to read, and
 * its size the route's to judge (the handler answers 413 before reading it). */
static int request_check(const char *s, size_t n, verdict *v) {
    size_t i = 0;
    for (int e; (e = eol(s, n, i)) > 0;) i += (size_t)e; /* empty lines before a request are ignored (RFC 9112 2.2) */
    if (i >= HEAD_MAX) return REFUSE(v, 431, "request_header_fields_too_large", "the request head is larger than %d bytes", HEAD_MAX);
    if (i < n && s[i] == '\r' && i + 1 == n) return 0;
    const size_t m0 = i;
    while (i < n && i - m0 <= 32 && is_tchar((unsigned char)s[i])) i++;
    if (i < n && (i == m0 || i - m0 > 32 || s[i] != ' '))
        return REFUSE(v, 400, "malformed_request", "this is not an HTTP request line (`METHOD /path HTTP/1.1`)");
    if (i == n) return 0;
    const size_t t0 = ++i;
    while (i < n && i - t0 <= URI_MAX && is_target((unsigned char)s[i])) i++;
    if (i - t0 > URI_MAX) return REFUSE(v, 414, "uri_too_long", "the request target is longer than %d bytes", URI_MAX);
    if (i == n) return 0;
    for (size_t k = t0; k + 2 < i; k++) /* the library decodes %00 into a NUL that would end the path early */
        if (s[k] == '%' && s[k + 1] == '0' && s[k + 2] == '0')
            return REFUSE(v, 400, "malformed_request", "the request target has an encoded NUL (%%00)");
    if (i == t0 || s[i] != ' ')
        return REFUSE(v, 400, "malformed_request", "%s", i == t0 ? "the request line has no target (`METHOD /path HTTP/1.1`)"
                                                   : s[i] == '\r' || s[i] == '\n' ? "the request line has no HTTP version (`METHOD /path HTTP/1.1`)"
                                                                                  : "the request target has a control character");
    const size_t v0 = ++i;
    for (; i < n && i - v0 < 8; i++) { /* HTTP/d.d */
        const size_t k = i - v0;
        if (!(k < 5 ? s[i] == "HTTP/"[k] : k == 6 ? s[i] == '.' : isdigit((unsigned char)s[i])))
            return REFUSE(v, 400, "malformed_request", "the HTTP version is not of the form HTTP/1.1");
    }
    int e = eol(s, n, i);
    if (i - v0 < 8 || e == 0) return 0;
    if (e < 0) return REFUSE(v, 400, "malformed_request", "the request line has more after its HTTP version");
    if (s[v0 + 5] != '1')
        return REFUSE(v, 505, "http_version_not_supported", "HTTP/%c.%c is not supported: this server speaks HTTP/1.1 and HTTP/1.0",
                      s[v0 + 5], s[v0 + 7]);
    const int http11 = s[v0 + 7] != '0';
    i += (size_t)e;
    int hosts = 0, lengths = 0, codings = 0, expect = 0, fields = 0;
    uint64_t clen = 0; /* the first Content-Length (a second must agree) */
    char coding[64] = "";
    for (;;) { /* header fields, until an empty line */
        const char *name, *val;
        size_t nl, vl;
        if ((e = eol(s, n, i)) > 0) {
            i += (size_t)e;
            break;
        }
        int r = e == 0 ? 0 : field_line(s, n, &i, &name, &nl, &val, &vl, v);
        if (r < 0) return -1;
        if (r == 0 || i > HEAD_MAX)
            return n > HEAD_MAX ? REFUSE(v, 431, "request_header_fields_too_large", "the request head is larger than %d bytes", HEAD_MAX) : 0;
#define IS(h) (nl == strlen(h) && !strncasecmp(name, h, nl))
        if (++fields > FIELDS_MAX)
            return REFUSE(v, 431, "request_header_fields_too_large", "more than %d header fields", FIELDS_MAX);
        /* white space after the value is allowed by RFC 9110 but read wrongly by the HTTP
         * library for these two: refused here, with a reason */
        if ((IS("Content-Length") || IS("Transfer-Encoding") || IS("Host")) && (val[vl] == ' ' || val[vl] == '\t'))
            return REFUSE(v, 400, "malformed_request", "`%.*s` has white space after its value", (int)nl, name);
        if (IS("Cookie")) { /* the library keeps every pair in its per-connection memory; this server reads none */
            size_t pairs = 1;
            for (size_t k = 0; k < vl; k++) pairs += val[k] == ';';
            if (pairs > FIELDS_MAX) return REFUSE(v, 431, "request_header_fields_too_large", "a Cookie header of more than %d pairs", FIELDS_MAX);
        }
        if (IS("Host")) {
            hosts++;
            for (size_t k = 0; k < vl; k++) /* a URI host and port (RFC 9110 7.2): ASCII */
                if ((unsigned char)val[k] >= 0x80 || val[k] == ' ' || val[k] == '\t')
                    return REFUSE(v, 400, "malformed_request", "the Host header is not an ASCII host[:port]");
        }
        else if (IS("Content-Length")) {
            uint64_t x = 0;
            size_t k = 0;
            for (; k < vl && isdigit((unsigned char)val[k]); k++) x = x > UINT32_MAX ? x : x * 10 + (uint64_t)(val[k] - '0');
            if (!vl || k < vl) return REFUSE(v, 400, "malformed_request", "Content-Length is not a number");
            if (x > UINT32_MAX) return REFUSE(v, 413, "request_too_large", "Content-Length is larger than any body this server takes");
            if (lengths++ && x != clen) return REFUSE(v, 400, "malformed_request", "two Content-Length headers that differ");
            clen = x;
        } else if (IS("Transfer-Encoding")) {
            codings++;
            excerpt(coding, sizeof coding, val, vl);
        } else if (IS("Expect")) {
            expect = vl == 12 && !strncasecmp(val, "100-continue", 12);
        }
#undef IS
    }
    if (i > HEAD_MAX) return REFUSE(v, 431, "request_header_fields_too_large", "the request head is larger than %d bytes", HEAD_MAX);
    if (http11 && !hosts) return REFUSE(v, 400, "malformed_request", "HTTP/1.1 requests need a Host header");
    if (hosts > 1) return REFUSE(v, 400, "malformed_request", "more than one Host header");
    if (codings) {
        if (!http11) return REFUSE(v, 400, "malformed_request", "Transfer-Encoding in an HTTP/1.0 request");
        if (lengths) return REFUSE(v, 400, "malformed_request", "both Transfer-Encoding and Content-Length");
        if (codings > 1 || strcasecmp(coding, "chunked"))
            return REFUSE(v, 501, "not_implemented", "Transfer-Encoding `%s` is not supported (only chunked)", coding);
        v->expect_continue = expect && i == n;
        return chunked_check(s + i, n - i, v);
    }
    if (clen > 0 && clen <= CHUNKED_BODY && n - i < clen) { /* a small body waits here whole too: a truncated one gets 400/408 */
        v->expect_continue = expect && i == n;
        return 0;
    }
    return 1;
}

/* the connection closes and stops counting */
static void lst_drop(listener *l, pending *p) {
    close(p->fd);
    lst_count(l, p->addr.sin_addr.s_addr, -1, 0);
    p->fd = -1;
}

/* The JSON error object as a whole response; then the client's rest is read and
 * dropped until it closes (or k_linger_s): closing with unread bytes would reset the
 * connection and could lose the response on the way. */
static void lst_refuse(pending *p, int status, const char *code, const char *msg) {
    static const struct {
        int status;
        const char *reason;
    } reasons[] = {{400, "Bad Request"}, {408, "Request Timeout"}, {413, "Content Too Large"}, {414, "URI Too Long"},
                   {431, "Request Header Fields Too Large"}, {501, "Not Implemented"}, {505, "HTTP Version Not Supported"}};
    const char *reason = "Error";
    for (size_t k = 0; k < sizeof reasons / sizeof reasons[0]; k++)
        if (reasons[k].status == status) reason = reasons[k].reason;
    cJSON *j = dl_api_error_object("invalid_request_error", NULL, code, msg);
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    char date[64], head[320];
    const time_t t = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&t, &tm));
    const size_t blen = body ? strlen(body) : 0;
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nDate: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      status, reason, date, blen);
    struct iovec iov[2] = {{head, (size_t)hn}, {body, blen}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    if (sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {} /* a new socket's buffer takes it; a client gone hears nothing */
    free(body);
    shutdown(p->fd, SHUT_WR);
    dl_api_count_reply(status);
    const int one = 1;
    setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    p->closing = 1;
    p->retry = 0;
    p->deadline = dl_now() + k_linger_s;
}

/* a refused connection: its input read and dropped (at most 256 KiB a turn) until EOF */
static void lst_drain(listener *l, pending *p) {
    ssize_t r = 0;
    for (int k = 0; k < 64 && (r = recv(p->fd, l->buf, 4096, MSG_DONTWAIT)) > 0; k++) {}
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) lst_drop(l, p);
}

/* a well-formed request to libmicrohttpd, which counts the connection from here on */
static void lst_handover(listener *l, pending *p) {
    const int one = 1;
    setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    lst_count(l, p->addr.sin_addr.s_addr, -1, 0);
    if (MHD_add_connection(l->d, p->fd, (const struct sockaddr *)&p->addr, sizeof p->addr) != MHD_YES)
        DL_WARN("serve: a connection could not be handed to the HTTP library: %s", strerror(errno)); /* it closed it */
    p->fd = -1;
}

/* A pending connection with news (bytes, or its peer's end): look at what is there. */
static void lst_look(listener *l, pending *p, short revents) {
    if (p->closing) {
        lst_drain(l, p);
        return;
    }
    ssize_t n = recv(p->fd, l->buf, PEEK_MAX + 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) { /* gone before it sent anything */
        lst_drop(l, p);
        return;
    }
    verdict v = {0};
    const int r = request_check(l->buf, (size_t)n, &v);
    if (r > 0) lst_handover(l, p);
    else if (r < 0) lst_refuse(p, v.status, v.code, v.msg);
    else if (revents & (POLLRDHUP | POLLHUP | POLLERR))
        lst_refuse(p, 400, "malformed_request", "the request ended (the client closed its side) before it was complete");
    else {
        if (v.expect_continue && !p->continued) { /* the client waits for this before it sends a chunked body */
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            if (send(p->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {}
            p->continued = 1;
        }
        if ((size_t)n <= p->seen) p->retry = dl_now() + 0.02; /* woken without new bytes: no busy loop */
        p->seen = (size_t)n;
        const int more = (int)n + 1; /* poll again when more than this has come */
        setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &more, sizeof more);
    }
}

/* A pending connection past its deadline: a request that did not all come in time is
 * a 408; one that sent nothing is closed without a word (an idle connection), as is one
 * that lingered after its refusal. */
static void lst_expire(listener *l, pending *p) {
    if (!p->closing && recv(p->fd, l->buf, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
        lst_refuse(p, 408, "request_timeout", "the request did not all arrive within the connection's idle timeout");
    else
        lst_drop(l, p);
}

/* every connection waiting to be accepted: pending, or closed at once past a limit */
static void lst_accept(listener *l) {
    for (;;) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int fd = accept4(l->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) l->accept_retry = dl_now() + 0.1;
            return;
        }
        if (l->np >= l->max_conns || !lst_count(l, a.sin_addr.s_addr, 1, 0)) { /* over a limit: closed at once */
            close(fd);
            continue;
        }
        l->p[l->np++] = (pending){.fd = fd, .addr = a, .deadline = dl_now() + l->timeout_s};
    }
}

/* The listener's thread: one poll over the listening socket and the pending
 * connections (those that wait for more bytes, for a retry or for their deadline),
 * until dl_listener_stop. */
static void *lst_main(void *arg) {
    listener *l = arg;
    struct pollfd *pf = malloc(sizeof *pf * (size_t)(l->max_conns + 2));
    while (pf) {
        double now = dl_now();
        int timeout = 1000, npf = 2;
        pf[0] = (struct pollfd){.fd = l->stop[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = now >= l->accept_retry ? l->lfd : -1, .events = POLLIN};
        if (now < l->accept_retry) timeout = 100;
        for (int k = 0; k < l->np; k++) {
            const pending *p = &l->p[k];
            const double until = p->retry > now && p->retry < p->deadline ? p->retry : p->deadline;
            const int ms = until <= now ? 0 : (int)((until - now) * 1000) + 1;
            timeout = ms < timeout ? ms : timeout;
            pf[npf++] = (struct pollfd){.fd = p->retry > now ? -1 : p->fd, .events = POLLIN | POLLRDHUP};
        }
        if (poll(pf, (nfds_t)npf, timeout) < 0 && errno != EINTR) {
            DL_ERROR("serve: poll: %s", strerror(errno));
            break;
        }
        if (pf[0].revents) break;
        const int polled = l->np; /* accept appends: the new ones are looked at on the next turn */
        if (pf[1].revents & POLLIN) lst_accept(l);
        now = dl_now();
        for (int k = 0; k < polled; k++) {
            pending *p = &l->p[k];
            if (pf[k + 2].revents) lst_look(l, p, pf[k + 2].revents);
            if (p->fd >= 0 && now >= p->deadline) lst_expire(l, p);
        }
        int kept = 0; /* the handed over and the closed go */
        for (int k = 0; k < l->np; k++)
            if (l->p[k].fd >= 0) l->p[kept++] = l->p[k];
        l->np = kept;
    }
    for (int k = 0; k < l->np; k++) lst_drop(l, &l->p[k]);
    l->np = 0;
    free(pf);
    return NULL;
}

dl_listener *dl_listener_new(int max_conns, int per_ip, double timeout_s) {
    listener *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->lfd = l->stop[0] = l->stop[1] = -1;
    l->max_conns = max_conns > 0 ? max_conns : 1;
    l->per_ip = per_ip > 0 ? per_ip : l->max_conns;
    l->timeout_s = timeout_s > 0 ? timeout_s : 15;
    pthread_mutex_init(&l->mu, NULL);
    l->ips = calloc((size_t)l->max_conns + 1, sizeof *l->ips);
    l->p = calloc((size_t)l->max_conns, sizeof *l->p);
    l->buf = malloc(PEEK_MAX + 1);
    if (!l->ips || !l->p || !l->buf) {
        dl_listener_free(l);
        return NULL;
    }
    return l;
}

int dl_listener_start(dl_listener *l, struct MHD_Daemon *d, const struct sockaddr_in *addr) {
    l->d = d;
    const int one = 1, rcvbuf = 256 * 1024; /* a head and a chunked body wait in the socket: room for both */
    struct sockaddr_in got;
    socklen_t gl = sizeof got;
    if ((l->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0 ||
        setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        setsockopt(l->lfd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0 ||
        bind(l->lfd, (const struct sockaddr *)addr, sizeof *addr) != 0 || listen(l->lfd, SOMAXCONN) != 0 ||
        getsockname(l->lfd, (struct sockaddr *)&got, &gl) != 0 || pipe2(l->stop, O_CLOEXEC) != 0 ||
        pthread_create(&l->th, NULL, lst_main, l) != 0) {
        DL_ERROR("serve: listen: %s", strerror(errno));
        return 0;
    }
    l->port = ntohs(got.sin_port);
    return 1;
}

int dl_listener_port(const dl_listener *l) { return l->port; }

void dl_listener_stop(dl_listener *l) {
    if (l->stop[1] >= 0 && l->port) {
        if (write(l->stop[1], "s", 1) < 0) {}
        pthread_join(l->th, NULL);
    }
    if (l->lfd >= 0) close(l->lfd);
    if (l->stop[0] >= 0) close(l->stop[0]), close(l->stop[1]);
    l->lfd = l->stop[0] = l->stop[1] = -1;
}

void dl_listener_free(dl_listener *l) {
    if (!l) return;
    free(l->ips), free(l->p), free(l->buf);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

