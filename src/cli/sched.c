/* `difflet profile | simulate | sched-eval`: the DDiT scheduler's profile table (the
 * RIB, in SQLite), one simulation, and the paper's evaluation grid as CSV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "difflet/program.h"
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
    if (!strncmp(s, "sdop:", 5)) {
        c->policy = DL_POLICY_SDOP;
        c->static_dop = atoi(s + 5);
        return dl_dop_index(c->static_dop) >= 0;
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
    printf("%-10s avg %8.2f s  p99 %8.2f s  cost %10.1f dev-s  util %5.1f%%  makespan %9.1f s  promotions %d\n", label,
           r->avg_latency, r->p99_latency, r->cost, 100 * r->utilization, r->makespan, r->promotions);
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
            fprintf(stderr, "usage: difflet simulate [--profile fig17|NAME] [--policy ddit|sdop:N|spci|dpci|dp|optimal]\n"
                            "  [--rate R|burst] [--mix L:M:H] [--requests N] [--nodes K] [--devices-per-node D]\n"
                            "  [--seed S] [--vae-dop N] [--promote-overhead S] [--no-decouple] [--no-promote]\n");
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
enum { NPOL = sizeof POLS / sizeof POLS[0] };
static const double RATES[] = {0.25, 0.5, 0.75, 1.0, 0};
static const char *MIXES[] = {"1:1:1", "6:1:3", "4:4:2", "2:2:6", "3:6:1", "1:3:6"};

/* averages over seeds; a failed configuration (e.g. the queue model past saturation)
 * is a NaN row */
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

