/* `difflet profile | simulate | sched-eval`: the DDiT scheduler's profile table (the
 * RIB, in SQLite), one simulation, and the paper's evaluation as CSV: Figure 10's grid
 * over the paper's ten mixes, the multi-node cost (held and devices x makespan), the
 * ablations of Figures 13 and 14, and sweeps over run length and burst size (a result
 * at one length says little about another once the pool is overloaded). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "difflet/ddit.h"
#include "difflet/program.h"
#include "difflet/registry.h"
#include "difflet/sched.h"

static void default_db(char *buf, size_t n) {
    const char *e = getenv("DIFFLET_PROFILES");
    if (e && *e) snprintf(buf, n, "%s", e);
    else snprintf(buf, n, "%s/profiles.db", dl_cache_dir());
}

/* "fig17" is built in; any other name comes from the store */
static int load_profile(const char *db, const char *name, dl_profile *p) {
    if (!strcmp(name, "fig17")) {
        dl_profile_reference(p);
        return 1;
    }
    if (dl_profile_store_get(db, name, p) != DL_OK) {
        fprintf(stderr, "difflet: profile '%s': %s (the built-in one is fig17)\n", name, dl_last_error());
        return 0;
    }
    return 1;
}

static void print_profile(const char *name, const dl_profile *p) {
    printf("profile %s (%d steps; seconds for the whole phase)\n", name, p->steps);
    printf("  %-10s %-5s %9s %9s %9s %9s   B\n", "resolution", "phase", "DoP 1", "DoP 2", "DoP 4", "DoP 8");
    for (int r = 0; r < p->nres; r++)
        for (int ph = 0; ph < 2; ph++) {
            printf("  %-10s %-5s", ph ? "" : p->name[r], ph ? "vae" : "dit");
            for (int d = 0; d < DL_SCHED_MAX_DOP; d++) {
                double v = ph ? p->vae[r][d] : p->dit[r][d];
                if (v > 0) printf(" %9.2f", v);
                else printf(" %9s", "-");
            }
            if (!ph) printf("   %d", dl_profile_best_dop(p, r));
            printf("\n");
        }
}

int cli_profile(int argc, char **argv) {
    char db[1024];
    default_db(db, sizeof db);
    const char *name = NULL, *sub = argc > 0 ? argv[0] : "", *file = NULL;
    if (!strcmp(sub, "measure-rank")) return cli_profile_measure_rank(argc - 1, argv + 1);
    if (!strcmp(sub, "measure")) {
        for (int i = 1; i + 1 < argc; i++)
            if (!strcmp(argv[i], "--db")) snprintf(db, sizeof db, "%s", argv[i + 1]);
            else if (!strcmp(argv[i], "--name")) name = argv[i + 1];
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", db);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        if (slash && dl_mkdir_p(dir) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            return 1;
        }
        int rc = cli_profile_measure(argc - 1, argv + 1, db, name ? name : "measured");
        if (rc == 0) {
            dl_profile p;
            if (load_profile(db, name ? name : "measured", &p)) print_profile(name ? name : "measured", &p);
        }
        return rc;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--db") && i + 1 < argc) snprintf(db, sizeof db, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--name") && i + 1 < argc) name = argv[++i];
        else if (argv[i][0] != '-' && !file) file = argv[i];
        else {
            fprintf(stderr, "difflet profile: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!strcmp(sub, "import")) {
        if (!file) {
            fprintf(stderr, "difflet profile import: needs FILE.csv (rows: resolution,phase,dop,seconds)\n");
            return 2;
        }
        char *text;
        size_t len;
        dl_profile p;
        if (!name) name = "default";
        if (dl_file_read(file, 1 << 20, &text, &len) != DL_OK) {
            fprintf(stderr, "difflet: %s\n", dl_last_error());
            return 1;
        }
        dl_status s = dl_profile_parse_csv(&p, text, len);
        free(text);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", db);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        if (s == DL_OK && slash) s = dl_mkdir_p(dir);
        if (s == DL_OK) s = dl_profile_store_put(db, name, &p);
        if (s != DL_OK) {
            fprintf(stderr, "difflet: %s: %s\n", file, dl_last_error());
            return 1;
        }
        printf("imported %s as '%s' into %s\n", file, name, db);
        print_profile(name, &p);
        return 0;
    }
    if (!strcmp(sub, "show")) {
        dl_profile p;
        if (!name) name = file ? file : "fig17";
        if (!load_profile(db, name, &p)) return 1;
        print_profile(name, &p);
        return 0;
    }
    fprintf(stderr, "difflet profile: import FILE.csv [--name N] | show [NAME] | measure [--model DIR] [--sizes WxH,...] "
                    "[--steps N] [--reps N] [--max-dop D] [--name N]  [--db FILE]\n");
    return 2;
}

static int parse_policy(const char *s, dl_sim_config *c) {
    static const struct { const char *name; dl_policy p; } tab[] = {{"ddit", DL_POLICY_DDIT}, {"spci", DL_POLICY_SPCI},
        {"dpci", DL_POLICY_DPCI}, {"dp", DL_POLICY_DP}, {"optimal", DL_POLICY_OPTIMAL}};
    if (!strncmp(s, "sdop:", 5)) { /* sdop:N, or sdop:N+dec: the VAE decoupled from the DiT group (Fig. 13) */
        char *end;
        c->policy = DL_POLICY_SDOP;
        c->static_dop = (int)strtol(s + 5, &end, 10);
        c->static_decouple = !strcmp(end, "+dec");
        return dl_dop_index(c->static_dop) >= 0 && (!*end || c->static_decouple);
    }
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].name)) return c->policy = tab[i].p, 1;
    return 0;
}

