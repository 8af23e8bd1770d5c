/* `difflet loadgen`: open-loop load on a difflet server on this machine (loopback
 * only): requests arrive as a Poisson process of rate R per second regardless of
 * how fast earlier ones finish, each on its own thread; prints p50/p90/p99 latency
 * and SLO attainment (the share of requests answered within the SLO), as Difflet's
 * Table 8 reports them. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "difflet/check.h"

typedef struct {
    struct sockaddr_in addr;
    char body[512];
    double latency;
    int status;
} shot;

/* One HTTP/1.1 POST /v1/images/generations; returns the status code, -1 on error. */
static int post(const struct sockaddr_in *addr, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) != 0) {
        close(fd);
        return -1;
    }
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     strlen(body), body);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    char buf[4096];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    int status = -1;
    if (got > 12) {
        buf[got] = 0;
        sscanf(buf, "HTTP/1.%*d %d", &status);
    }
    while (got > 0) got = read(fd, buf, sizeof buf); /* drain */
    close(fd);
    return status;
}

static void *fire(void *arg) {
    shot *s = arg;
    double t0 = dl_now();
    s->status = post(&s->addr, s->body);
    s->latency = dl_now() - t0;
    return NULL;
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cli_loadgen(int argc, char **argv) {
    const char *url = NULL, *prompt = "a large red circle in the centre on a blue background";
    double rate = 1, slo = 5;
    int n = 20, steps = 20;
    uint64_t seed = 1;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--url")) url = argv[i + 1];
        else if (!strcmp(argv[i], "--rate")) rate = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--requests")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--slo")) slo = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) prompt = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "difflet: loadgen: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (argc % 2 || !url || rate <= 0 || n <= 0 || n > 100000 || steps <= 0) {
        fprintf(stderr, "difflet: loadgen: --url http://127.0.0.1:PORT [--rate R] [--requests N] [--steps S] [--slo SECONDS]\n");
        return 2;
    }
    char host[64];
    int port;
    if (sscanf(url, "http://%63[^:/]:%d", host, &port) != 2 || (strncmp(host, "127.", 4) && strcmp(host, "localhost"))) {
        fprintf(stderr, "difflet: loadgen: only loopback servers (http://127.x.x.x:PORT) may be targeted\n");
        return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, strcmp(host, "localhost") ? host : "127.0.0.1", &addr.sin_addr);
    shot *shots = calloc((size_t)n, sizeof *shots);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!shots || !th) return 1;
    uint64_t rng = seed;
    double t0 = dl_now(), next = t0;
    for (int i = 0; i < n; i++) {
        double u = (double)((dl_rng_next(&rng) >> 11) + 1) * 0x1p-53; /* exponential inter-arrival times */
        next += -log(u) / rate;
        double wait = next - dl_now();
        if (wait > 0) usleep((useconds_t)(wait * 1e6));
        shots[i].addr = addr;
        snprintf(shots[i].body, sizeof shots[i].body, "{\"prompt\":\"%s\",\"steps\":%d,\"seed\":%d}", prompt, steps, i);
        pthread_create(&th[i], NULL, fire, &shots[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    double span = dl_now() - t0, *lat = malloc((size_t)n * sizeof *lat);
    int ok = 0, within = 0, rejected = 0;
    for (int i = 0; i < n; i++) {
        if (shots[i].status == 200) lat[ok++] = shots[i].latency, within += shots[i].latency <= slo;
        rejected += shots[i].status == 429;
    }
    qsort(lat, (size_t)ok, sizeof *lat, by_double);
#define Q(p) (ok ? lat[(int)fmin(ok - 1, floor((p) * ok))] : NAN)
    printf("%d requests at %.2f/s (open loop, Poisson) in %.1f s: %d ok, %d rejected (429), %d failed\n", n, rate, span, ok,
           rejected, n - ok - rejected);
    printf("latency p50 %.3f s  p90 %.3f s  p99 %.3f s;  SLO %.1f s attained by %.1f%% of all requests\n", Q(0.5), Q(0.9),
           Q(0.99), slo, 100.0 * within / n);
#undef Q
    free(shots), free(th), free(lat);
    return 0;
}
