/* Parallel execution under real MPI ranks (`mpirun -n 2`, `-n 3` and `-n 4`; one rank runs
 * the single-rank paths): every split of the FLUX transformer that fits the world
 * size, on the parity models and difflet-tiny, against the unsplit model run by
 * every rank in the same process. Denoiser output max |err| <= 1e-5 max |ref| (f32);
 * for Ulysses and ring, every valid text length 1..T, with the split-vs-unsplit
 * difference far below what one more text token changes (Difflet §7.4). Layouts the
 * model cannot run are refused with a reason. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/artifact.h"
#include "difflet/comm.h"
#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/registry.h"
#include "test_util.h"
#include "difflet/flux.h"
#include "difflet/hunyuan.h"
#include "difflet/ltx2.h"
#include "difflet/opensora.h"
#include "difflet/wan.h"
#include "difflet/qwenimage.h"

static int g_rank;

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}
static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

typedef struct {
    int64_t Jd, Pd, Cin, T, N;
    float *lat, *txt, *pooled;
} inputs;

static void fill(float *p, int64_t n, uint64_t seed) { dl_randn(seed, p, n); }

/* 1 when every rank's flag is 1 */
static int all_ok(dl_comm *w, int ok) {
    float f = ok ? 0.f : 1.f;
    dl_comm_allreduce_sum(w, &f, 1);
    return f == 0.f;
}

static void run_layout(dl_comm *world, dl_model_dir *md, const char *name, dl_flux *ref, const inputs *in,
                       const char *spec, int64_t gh, int64_t gw, int expect_refused) {
    dl_par_config pc;
    dl_status s = dl_par_parse(spec, &pc);
    CHECK(s == DL_OK, "%s: parse %s: %s", name, spec, dl_last_error());
    char why[512];
    const char *bad = dl_par_check(&pc, 1, dl_comm_size(world), why, sizeof why);
    dl_dit_split sp = {.tp = pc.tp, .cp = pc.cp, .sp = pc.sp, .cp_mode = pc.cp_mode};
    if (!bad) bad = dl_dit_split_check(&sp, dl_flux_heads(ref), why, sizeof why);
    if (expect_refused) {
        CHECK(bad != NULL, "%s: layout %s should be refused for %lld heads", name, spec, (long long)dl_flux_heads(ref));
        if (bad && g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec, bad);
        /* the model itself refuses it too, before building anything */
        dl_par_place pl;
        if (dl_par_place_new(world, &pc, &pl) == DL_OK) {
            dl_flux *m = NULL;
            s = dl_flux_load_split(&m, md, "transformer", gh, gw, in->T, DL_F32, NULL, &pl.split);
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused"), "%s: %s loaded", name, spec);
            dl_flux_free(m);
            dl_par_place_free(&pl);
        }
        return;
    }
    CHECK(bad == NULL, "%s: %s refused: %s", name, spec, bad ? bad : "");
    dl_par_place pl;
    if ((s = dl_par_place_new(world, &pc, &pl)) != DL_OK) {
        CHECK(0, "%s: place: %s", name, dl_last_error());
        return;
    }
    dl_flux *m = NULL;
    s = dl_flux_load_split(&m, md, "transformer", gh, gw, in->T, DL_F32, NULL, &pl.split);
    CHECK(s == DL_OK, "%s %s: load: %s", name, spec, dl_last_error());
    const int64_t n = in->N * in->Cin;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *prevref = malloc((size_t)n * 4);
    int ok = s == DL_OK;
    /* full text first; then, for the modes that handle text specially, every valid length */
    int sweep = pc.cp > 1 && pc.cp_mode != DL_CP_GATHER;
    double worst = 0, worst_lo = 0, worst_hi = 0, least_len = INFINITY, refmax = 0;
    for (int64_t L = in->T; ok && L >= (sweep ? 1 : in->T); L--) {
        ok &= dl_flux_set_text_valid(ref, L) == DL_OK && dl_flux_set_text_valid(m, L) == DL_OK;
        ok &= dl_flux_run(ref, in->lat, in->txt, in->pooled, 0.6f, 3.5f, a, NULL) == DL_OK;
        ok &= dl_flux_run(m, in->lat, in->txt, in->pooled, 0.6f, 3.5f, b, NULL) == DL_OK;
        if (!ok) break;
        double mr = max_abs(a, n), e = max_diff(a, b, n);
        refmax = fmax(refmax, mr);
        worst = fmax(worst, e / mr);
        if (L <= in->T / 2) worst_lo = fmax(worst_lo, e / mr);
        else worst_hi = fmax(worst_hi, e / mr);
        CHECK(e <= 1e-5 * mr, "%s %s L=%lld: max |err| %.3g > 1e-5 x max |ref| %.3g", name, spec, (long long)L, e, mr);
        if (L < in->T) least_len = fmin(least_len, max_diff(a, prevref, n) / mr); /* one text token more */
        memcpy(prevref, a, (size_t)n * 4);
    }
    CHECK(ok, "%s %s: run: %s", name, spec, dl_last_error());
    ok = all_ok(world, ok);
    if (sweep && ok) {
        /* §7.4: the split's difference is far below a prompt-length change's, at every length */
        CHECK(least_len >= 100 * worst, "%s %s: split error %.3g is not far below the length change %.3g", name, spec,
              worst, least_len);
        if (g_rank == 0)
            printf("  %-10s %-22s ok: max rel err %.2e (L<=T/2 %.2e, L>T/2 %.2e); one text token changes >= %.2e\n", name,
                   spec, worst, worst_lo, worst_hi, least_len);
    } else if (ok && g_rank == 0) {
        printf("  %-10s %-22s ok: max rel err %.2e\n", name, spec, worst);
    }
    dl_flux_set_text_valid(ref, in->T);
    free(a), free(b), free(prevref);
    dl_flux_free(m);
    dl_par_place_free(&pl);
}

/* bf16 (the default on AVX-512 BF16 machines): splitting may change rounding, but
 * never by more than bf16 itself changes the result, |split - one rank| <=
 * |one rank bf16 - one rank f32|. */
static void bf16_layout(dl_comm *world, dl_model_dir *md, const char *name, dl_flux *ref32, dl_flux *ref16,
                        const inputs *in, const char *spec, int64_t gh, int64_t gw) {
    dl_par_config pc;
    dl_par_place pl;
    if (dl_par_parse(spec, &pc) != DL_OK || dl_par_place_new(world, &pc, &pl) != DL_OK) {
        CHECK(0, "%s %s bf16: %s", name, spec, dl_last_error());
        return;
    }
    dl_flux *m = NULL;
    const int64_t n = in->N * in->Cin;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *c = malloc((size_t)n * 4);
    int ok = dl_flux_load_split(&m, md, "transformer", gh, gw, in->T, DL_BF16, NULL, &pl.split) == DL_OK &&
             dl_flux_run(ref32, in->lat, in->txt, in->pooled, 0.6f, 3.5f, a, NULL) == DL_OK &&
             dl_flux_run(ref16, in->lat, in->txt, in->pooled, 0.6f, 3.5f, b, NULL) == DL_OK &&
             dl_flux_run(m, in->lat, in->txt, in->pooled, 0.6f, 3.5f, c, NULL) == DL_OK;
    CHECK(ok, "%s %s bf16: %s", name, spec, dl_last_error());
    if (ok) {
        double mr = max_abs(a, n), es = max_diff(b, c, n) / mr, eb = max_diff(a, b, n) / mr;
        CHECK(es <= eb, "%s %s bf16: the split moves the output by %.3g, more than bf16 does (%.3g)", name, spec, es, eb);
        if (g_rank == 0) printf("  %-10s %-22s bf16: split vs one rank %.2e, bf16 vs f32 %.2e\n", name, spec, es, eb);
    }
    CHECK(all_ok(world, ok), "%s %s bf16: a rank failed", name, spec);
    free(a), free(b), free(c);
    dl_flux_free(m);
    dl_par_place_free(&pl);
}

