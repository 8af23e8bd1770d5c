/* DDiT scheduling: the buddy allocator under long random operation sequences, the
 * optimal DoP of the reference profile, every policy's invariants in simulation
 * (every request completes, FCFS starts, DoP never above B, no device held twice,
 * no device idle while DDiT has a request waiting), determinism per seed, the queue
 * models against simulated queues (and W >= d over a grid), the makespan-based cost,
 * the static-DoP decoupling ablation (Fig. 13), and the sweeps' invariants (latency
 * monotone in load for a static DoP, p99 growing with the length past capacity). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/check.h"
#include "difflet/sched.h"
#include "test_util.h"

static void test_buddy(void) {
    dl_buddy b;
    CHECK(dl_buddy_init(&b, 2, 8) == DL_OK && dl_buddy_free_count(&b) == 16, "init");
    CHECK(dl_buddy_init(&b, 2, 6) == DL_ERR_INVALID, "devices per node must be a power of two");
    dl_buddy_init(&b, 2, 8);
    int held[64][2], n = 0, bad = 0;
    uint64_t rng = 7;
    for (int it = 0; it < 20000; it++) {
        if (n && (dl_rng_next(&rng) % 3 == 0 || n == 64)) {
            int k = (int)(dl_rng_next(&rng) % (uint64_t)n);
            dl_buddy_free(&b, held[k][0], held[k][1]);
            held[k][0] = held[n - 1][0], held[k][1] = held[n - 1][1], n--;
        } else {
            int size = 1 << (dl_rng_next(&rng) % 4);
            int g = dl_buddy_alloc(&b, size);
            if (g >= 0) {
                bad += g % size != 0 || g / 8 != (g + size - 1) / 8; /* aligned, inside one node */
                for (int k = 0; k < n; k++) /* never overlapping a held group */
                    bad += g < held[k][0] + held[k][1] && held[k][0] < g + size;
                held[n][0] = g, held[n][1] = size, n++;
            } else {
                bad += dl_buddy_largest(&b) >= size; /* refused although a group was free */
            }
        }
        int used = 0;
        for (int k = 0; k < n; k++) used += held[k][1];
        bad += used + dl_buddy_free_count(&b) != 16;
    }
    CHECK(bad == 0, "buddy invariants over 20,000 random operations (%d violations)", bad);
    while (n) n--, dl_buddy_free(&b, held[n][0], held[n][1]);
    CHECK(dl_buddy_largest(&b) == 8 && dl_buddy_free_count(&b) == 16, "every free merges back: a whole node is free again");
    int g = dl_buddy_alloc(&b, 2);
    CHECK(dl_buddy_grow(&b, g, 2, 4) == g / 4 * 4 && dl_buddy_free_count(&b) == 12, "grow in place to 4");
    dl_buddy_init(&b, 1, 8); /* any-device groups: two lone free devices form a pair */
    for (int k = 0; k < 4; k++) dl_buddy_alloc(&b, 2);
    dl_buddy_free(&b, 1, 1), dl_buddy_free(&b, 3, 1);
    uint64_t mask;
    CHECK(dl_buddy_alloc(&b, 2) < 0 && dl_buddy_alloc_any(&b, 2, &mask) == 0 && mask == 0xa && dl_buddy_free_count(&b) == 0,
          "any-device pair from devices 1 and 3 (mask %#llx)", (unsigned long long)mask);
    CHECK(dl_buddy_alloc_any(&b, 1, &mask) < 0 && mask == 0, "a full pool refuses");
}