static int parse_mix(const char *s, double *mix) {
    memset(mix, 0, sizeof(double) * DL_SCHED_MAX_RES);
    int n = 0;
    for (const char *q = s; *q && n < DL_SCHED_MAX_RES; n++) {
        char *end;
        mix[n] = strtod(q, &end);
        if (end == q || mix[n] < 0) return 0;
        q = *end == ':' ? end + 1 : end;
        if (*end && *end != ':') return 0;
    }
    return n > 0;
}

static void print_result(const char *label, const dl_sim_result *r) {
    printf("%-10s avg %8.2f s  p99 %8.2f s  cost %10.1f dev-s  util %5.1f%%  makespan %9.1f s (x devices: %.1f dev-s)  "
           "promotions %d\n",
           label, r->avg_latency, r->p99_latency, r->cost, 100 * r->utilization, r->makespan, r->reserved_cost, r->promotions);
}

int cli_simulate(int argc, char **argv) {
    char db[1024];
    default_db(db, sizeof db);
    const char *prof = "fig17", *policy = "ddit";
    dl_sim_config c = {.decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1, .per_node = 8, .rate = 0,
                       .mix = {1, 1, 1}, .nreq = 1000, .seed = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "--no-decouple")) c.decouple = 0;
        else if (!strcmp(a, "--queue-aware")) c.queue_aware = 1;
        else if (!strcmp(a, "--no-promote")) c.promote = 0;
        else if (!strcmp(a, "--any-placement")) c.place_any = 1;
        else if (!v) ok = 0;
        else if (!strcmp(a, "--profile")) prof = v, i++;
        else if (!strcmp(a, "--db")) snprintf(db, sizeof db, "%s", v), i++;
        else if (!strcmp(a, "--policy")) ok = parse_policy(v, &c), policy = v, i++;
        else if (!strcmp(a, "--rate")) c.rate = !strcmp(v, "burst") ? 0 : atof(v), ok = !strcmp(v, "burst") || c.rate > 0, i++;
        else if (!strcmp(a, "--mix")) ok = parse_mix(v, c.mix), i++;
        else if (!strcmp(a, "--requests")) c.nreq = atoi(v), i++;
        else if (!strcmp(a, "--nodes")) c.nodes = atoi(v), i++;
        else if (!strcmp(a, "--devices-per-node")) c.per_node = atoi(v), i++;
        else if (!strcmp(a, "--seed")) c.seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--vae-dop")) c.vae_dop = atoi(v), ok = dl_dop_index(c.vae_dop) >= 0, i++;
        else if (!strcmp(a, "--promote-overhead")) c.promote_overhead = atof(v), ok = c.promote_overhead >= 0, i++;
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "difflet simulate: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
            fprintf(stderr, "usage: difflet simulate [--profile fig17|NAME] [--policy ddit|sdop:N|sdop:N+dec|spci|dpci|dp|optimal]\n"
                            "  [--rate R|burst] [--mix L:M:H] [--requests N] [--nodes K] [--devices-per-node D]\n"
                            "  [--seed S] [--vae-dop N] [--promote-overhead S] [--no-decouple] [--no-promote]\n"
                            "  [--queue-aware] [--any-placement (sdop: groups of any free devices of a node)]\n");
            return 2;
        }
    }
    dl_profile p;
    if (!load_profile(db, prof, &p)) return 1;
    dl_sim_result r;
    if (dl_simulate(&p, &c, &r) != DL_OK) {
        fprintf(stderr, "difflet simulate: %s\n", dl_last_error());
        return 1;
    }
    printf("profile %s, %d x %d devices, %d requests, rate %s, seed %llu\n", prof, c.nodes, c.per_node, c.nreq,
           c.rate > 0 ? "poisson" : "burst", (unsigned long long)c.seed);
    print_result(policy, &r);
    if (c.policy == DL_POLICY_OPTIMAL) {
        dl_optimal_plan plan;
        dl_optimal(&p, &c, &plan);
        printf("Algorithm 1: cost %.1f device-seconds;", plan.cost);
        for (int k = 0; k < p.nres; k++)
            if (plan.devices[k]) printf(" %s: %d devices, %d x DoP %d;", p.name[k], plan.devices[k], plan.instances[k], plan.dop[k]);
        printf("\n");
    }
    return 0;
}

/* ---- the evaluation grid ------------------------------------------------------------ */
typedef struct { const char *label; dl_policy p; int dop; } pol;
static const pol POLS[] = {{"ddit", DL_POLICY_DDIT, 0},   {"ddit-qa", DL_POLICY_DDIT, -1}, {"sdop:1", DL_POLICY_SDOP, 1}, {"sdop:2", DL_POLICY_SDOP, 2},
                           {"sdop:4", DL_POLICY_SDOP, 4}, {"sdop:8", DL_POLICY_SDOP, 8}, {"spci", DL_POLICY_SPCI, 0},
                           {"dpci", DL_POLICY_DPCI, 0},   {"dp", DL_POLICY_DP, 0},       {"optimal", DL_POLICY_OPTIMAL, 0}};
enum { NPOL = sizeof POLS / sizeof POLS[0], NSIM = NPOL - 1 /* all but optimal: the single-node policies */ };
static const double RATES[] = {0.25, 0.5, 0.75, 1.0, 0};
enum { NRATE = sizeof RATES / sizeof RATES[0], MAX_LIST = 16 };
/* the paper's ten Low:Medium:High mixes: Figure 10's four, then Figure 16's (Appendix C)
 * six; Figures 11 and 12 use all ten */
static const char *PAPER_MIXES[] = {"1:1:1", "6:1:3", "4:4:2", "2:2:6", "3:6:1", "1:3:6", "4:2:4", "2:4:4", "6:2:2", "2:6:2"};
/* a run's p99 within this factor of the best counts as a tie for first place */
#define TIE 1.005