static void model(dl_comm *world, const char *dir, const char *name) {
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "open %s: %s", dir, dl_last_error());
        return;
    }
    const cJSON *cfg;
    dl_model_dir_config(md, "transformer", &cfg);
    inputs in = {.Jd = (int64_t)cJSON_GetObjectItem(cfg, "joint_attention_dim")->valuedouble,
                 .Pd = (int64_t)cJSON_GetObjectItem(cfg, "pooled_projection_dim")->valuedouble,
                 .Cin = (int64_t)cJSON_GetObjectItem(cfg, "in_channels")->valuedouble, .T = 9};
    const int64_t gh = 3, gw = 5; /* 15 image tokens: uneven shards over 2 and 4 ranks */
    in.N = gh * gw;
    in.lat = malloc((size_t)(in.N * in.Cin) * 4);
    in.txt = malloc((size_t)(in.T * in.Jd) * 4);
    in.pooled = malloc((size_t)in.Pd * 4);
    fill(in.lat, in.N * in.Cin, 1), fill(in.txt, in.T * in.Jd, 2), fill(in.pooled, in.Pd, 3);
    dl_flux *ref = NULL;
    dl_status s = dl_flux_load(&ref, md, "transformer", gh, gw, in.T, DL_F32, NULL);
    CHECK(s == DL_OK, "%s: load: %s", name, dl_last_error());
    const int64_t H = ref ? dl_flux_heads(ref) : 0;
    static const char *two[] = {"tp=2", "tp=2,sp", "cp=2:ulysses", "cp=2:ring", "cp=2:gather", NULL};
    static const char *four[] = {"tp=2,cp=2:ulysses", "tp=2,cp=2:ring", "tp=2,sp,cp=2:gather", "tp=2,sp,cp=2:ring",
                                 "cp=4:ring", "cp=4:ulysses", "tp=4", "tp=4,sp", NULL};
    static const char *three[] = {"cp=3:ring", "cp=3:gather", "cp=3:ulysses", NULL};
    static const char *one[] = {"1", NULL};
    int W = dl_comm_size(world);
    const char **list = W == 2 ? two : W == 3 ? three : W == 4 ? four : one;
    for (int i = 0; ref && list[i]; i++) {
        dl_par_config pc;
        dl_par_parse(list[i], &pc);
        int need = (pc.cp > 1 && pc.cp_mode == DL_CP_ULYSSES) ? pc.tp * pc.cp : pc.tp;
        run_layout(world, md, name, ref, &in, list[i], gh, gw, H % need != 0);
    }
    dl_flux *ref16 = NULL;
    if (ref && dl_flux_load(&ref16, md, "transformer", gh, gw, in.T, DL_BF16, NULL) == DL_OK)
        for (int i = 0; list[i]; i++) {
            dl_par_config pc;
            dl_par_parse(list[i], &pc);
            int need = (pc.cp > 1 && pc.cp_mode == DL_CP_ULYSSES) ? pc.tp * pc.cp : pc.tp;
            if (H % need == 0) bf16_layout(world, md, name, ref, ref16, &in, list[i], gh, gw);
        }
    dl_flux_free(ref16);
    dl_flux_free(ref);
    free(in.lat), free(in.txt), free(in.pooled);
    dl_model_dir_free(md);
}

/* Every collective with values each rank can predict: sums of rank ids, uneven
 * gathers, a reduce-scatter, an all-to-all with per-pair sizes, a ring step. */
static void comm_checks(dl_comm *w) {
    const int r = dl_comm_rank(w), n = dl_comm_size(w);
    int ok = 1;
    float v[3] = {(float)r, 1.f, (float)(r * r)};
    ok &= dl_comm_allreduce_sum(w, v, 3) == DL_OK;
    float s1 = 0, s2 = 0;
    for (int i = 0; i < n; i++) s1 += (float)i, s2 += (float)(i * i);
    CHECK(ok && v[0] == s1 && v[1] == (float)n && v[2] == s2, "allreduce: %g %g %g", v[0], v[1], v[2]);
    int32_t b[2] = {r == 0 ? 77 : -1, r == 0 ? 88 : -1};
    CHECK(dl_comm_bcast(w, b, sizeof b, 0) == DL_OK && b[0] == 77 && b[1] == 88, "bcast");
    /* rank i contributes i + 1 bytes of value i */
    size_t cnt[64], dsp[64], tot = 0;
    for (int i = 0; i < n; i++) cnt[i] = (size_t)i + 1, dsp[i] = tot, tot += cnt[i];
    unsigned char mine[64], all[64 * 65 / 2];
    memset(mine, r, sizeof mine);
    ok = dl_comm_allgatherv(w, mine, all, cnt, dsp) == DL_OK;
    for (int i = 0; i < n && ok; i++)
        for (size_t k = 0; k < cnt[i]; k++) ok &= all[dsp[i] + k] == i;
    CHECK(ok, "allgatherv with uneven counts");
    int32_t ag[64], me = 10 * r;
    ok = dl_comm_allgather(w, &me, sizeof me, ag) == DL_OK;
    for (int i = 0; i < n; i++) ok &= ag[i] == 10 * i;
    CHECK(ok, "allgather");
    /* reduce-scatter: element j of every rank's vector is j + rank; rank i keeps i + 1 sums */
    float sv[64 * 65 / 2], rv[64];
    for (size_t j = 0; j < tot; j++) sv[j] = (float)j + (float)r;
    ok = dl_comm_reduce_scatter_sum(w, sv, rv, cnt) == DL_OK;
    for (size_t k = 0; k < cnt[r] && ok; k++) ok &= rv[k] == (float)n * (float)(dsp[r] + k) + s1;
    CHECK(ok, "reduce-scatter with uneven counts");
    /* all-to-all: rank r sends (r + j + 1) bytes of value 16 r + j to rank j */
    size_t sc[64], sd[64], rc[64], rd[64], so = 0, ro = 0;
    unsigned char sb[64 * 130], rb[64 * 130];
    for (int j = 0; j < n; j++) {
        sc[j] = (size_t)(r + j + 1), sd[j] = so, memset(sb + so, 16 * r + j, sc[j]), so += sc[j];
        rc[j] = (size_t)(j + r + 1), rd[j] = ro, ro += rc[j];
    }
    ok = dl_comm_alltoallv(w, sb, sc, sd, rb, rc, rd) == DL_OK;
    for (int j = 0; j < n && ok; j++)
        for (size_t k = 0; k < rc[j]; k++) ok &= rb[rd[j] + k] == (unsigned char)(16 * j + r);
    CHECK(ok, "alltoallv");
    /* ring step: send my id right, receive the left neighbour's */
    int32_t out = r, in = -1;
    ok = dl_comm_sendrecv(w, &out, sizeof out, (r + 1) % n, &in, sizeof in, (r + n - 1) % n) == DL_OK;
    CHECK(ok && in == (r + n - 1) % n, "sendrecv ring: got %d", in);
    if (n > 1) { /* a sub-group: even and odd ranks; sums within it */
        dl_comm *g;
        ok = dl_comm_split(w, r % 2, r, &g) == DL_OK;
        float x = (float)r;
        ok = ok && dl_comm_allreduce_sum(g, &x, 1) == DL_OK;
        float want = 0;
        for (int i = r % 2; i < n; i += 2) want += (float)i;
        CHECK(ok && x == want && dl_comm_rank(g) == r / 2, "split: sum %g, want %g", x, want);
        if (r == 0) CHECK(dl_comm_send(w, &out, sizeof out, 1, 5) == DL_OK, "send");
        if (r == 1) CHECK(dl_comm_recv(w, &in, sizeof in, 0, 5) == DL_OK && in == 0, "recv");
        dl_comm_free(g);
    } else {
        CHECK(dl_comm_send(w, &out, sizeof out, 0, 5) != DL_OK, "send on one rank is refused");
    }
    dl_comm_stats st = dl_comm_stats_get(w);
    CHECK(n == 1 || (st.bytes > 0 && st.calls >= 7), "statistics: %.0f bytes, %ld calls", st.bytes, st.calls);
    if (g_rank == 0) printf("  comm: every collective checked on %d rank(s)%s\n", n, dl_comm_have_mpi() ? " (MPI build)" : "");
}

/* The whole pipeline on a layout (true CFG, step caching on, programs from the cache
 * twice: compiled, then loaded): every replica host's picture against the unsplit
 * pipeline's, PSNR >= 50 dB in f32, and every rank ran exactly the decided steps. */