int cli_sched_eval(int argc, char **argv) {
    const char *out = "docs/sched";
    int nreq = 500, seeds = 5;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) nreq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seeds") && i + 1 < argc) seeds = atoi(argv[++i]);
        else {
            fprintf(stderr, "difflet sched-eval: unknown argument '%s' (--out DIR --requests N --seeds S)\n", argv[i]);
            return 2;
        }
    }
    if (nreq < 10 || seeds < 1 || dl_mkdir_p(out) != DL_OK) {
        fprintf(stderr, "difflet sched-eval: need --requests >= 10, --seeds >= 1 and a writable --out\n");
        return 2;
    }
    dl_profile p;
    dl_profile_reference(&p);
    FILE *single = open_csv(out, "single_node.csv", "rate,mix,policy,avg_latency,p99_latency,cost,utilization");
    FILE *multi = open_csv(out, "multi_node.csv", "mix,policy,avg_latency,p99_latency,cost,optimal_cost,cost_vs_optimal");
    FILE *abl = open_csv(out, "ablation.csv", "ablation,setting,rate,mix,avg_latency,p99_latency,cost");
    if (!single || !multi || !abl) return 1;
    int goal_p99[2] = {1, 1}, goal_burst[2] = {1, 1}, cells = 0;
    double worst_ratio[2] = {0, 0}, best_base_ratio = INFINITY;
    printf("single node (8 devices), %d requests x %d seeds: p99 seconds (DDiT / DDiT queue-aware / best static DoP / best baseline)\n", nreq, seeds);
    for (size_t ri = 0; ri < sizeof RATES / sizeof RATES[0]; ri++)
        for (size_t mi = 0; mi < sizeof MIXES / sizeof MIXES[0]; mi++) {
            dl_sim_config c = {.decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 1, .per_node = 8, .rate = RATES[ri], .nreq = nreq};
            parse_mix(MIXES[mi], c.mix);
            char rate_name[16];
            if (RATES[ri] > 0) snprintf(rate_name, sizeof rate_name, "%g", RATES[ri]);
            else snprintf(rate_name, sizeof rate_name, "burst");
            double ddit_p99[2] = {NAN, NAN}, best_static = INFINITY, best_other = INFINITY;
            for (int k = 0; k < NPOL; k++) {
                if (POLS[k].p == DL_POLICY_OPTIMAL) continue; /* a cost bound, compared in the multi-node grid */
                c.policy = POLS[k].p, c.static_dop = POLS[k].dop, c.queue_aware = POLS[k].dop < 0;
                dl_sim_result r;
                run_avg(&p, c, seeds, &r);
                fprintf(single, "%s,%s,%s,%.4f,%.4f,%.2f,%.4f\n", rate_name, MIXES[mi], POLS[k].label, r.avg_latency,
                        r.p99_latency, r.cost, r.utilization);
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
            printf("  rate %-5s mix %-5s  %8.1f  %8.1f  %8.1f  %8.1f%s\n", rate_name, MIXES[mi], ddit_p99[0], ddit_p99[1],
                   best_static, best_other, ddit_p99[0] > best_static * 1.0001 ? "  <- DDiT behind static" : "");
        }
    printf("8 nodes x 8 devices, burst of %d requests: cost relative to the theoretical optimum (Algorithm 1)\n", nreq * 4);
    for (size_t mi = 0; mi < sizeof MIXES / sizeof MIXES[0]; mi++) {
        dl_sim_config c = {.decouple = 1, .promote = 1, .vae_dop = 1, .nodes = 8, .per_node = 8, .rate = 0, .nreq = nreq * 4};
        parse_mix(MIXES[mi], c.mix);
        dl_optimal_plan plan;
        if (dl_optimal(&p, &c, &plan) != DL_OK) continue;
        printf("  mix %-5s", MIXES[mi]);
        for (int k = 0; k < NPOL; k++) {
            c.policy = POLS[k].p, c.static_dop = POLS[k].dop, c.queue_aware = POLS[k].dop < 0;
            if (c.policy == DL_POLICY_SDOP && c.static_dop != 4) continue; /* the paper's multi-node static DoP */
            dl_sim_result r;
            run_avg(&p, c, seeds, &r);
            double ratio = r.cost / plan.cost;
            fprintf(multi, "%s,%s,%.4f,%.4f,%.2f,%.2f,%.4f\n", MIXES[mi], POLS[k].label, r.avg_latency, r.p99_latency, r.cost,
                    plan.cost, ratio);
            printf("  %s %.2f", POLS[k].label, ratio);
            if (k <= 1 && ratio > worst_ratio[k]) worst_ratio[k] = ratio;
            if (k > 1 && c.policy != DL_POLICY_OPTIMAL && ratio < best_base_ratio) best_base_ratio = ratio;
        }
        printf("\n");
    }
    /* ablations on one node: decoupling (Figure 13) and promotion (Figure 14) */
    for (int ab = 0; ab < 2; ab++)
        for (size_t ri = 0; ri < sizeof RATES / sizeof RATES[0]; ri++)
            for (size_t mi = 0; mi < sizeof MIXES / sizeof MIXES[0]; mi++)
                for (int on = 1; on >= 0; on--) {
                    dl_sim_config c = {.policy = DL_POLICY_DDIT, .decouple = ab == 0 ? on : 1, .promote = ab == 1 ? on : 1,
                                       .vae_dop = 1, .nodes = 1, .per_node = 8, .rate = RATES[ri], .nreq = nreq};
                    parse_mix(MIXES[mi], c.mix);
                    dl_sim_result r;
                    run_avg(&p, c, seeds, &r);
                    char rate_name[16];
                    if (RATES[ri] > 0) snprintf(rate_name, sizeof rate_name, "%g", RATES[ri]);
                    else snprintf(rate_name, sizeof rate_name, "burst");
                    fprintf(abl, "%s,%s,%s,%s,%.4f,%.4f,%.2f\n", ab ? "promotion" : "decoupling", on ? "on" : "off",
                            rate_name, MIXES[mi], r.avg_latency, r.p99_latency, r.cost);
                }
    fclose(single), fclose(multi), fclose(abl);
    for (int v = 0; v < 2; v++)
        printf("goals, %s: p99 <= best static DoP in every one of %d cells: %s; better than every baseline under burst: %s;\n"
               "       multi-node cost <= 1.2x optimum: worst %.2fx (%s); best baseline %.2fx\n",
               v ? "DDiT queue-aware" : "DDiT (paper)", cells, goal_p99[v] ? "met" : "NOT met", goal_burst[v] ? "met" : "NOT met",
               worst_ratio[v], worst_ratio[v] <= 1.2 ? "met" : "NOT met", best_base_ratio);
    printf("wrote %s/single_node.csv, multi_node.csv, ablation.csv\n", out);
    return 0;
}