typedef struct {
    const char *mixes[MAX_LIST];
    int nmix, nreq, seeds, counts[MAX_LIST], ncounts, bursts[MAX_LIST], nbursts;
    const char *out;
} eval_opts;

static void set_policy(dl_sim_config *c, const pol *q) {
    c->policy = q->p, c->static_dop = q->dop > 0 ? q->dop : 0, c->queue_aware = q->dop < 0;
}

static void rate_label(double rate, char *buf, size_t n) {
    if (rate > 0) snprintf(buf, n, "%g", rate);
    else snprintf(buf, n, "burst");
}

/* averages over seeds 1000, 1001, ...; a failed configuration (e.g. the queue model
 * past saturation) is a NaN row */
static void run_avg(const dl_profile *p, dl_sim_config c, int seeds, dl_sim_result *avg) {
    memset(avg, 0, sizeof *avg);
    for (int s = 0; s < seeds; s++) {
        dl_sim_result r;
        c.seed = 1000 + (uint64_t)s;
        if (dl_simulate(p, &c, &r) != DL_OK) {
            avg->avg_latency = avg->p99_latency = avg->cost = avg->optimal_cost = NAN;
            return;
        }
        avg->avg_latency += r.avg_latency / seeds, avg->p99_latency += r.p99_latency / seeds;
        avg->cost += r.cost / seeds, avg->utilization += r.utilization / seeds, avg->makespan += r.makespan / seeds;
        avg->reserved_cost += r.reserved_cost / seeds;
        avg->optimal_cost += r.optimal_cost / seeds, avg->promotions += r.promotions;
    }
}

static FILE *open_csv(const char *dir, const char *name, const char *header) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "difflet sched-eval: cannot write %s\n", path);
    else fprintf(f, "%s\n", header);
    return f;
}

static dl_sim_config one_node(double rate, int nreq, const char *mix) {
    dl_sim_config c = {.decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1, .per_node = 8, .rate = rate, .nreq = nreq};
    parse_mix(mix, c.mix);
    return c;
}

/* offered load on the pool: arrival rate x mean device-seconds per request / devices,
 * with every request at DoP 1 (the least work this profile allows) or at its B (the
 * DiT at B, the VAE at DoP 1, as DDiT with decoupling runs it uncontended) */
static void offered_load(const dl_profile *p, const dl_sim_config *c, double *at1, double *atB) {
    double sum = 0, w1 = 0, wB = 0;
    for (int k = 0; k < p->nres; k++) sum += c->mix[k];
    for (int k = 0; k < p->nres; k++) {
        if (!(c->mix[k] > 0)) continue;
        int B = dl_profile_best_dop(p, k);
        w1 += c->mix[k] / sum * (p->dit[k][0] + p->vae[k][0]);
        wB += c->mix[k] / sum * (B * p->dit[k][dl_dop_index(B)] + p->vae[k][0]);
    }
    const int M = c->nodes * c->per_node;
    *at1 = c->rate > 0 ? c->rate * w1 / M : INFINITY;
    *atB = c->rate > 0 ? c->rate * wB / M : INFINITY;
}

/* Figure 10's grid on one node: every rate x mix x policy at --requests */
static int eval_single(const dl_profile *p, const eval_opts *o) {
    FILE *f = open_csv(o->out, "single_node.csv", "rate,mix,policy,avg_latency,p99_latency,cost,utilization");
    if (!f) return 1;
    int goal_p99[2] = {1, 1}, goal_burst[2] = {1, 1}, cells = 0;
    printf("single node (8 devices), %d requests x %d seeds: p99 seconds (DDiT / DDiT queue-aware / best static DoP / best baseline)\n",
           o->nreq, o->seeds);
    for (int ri = 0; ri < NRATE; ri++)
        for (int mi = 0; mi < o->nmix; mi++) {
            dl_sim_config c = one_node(RATES[ri], o->nreq, o->mixes[mi]);
            char rn[16];
            rate_label(RATES[ri], rn, sizeof rn);
            double ddit_p99[2] = {NAN, NAN}, best_static = INFINITY, best_other = INFINITY;
            for (int k = 0; k < NSIM; k++) {
                set_policy(&c, &POLS[k]);
                dl_sim_result r;
                run_avg(p, c, o->seeds, &r);
                fprintf(f, "%s,%s,%s,%.4f,%.4f,%.2f,%.4f\n", rn, o->mixes[mi], POLS[k].label, r.avg_latency, r.p99_latency, r.cost,
                        r.utilization);
                if (k <= 1) ddit_p99[k] = r.p99_latency;
                else {
                    if (POLS[k].p == DL_POLICY_SDOP && r.p99_latency < best_static) best_static = r.p99_latency;
                    if (r.p99_latency < best_other) best_other = r.p99_latency;
                }
            }
            cells++;
            for (int v = 0; v < 2; v++) {
                if (ddit_p99[v] > best_static * 1.0001) goal_p99[v] = 0;
                if (RATES[ri] == 0 && !(ddit_p99[v] < best_other)) goal_burst[v] = 0;
            }
            printf("  rate %-5s mix %-5s  %8.1f  %8.1f  %8.1f  %8.1f%s\n", rn, o->mixes[mi], ddit_p99[0], ddit_p99[1], best_static,
                   best_other, ddit_p99[0] > best_static * 1.0001 ? "  <- DDiT behind static" : "");
        }
    fclose(f);
    for (int v = 0; v < 2; v++)
        printf("goals, %s: p99 <= best static DoP in every one of %d cells: %s; better than every baseline under burst: %s\n",
               v ? "DDiT queue-aware" : "DDiT (paper)", cells, goal_p99[v] ? "met" : "NOT met", goal_burst[v] ? "met" : "NOT met");
    return 0;
}