static void pipeline_layout(dl_comm *world, const char *dir, const char *name, int w, int h, const char *spec) {
    dl_par_config pc;
    dl_par_parse(spec, &pc);
    dl_par_place pl;
    if (dl_par_place_new(world, &pc, &pl) != DL_OK) {
        CHECK(0, "%s %s: place: %s", name, spec, dl_last_error());
        return;
    }
    /* round 0: cadence:2; round 1: calibrated on the probe (collective over the cp
     * group, sent from the branch-1 group with cfg=2): f(x) = x, accumulated */
    dl_stepcache_config cad, cal = {.mode = DL_STEPCACHE_CALIBRATED, .threshold = 0.25f, .coef = {1, 0}, .ncoef = 2,
                                    .accumulate = 1};
    dl_stepcache_parse("cadence:2", &cad);
    cad.keep_first = cad.keep_last = cal.keep_first = cal.keep_last = 1;
    const int64_t n = (int64_t)w * h * 3;
    float *ref = malloc((size_t)n * 4), *img = malloc((size_t)n * 4);
    int ok = 1;
    for (int round = 0; round < 2 && ok; round++) {
        dl_flux_shape sh = {.width = w, .height = h, .max_sequence_length = 16, .dt = DL_F32, .par = &pl};
        dl_flux_pipeline *p = NULL;
        int compiles = dl_program_stats_get().compiles;
        ok = dl_flux_pipeline_load(&p, dir, &sh) == DL_OK;
        CHECK(ok, "%s %s: load: %s", name, spec, dl_last_error());
        if (!ok) break;
        /* the second load finds every rank's program (its own split) in the cache */
        CHECK(round == 0 || dl_program_stats_get().compiles == compiles, "%s %s: rank %d recompiled", name, spec, g_rank);
        if (!dl_flux_pipeline_is_host(p)) {
            ok = dl_flux_pipeline_worker(p) == DL_OK;
            CHECK(ok, "%s %s: worker: %s", name, spec, dl_last_error());
            dl_flux_pipeline_free(p);
            continue;
        }
        const char *prompt = pl.replica ? "a large green square in the centre on a white background"
                                        : "a small red circle in the top left on a blue background";
        dl_flux_request r = {.prompt = prompt, .negative_prompt = "blurry", .steps = 6, .guidance = 3.5f,
                             .true_cfg = 3.f, .seed = 5 + (uint64_t)pl.replica, .cache = round ? &cal : &cad};
        dl_flux_timing tm = {0}, tr = {0};
        /* a request refused before the workers hear of it still ends on every rank */
        dl_flux_request bad = r;
        bad.prompt = NULL;
        CHECK(dl_flux_generate(p, &bad, NULL, img, &tm) == DL_ERR_INVALID && strstr(dl_last_error(), "prompt"),
              "%s %s: a request without a prompt: %s", name, spec, dl_last_error());
        ok = dl_flux_generate(p, &r, NULL, img, &tm) == DL_OK;
        CHECK(ok, "%s %s: generate: %s", name, spec, dl_last_error());
        dl_flux_pipeline_free(p); /* releases the workers */
        if (!ok) break;
        /* the unsplit reference, in this process */
        dl_flux_shape one = {.width = w, .height = h, .max_sequence_length = 16, .dt = DL_F32, .cache = DL_CACHE_OFF};
        ok = dl_flux_pipeline_load(&p, dir, &one) == DL_OK && dl_flux_generate(p, &r, NULL, ref, &tr) == DL_OK;
        CHECK(ok, "%s %s: reference: %s", name, spec, dl_last_error());
        dl_flux_pipeline_free(p);
        if (!ok) break;
        double db = test_psnr(ref, img, n, 1.0);
        int group = dl_comm_size(pl.replica_comm);
        CHECK(db >= 50, "%s %s: image PSNR %.1f dB < 50 against one rank", name, spec, db);
        CHECK(tm.ranks == group, "%s %s: %d of %d ranks confirmed the decided steps", name, spec, tm.ranks, group);
        CHECK(tm.transformer_calls == tr.transformer_calls && tm.cached_steps == tr.cached_steps,
              "%s %s: %d calls / %d cached vs %d / %d on one rank", name, spec, tm.transformer_calls, tm.cached_steps,
              tr.transformer_calls, tr.cached_steps);
        char q[32];
        snprintf(q, sizeof q, isinf(db) ? "identical" : "PSNR %.1f dB", db);
        if (ok)
            printf("  %-10s %-22s pipeline (replica %d, %s): %s vs one rank, %d calls + %d cached, %d ranks agree\n",
                   name, spec, pl.replica, round ? "calibrated, 2nd load" : "cadence:2, 1st load", q, tm.transformer_calls,
                   tm.cached_steps, tm.ranks);
    }
    CHECK(all_ok(world, ok), "%s %s: a rank failed", name, spec);
    free(ref), free(img);
    dl_par_place_free(&pl);
}

/* The Wan pipeline on a layout (CFG with guidance 5, calibrated caching on its probe
 * program): every frame of the host's video against one rank, PSNR >= 50 dB in f32,
 * the same calls and cached steps, and every rank confirming them. */
typedef struct {
    const char *dir, *name;
    int W, H, F;
    float guidance, true_cfg;
    const char *neg;
} gen_case;

static void gen_layout(dl_comm *world, const gen_case *gc, const char *spec);
static void ltx2_pipeline_layout(dl_comm *world, const char *spec);

static void wan_pipeline_layout(dl_comm *world, const char *spec) {
    static const gen_case wan = {DATA_DIR "/wan/a", "wan-a", 48, 32, 9, 5.f, 1.f, "blurry"};
    gen_layout(world, &wan, spec);
}

/* Qwen-Image: true CFG whose two branches have different text lengths (each its own
 * valid key count, sent with its conditioning) */
static void qwen_pipeline_layout(dl_comm *world, const char *spec) {
    static const gen_case qwen = {DATA_DIR "/qwenimage/a", "qwen-a", 48, 32, 1, 1.f, 4.f,
                                  "blurry, low quality, jpeg artefacts, extra fingers, watermark"};
    gen_layout(world, &qwen, spec);
}

static void gen_layout(dl_comm *world, const gen_case *gc, const char *spec) {
    dl_par_config pc;
    dl_par_parse(spec, &pc);
    dl_par_place pl;
    if (dl_par_place_new(world, &pc, &pl) != DL_OK) {
        CHECK(0, "%s %s: place: %s", gc->name, spec, dl_last_error());
        return;
    }
    dl_stepcache_config cal = {.mode = DL_STEPCACHE_CALIBRATED, .threshold = 0.6f, .coef = {1, 0}, .ncoef = 2,
                               .accumulate = 1, .keep_first = 1, .keep_last = 1};
    const int W = gc->W, H = gc->H, F = gc->F;
    dl_gen_shape sh = {.width = W, .height = H, .frames = F, .max_sequence_length = 16, .dt = DL_F32, .par = &pl};
    dl_pipeline *p = NULL;
    int ok = dl_pipeline_load(&p, gc->dir, &sh) == DL_OK;
    CHECK(ok, "%s %s: load: %s", gc->name, spec, dl_last_error());
    if (ok && !dl_pipeline_is_host(p)) {
        ok = dl_pipeline_worker(p) == DL_OK;
        CHECK(ok, "%s %s: worker: %s", gc->name, spec, dl_last_error());
        dl_pipeline_free(p);
    } else if (ok) {
        dl_gen_request r = {.prompt = "a red circle moving from left to right", .negative_prompt = gc->neg, .steps = 8,
                            .guidance = gc->guidance, .true_cfg = gc->true_cfg, .seed = 9 + (uint64_t)pl.replica,
                            .cache = &cal, .want_pixels = 1};
        dl_media a = {0}, b = {0};
        dl_gen_timing tm = {0}, tr = {0};
        ok = dl_pipeline_generate(p, &r, &a, &tm) == DL_OK;
        CHECK(ok, "%s %s: generate: %s", gc->name, spec, dl_last_error());
        dl_pipeline_free(p);
        dl_gen_shape one = {.width = W, .height = H, .frames = F, .max_sequence_length = 16, .dt = DL_F32,
                            .cache = DL_CACHE_OFF};
        if (ok) {
            ok = dl_pipeline_load(&p, gc->dir, &one) == DL_OK && dl_pipeline_generate(p, &r, &b, &tr) == DL_OK;
            CHECK(ok, "%s %s: reference: %s", gc->name, spec, dl_last_error());
            dl_pipeline_free(p);
        }
        if (ok) {
            double worst = INFINITY;
            const int64_t fr = (int64_t)W * H * 3;
            for (int f = 0; f < F; f++) worst = fmin(worst, test_psnr(b.pixels + f * fr, a.pixels + f * fr, fr, 1.0));
            int group = dl_comm_size(pl.replica_comm);
            CHECK(worst >= 50, "%s %s: worst frame PSNR %.1f dB < 50 against one rank", gc->name, spec, worst);
            CHECK(tm.ranks == group, "%s %s: %d of %d ranks confirmed the decided steps", gc->name, spec, tm.ranks, group);
            CHECK(tm.denoiser_calls == tr.denoiser_calls && tm.cached_steps == tr.cached_steps && tm.cached_steps > 0,
                  "%s %s: %d calls / %d cached vs %d / %d on one rank", gc->name, spec, tm.denoiser_calls, tm.cached_steps,
                  tr.denoiser_calls, tr.cached_steps);
            char q[32];
            snprintf(q, sizeof q, isinf(worst) ? "identical" : "worst frame %.1f dB", worst);
            printf("  %-10s %-22s pipeline (replica %d, calibrated): %s vs one rank, %d calls + %d cached, %d ranks agree\n",
                   gc->name, spec, pl.replica, q, tm.denoiser_calls, tm.cached_steps, tm.ranks);
        }
        dl_media_free(&a), dl_media_free(&b);
    }
    CHECK(all_ok(world, ok), "%s %s: a rank failed", gc->name, spec);
    dl_par_place_free(&pl);
}

/* DDiT's promotion: an OpenSora request runs steps on one rank, is preempted at a step
 * boundary, resumes on all the ranks (CP over W), is preempted again and finishes on
 * one rank; every frame >= 50 dB against the uninterrupted one-rank run (f32). */
typedef struct {
    int stop_after;
    atomic_int flag;
    int done;
    float *lat;
    int64_t n;
} promo_ctx;

static void promo_step(void *ctx, int step, int steps, double elapsed) {
    promo_ctx *c = ctx;
    (void)steps, (void)elapsed;
    if (step == c->stop_after) atomic_store(&c->flag, 1);
}

static void promo_take(void *ctx, int done, const float *lat, int64_t n) {
    promo_ctx *c = ctx;
    float *keep = malloc((size_t)n * sizeof *keep);
    if (keep) memcpy(keep, lat, (size_t)n * sizeof *keep);
    free(c->lat);
    c->lat = keep, c->n = n, c->done = done;
}