static void test_profile(void) {
    dl_profile p;
    dl_profile_reference(&p);
    CHECK(dl_profile_best_dop(&p, 0) == 1 && dl_profile_best_dop(&p, 1) == 2 && dl_profile_best_dop(&p, 2) == 4,
          "B = 1, 2, 4 for 144p, 240p, 360p as the paper says");
    const char *csv = "resolution,phase,dop,seconds\nlow,dit,1,10\nlow,dit,2,5.5\nlow,vae,1,1\nhigh,dit,1,40\nhigh,dit,2,20\nhigh,dit,4,10.5\nhigh,vae,1,2\n";
    CHECK(dl_profile_parse_csv(&p, csv, strlen(csv)) == DL_OK && p.nres == 2 && dl_profile_best_dop(&p, 1) == 2,
          "CSV import: %s", dl_last_error());
    CHECK(dl_profile_parse_csv(&p, "x,dit,3,1\n", 10) == DL_ERR_FORMAT, "bad DoP refused");
    char path[] = "/tmp/difflet_prof_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    dl_profile q, r;
    dl_profile_reference(&q);
    CHECK(dl_profile_store_put(path, "fig17", &q) == DL_OK && dl_profile_store_get(path, "fig17", &r) == DL_OK &&
              r.nres == 4 && r.dit[3][3] == 6.90 && !strcmp(r.name[2], "360p"),
          "SQLite round trip: %s", dl_last_error());
    CHECK(dl_profile_store_get(path, "nope", &r) == DL_ERR_INVALID, "unknown profile");
    q.steps = 12; /* the step count travels with the profile */
    CHECK(dl_profile_store_put(path, "twelve", &q) == DL_OK && dl_profile_store_get(path, "twelve", &r) == DL_OK &&
              r.steps == 12,
          "steps round trip: %d", r.steps);
    unlink(path);
}

static void test_policies(void) {
    dl_profile p;
    dl_profile_reference(&p);
    dl_sim_config c = {.decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1, .per_node = 8, .rate = 0.5,
                       .mix = {1, 1, 1}, .nreq = 400, .seed = 3};
    const dl_policy pol[] = {DL_POLICY_DDIT, DL_POLICY_SDOP, DL_POLICY_SDOP, DL_POLICY_SPCI, DL_POLICY_DPCI, DL_POLICY_DP, DL_POLICY_OPTIMAL};
    const int sd[] = {0, 1, 4, 0, 0, 0, 0};
    for (int rate = 0; rate < 2; rate++)
        for (size_t k = 0; k < sizeof pol / sizeof pol[0]; k++) {
            c.policy = pol[k], c.static_dop = sd[k], c.rate = rate ? 0.5 : 0;
            dl_sim_result r;
            CHECK(dl_simulate(&p, &c, &r) == DL_OK, "%s", dl_last_error());
            CHECK(r.completed == c.nreq && r.errors_fcfs == 0 && r.errors_dop == 0 && r.errors_double == 0 &&
                      r.errors_idle == 0 && r.cost > 0 && r.utilization <= 1.0 + 1e-9,
                  "%s%d rate %.2f: completed %d, fcfs %d, dop %d, double %d, idle %d, util %.3f", dl_policy_name(pol[k]), sd[k],
                  c.rate, r.completed, r.errors_fcfs, r.errors_dop, r.errors_double, r.errors_idle, r.utilization);
            /* the makespan-based cost rents every device for the whole trace: never below
             * the device-seconds requests hold */
            CHECK(r.reserved_cost == 8 * r.makespan && r.reserved_cost >= r.cost * (1 - 1e-12),
                  "%s%d rate %.2f: devices x makespan %.1f, held %.1f", dl_policy_name(pol[k]), sd[k], c.rate, r.reserved_cost, r.cost);
        }
    { /* SPCI's static DoP-1 instances against DPCI's B-sized ones: under a burst more,
         smaller instances hold fewer device-seconds (DoP 1 is the most efficient here) and
         the two policies no longer coincide; sdop:2 clusters cost more than sdop:1's */
        dl_sim_result rs, rd, r2;
        c.rate = 0;
        c.policy = DL_POLICY_SPCI, c.static_dop = 0;
        int ok = dl_simulate(&p, &c, &rs) == DL_OK;
        c.static_dop = 2;
        ok &= dl_simulate(&p, &c, &r2) == DL_OK;
        c.policy = DL_POLICY_DPCI, c.static_dop = 0;
        ok &= dl_simulate(&p, &c, &rd) == DL_OK;
        CHECK(ok && rs.cost < rd.cost && rs.cost < r2.cost, "spci cost %.1f (sdop 2: %.1f) vs dpci %.1f", rs.cost, r2.cost, rd.cost);
    }
    for (int rate = 0; rate < 2; rate++) { /* the queue-aware variant keeps the same invariants */
        dl_sim_result r;
        c.policy = DL_POLICY_DDIT, c.queue_aware = 1, c.rate = rate ? 0.75 : 0;
        CHECK(dl_simulate(&p, &c, &r) == DL_OK && r.completed == c.nreq && r.errors_fcfs == 0 && r.errors_dop == 0 &&
                  r.errors_double == 0 && r.errors_idle == 0,
              "ddit queue-aware rate %.2f: fcfs %d dop %d double %d idle %d", c.rate, r.errors_fcfs, r.errors_dop, r.errors_double,
              r.errors_idle);
    }
    c.queue_aware = 0;
    c.policy = DL_POLICY_DDIT, c.rate = 0.75;
    dl_sim_result a, b;
    dl_simulate(&p, &c, &a);
    dl_simulate(&p, &c, &b);
    CHECK(!memcmp(&a, &b, sizeof a), "the same seed gives the same simulation");
    c.seed = 4;
    dl_simulate(&p, &c, &b);
    CHECK(a.avg_latency != b.avg_latency, "another seed, another run");
    c.nodes = 8;
    c.rate = 0;
    c.nreq = 2000;
    CHECK(dl_simulate(&p, &c, &a) == DL_OK && a.completed == 2000 && a.errors_idle == 0, "8 nodes x 8 devices, burst");
}