/* Figures 11 and 12: 8 x 8 devices, a burst of 4 x --requests; two costs against
 * Algorithm 1's: the device-seconds requests hold, and devices x makespan */
static int eval_multi(const dl_profile *p, const eval_opts *o) {
    FILE *f = open_csv(o->out, "multi_node.csv",
                       "mix,policy,avg_latency,p99_latency,cost,optimal_cost,cost_vs_optimal,makespan,makespan_cost,"
                       "makespan_cost_vs_optimal");
    if (!f) return 1;
    double worst_ratio[2] = {0, 0}, best_base_ratio = INFINITY;
    printf("8 nodes x 8 devices, burst of %d requests: cost relative to the theoretical optimum (Algorithm 1),\n"
           "  held device-seconds / devices x makespan\n",
           o->nreq * 4);
    for (int mi = 0; mi < o->nmix; mi++) {
        dl_sim_config c = one_node(0, o->nreq * 4, o->mixes[mi]);
        c.nodes = 8;
        dl_optimal_plan plan;
        if (dl_optimal(p, &c, &plan) != DL_OK) continue;
        printf("  mix %-5s", o->mixes[mi]);
        for (int k = 0; k < NPOL; k++) {
            set_policy(&c, &POLS[k]);
            if (c.policy == DL_POLICY_SDOP && c.static_dop != 4) continue; /* the paper's multi-node static DoP */
            dl_sim_result r;
            run_avg(p, c, o->seeds, &r);
            double ratio = r.cost / plan.cost, mratio = r.reserved_cost / plan.cost;
            fprintf(f, "%s,%s,%.4f,%.4f,%.2f,%.2f,%.4f,%.2f,%.2f,%.4f\n", o->mixes[mi], POLS[k].label, r.avg_latency, r.p99_latency,
                    r.cost, plan.cost, ratio, r.makespan, r.reserved_cost, mratio);
            printf("  %s %.2f/%.2f", POLS[k].label, ratio, mratio);
            if (k <= 1 && ratio > worst_ratio[k]) worst_ratio[k] = ratio;
            if (k > 1 && c.policy != DL_POLICY_OPTIMAL && ratio < best_base_ratio) best_base_ratio = ratio;
        }
        printf("\n");
    }
    fclose(f);
    for (int v = 0; v < 2; v++)
        printf("goal, %s: multi-node held cost <= 1.2x optimum: worst %.2fx (%s); best baseline %.2fx\n",
               v ? "DDiT queue-aware" : "DDiT (paper)", worst_ratio[v], worst_ratio[v] <= 1.2 ? "met" : "NOT met", best_base_ratio);
    return 0;
}

/* Figure 13 (decoupling: in DDiT, and the paper's own form, static DoP 2 with the VAE
 * decoupled, its returned devices regrouped as aligned pairs or as any free pair) and
 * Figure 14 (promotion), on one node */
static int eval_ablation(const dl_profile *p, const eval_opts *o) {
    FILE *f = open_csv(o->out, "ablation.csv", "ablation,setting,rate,mix,avg_latency,p99_latency,cost");
    if (!f) return 1;
    static const struct { const char *ablation, *setting; int decouple, promote, sdop, any; } V[] = {
        {"decoupling", "on", 1, 1, 0, 0},          {"decoupling", "off", 0, 1, 0, 0},
        {"promotion", "on", 1, 1, 0, 0},           {"promotion", "off", 1, 0, 0, 0},
        {"sdop2-decoupling", "off", 0, 0, 2, 0},   {"sdop2-decoupling", "on", 1, 0, 2, 0},
        {"sdop2-decoupling", "on-any", 1, 0, 2, 1}};
    enum { NV = sizeof V / sizeof V[0] };
    /* Fig. 13: the range over the mixes of the p99 reduction of "on" and "on-any" over "off", per rate */
    double lo[NRATE][2], hi[NRATE][2];
    for (int ri = 0; ri < NRATE; ri++) lo[ri][0] = lo[ri][1] = INFINITY, hi[ri][0] = hi[ri][1] = -INFINITY;
    for (size_t g = 0; g < NV; g++) { /* each ablation: rate x mix x its settings */
        if (g > 0 && !strcmp(V[g].ablation, V[g - 1].ablation)) continue;
        for (int ri = 0; ri < NRATE; ri++)
            for (int mi = 0; mi < o->nmix; mi++) {
                double p99_off = NAN;
                for (size_t v = g; v < NV && !strcmp(V[v].ablation, V[g].ablation); v++) {
                    dl_sim_config c = one_node(RATES[ri], o->nreq, o->mixes[mi]);
                    if (V[v].sdop) c.policy = DL_POLICY_SDOP, c.static_dop = V[v].sdop, c.static_decouple = V[v].decouple, c.place_any = V[v].any;
                    else c.policy = DL_POLICY_DDIT, c.decouple = V[v].decouple, c.promote = V[v].promote;
                    dl_sim_result r;
                    run_avg(p, c, o->seeds, &r);
                    char rn[16];
                    rate_label(RATES[ri], rn, sizeof rn);
                    fprintf(f, "%s,%s,%s,%s,%.4f,%.4f,%.2f\n", V[v].ablation, V[v].setting, rn, o->mixes[mi], r.avg_latency,
                            r.p99_latency, r.cost);
                    if (V[v].sdop && !V[v].decouple) p99_off = r.p99_latency;
                    if (V[v].sdop && V[v].decouple) {
                        double gain = 1 - r.p99_latency / p99_off;
                        lo[ri][V[v].any] = fmin(lo[ri][V[v].any], gain), hi[ri][V[v].any] = fmax(hi[ri][V[v].any], gain);
                    }
                }
            }
    }
    fclose(f);
    printf("Fig. 13 ablation, static DoP 2 with the VAE decoupled: p99 reduction over the mixes, returned devices regrouped\n"
           "  as aligned pairs / as any free pair\n");
    for (int ri = 0; ri < NRATE; ri++) {
        char rn[16];
        rate_label(RATES[ri], rn, sizeof rn);
        printf("  rate %-5s %5.1f%% .. %5.1f%%  /  %5.1f%% .. %5.1f%%\n", rn, 100 * lo[ri][0], 100 * hi[ri][0], 100 * lo[ri][1],
               100 * hi[ri][1]);
    }
    return 0;
}