static void opensora_promotion(dl_comm *world) {
    const int W = dl_comm_size(world);
    if (W < 2) return;
    char spec[32];
    snprintf(spec, sizeof spec, "cp=%d:ulysses", W);
    dl_par_config pc;
    dl_par_place pl;
    if (dl_par_parse(spec, &pc) != DL_OK || dl_par_place_new(world, &pc, &pl) != DL_OK) {
        CHECK(0, "opensora promotion %s: place: %s", spec, dl_last_error());
        return;
    }
    const char *dir = DATA_DIR "/opensora/a";
    dl_gen_shape one = {.width = 56, .height = 40, .frames = 34, .dt = DL_F32, .cache = DL_CACHE_OFF}, par = one;
    par.par = &pl;
    dl_gen_request r = {.prompt = "a red fox runs through the snow", .steps = 6, .guidance = 7.f, .seed = 5, .want_pixels = 1};
    dl_pipeline *p1 = NULL, *pw = NULL;
    dl_media ref = {0}, out = {0};
    promo_ctx c = {.stop_after = 2};
    int ok = 1;
    if (g_rank == 0) { /* one rank: the reference, then steps 1-2 */
        dl_gen_request a = r;
        a.preempt = &c.flag, a.on_step = promo_step, a.on_preempt = promo_take, a.ctx = &c;
        ok = dl_pipeline_load(&p1, dir, &one) == DL_OK && dl_pipeline_generate(p1, &r, &ref, NULL) == DL_OK &&
             dl_pipeline_generate(p1, &a, &out, NULL) == DL_ERR_PREEMPTED && c.done == 2;
        CHECK(ok, "opensora promotion: one rank: %s (%d steps)", dl_last_error(), c.done);
    }
    /* all ranks: steps 3-4 at DoP W, preempted again */
    int ok2 = all_ok(world, ok) && dl_pipeline_load(&pw, dir, &par) == DL_OK;
    if (ok2 && !dl_pipeline_is_host(pw)) {
        ok2 = dl_pipeline_worker_one(pw, &(int){0}) == DL_OK;
    } else if (ok2) {
        dl_gen_request b = r;
        c.stop_after = 4, atomic_store(&c.flag, 0);
        b.resume_step = c.done, b.resume_latents = c.lat, b.resume_numel = c.n;
        b.preempt = &c.flag, b.on_step = promo_step, b.on_preempt = promo_take, b.ctx = &c;
        ok2 = dl_pipeline_generate(pw, &b, &out, NULL) == DL_ERR_PREEMPTED && c.done == 4;
        CHECK(ok2, "opensora promotion: %s: %s (%d steps)", spec, dl_last_error(), c.done);
    }
    if (all_ok(world, ok2) && g_rank == 0) { /* back on one rank: steps 5-6 and the decode */
        dl_gen_request d = r;
        d.resume_step = c.done, d.resume_latents = c.lat, d.resume_numel = c.n;
        if (dl_pipeline_generate(p1, &d, &out, NULL) == DL_OK) {
            double worst = INFINITY;
            const int64_t fr = (int64_t)out.width * out.height * 3;
            for (int f = 0; f < out.frames; f++) worst = fmin(worst, test_psnr(ref.pixels + f * fr, out.pixels + f * fr, fr, 1.0));
            CHECK(out.frames == ref.frames && worst >= 50, "opensora promotion 1 -> %d -> 1 rank(s): worst frame %.1f dB < 50", W, worst);
            char q[32];
            snprintf(q, sizeof q, isinf(worst) ? "identical" : "worst frame %.1f dB", worst);
            printf("  opensora   promotion 1 -> %s -> 1 rank at steps 2 and 4 of 6: %s vs uninterrupted\n", spec, q);
        } else
            CHECK(0, "opensora promotion: the last steps: %s", dl_last_error());
    }
    dl_media_free(&ref), dl_media_free(&out);
    free(c.lat);
    dl_pipeline_free(pw);
    dl_pipeline_free(p1);
    dl_par_place_free(&pl);
}

static void pipelines(dl_comm *world) {
    static const char *two[] = {"cfg=2", "tp=2,sp", "cp=2:ring", "dp=2", NULL};
    static const char *four[] = {"tp=2,cfg=2", "cp=2:ulysses,cfg=2", "tp=2,cp=2:gather", "dp=2,cp=2:ring", NULL};
    static const char *three[] = {"cp=3:ring", "dp=3", NULL};
    static const char *one[] = {"1", NULL};
    int W = dl_comm_size(world);
    const char **list = W == 2 ? two : W == 3 ? three : W == 4 ? four : one;
    for (int i = 0; list[i]; i++) {
        pipeline_layout(world, SOURCE_DIR "/models/difflet-tiny", "tiny", 64, 64, list[i]);
        if (!strstr(list[i], "tp=2,cp=2")) /* the parity model has 2 heads */
            pipeline_layout(world, DATA_DIR "/flux/dev", "parity-dev", 32, 48, list[i]);
    }
    static const char *wan2[] = {"cfg=2", "cp=2:ulysses", "cp=2:ring", "tp=2", "tp=2,sp", NULL}, *wan3[] = {"cp=3:gather", NULL};
    static const char *wan4[] = {"cp=2:ulysses,cfg=2", "cp=4:ring", "dp=2,cp=2:gather", "tp=2,cp=2:ring", NULL};
    const char **wl = W == 2 ? wan2 : W == 3 ? wan3 : W == 4 ? wan4 : one;
    for (int i = 0; wl[i]; i++) wan_pipeline_layout(world, wl[i]);
    static const char *qw2[] = {"cfg=2", "cp=2:ring", "tp=2", NULL}, *qw3[] = {"cp=3:gather", NULL};
    static const char *qw4[] = {"tp=2,cfg=2", "cp=2:ulysses,cfg=2", NULL};
    const char **ql = W == 2 ? qw2 : W == 3 ? qw3 : W == 4 ? qw4 : one;
    for (int i = 0; ql[i]; i++) qwen_pipeline_layout(world, ql[i]);
    /* LTX-2: four passes a step through the shared loop; with cfg=2 they alternate between the groups */
    static const char *lt2[] = {"cp=2:ulysses", "tp=2", "cfg=2", NULL}, *lt3[] = {"cp=3:gather", NULL};
    static const char *lt4[] = {"tp=2,cp=2:ring", "cp=2:ring,cfg=2", "dp=2,tp=2", NULL};
    const char **ll = W == 2 ? lt2 : W == 3 ? lt3 : W == 4 ? lt4 : one;
    for (int i = 0; ll[i]; i++) ltx2_pipeline_layout(world, ll[i]);
}

/* Wan 2.1: CP over the video tokens (text replicated for cross-attention) in every
 * mode that fits the world size, against the unsplit transformer; Ulysses where the
 * heads divide, refused with the reason where they do not; TP refused by name */
static void wan_model(dl_comm *world, const char *dir, const char *name, int64_t lf, int64_t lh, int64_t lw) {
    const int n = dl_comm_size(world);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        return;
    }
    const int64_t T = 16;
    dl_wan *ref = NULL;
    if (dl_wan_load(&ref, md, "transformer", lf, lh, lw, T, DL_F32, NULL, NULL) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t C = dl_wan_in_channels(ref), nl = C * lf * lh * lw, nt = T * dl_wan_text_dim(ref);
    float *lat = malloc((size_t)nl * 4), *txt = malloc((size_t)nt * 4), *a = malloc((size_t)nl * 4), *b = malloc((size_t)nl * 4);
    fill(lat, nl, 5), fill(txt, nt, 6);
    memset(txt + nt / 2, 0, (size_t)(nt - nt / 2) * 4); /* zero rows past the prompt, as the pipeline pads */
    int ok = dl_wan_run(ref, lat, txt, 640.f, a) == DL_OK;
    CHECK(ok, "%s: unsplit run: %s", name, dl_last_error());
    static const char *const modes[] = {"ulysses", "ring", "gather", "tp", "tp-plain"};
    for (int k = 0; ok && n > 1 && k < 5; k++) {
        char spec[64], why[512];
        if (k < 3) snprintf(spec, sizeof spec, "cp=%d:%s", n, modes[k]);
        else if (n == 2 || n == 4) /* TP with and without sequence parallelism */
            snprintf(spec, sizeof spec, k == 3 ? (n == 2 ? "tp=2,sp" : "tp=2,sp,cp=2:ring") : (n == 2 ? "tp=2" : "tp=2,cp=2:ring"));
        else continue;
        dl_par_config pc;
        dl_par_parse(spec, &pc);
        dl_dit_split sp = {.tp = pc.tp, .cp = pc.cp, .sp = pc.sp, .cp_mode = pc.cp_mode};
        const char *bad = dl_dit_split_check(&sp, dl_wan_heads(ref), why, sizeof why);
        dl_par_place pl;
        if (dl_par_place_new(world, &pc, &pl) != DL_OK) {
            CHECK(0, "%s %s: place: %s", name, spec, dl_last_error());
            continue;
        }
        dl_wan *m = NULL;
        dl_status s = dl_wan_load(&m, md, "transformer", lf, lh, lw, T, DL_F32, NULL, &pl.split);
        if (bad) {
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused"), "%s %s: loaded despite %s", name, spec, bad);
            if (g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec, bad);
        } else {
            CHECK(s == DL_OK, "%s %s: load: %s", name, spec, dl_last_error());
            int r = s == DL_OK && dl_wan_run(m, lat, txt, 640.f, b) == DL_OK;
            CHECK(r || s != DL_OK, "%s %s: run: %s", name, spec, dl_last_error());
            double mr = max_abs(a, nl), e = r ? max_diff(a, b, nl) : INFINITY;
            CHECK(e <= 1e-5 * mr, "%s %s: max |err| %.3g > 1e-5 x max |ref| %.3g", name, spec, e, mr);
            if (all_ok(world, r && e <= 1e-5 * mr) && g_rank == 0) printf("  %-10s %-22s ok: max rel err %.2e\n", name, spec, e / mr);
        }
        dl_wan_free(m);
        dl_par_place_free(&pl);
    }
    free(lat), free(txt), free(a), free(b);
    dl_wan_free(ref);
    dl_model_dir_free(md);
}