/* M/D/1: Poisson arrivals, one server, deterministic service d: the mean time in the
 * system from a simulation of 200,000 requests against Eq. 6 */
static void test_md1(void) {
    const double lambda = 0.6, d = 1.0;
    uint64_t rng = 11;
    double t = 0, free_at = 0, total = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        t += -log((double)((dl_rng_next(&rng) >> 11) + 1) * 0x1p-53) / lambda;
        double start = t > free_at ? t : free_at;
        free_at = start + d;
        total += free_at - t;
    }
    double sim = total / n, model = dl_md1_time(lambda, d); /* 1 + 0.6 / (2 * 0.4) = 1.75 */
    CHECK(fabs(model - 1.75) < 1e-12 && fabs(sim - model) / model < 0.02, "M/D/1: simulated %.4f, Eq. 6 %.4f", sim, model);
    CHECK(isinf(dl_md1_time(1.5, 1.0)), "an overloaded queue has no steady state");
    /* M/D/c (Eq. 7's place): the textbook approximation against a simulation of c
     * deterministic servers fed FCFS, within 5 % at moderate and high load; never below
     * the service time; Eq. 7 as printed is, at light load (the point) */
    static const struct {
        double lambda, d;
        int c;
    } pts[] = {{1.2, 1.0, 2}, {1.8, 1.0, 2}, {2.4, 1.0, 4}, {3.4, 1.0, 4}, {5.0, 1.0, 8}};
    for (size_t k = 0; k < sizeof pts / sizeof pts[0]; k++) {
        const double lam = pts[k].lambda, dd = pts[k].d;
        const int c = pts[k].c;
        double fr[8] = {0}, tt = 0, tot = 0;
        for (int i = 0; i < n; i++) {
            tt += -log((double)((dl_rng_next(&rng) >> 11) + 1) * 0x1p-53) / lam;
            int j = 0; /* the server free first */
            for (int q = 1; q < c; q++) j = fr[q] < fr[j] ? q : j;
            double st = tt > fr[j] ? tt : fr[j];
            fr[j] = st + dd;
            tot += fr[j] - tt;
        }
        double simc = tot / n, w = dl_mdc_time(lam, dd, c);
        CHECK(fabs(simc - w) / simc < 0.05, "M/D/%d at lambda %.1f: simulated %.4f, approximation %.4f", c, lam, simc, w);
    }
    /* W >= d over a grid of service times, arrival rates up to saturation and servers */
    int below = 0, points = 0;
    for (double sd = 0.5; sd < 30; sd *= 2.2)
        for (double lam = 0.001; lam < 8 / sd; lam *= 1.25)
            for (int c = 1; c <= 8; c++, points++) {
                double w = c == 1 ? dl_md1_time(lam, sd) : dl_mdc_time(lam, sd, c);
                if (!(isinf(w) ? lam * sd / c >= 1 - 1e-12 : w >= sd && lam * sd / c < 1) && !below++)
                    CHECK(0, "M/D/%d at lambda %.4f, d %.2f: %.4f (below the service time or wrongly infinite)", c, lam, sd, w);
            }
    CHECK(below == 0 && points > 1000, "W >= d at all %d grid points (%d violations)", points, below);
    double printed = dl_mdc_time_printed(0.05, 20.04, 2);
    CHECK(fabs(printed - 13.38) < 0.01 && dl_mdc_time(0.05, 20.04, 2) >= 20.04,
          "Eq. 7 as printed at lambda 0.05, d 20.04, c 2: %.2f s (below d); textbook %.2f s", printed,
          dl_mdc_time(0.05, 20.04, 2));
}