/* one sweep cell: every single-node policy on the same configuration; then each
 * one's p99 against the best static DoP and its rank (ties within TIE share a rank) */
typedef struct { dl_sim_result r[NSIM]; double best_static, vs_static[NSIM]; int rank[NSIM]; } cell;

static void run_cell(const dl_profile *p, dl_sim_config c, int seeds, cell *x) {
    x->best_static = INFINITY;
    for (int k = 0; k < NSIM; k++) {
        set_policy(&c, &POLS[k]);
        run_avg(p, c, seeds, &x->r[k]);
        if (POLS[k].p == DL_POLICY_SDOP && x->r[k].p99_latency < x->best_static) x->best_static = x->r[k].p99_latency;
    }
    for (int k = 0; k < NSIM; k++) {
        x->vs_static[k] = x->r[k].p99_latency / x->best_static;
        x->rank[k] = 1;
        for (int j = 0; j < NSIM; j++) x->rank[k] += x->r[j].p99_latency * TIE < x->r[k].p99_latency;
    }
}

/* seeds for a run of n requests: at least --seeds, and at least 2,500 requests per cell
 * in all, so that the p99 of short runs is an average over many runs */
static int seeds_for(int n, int seeds) {
    int s = (2500 + n - 1) / n;
    return s > seeds ? s : seeds;
}

/* the wins of one sweep row (a rate and a length, over the mixes): how many mixes each
 * policy is first in (ties count for each), and DDiT's and ddit-qa's p99 against the
 * best static DoP (fewest mixes where it is ahead, the range of the ratio) */
typedef struct { int first[NSIM], ahead[2], n; double lo[2], hi[2]; } tally;

static void tally_add(tally *t, const cell *x) {
    if (!t->n) t->lo[0] = t->lo[1] = INFINITY, t->hi[0] = t->hi[1] = 0;
    t->n++;
    for (int k = 0; k < NSIM; k++) t->first[k] += x->rank[k] == 1;
    for (int v = 0; v < 2; v++) {
        t->ahead[v] += x->vs_static[v] <= 1.0001;
        if (x->vs_static[v] < t->lo[v]) t->lo[v] = x->vs_static[v];
        if (x->vs_static[v] > t->hi[v]) t->hi[v] = x->vs_static[v];
    }
}

static void tally_print(const char *label, const tally *t) {
    printf("  %-22s ddit %2d/%d ahead of best static (x%.2f..%.2f), ddit-qa %2d/%d (x%.2f..%.2f); first:", label, t->ahead[0],
           t->n, t->lo[0], t->hi[0], t->ahead[1], t->n, t->lo[1], t->hi[1]);
    for (int k = 0; k < NSIM; k++)
        if (t->first[k]) printf(" %s %d", POLS[k].label, t->first[k]);
    printf("\n");
}

/* the request-count sweep: every rate x length x mix x policy on one node. At a rate
 * past the pool's capacity there is no steady state and the p99 grows with the length */
static int eval_counts(const dl_profile *p, const eval_opts *o) {
    FILE *f = open_csv(o->out, "count_sweep.csv",
                       "requests,rate,mix,policy,seeds,load_dop1,load_at_B,avg_latency,p99_latency,cost,utilization,makespan,"
                       "p99_vs_best_static,rank_p99");
    if (!f) return 1;
    printf("request-count sweep, one node: p99 against the best static DoP, over %d mixes; first: mixes where each policy has the "
           "lowest p99 (ties within %.1f%%)\n",
           o->nmix, 100 * (TIE - 1));
    for (int ri = 0; ri < NRATE; ri++)
        for (int ni = 0; ni < o->ncounts; ni++) {
            tally t = {0};
            char rn[16], label[48];
            rate_label(RATES[ri], rn, sizeof rn);
            int n = o->counts[ni], seeds = seeds_for(n, o->seeds);
            for (int mi = 0; mi < o->nmix; mi++) {
                dl_sim_config c = one_node(RATES[ri], n, o->mixes[mi]);
                double l1, lB;
                offered_load(p, &c, &l1, &lB);
                cell x;
                run_cell(p, c, seeds, &x);
                tally_add(&t, &x);
                for (int k = 0; k < NSIM; k++)
                    fprintf(f, "%d,%s,%s,%s,%d,%.4f,%.4f,%.4f,%.4f,%.2f,%.4f,%.2f,%.4f,%d\n", n, rn, o->mixes[mi], POLS[k].label, seeds, l1,
                            lB, x.r[k].avg_latency, x.r[k].p99_latency, x.r[k].cost, x.r[k].utilization, x.r[k].makespan,
                            x.vs_static[k], x.rank[k]);
            }
            snprintf(label, sizeof label, "rate %s, %d req:", rn, n);
            tally_print(label, &t);
        }
    fclose(f);
    return 0;
}