/* Qwen-Image: every layout that fits the world size against the unsplit
 * transformer, at every valid text length 1..T (the prompt's own length is the
 * valid key count), with the split's error far below what one more text token
 * changes (Difflet §7.4) */
static void qwen_model(dl_comm *world, const char *dir, const char *name, int64_t gh, int64_t gw) {
    const int n = dl_comm_size(world);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        return;
    }
    const int64_t T = 12;
    dl_qwenimage *ref = NULL;
    if (dl_qwenimage_load(&ref, md, "transformer", gh, gw, T, DL_F32, NULL, NULL) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t N = gh * gw, C = dl_qwenimage_in_channels(ref), nl = N * C, nt = T * dl_qwenimage_text_dim(ref);
    float *lat = malloc((size_t)nl * 4), *txt = malloc((size_t)nt * 4), *a = malloc((size_t)nl * 4);
    float *b = malloc((size_t)nl * 4), *prev = malloc((size_t)nl * 4);
    fill(lat, nl, 7), fill(txt, nt, 8);
    char spec[4][64];
    int ns = 0;
    if (n > 1) {
        snprintf(spec[ns++], 64, "cp=%d:ring", n);
        snprintf(spec[ns++], 64, "cp=%d:gather", n);
        snprintf(spec[ns++], 64, "cp=%d:ulysses", n);
        if (n == 2 || n == 4) snprintf(spec[ns++], 64, n == 2 ? "tp=2,sp" : "tp=2,cp=2:ring");
    }
    for (int k = 0; k < ns; k++) {
        char why[512];
        dl_par_config pc;
        dl_par_parse(spec[k], &pc);
        dl_dit_split sp = {.tp = pc.tp, .cp = pc.cp, .sp = pc.sp, .cp_mode = pc.cp_mode};
        const char *bad = dl_dit_split_check(&sp, dl_qwenimage_heads(ref), why, sizeof why);
        if (bad) {
            if (g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec[k], bad);
            continue;
        }
        dl_par_place pl;
        if (dl_par_place_new(world, &pc, &pl) != DL_OK) continue;
        dl_qwenimage *m = NULL;
        int ok = dl_qwenimage_load(&m, md, "transformer", gh, gw, T, DL_F32, NULL, &pl.split) == DL_OK;
        CHECK(ok, "%s %s: load: %s", name, spec[k], dl_last_error());
        double worst = 0, least = INFINITY;
        for (int64_t L = T; ok && L >= 1; L--) {
            ok = dl_qwenimage_run(ref, lat, txt, L, 0.55f, a) == DL_OK && dl_qwenimage_run(m, lat, txt, L, 0.55f, b) == DL_OK;
            if (!ok) break;
            double mr = max_abs(a, nl), e = max_diff(a, b, nl) / mr;
            worst = fmax(worst, e);
            CHECK(e <= 1e-5, "%s %s L=%lld: rel err %.3g", name, spec[k], (long long)L, e);
            if (L < T) least = fmin(least, max_diff(a, prev, nl) / mr);
            memcpy(prev, a, (size_t)nl * 4);
        }
        CHECK(ok, "%s %s: run: %s", name, spec[k], dl_last_error());
        CHECK(!ok || least >= 100 * worst, "%s %s: split error %.3g is not far below the length change %.3g", name, spec[k],
              worst, least);
        if (all_ok(world, ok) && g_rank == 0)
            printf("  %-10s %-22s ok: max rel err %.2e over L = 1..%lld; one text token changes >= %.2e\n", name, spec[k],
                   worst, (long long)T, least);
        dl_qwenimage_free(m);
        dl_par_place_free(&pl);
    }
    free(lat), free(txt), free(a), free(b), free(prev);
    dl_qwenimage_free(ref);
    dl_model_dir_free(md);
}

/* HunyuanVideo: every layout that fits the world size against the unsplit
 * transformer, at every valid text length 1..T (the refiner's mask and the joint
 * attention's valid keys), with the split's error far below what one more text
 * token changes (Difflet §7.4) */
static void hunyuan_model(dl_comm *world, const char *dir, const char *name, int64_t lf, int64_t lh, int64_t lw) {
    const int n = dl_comm_size(world);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        return;
    }
    const int64_t T = 10;
    dl_hunyuan_video *ref = NULL;
    if (dl_hunyuan_video_load(&ref, md, "transformer", lf, lh, lw, T, DL_F32, NULL, NULL) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    int64_t Td, Pd;
    dl_hunyuan_video_text_dims(ref, &Td, &Pd);
    const int64_t ni = dl_hunyuan_video_in_channels(ref) * lf * lh * lw, no = dl_hunyuan_video_out_channels(ref) * lf * lh * lw;
    float *lat = malloc((size_t)ni * 4), *txt = malloc((size_t)(T * Td) * 4), *pooled = malloc((size_t)Pd * 4);
    float *a = malloc((size_t)no * 4), *b = malloc((size_t)no * 4), *prev = malloc((size_t)no * 4);
    fill(lat, ni, 9), fill(txt, T * Td, 10), fill(pooled, Pd, 11);
    char spec[5][64];
    int ns = 0;
    if (n > 1) {
        snprintf(spec[ns++], 64, "cp=%d:ring", n);
        snprintf(spec[ns++], 64, "cp=%d:gather", n);
        snprintf(spec[ns++], 64, "cp=%d:ulysses", n);
        if (n == 2) snprintf(spec[ns++], 64, "tp=2"), snprintf(spec[ns++], 64, "tp=2,sp");
        if (n == 4) snprintf(spec[ns++], 64, "tp=2,sp,cp=2:ring");
    }
    for (int k = 0; k < ns; k++) {
        char why[512];
        dl_par_config pc;
        dl_par_parse(spec[k], &pc);
        dl_dit_split sp = {.tp = pc.tp, .cp = pc.cp, .sp = pc.sp, .cp_mode = pc.cp_mode};
        const char *bad = dl_dit_split_check(&sp, dl_hunyuan_video_heads(ref), why, sizeof why);
        dl_par_place pl;
        if (dl_par_place_new(world, &pc, &pl) != DL_OK) continue;
        dl_hunyuan_video *m = NULL;
        dl_status s = dl_hunyuan_video_load(&m, md, "transformer", lf, lh, lw, T, DL_F32, NULL, &pl.split);
        if (bad) {
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused"), "%s %s: loaded despite %s", name, spec[k], bad);
            if (g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec[k], bad);
            dl_par_place_free(&pl);
            continue;
        }
        int ok = s == DL_OK;
        CHECK(ok, "%s %s: load: %s", name, spec[k], dl_last_error());
        double worst = 0, least = INFINITY;
        for (int64_t L = T; ok && L >= 1; L--) {
            ok = dl_hunyuan_video_run(ref, lat, txt, L, pooled, 640.f, 5.f, a) == DL_OK &&
                 dl_hunyuan_video_run(m, lat, txt, L, pooled, 640.f, 5.f, b) == DL_OK;
            if (!ok) break;
            double mr = max_abs(a, no), e = max_diff(a, b, no) / mr;
            worst = fmax(worst, e);
            CHECK(e <= 1e-5, "%s %s L=%lld: rel err %.3g", name, spec[k], (long long)L, e);
            if (L < T) least = fmin(least, max_diff(a, prev, no) / mr);
            memcpy(prev, a, (size_t)no * 4);
        }
        CHECK(ok, "%s %s: run: %s", name, spec[k], dl_last_error());
        CHECK(!ok || least >= 100 * worst, "%s %s: split error %.3g is not far below the length change %.3g", name, spec[k],
              worst, least);
        if (all_ok(world, ok) && g_rank == 0)
            printf("  %-10s %-22s ok: max rel err %.2e over L = 1..%lld; one text token changes >= %.2e\n", name, spec[k],
                   worst, (long long)T, least);
        dl_hunyuan_video_free(m);
        dl_par_place_free(&pl);
    }
    free(lat), free(txt), free(pooled), free(a), free(b), free(prev);
    dl_hunyuan_video_free(ref);
    dl_model_dir_free(md);
}

/* STDiT3 (OpenSora 1.2): every layout of the world size (tp, cp = OpenSora's dynamic
 * sequence parallelism, tp x cp) against the unsplit transformer, one branch and
 * batched CFG (two captions of different valid lengths); uneven frame / position
 * shards included. Refused by name: tp not dividing the heads, sp, more cp ranks than
 * frames or positions after patching (frames x positions: tf x ts). */