/* The paper's Fig. 13 ablation: static DoP with the VAE decoupled from the DiT group.
 * One resolution (DiT 6 s at DoP 2, VAE 1 s) makes the device-seconds exact: 2 x 7 per
 * request coupled, 2 x 6 + 1 decoupled. With aligned buddy pairs the returned device
 * can never join a pair while its buddy runs the VAE, so the latencies are identical;
 * with any-device placement two returned devices can form a pair, which shortens the
 * queue under Poisson arrivals (the paper's "odd number of GPUs released" limits it).
 * Without decoupling, any-device placement changes nothing. */
static void test_static_decouple(void) {
    dl_profile q;
    const char *csv = "x,dit,1,10\nx,dit,2,6\nx,vae,1,1\nx,vae,2,1\n";
    CHECK(dl_profile_parse_csv(&q, csv, strlen(csv)) == DL_OK, "one-resolution profile: %s", dl_last_error());
    for (int rate = 0; rate < 2; rate++) {
        dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = 2, .vae_dop = 1, .nodes = 1, .per_node = 8,
                           .rate = rate ? 0.5 : 0, .mix = {1}, .nreq = 300, .seed = 9};
        dl_sim_result off, on, any, any_off;
        int ok = dl_simulate(&q, &c, &off) == DL_OK;
        c.static_decouple = 1;
        ok &= dl_simulate(&q, &c, &on) == DL_OK;
        c.place_any = 1;
        ok &= dl_simulate(&q, &c, &any) == DL_OK;
        c.static_decouple = 0;
        ok &= dl_simulate(&q, &c, &any_off) == DL_OK;
        CHECK(ok, "%s", dl_last_error());
        CHECK(fabs(off.cost - 14.0 * 300) < 1e-6 && fabs(on.cost - 13.0 * 300) < 1e-6 && fabs(any.cost - 13.0 * 300) < 1e-6,
              "rate %.1f: held device-seconds coupled %.3f (14 x 300), decoupled %.3f and %.3f (13 x 300)", c.rate, off.cost, on.cost,
              any.cost);
        CHECK(on.avg_latency == off.avg_latency && on.p99_latency == off.p99_latency && on.makespan == off.makespan,
              "rate %.1f: aligned pairs: decoupling returns a device nobody can use (avg %.3f vs %.3f)", c.rate, on.avg_latency,
              off.avg_latency);
        CHECK(any_off.avg_latency == off.avg_latency && any_off.p99_latency == off.p99_latency && any_off.cost == off.cost,
              "rate %.1f: without decoupling any-device placement is the aligned one", c.rate);
        CHECK(any.completed == 300 && any.errors_double == 0 && any.errors_fcfs == 0, "rate %.1f: any-device placement invariants",
              c.rate);
        if (!rate) /* lockstep: the 4 devices returned at 6 s form 2 pairs, but later ones come
                      back an odd number at a time and wait for a partner: still 7 s per 4 requests */
            CHECK(any.makespan == off.makespan && any.makespan >= 13.0 * 300 / 8, "burst: any-device placement drains in %.1f s (coupled %.1f s)",
                  any.makespan, off.makespan);
    }
    dl_profile p;
    dl_profile_reference(&p);
    double p99[3] = {0, 0, 0}; /* fig17, rate 0.75, 1:1:1, 3 seeds: coupled, aligned, any */
    for (int seed = 1; seed <= 3; seed++)
        for (int v = 0; v < 3; v++) {
            dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = 2, .static_decouple = v > 0, .place_any = v == 2, .vae_dop = 1,
                               .nodes = 1, .per_node = 8, .rate = 0.75, .mix = {1, 1, 1}, .nreq = 400, .seed = (uint64_t)seed};
            dl_sim_result r;
            CHECK(dl_simulate(&p, &c, &r) == DL_OK, "%s", dl_last_error());
            p99[v] += r.p99_latency / 3;
        }
    CHECK(p99[1] == p99[0] && p99[2] < p99[0] * 0.97, "fig17 rate 0.75: p99 coupled %.2f s, decoupled aligned %.2f s, any %.2f s",
          p99[0], p99[1], p99[2]);
    dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = 2, .static_decouple = 1, .place_any = 1, .vae_dop = 1, .nodes = 2,
                       .per_node = 8, .rate = 1.5, .mix = {1, 1, 1}, .nreq = 400, .seed = 4};
    dl_sim_result r;
    CHECK(dl_simulate(&p, &c, &r) == DL_OK && r.completed == 400 && r.errors_double == 0 && r.errors_fcfs == 0,
          "fig17, 2 nodes, sdop:2 decoupled, any placement: %s", dl_last_error());
    c.policy = DL_POLICY_DDIT;
    CHECK(dl_simulate(&p, &c, &r) == DL_ERR_INVALID, "static decoupling is an option of sdop:N only");
}