/* the burst-size sweep: small bursts at time 0 on one node */
static int eval_bursts(const dl_profile *p, const eval_opts *o) {
    FILE *f = open_csv(o->out, "burst_sweep.csv",
                       "burst,mix,policy,seeds,avg_latency,p99_latency,cost,utilization,makespan,p99_vs_best_static,rank_p99");
    if (!f) return 1;
    printf("burst-size sweep, one node:\n");
    for (int bi = 0; bi < o->nbursts; bi++) {
        tally t = {0};
        int n = o->bursts[bi], seeds = seeds_for(n, o->seeds);
        for (int mi = 0; mi < o->nmix; mi++) {
            cell x;
            run_cell(p, one_node(0, n, o->mixes[mi]), seeds, &x);
            tally_add(&t, &x);
            for (int k = 0; k < NSIM; k++)
                fprintf(f, "%d,%s,%s,%d,%.4f,%.4f,%.2f,%.4f,%.2f,%.4f,%d\n", n, o->mixes[mi], POLS[k].label, seeds, x.r[k].avg_latency,
                        x.r[k].p99_latency, x.r[k].cost, x.r[k].utilization, x.r[k].makespan, x.vs_static[k], x.rank[k]);
        }
        char label[48];
        snprintf(label, sizeof label, "burst of %d:", n);
        tally_print(label, &t);
    }
    fclose(f);
    return 0;
}

/* "a,b,c" -> up to MAX_LIST integers >= 1 */
static int parse_ints(const char *s, int *v, int *n) {
    *n = 0;
    for (const char *q = s; *q;) {
        char *end;
        long x = strtol(q, &end, 10);
        if (end == q || x < 1 || x > 1000000 || *n == MAX_LIST || (*end && *end != ',')) return 0;
        v[(*n)++] = (int)x;
        q = *end ? end + 1 : end;
    }
    return *n > 0;
}

/* "all" | "fig10" | "L:M:H,L:M:H,..." (the strings stay in argv) */
static int parse_mixes(char *s, eval_opts *o) {
    o->nmix = 0;
    if (!strcmp(s, "all") || !strcmp(s, "fig10")) {
        o->nmix = !strcmp(s, "all") ? 10 : 4;
        for (int i = 0; i < o->nmix; i++) o->mixes[i] = PAPER_MIXES[i];
        return 1;
    }
    for (char *q = strtok(s, ","); q; q = strtok(NULL, ",")) {
        double m[DL_SCHED_MAX_RES];
        if (o->nmix == MAX_LIST || !parse_mix(q, m)) return 0;
        o->mixes[o->nmix++] = q;
    }
    return o->nmix > 0;
}

int cli_sched_eval(int argc, char **argv) {
    eval_opts o = {.nreq = 500, .seeds = 5, .out = "docs/sched", .counts = {100, 500, 2000}, .ncounts = 3,
                   .bursts = {8, 16, 32, 64, 128}, .nbursts = 5};
    char all[] = "all";
    parse_mixes(all, &o);
    const char *only = "single,multi,ablation,counts,bursts";
    int ok = 1;
    for (int i = 0; i < argc && ok; i++) {
        const char *a = argv[i];
        char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) ok = 0;
        else if (!strcmp(a, "--out")) o.out = v;
        else if (!strcmp(a, "--requests")) o.nreq = atoi(v);
        else if (!strcmp(a, "--seeds")) o.seeds = atoi(v);
        else if (!strcmp(a, "--mixes")) ok = parse_mixes(v, &o);
        else if (!strcmp(a, "--counts")) ok = parse_ints(v, o.counts, &o.ncounts);
        else if (!strcmp(a, "--bursts")) ok = parse_ints(v, o.bursts, &o.nbursts);
        else if (!strcmp(a, "--only")) only = v;
        else ok = 0;
        i++;
    }
    if (!ok || o.nreq < 10 || o.seeds < 1 || dl_mkdir_p(o.out) != DL_OK) {
        fprintf(stderr, "usage: difflet sched-eval [--out DIR (docs/sched)] [--requests N >= 10 (500)] [--seeds S (5)]\n"
                        "  [--mixes all|fig10|L:M:H,... (all: the paper's ten)] [--counts N,... (100,500,2000)]\n"
                        "  [--bursts N,... (8,16,32,64,128)] [--only single,multi,ablation,counts,bursts]\n");
        return 2;
    }
    dl_profile p;
    dl_profile_reference(&p);
    static const struct { const char *name; int (*fn)(const dl_profile *, const eval_opts *); } SECTIONS[] = {
        {"single", eval_single}, {"multi", eval_multi}, {"ablation", eval_ablation}, {"counts", eval_counts}, {"bursts", eval_bursts}};
    printf("mixes (Low:Medium:High = 144p:240p:360p):");
    for (int i = 0; i < o.nmix; i++) printf(" %s", o.mixes[i]);
    printf("\n");
    for (size_t k = 0; k < sizeof SECTIONS / sizeof SECTIONS[0]; k++) {
        const char *hit = strstr(only, SECTIONS[k].name);
        size_t len = strlen(SECTIONS[k].name);
        if (!hit || (hit != only && hit[-1] != ',') || (hit[len] && hit[len] != ',')) continue;
        if (SECTIONS[k].fn(&p, &o)) return 1;
    }
    printf("wrote the CSVs of [%s] to %s\n", only, o.out);
    return 0;
}

/* ---- DDiT on real ranks ------------------------------------------------------------ */

/* `difflet ddit`: a trace served by DDiT on real ranks (ddit.h): 1 + --units ranks of
 * one thread (self-launched under mpirun), then the same config simulated on the same
 * profile, side by side. */