static void stdit3_model(dl_comm *world, const char *dir, const char *name, int64_t lf, int64_t lh, int64_t lw, int64_t tf,
                         int64_t ts) {
    const int n = dl_comm_size(world);
    dl_model_dir *md;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        return;
    }
    dl_stdit3 *ref = NULL;
    const int64_t T = 12;
    if (dl_stdit3_load(&ref, md, "transformer", lf, lh, lw, T, DL_F32, NULL, NULL, 1) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t ni = dl_stdit3_in_channels(ref) * lf * lh * lw, no = dl_stdit3_out_channels(ref) * lf * lh * lw;
    const int64_t ny = T * dl_stdit3_caption_channels(ref), heads = dl_stdit3_heads(ref);
    float *lat = malloc((size_t)ni * 4), *y0 = malloc((size_t)ny * 4), *y1 = malloc((size_t)ny * 4);
    float *a0 = malloc((size_t)no * 4), *a1 = malloc((size_t)no * 4), *b0 = malloc((size_t)no * 4), *b1 = malloc((size_t)no * 4);
    fill(lat, ni, 21), fill(y0, ny, 22), fill(y1, ny, 23);
    const dl_stdit3_cond c0 = {.y = y0, .valid = 9, .timestep = 640.f, .fps = 24.f, .height = 8.f * lh, .width = 8.f * lw};
    dl_stdit3_cond c1 = c0;
    c1.y = y1, c1.valid = 3;
    int ok = dl_stdit3_run(ref, lat, &c0, a0) == DL_OK && dl_stdit3_run(ref, lat, &c1, a1) == DL_OK;
    CHECK(ok, "%s: unsplit run: %s", name, dl_last_error());
    char spec[4][64];
    int ns = 0;
    if (n > 1) {
        snprintf(spec[ns++], 64, "tp=%d", n);
        snprintf(spec[ns++], 64, "cp=%d", n);
        if (n == 2) snprintf(spec[ns++], 64, "tp=2,sp");
        if (n == 4) snprintf(spec[ns++], 64, "tp=2,cp=2");
    }
    for (int k = 0; ok && k < ns; k++) {
        dl_par_config pc;
        dl_par_place pl;
        if (dl_par_parse(spec[k], &pc) != DL_OK || dl_par_place_new(world, &pc, &pl) != DL_OK) {
            CHECK(0, "%s %s: place: %s", name, spec[k], dl_last_error());
            continue;
        }
        const char *bad = heads % pc.tp ? "heads" : pc.sp ? "sp" : pc.cp > tf || pc.cp > ts ? "frames" : NULL;
        dl_stdit3 *m1 = NULL, *m2 = NULL;
        dl_status s = dl_stdit3_load(&m1, md, "transformer", lf, lh, lw, T, DL_F32, NULL, &pl.split, 1);
        if (bad) {
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused"), "%s %s: loaded despite %s", name, spec[k], bad);
            if (g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec[k], dl_last_error());
        } else {
            CHECK(s == DL_OK, "%s %s: load: %s", name, spec[k], dl_last_error());
            int r = s == DL_OK && dl_stdit3_load(&m2, md, "transformer", lf, lh, lw, T, DL_F32, NULL, &pl.split, 2) == DL_OK;
            r = r && dl_stdit3_run(m1, lat, &c0, b0) == DL_OK;
            double mr = max_abs(a0, no), e = r ? max_diff(a0, b0, no) / mr : INFINITY;
            r = r && dl_stdit3_run2(m2, lat, &c0, &c1, b0, b1) == DL_OK;
            double e2 = r ? fmax(max_diff(a0, b0, no) / mr, max_diff(a1, b1, no) / max_abs(a1, no)) : INFINITY;
            CHECK(r, "%s %s: run: %s", name, spec[k], dl_last_error());
            CHECK(e <= 1e-5 && e2 <= 1e-5, "%s %s: max rel err %.3g (batched CFG %.3g) > 1e-5", name, spec[k], e, e2);
            /* the probe: this rank's frames, the score summed over the cp group */
            dl_stdit3_probe *p1 = NULL, *p2 = NULL;
            double sc[4] = {-1, -1, -1, -1};
            int pr = dl_stdit3_probe_load(&p1, md, "transformer", lf, lh, lw, DL_F32, NULL, NULL) == DL_OK &&
                     dl_stdit3_probe_load(&p2, md, "transformer", lf, lh, lw, DL_F32, NULL, &pl.split) == DL_OK &&
                     dl_stdit3_probe_run(p1, 0, lat, &c0, &sc[0]) == DL_OK && dl_stdit3_probe_run(p2, 0, lat, &c0, &sc[1]) == DL_OK;
            dl_stdit3_cond cl = c0;
            cl.timestep = 600.f;
            pr = pr && dl_stdit3_probe_run(p1, 0, lat, &cl, &sc[2]) == DL_OK && dl_stdit3_probe_run(p2, 0, lat, &cl, &sc[3]) == DL_OK;
            CHECK(pr && sc[0] == 0 && sc[1] == 0 && sc[2] > 0 && fabs(sc[3] - sc[2]) <= 1e-6 * sc[2], "%s %s probe: %s; %g %g %g %g",
                  name, spec[k], dl_last_error(), sc[0], sc[1], sc[2], sc[3]);
            dl_stdit3_probe_free(p1), dl_stdit3_probe_free(p2);
            /* this rank's program (compiled into an artifact, loaded from it) gives the same bytes:
             * the TP slices of the fused qkv / kv_linear are recorded under names of their own */
            char pdir[64];
            snprintf(pdir, sizeof pdir, "/tmp/difflet_par_stdit3_XXXXXX");
            dl_checkpoint *ck = NULL;
            dl_artifact_writer *aw = NULL;
            dl_artifact *art = NULL;
            dl_stdit3 *m3 = NULL, *m4 = NULL;
            int pg = mkdtemp(pdir) && dl_model_dir_checkpoint(md, "transformer", &ck) == DL_OK &&
                     dl_artifact_writer_open(&aw, pdir) == DL_OK;
            dl_wsrc rec = {.ck = ck, .rec = aw};
            pg = pg && dl_stdit3_load(&m3, md, "transformer", lf, lh, lw, T, DL_F32, &rec, &pl.split, 1) == DL_OK;
            if (aw) pg = dl_artifact_writer_finish(aw, "{}", rec.arena, 0) == DL_OK && pg;
            pg = pg && dl_artifact_open(&art, pdir, 1) == DL_OK;
            dl_wsrc from = {.art = art};
            pg = pg && dl_stdit3_load(&m4, md, "transformer", lf, lh, lw, T, DL_F32, &from, &pl.split, 1) == DL_OK &&
                 dl_stdit3_run(m1, lat, &c0, b0) == DL_OK && dl_stdit3_run(m4, lat, &c0, b1) == DL_OK;
            CHECK(pg && !memcmp(b0, b1, (size_t)no * 4), "%s %s: program: %s", name, spec[k], dl_last_error());
            dl_stdit3_free(m3), dl_stdit3_free(m4);
            dl_artifact_close(art);
            dl_ckpt_free(ck);
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", pdir);
            CHECK(system(cmd) == 0, "%s", cmd);
            if (all_ok(world, r && pr && pg && e <= 1e-5 && e2 <= 1e-5) && g_rank == 0)
                printf("  %-10s %-22s ok: max rel err %.2e, batched CFG %.2e; probe score %.6g (one rank %.6g); program = checkpoint\n",
                       name, spec[k], e, e2, sc[3], sc[2]);
        }
        dl_stdit3_free(m1), dl_stdit3_free(m2);
        dl_par_place_free(&pl);
    }
    free(lat), free(y0), free(y1), free(a0), free(a1), free(b0), free(b1);
    dl_stdit3_free(ref);
    dl_model_dir_free(md);
}

/* LTX-2 (LTX2VideoTransformer3DModel): every layout of the world size against the unsplit
 * transformer, both streams, for the plain, STG (perturbed block 1) and modality-isolated
 * passes, f32 max |err| <= 1e-5 max |ref| per stream on every rank (each returns the full
 * outputs); the probe's score against one rank's; this rank's program (compiled into an
 * artifact, loaded) against the checkpoint's bytes. Refused by name, by the check and by
 * the loader: tp not dividing the video or audio heads, Ulysses over tp x cp not dividing
 * them, sp, more cp ranks than video tokens. */