/* The sweeps' invariants. A static DoP on one node is a FCFS queue with 8/N identical
 * servers; with one seed a higher rate compresses the same arrivals, so every
 * request's wait, and so the average and the p99, can only grow with the rate, a
 * burst (every arrival at 0) being the limit. A longer run adds requests behind the
 * same prefix: the makespan grows with the count. Past the pool's capacity there is
 * no steady state and the p99 grows with the run length (the point: sdop:1 at
 * rate 1 on 1:1:1, offered load 1.33); below it the p99 settles. */
static void test_sweeps(void) {
    dl_profile p;
    dl_profile_reference(&p);
    static const double rates[] = {0.25, 0.5, 0.75, 1.0, 1.5, 0};
    static const double mixes[][3] = {{1, 1, 1}, {2, 2, 6}, {6, 1, 3}};
    for (int m = 0; m < 3; m++)
        for (int dop = 1; dop <= 4; dop *= 2) {
            double last_p99 = 0, last_avg = 0, last_span = 0;
            int mono = 1, span_mono = 1;
            for (int ri = 0; ri < 6; ri++) {
                dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = dop, .vae_dop = 1, .nodes = 1, .per_node = 8,
                                   .rate = rates[ri], .nreq = 300, .seed = 21};
                memcpy(c.mix, mixes[m], sizeof mixes[m]);
                dl_sim_result r;
                CHECK(dl_simulate(&p, &c, &r) == DL_OK, "%s", dl_last_error());
                mono &= r.p99_latency >= last_p99 - 1e-9 && r.avg_latency >= last_avg - 1e-9;
                last_p99 = r.p99_latency, last_avg = r.avg_latency;
            }
            for (int n = 8; n <= 256; n *= 2) {
                dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = dop, .vae_dop = 1, .nodes = 1, .per_node = 8, .nreq = n,
                                   .seed = 21};
                memcpy(c.mix, mixes[m], sizeof mixes[m]);
                dl_sim_result r;
                CHECK(dl_simulate(&p, &c, &r) == DL_OK, "%s", dl_last_error());
                span_mono &= r.makespan >= last_span - 1e-9;
                last_span = r.makespan;
            }
            CHECK(mono, "sdop:%d mix %g:%g:%g: p99 and average latency grow with the rate up to a burst", dop, mixes[m][0],
                  mixes[m][1], mixes[m][2]);
            CHECK(span_mono, "sdop:%d mix %g:%g:%g: a burst's makespan grows with its size", dop, mixes[m][0], mixes[m][1],
                  mixes[m][2]);
        }
    double p99[2][3];
    static const int counts[3] = {100, 500, 2000};
    for (int ri = 0; ri < 2; ri++)
        for (int k = 0; k < 3; k++) {
            p99[ri][k] = 0;
            for (int seed = 0; seed < 4; seed++) {
                dl_sim_config c = {.policy = DL_POLICY_SDOP, .static_dop = 1, .vae_dop = 1, .nodes = 1, .per_node = 8,
                                   .rate = ri ? 1.0 : 0.25, .mix = {1, 1, 1}, .nreq = counts[k], .seed = 100 + (uint64_t)seed};
                dl_sim_result r;
                dl_simulate(&p, &c, &r);
                p99[ri][k] += r.p99_latency / 4;
            }
        }
    CHECK(p99[1][1] > 2 * p99[1][0] && p99[1][2] > 3 * p99[1][1],
          "overloaded (rate 1): p99 %.0f, %.0f, %.0f s for 100, 500, 2000 requests: grows with the length", p99[1][0], p99[1][1],
          p99[1][2]);
    CHECK(p99[0][2] < 1.5 * p99[0][1] && p99[0][1] < 1.5 * p99[0][0],
          "light load (rate 0.25): p99 %.1f, %.1f, %.1f s: settles", p99[0][0], p99[0][1], p99[0][2]);
}