int cli_ddit(int argc, char **argv) {
    char db[1024];
    default_db(db, sizeof db);
    const char *prof = NULL, *model = NULL, *sizes = NULL, *json = NULL, *out = NULL, *dtype = "f32";
    int units = 2;
    dl_ddit_config dc = {.frames = 1, .steps = 0, .guidance = 7.f, .prompt = "a red circle moving from left to right"};
    dl_sim_config *c = &dc.sim;
    *c = (dl_sim_config){.policy = DL_POLICY_DDIT, .decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1, .rate = 0,
                         .mix = {1, 1, 1, 1, 1, 1, 1, 1}, .nreq = 40, .seed = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "--no-decouple")) c->decouple = 0;
        else if (!strcmp(a, "--queue-aware")) c->queue_aware = 1;
        else if (!strcmp(a, "--no-promote")) c->promote = 0;
        else if (!v) ok = 0;
        else if (!strcmp(a, "--model")) model = v, i++;
        else if (!strcmp(a, "--units")) units = atoi(v), i++;
        else if (!strcmp(a, "--sizes")) sizes = v, i++;
        else if (!strcmp(a, "--frames")) dc.frames = atoi(v), ok = dc.frames >= 1 && dc.frames <= 100000, i++;
        else if (!strcmp(a, "--steps")) dc.steps = atoi(v), ok = dc.steps >= 1 && dc.steps <= 1000, i++;
        else if (!strcmp(a, "--guidance")) dc.guidance = (float)atof(v), ok = isfinite(dc.guidance), i++;
        else if (!strcmp(a, "--prompt")) dc.prompt = v, i++;
        else if (!strcmp(a, "--dtype")) dtype = v, ok = dl_dtype_parse(v, &(dl_dtype){0}, NULL), i++;
        else if (!strcmp(a, "--profile")) prof = v, i++;
        else if (!strcmp(a, "--db")) snprintf(db, sizeof db, "%s", v), i++;
        else if (!strcmp(a, "--policy")) ok = parse_policy(v, c) && (c->policy == DL_POLICY_DDIT || c->policy == DL_POLICY_SDOP), i++;
        else if (!strcmp(a, "--rate")) c->rate = !strcmp(v, "burst") ? 0 : atof(v), ok = !strcmp(v, "burst") || c->rate > 0, i++;
        else if (!strcmp(a, "--mix")) ok = parse_mix(v, c->mix), i++;
        else if (!strcmp(a, "--requests")) c->nreq = atoi(v), ok = c->nreq >= 1 && c->nreq <= 100000, i++;
        else if (!strcmp(a, "--seed")) c->seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--out")) out = v, i++;
        else if (!strcmp(a, "--json")) json = v, i++;
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "difflet ddit: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
            fprintf(stderr, "usage: difflet ddit --model DIR --sizes WxH,... --profile NAME [--db FILE] [--units U (2)]\n"
                            "  [--frames F] [--steps S (the profile's)] [--guidance G] [--prompt P] [--dtype f32|bf16|int8|int8-wo]\n"
                            "  [--policy ddit|sdop:N|sdop:N+dec] [--queue-aware] [--no-promote] [--no-decouple]\n"
                            "  [--rate R|burst] [--mix A:B:...] [--requests N (40)] [--seed S] [--out DIR] [--json FILE]\n");
            return 2;
        }
    }
    if (!model || !sizes || !prof) {
        fprintf(stderr, "difflet ddit: --model, --sizes and --profile are needed (difflet ddit --help)\n");
        return 2;
    }
    if (units < 1 || units > 64 || (units & (units - 1))) {
        fprintf(stderr, "difflet ddit: --units %d: a power of two up to 64\n", units);
        return 2;
    }
    if (c->policy == DL_POLICY_SDOP && c->static_dop > units) {
        fprintf(stderr, "difflet ddit: sdop:%d needs %d units, there are %d\n", c->static_dop, c->static_dop, units);
        return 2;
    }
    char mbuf[4096], list[512];
    if (!cli_model("ddit", model, mbuf, sizeof mbuf)) return 1;
    dc.model = mbuf;
    const dl_model_entry *e;
    if (dl_registry_lookup(dc.model, &e) != DL_OK) {
        fprintf(stderr, "difflet ddit: %s\n", dl_last_error());
        return 1;
    }
    if (!e->resumable) {
        fprintf(stderr, "difflet ddit: %s cannot move a request between rank groups (its scheduler keeps state between "
                        "steps); resumable: OpenSoraPipeline\n", e->pipeline_class);
        return 2;
    }
    if (!load_profile(db, prof, &dc.prof)) return 1;
    snprintf(list, sizeof list, "%s", sizes);
    for (char *save = NULL, *sz = strtok_r(list, ",", &save); sz; sz = strtok_r(NULL, ",", &save)) {
        char x;
        if (dc.nsizes == DL_SCHED_MAX_RES || sscanf(sz, "%d%c%d", &dc.sizes[dc.nsizes][0], &x, &dc.sizes[dc.nsizes][1]) != 3 ||
            x != 'x' || dc.sizes[dc.nsizes][0] < 16 || dc.sizes[dc.nsizes][1] < 16) {
            fprintf(stderr, "difflet ddit: --sizes: `%s` is not WxH (16 or more; at most %d sizes)\n", sz, DL_SCHED_MAX_RES);
            return 2;
        }
        dc.nsizes++;
    }
    if (dc.nsizes != dc.prof.nres) {
        fprintf(stderr, "difflet ddit: %d sizes, but profile '%s' has %d resolutions (size r is its resolution r)\n",
                dc.nsizes, prof, dc.prof.nres);
        return 2;
    }
    if (!dc.steps) dc.steps = dc.prof.steps;
    for (int k = dc.nsizes; k < DL_SCHED_MAX_RES; k++) c->mix[k] = 0;
    c->per_node = units;
    dl_dtype_parse(dtype, &dc.dt, &dc.quant);
    dc.out_dir = out;
    if (out && dl_mkdir_p(out) != DL_OK) { /* on every host of a world that spans several */
        fprintf(stderr, "difflet ddit: %s\n", dl_last_error());
        return 1;
    }
    if (!dl_comm_launched()) {
        const char *sub[1] = {"ddit"};
        return cli_mpirun(sub, 1, argc, argv, units + 1, 1, 1);
    }
    dl_comm *world;
    if (dl_comm_world(&world) != DL_OK || dl_comm_size(world) != units + 1) {
        fprintf(stderr, "difflet ddit: a world of %d ranks (the scheduler and %d units) is needed\n", units + 1, units);
        dl_comm_abort(2);
    }
    const int rank = dl_comm_rank(world);
    if (rank == 0)
        printf("difflet ddit: %s, %d units + the scheduler rank (1 thread each), policy %s%s, %d requests (%s), profile %s, "
               "%d steps\n",
               e->pipeline_class, units, c->policy == DL_POLICY_DDIT ? (c->queue_aware ? "ddit (queue-aware)" : "ddit") : "sdop",
               c->policy == DL_POLICY_SDOP ? "" : "", c->nreq, c->rate > 0 ? "poisson" : "burst", prof, dc.steps);
    fflush(stdout);
    dl_ddit_result r;
    dl_status s = dl_ddit_run(world, &dc, &r);
    int rc = 0;
    if (rank == 0) {
        if (s != DL_OK) {
            fprintf(stderr, "difflet ddit: %s\n", dl_last_error());
            rc = 1;
        } else {
            dl_sim_config sc = *c;
            sc.nodes = r.nodes, sc.per_node = r.per_node; /* as the units' hosts are */
            dl_profile sp = dc.prof;
            /* the simulator steps the profile's DiT time per step: the run's step count scales it */
            for (int k = 0; k < sp.nres; k++)
                for (int d = 0; d < DL_SCHED_MAX_DOP; d++) sp.dit[k][d] *= (double)dc.steps / dc.prof.steps;
            sp.steps = dc.steps;
            dl_sim_result sim;
            dl_status ss = dl_simulate(&sp, &sc, &sim);
            for (int i = 0; i < r.nreq && r.nreq <= 200; i++)
                printf("  request %3d  %-8s DoP %d -> %d  latency %8.3f s  (last run: DiT %.3f s, VAE %.3f s)\n", i,
                       dc.prof.name[r.res[i]], r.first_dop[i], r.last_dop[i], r.latency[i], r.dit_last[i], r.vae[i]);
            printf("real:      avg %8.3f s  p50 %8.3f s  p99 %8.3f s  makespan %8.2f s  promotions %d  completed %d  failed %d"
                   "  (%d node%s x %d units)\n",
                   r.avg, r.p50, r.p99, r.makespan, r.promotions, r.completed, r.failed, r.nodes, r.nodes > 1 ? "s" : "",
                   r.per_node);
            if (ss == DL_OK) {
                printf("simulated: avg %8.3f s  p50 %8.3f s  p99 %8.3f s  makespan %8.2f s  promotions %d\n", sim.avg_latency,
                       sim.p50_latency, sim.p99_latency, sim.makespan, sim.promotions);
                printf("simulated / real: avg %.3f  p50 %.3f  p99 %.3f\n", sim.avg_latency / r.avg, sim.p50_latency / r.p50,
                       sim.p99_latency / r.p99);
            } else
                printf("simulated: %s\n", dl_last_error());
            printf("promotion handover (latents through the scheduler rank): avg %.3f ms, max %.3f ms; prompt encoding "
                   "per run %.3f s\n",
                   1e3 * r.handover_avg, 1e3 * r.handover_max, r.encode_avg);
            if (json) {
                cJSON *j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "pipeline", e->pipeline_class);
                cJSON_AddNumberToObject(j, "units", units);
                cJSON_AddNumberToObject(j, "requests", r.nreq);
                cJSON_AddNumberToObject(j, "real_avg", r.avg), cJSON_AddNumberToObject(j, "real_p50", r.p50);
                cJSON_AddNumberToObject(j, "real_p99", r.p99), cJSON_AddNumberToObject(j, "promotions", r.promotions);
                cJSON_AddNumberToObject(j, "completed", r.completed), cJSON_AddNumberToObject(j, "failed", r.failed);
                cJSON_AddNumberToObject(j, "handover_max_s", r.handover_max);
                if (ss == DL_OK) {
                    cJSON_AddNumberToObject(j, "sim_avg", sim.avg_latency), cJSON_AddNumberToObject(j, "sim_p50", sim.p50_latency);
                    cJSON_AddNumberToObject(j, "sim_p99", sim.p99_latency), cJSON_AddNumberToObject(j, "sim_promotions", sim.promotions);
                }
                cJSON *q = cJSON_AddArrayToObject(j, "requests_detail");
                for (int i = 0; i < r.nreq; i++) {
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddNumberToObject(o, "res", r.res[i]), cJSON_AddNumberToObject(o, "first_dop", r.first_dop[i]);
                    cJSON_AddNumberToObject(o, "last_dop", r.last_dop[i]), cJSON_AddNumberToObject(o, "latency", r.latency[i]);
                    cJSON_AddItemToArray(q, o);
                }
                char *t = cJSON_Print(j);
                if (!t || dl_file_write_atomic(json, t, strlen(t)) != DL_OK) rc = 1;
                free(t);
                cJSON_Delete(j);
            }
            rc = r.failed ? 1 : rc;
        }
        dl_ddit_result_free(&r);
    }
    dl_comm_finalize();
    return rc;
}