static void ltx2_model(dl_comm *world, const char *dir, const char *name, dl_ltx2_transformer_shape sh) {
    const int n = dl_comm_size(world);
    dl_model_dir *md;
    dl_ltx2_transformer *ref = NULL;
    const cJSON *cfg = NULL;
    if (dl_model_dir_open(&md, dir) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        return;
    }
    if (dl_model_dir_config(md, "transformer", &cfg) != DL_OK ||
        dl_ltx2_transformer_load(&ref, md, "transformer", &sh, DL_F32, NULL) != DL_OK) {
        CHECK(0, "%s: %s", name, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const dl_ltx2_transformer_info *in = dl_ltx2_transformer_get_info(ref);
    const int64_t nv = in->video_tokens * in->video_in, na = in->audio_tokens * in->audio_in;
    const int64_t nt = in->text_rows * in->text_width, nat = in->text_rows * in->audio_text_width;
    const int64_t ov = in->video_tokens * in->video_out, oa = in->audio_tokens * in->audio_out;
    float *v = malloc((size_t)nv * 4), *a = malloc((size_t)na * 4), *t = malloc((size_t)nt * 4), *at = malloc((size_t)nat * 4);
    float *rv[3], *ra[3], *gv = malloc((size_t)ov * 4), *ga = malloc((size_t)oa * 4);
    fill(v, nv, 31), fill(a, na, 32), fill(t, nt, 33), fill(at, nat, 34);
    static const int stg[1] = {1};
    dl_ltx2_transformer_input x[3];
    int ok = 1;
    for (int k = 0; k < 3; k++) { /* plain, STG, isolated modalities: the pipeline's kinds of pass */
        x[k] = (dl_ltx2_transformer_input){.video = v, .audio = a, .text = t, .audio_text = at, .video_tokens = in->video_tokens,
                                           .audio_tokens = in->audio_tokens, .text_rows = in->text_rows, .timestep = 640.f,
                                           .audio_timestep = 610.f, .sigma = 0.64f, .audio_sigma = 0.61f,
                                           .use_cross_timestep = 1, .isolate_modalities = k == 2,
                                           .stg_blocks = k == 1 ? stg : NULL, .stg_nblocks = k == 1};
        rv[k] = malloc((size_t)ov * 4), ra[k] = malloc((size_t)oa * 4);
        ok = ok && dl_ltx2_transformer_run(ref, &x[k], rv[k], ra[k]) == DL_OK;
    }
    CHECK(ok, "%s: unsplit run: %s", name, dl_last_error());
    char spec[8][64];
    int ns = 0;
    if (n > 1) {
        snprintf(spec[ns++], 64, "cp=%d:ulysses", n);
        snprintf(spec[ns++], 64, "cp=%d:ring", n);
        snprintf(spec[ns++], 64, "cp=%d:gather", n);
        snprintf(spec[ns++], 64, "tp=%d", n);
        if (n == 2) snprintf(spec[ns++], 64, "tp=2,sp");
        if (n == 4) {
            snprintf(spec[ns++], 64, "tp=2,cp=2:ring");
            snprintf(spec[ns++], 64, "tp=2,cp=2:gather");
            snprintf(spec[ns++], 64, "tp=2,cp=2:ulysses");
        }
    }
    for (int k = 0; ok && k < ns; k++) {
        dl_par_config pc;
        dl_par_place pl;
        if (dl_par_parse(spec[k], &pc) != DL_OK || dl_par_place_new(world, &pc, &pl) != DL_OK) {
            CHECK(0, "%s %s: place: %s", name, spec[k], dl_last_error());
            continue;
        }
        char why[512];
        const char *bad = dl_ltx2_split_check(cfg, &pl.split, why, sizeof why);
        dl_ltx2_transformer *m = NULL;
        dl_status s = dl_ltx2_transformer_load_split(&m, md, "transformer", &sh, DL_F32, NULL, &pl.split);
        if (bad) {
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused"), "%s %s: loaded despite %s", name, spec[k], bad);
            if (g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, spec[k], bad);
            dl_par_place_free(&pl);
            continue;
        }
        CHECK(s == DL_OK, "%s %s: load: %s", name, spec[k], dl_last_error());
        double worst[2] = {0, 0};
        int r = s == DL_OK;
        for (int p = 0; r && p < 3; p++) {
            r = dl_ltx2_transformer_run(m, &x[p], gv, ga) == DL_OK;
            double ev = r ? max_diff(rv[p], gv, ov) / max_abs(rv[p], ov) : INFINITY;
            double ea = r ? max_diff(ra[p], ga, oa) / max_abs(ra[p], oa) : INFINITY;
            CHECK(ev <= 1e-5 && ea <= 1e-5, "%s %s pass %d: video %.3g, audio %.3g of max |ref| (> 1e-5)", name, spec[k], p, ev, ea);
            worst[0] = fmax(worst[0], ev), worst[1] = fmax(worst[1], ea);
        }
        CHECK(r, "%s %s: run: %s", name, spec[k], dl_last_error());
        /* the probe: this rank's video rows, the score summed over the cp group */
        dl_ltx2_probe *p1 = NULL, *p2 = NULL;
        double sc[4] = {-1, -1, -1, -1};
        int pr = dl_ltx2_probe_load(&p1, md, "transformer", &sh, DL_F32, NULL) == DL_OK &&
                 dl_ltx2_probe_load_split(&p2, md, "transformer", &sh, DL_F32, NULL, &pl.split) == DL_OK &&
                 dl_ltx2_probe_run(p1, 0, v, 900.f, &sc[0]) == DL_OK && dl_ltx2_probe_run(p2, 0, v, 900.f, &sc[1]) == DL_OK &&
                 dl_ltx2_probe_run(p1, 0, v, 800.f, &sc[2]) == DL_OK && dl_ltx2_probe_run(p2, 0, v, 800.f, &sc[3]) == DL_OK;
        CHECK(pr && sc[0] == 0 && sc[1] == 0 && sc[2] > 0 && fabs(sc[3] - sc[2]) <= 1e-6 * sc[2], "%s %s probe: %s; %g %g %g %g",
              name, spec[k], dl_last_error(), sc[0], sc[1], sc[2], sc[3]);
        dl_ltx2_probe_free(p1), dl_ltx2_probe_free(p2);
        /* this rank's program (compiled into an artifact, then loaded from it): the same bytes */
        char pdir[64];
        snprintf(pdir, sizeof pdir, "/tmp/difflet_par_ltx2_XXXXXX");
        dl_checkpoint *ck = NULL;
        dl_artifact_writer *aw = NULL;
        dl_artifact *art = NULL;
        dl_ltx2_transformer *m3 = NULL, *m4 = NULL;
        float *pv = malloc((size_t)ov * 4), *pa = malloc((size_t)oa * 4);
        int pg = mkdtemp(pdir) && dl_model_dir_checkpoint(md, "transformer", &ck) == DL_OK &&
                 dl_artifact_writer_open(&aw, pdir) == DL_OK;
        dl_wsrc rec = {.ck = ck, .rec = aw};
        pg = pg && dl_ltx2_transformer_load_split(&m3, md, "transformer", &sh, DL_F32, &rec, &pl.split) == DL_OK;
        if (aw) pg = dl_artifact_writer_finish(aw, "{}", rec.arena, 0) == DL_OK && pg;
        pg = pg && dl_artifact_open(&art, pdir, 1) == DL_OK;
        dl_wsrc from = {.art = art};
        pg = pg && dl_ltx2_transformer_load_split(&m4, md, "transformer", &sh, DL_F32, &from, &pl.split) == DL_OK &&
             r && dl_ltx2_transformer_run(m, &x[1], gv, ga) == DL_OK && dl_ltx2_transformer_run(m4, &x[1], pv, pa) == DL_OK;
        CHECK(pg && !memcmp(gv, pv, (size_t)ov * 4) && !memcmp(ga, pa, (size_t)oa * 4), "%s %s: program: %s", name, spec[k],
              dl_last_error());
        dl_ltx2_transformer_free(m3), dl_ltx2_transformer_free(m4);
        dl_artifact_close(art);
        dl_ckpt_free(ck);
        free(pv), free(pa);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", pdir);
        CHECK(system(cmd) == 0, "%s", cmd);
        if (all_ok(world, r && pr && pg && worst[0] <= 1e-5 && worst[1] <= 1e-5) && g_rank == 0)
            printf("  %-10s %-22s ok: max rel err video %.2e, audio %.2e (plain, STG, isolated); probe %.6g (one rank %.6g); "
                   "program = checkpoint\n", name, spec[k], worst[0], worst[1], sc[3], sc[2]);
        dl_ltx2_transformer_free(m);
        dl_par_place_free(&pl);
    }
    /* more cp ranks than video tokens: refused by the loader, whatever the mode */
    if (n > 1) {
        dl_par_config pc;
        dl_par_place pl;
        char sp[32];
        snprintf(sp, sizeof sp, "cp=%d:ring", n);
        if (dl_par_parse(sp, &pc) == DL_OK && dl_par_place_new(world, &pc, &pl) == DL_OK) {
            dl_ltx2_transformer_shape one = sh;
            one.frames = one.height = one.width = 1;
            dl_ltx2_transformer *m = NULL;
            dl_status s = dl_ltx2_transformer_load_split(&m, md, "transformer", &one, DL_F32, NULL, &pl.split);
            CHECK(s != DL_OK && strstr(dl_last_error(), "refused") && strstr(dl_last_error(), "video tokens"),
                  "%s %s on 1 video token: %s", name, sp, s == DL_OK ? "loaded" : dl_last_error());
            if (s != DL_OK && g_rank == 0) printf("  %-10s %-22s refused: %s\n", name, "(1 video token)", dl_last_error());
            dl_ltx2_transformer_free(m);
            dl_par_place_free(&pl);
        }
    }
    for (int k = 0; k < 3; k++) free(rv[k]), free(ra[k]);
    free(v), free(a), free(t), free(at), free(gv), free(ga);
    dl_ltx2_transformer_free(ref);
    dl_model_dir_free(md);
}

/* The LTX-2 pipeline on a layout (CFG with a negative prompt, STG on block 1, modality
 * guidance, guidance rescale: four passes a step; calibrated caching on the probe
 * program): every frame of the host's video and the waveform against one rank, PSNR
 * >= 50 dB per frame and SNR >= 50 dB per channel in f32, the same calls and cached
 * steps, every rank confirming them. */
static void ltx2_pipeline_layout(dl_comm *world, const char *spec) {
    const char *dir = DATA_DIR "/ltx2/pipe", *name = "ltx2-pipe";
    dl_par_config pc;
    dl_par_parse(spec, &pc);
    dl_par_place pl;
    if (dl_par_place_new(world, &pc, &pl) != DL_OK) {
        CHECK(0, "%s %s: place: %s", name, spec, dl_last_error());
        return;
    }
    dl_stepcache_config cal = {.mode = DL_STEPCACHE_CALIBRATED, .threshold = 0.6f, .coef = {1, 0}, .ncoef = 2,
                               .accumulate = 1, .keep_first = 1, .keep_last = 1};
    dl_gen_shape sh = {.width = 96, .height = 96, .frames = 9, .max_sequence_length = 16, .dt = DL_F32, .par = &pl};
    dl_pipeline *p = NULL;
    int ok = dl_pipeline_load(&p, dir, &sh) == DL_OK;
    CHECK(ok, "%s %s: load: %s", name, spec, dl_last_error());
    if (ok && !dl_pipeline_is_host(p)) {
        ok = dl_pipeline_worker(p) == DL_OK;
        CHECK(ok, "%s %s: worker: %s", name, spec, dl_last_error());
        dl_pipeline_free(p);
    } else if (ok) {
        dl_gen_request r = {.prompt = "A red circle moves to the right.", .negative_prompt = "blurry, static", .steps = 6,
                            .guidance = 3.f, .seed = 11 + (uint64_t)pl.replica, .cache = &cal, .want_pixels = 1};
        dl_media m = {0}, o = {0};
        dl_gen_timing tm = {0}, tr = {0};
        /* a request refused before the loop still ends on every rank */
        dl_gen_request bad = r;
        bad.prompt = NULL;
        CHECK(dl_pipeline_generate(p, &bad, &m, &tm) == DL_ERR_INVALID && strstr(dl_last_error(), "prompt"),
              "%s %s: a request without a prompt: %s", name, spec, dl_last_error());
        ok = dl_pipeline_generate(p, &r, &m, &tm) == DL_OK;
        CHECK(ok, "%s %s: generate: %s", name, spec, dl_last_error());
        dl_pipeline_free(p);
        dl_gen_shape one = {.width = 96, .height = 96, .frames = 9, .max_sequence_length = 16, .dt = DL_F32,
                            .cache = DL_CACHE_OFF};
        if (ok) {
            ok = dl_pipeline_load(&p, dir, &one) == DL_OK && dl_pipeline_generate(p, &r, &o, &tr) == DL_OK;
            CHECK(ok, "%s %s: reference: %s", name, spec, dl_last_error());
            dl_pipeline_free(p);
        }
        if (ok && (m.frames != o.frames || m.audio_samples != o.audio_samples || m.audio_channels != o.audio_channels)) {
            CHECK(0, "%s %s: %d frames, %lld x %d samples; one rank %d, %lld x %d", name, spec, m.frames,
                  (long long)m.audio_samples, m.audio_channels, o.frames, (long long)o.audio_samples, o.audio_channels);
            ok = 0;
        }
        if (ok) {
            double worst = INFINITY, snr = INFINITY;
            const int64_t fr = (int64_t)m.width * m.height * 3;
            for (int f = 0; f < m.frames; f++) worst = fmin(worst, test_psnr(o.pixels + f * fr, m.pixels + f * fr, fr, 1.0));
            for (int c = 0; c < m.audio_channels; c++) {
                double se = 0, sig = 0;
                for (int64_t i = 0; i < m.audio_samples; i++) {
                    const double w = o.audio[i * m.audio_channels + c], d = m.audio[i * m.audio_channels + c] - w;
                    se += d * d, sig += w * w;
                }
                snr = fmin(snr, se == 0 ? INFINITY : 10 * log10(sig / se));
            }
            int group = dl_comm_size(pl.replica_comm);
            CHECK(worst >= 50, "%s %s: worst frame PSNR %.1f dB < 50 against one rank", name, spec, worst);
            CHECK(snr >= 50, "%s %s: worst channel's waveform SNR %.1f dB < 50 against one rank", name, spec, snr);
            CHECK(tm.ranks == group, "%s %s: %d of %d ranks confirmed the decided steps", name, spec, tm.ranks, group);
            CHECK(tm.denoiser_calls == tr.denoiser_calls && tm.cached_steps == tr.cached_steps && tm.cached_steps > 0,
                  "%s %s: %d calls / %d cached vs %d / %d on one rank", name, spec, tm.denoiser_calls, tm.cached_steps,
                  tr.denoiser_calls, tr.cached_steps);
            char q[64];
            snprintf(q, sizeof q, isinf(worst) ? "identical frames" : "worst frame %.1f dB", worst);
            printf("  %-10s %-22s pipeline (replica %d, calibrated): %s, waveform %.1f dB vs one rank, %d calls + %d cached, "
                   "%d ranks agree\n", name, spec, pl.replica, q, snr, tm.denoiser_calls, tm.cached_steps, tm.ranks);
        }
        dl_media_free(&m), dl_media_free(&o);
    }
    CHECK(all_ok(world, ok), "%s %s: a rank failed", name, spec);
    dl_par_place_free(&pl);
}

int main(void) {
    dl_comm *world;
    if (dl_comm_world(&world) != DL_OK) {
        fprintf(stderr, "test_parallel: %s\n", dl_last_error());
        return 1;
    }
    g_rank = dl_comm_rank(world);
    if (g_rank == 0) printf("test_parallel: %d rank(s)\n", dl_comm_size(world));
    comm_checks(world);
    model(world, DATA_DIR "/flux/dev", "parity-dev");
    model(world, DATA_DIR "/flux/schnell", "parity-sch");
    model(world, SOURCE_DIR "/models/difflet-tiny", "tiny");
    pipelines(world);
    wan_model(world, DATA_DIR "/wan/a", "wan-a", 3, 8, 12);
    wan_model(world, DATA_DIR "/wan/b", "wan-b", 2, 6, 4);
    qwen_model(world, DATA_DIR "/qwenimage/a", "qwen-a", 4, 6);
    qwen_model(world, DATA_DIR "/qwenimage/b", "qwen-b", 4, 2);
    hunyuan_model(world, DATA_DIR "/hunyuan/a", "hunyuan-a", 2, 4, 6);
    hunyuan_model(world, DATA_DIR "/hunyuan/b", "hunyuan-b", 4, 3, 5);
    stdit3_model(world, DATA_DIR "/opensora/a", "stdit3-a", 10, 8, 12, 10, 24);
    stdit3_model(world, DATA_DIR "/opensora/b", "stdit3-b", 5, 6, 6, 3, 9);
    opensora_promotion(world);
    /* LTX-2: a (interleaved RoPE, caption projections), b (split RoPE, gated attention, prompt
     * adaLN, 2 x 2 patches, perturbed_attn), the pipeline's transformer; 14 / 15 / 192 video
     * tokens (uneven shards over 2, 3 and 4 ranks) */
    ltx2_model(world, DATA_DIR "/ltx2/transformer_a", "ltx2-a", (dl_ltx2_transformer_shape){2, 1, 7, 5, 6, 24.0});
    ltx2_model(world, DATA_DIR "/ltx2/transformer_b", "ltx2-b", (dl_ltx2_transformer_shape){3, 2, 10, 7, 6, 25.0});
    ltx2_model(world, DATA_DIR "/ltx2/pipe", "ltx2-pipe", (dl_ltx2_transformer_shape){3, 8, 8, 9, 16, 24.0});
    /* layouts the parser refuses, by name */
    dl_par_config pc;
    CHECK(dl_par_parse("tp=0", &pc) != DL_OK, "tp=0 accepted");
    CHECK(dl_par_parse("cp=2:spiral", &pc) != DL_OK && strstr(dl_last_error(), "spiral"), "unknown cp mode accepted");
    CHECK(dl_par_parse("pp=2", &pc) != DL_OK && strstr(dl_last_error(), "pp"), "unknown key accepted");
    CHECK(dl_par_parse("cfg=3", &pc) != DL_OK, "cfg=3 accepted");
    char why[512];
    dl_par_parse("tp=2,cfg=2", &pc);
    CHECK(dl_par_check(&pc, 1, 4, why, sizeof why) != NULL, "cfg=2 accepted for a one-pass pipeline");
    CHECK(dl_par_check(&pc, 2, 2, why, sizeof why) != NULL, "4-rank layout accepted on 2 ranks");
    dl_par_parse("sp", &pc);
    CHECK(dl_par_check(&pc, 1, 1, why, sizeof why) != NULL, "sp without tp accepted");
    int failed = !all_ok(world, g_fail == 0);
    int rc = g_rank == 0 ? test_done("test_parallel") : (g_fail ? 1 : 0);
    dl_comm_finalize();
    return failed ? 1 : rc;
}