/* brute force over the same space as Algorithm 1: each type in the mix, in order,
 * takes a contiguous range of devices after the previous type's and a DoP */
static double brute(const dl_profile *p, const dl_sim_config *c, const int *types, int ntypes, int from, int M, double mixsum) {
    if (ntypes == 0) return 0;
    double best = INFINITY;
    for (int a = from; a < M; a++)
        for (int b = a + 1; b <= M; b++)
            for (int dop = 1; dop <= 8; dop *= 2) {
                int alpha = 0;
                for (int s = a; s < b;) { /* whole groups inside each node, counted directly */
                    int e = s;
                    while (e < b && e / c->per_node == s / c->per_node) e++;
                    alpha += (e - s) / dop;
                    s = e;
                }
                if (!alpha) continue;
                double v = (b - a) * dl_occupy(p, c, types[0], c->mix[types[0]] / mixsum, dop, alpha) +
                           brute(p, c, types + 1, ntypes - 1, b, M, mixsum);
                if (v < best) best = v;
            }
    return best;
}

static void test_optimal(void) {
    dl_profile p;
    dl_profile_reference(&p);
    CHECK(dl_bandwidth_partition(0, 16, 8, 4) == 4 && dl_bandwidth_partition(6, 14, 8, 4) == 1 &&
              dl_bandwidth_partition(6, 14, 8, 2) == 4 && dl_bandwidth_partition(7, 16, 8, 8) == 1,
          "BandwidthAwarePartition keeps groups inside nodes");
    uint64_t rng = 5;
    for (int trial = 0; trial < 24; trial++) {
        dl_sim_config c = {.nodes = 1 + (int)(dl_rng_next(&rng) % 2), .per_node = trial % 3 == 0 ? 2 : 4, .vae_dop = 1,
                           .nreq = 10 + (int)(dl_rng_next(&rng) % 50), .rate = trial % 2 ? 0 : 0.05 + 0.05 * (trial % 4)};
        int types[DL_SCHED_MAX_RES], n = 0;
        double mixsum = 0;
        for (int r = 0; r < 3; r++) {
            c.mix[r] = (double)(dl_rng_next(&rng) % 4);
            if (c.mix[r] > 0) types[n++] = r, mixsum += c.mix[r];
        }
        if (!n) c.mix[1] = 1, types[n++] = 1, mixsum = 1;
        dl_optimal_plan plan;
        dl_status st = dl_optimal(&p, &c, &plan);
        double b = brute(&p, &c, types, n, 0, c.nodes * c.per_node, mixsum);
        if (!isfinite(b)) {
            CHECK(st != DL_OK, "trial %d: no assignment, and the DP says so", trial);
            continue;
        }
        CHECK(st == DL_OK && fabs(plan.cost - b) <= 1e-9 * b, "trial %d: DP %.6f, brute force %.6f", trial, plan.cost, b);
        int used = 0;
        for (int k = 0; k < n; k++) used += plan.devices[types[k]];
        CHECK(used <= c.nodes * c.per_node, "trial %d: the plan fits the devices", trial);
    }
    /* the partition served as clusters completes everything */
    dl_sim_config c = {.policy = DL_POLICY_OPTIMAL, .nodes = 8, .per_node = 8, .vae_dop = 1, .mix = {1, 3, 6}, .nreq = 1000, .seed = 2};
    dl_sim_result r;
    CHECK(dl_simulate(&p, &c, &r) == DL_OK && r.completed == 1000 && r.optimal_cost > 0 && r.cost <= r.optimal_cost * 1.0001,
          "optimal plan simulated: %s, cost %.0f, Algorithm 1 %.0f", dl_last_error(), r.cost, r.optimal_cost);
}

int main(void) {
    test_buddy();
    test_profile();
    test_policies();
    test_md1();
    test_static_decouple();
    test_sweeps();
    test_optimal();
    return test_done("test_sched");
}
