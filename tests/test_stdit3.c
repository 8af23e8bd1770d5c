/* STDiT3 (OpenSora 1.2's denoiser) against the reference (tests/data/opensora/{a,b}/
 * vectors.safetensors, dumped from Open-Sora v1.2.0 by the oracle): two tiny
 * random-weight configs (a: depth 2, hidden 64, 4 heads, patch (1, 2, 2) over
 * 10x8x12 latents; b: depth 3, hidden 96, 3 heads, patch (2, 2, 2) over 5x6x6:
 * padded to the patch and cropped back). The reference ran a batch of two samples
 * with their own latents, timesteps and captions; each runs here alone. f32: every
 * intermediate the reference dumps and the output <= 1e-4 x max|ref|, naming the
 * first that diverges; bf16: the output's PSNR; batched CFG against one-branch
 * calls; a compiled program against the checkpoint; the probe; the refusals. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/artifact.h"
#include "difflet/opensora.h"
#include "test_util.h"

/* one reference sample's inputs */
typedef struct {
    dl_checkpoint *vec;
    int b;                          /* the sample */
    int64_t lat[3], T, Ccap, C, n;  /* latent grid, caption rows and width, channels, latent values */
    float *x, *y, *want;            /* [C, F, H, W], [T, Ccap], [Cout, F, H, W] */
    int64_t nout;
    dl_stdit3_cond cond;
    float *ts, *yl, *fps, *hh, *ww;
} sample;

/* an int64 vector (y_lens) as floats */
static float *int_vec(const dl_checkpoint *ck, const char *name) {
    const dl_st_tensor *t = dl_ckpt_find(ck, name);
    float *p = t && t->dtype == DL_ST_I64 ? malloc((size_t)t->numel * sizeof *p) : NULL;
    for (int64_t i = 0; p && i < t->numel; i++) {
        int64_t v;
        memcpy(&v, (const char *)t->data + i * 8, 8);
        p[i] = (float)v;
    }
    if (!p) fprintf(stderr, "no int64 vector %s\n", name);
    return p;
}

static void sample_free(sample *s) {
    free(s->x), free(s->y), free(s->want), free(s->ts), free(s->yl), free(s->fps), free(s->hh), free(s->ww);
    dl_ckpt_free(s->vec);
}

static int sample_load(sample *s, const char *v, int b) {
    char path[256];
    memset(s, 0, sizeof *s);
    s->b = b;
    snprintf(path, sizeof path, DATA_DIR "/opensora/%s/vectors.safetensors", v);
    if (dl_ckpt_open(&s->vec, path, "vectors") != DL_OK) {
        CHECK(0, "%s: %s", path, dl_last_error());
        return 0;
    }
    int64_t xs[8] = {0}, ys[8] = {0}, os[8] = {0}, nx, ny, no;
    float *x = test_vec(s->vec, "stdit3.x", &nx, xs), *y = test_vec(s->vec, "stdit3.y", &ny, ys);
    float *o = test_vec(s->vec, "stdit3.out", &no, os);
    s->ts = test_vec(s->vec, "stdit3.timestep", NULL, NULL), s->yl = int_vec(s->vec, "stdit3.y_lens");
    s->fps = test_vec(s->vec, "stdit3.fps", NULL, NULL), s->hh = test_vec(s->vec, "stdit3.height", NULL, NULL);
    s->ww = test_vec(s->vec, "stdit3.width", NULL, NULL);
    if (!x || !y || !o || !s->ts || !s->yl || !s->fps || !s->hh || !s->ww) {
        free(x), free(y), free(o);
        CHECK(0, "%s: vectors missing", v);
        return 0;
    }
    s->C = xs[1], s->lat[0] = xs[2], s->lat[1] = xs[3], s->lat[2] = xs[4];
    s->n = nx / 2, s->T = ys[2], s->Ccap = ys[3], s->nout = no / 2;
    s->x = malloc((size_t)s->n * 4), s->y = malloc((size_t)(s->T * s->Ccap) * 4), s->want = malloc((size_t)s->nout * 4);
    memcpy(s->x, x + b * s->n, (size_t)s->n * 4);
    memcpy(s->y, y + b * s->T * s->Ccap, (size_t)(s->T * s->Ccap) * 4);
    memcpy(s->want, o + b * s->nout, (size_t)s->nout * 4);
    free(x), free(y), free(o);
    s->cond = (dl_stdit3_cond){.y = s->y, .valid = (int64_t)s->yl[b], .timestep = s->ts[b], .fps = s->fps[0],
                               .height = s->hh[0], .width = s->ww[0]};
    return 1;
}

static int open_dir(dl_model_dir **md, const char *v) {
    char path[256];
    snprintf(path, sizeof path, DATA_DIR "/opensora/%s", v);
    if (dl_model_dir_open(md, path) != DL_OK) {
        CHECK(0, "open %s: %s", path, dl_last_error());
        return 0;
    }
    return 1;
}

static dl_status load(dl_stdit3 **m, dl_model_dir *md, const sample *s, dl_dtype dt, dl_wsrc *src, int batch) {
    return dl_stdit3_load(m, md, "transformer", s->lat[0], s->lat[1], s->lat[2], s->T, dt, src, NULL, batch);
}

/* ---- the intermediates -------------------------------------------------------------- */

typedef struct {
    const sample *s;
    const char *v;
    int seen;
    char first[32];                 /* the first intermediate over the bound */
    double worst;
} tap_state;

static void on_tap(void *ctx, const char *name, const void *data, dl_dtype dt, int64_t rows, int64_t cols) {
    tap_state *t = ctx;
    const sample *s = t->s;
    char vn[64];
    snprintf(vn, sizeof vn, "stdit3.%s", name);
    int64_t n = 0, sh[8] = {0};
    float *ref = test_vec(s->vec, vn, &n, sh);
    if (!ref) {
        CHECK(0, "%s: no reference for %s", t->v, name);
        return;
    }
    const int64_t want = rows * cols;
    int64_t off = 0;
    if (!strcmp(name, "y_tokens")) /* both samples' valid tokens, concatenated */
        off = s->b ? (int64_t)s->yl[0] * cols : 0;
    else if (strcmp(name, "pos_emb"))
        off = s->b * (n / 2); /* [2, ...]: this sample's half */
    float *got = malloc((size_t)want * 4);
    for (int64_t i = 0; i < want; i++)
        got[i] = dt == DL_F32 ? ((const float *)data)[i] : dl_bf16_to_f32(((const uint16_t *)data)[i]);
    double e = off + want <= n ? test_rel_err(got, ref + off, want) : INFINITY;
    printf("    %-12s [%lld, %lld] max err %.2e of max|ref|\n", name, (long long)rows, (long long)cols, e);
    CHECK(e <= 1e-4, "%s sample %d: %s differs by %.3g of max|ref| (%lld values; reference %lld)", t->v, s->b, name, e,
          (long long)want, (long long)n);
    if (e > 1e-4 && !t->first[0]) snprintf(t->first, sizeof t->first, "%s", name);
    t->worst = fmax(t->worst, e);
    t->seen++;
    free(got), free(ref);
}

/* f32: every intermediate and the output; bf16: the output's PSNR against f32 */
static void test_parity(const char *v, int b, int depth, dl_dtype dt) {
    sample s;
    dl_model_dir *md;
    if (!sample_load(&s, v, b)) return;
    if (!open_dir(&md, v)) {
        sample_free(&s);
        return;
    }
    dl_stdit3 *m = NULL;
    if (load(&m, md, &s, dt, NULL, 1) != DL_OK) {
        CHECK(0, "%s load: %s", v, dl_last_error());
    } else {
        tap_state ts = {.s = &s, .v = v};
        if (dt == DL_F32) {
            printf("  stdit3 %s sample %d f32 intermediates:\n", v, b);
            dl_stdit3_set_tap(m, on_tap, &ts);
        }
        float *got = calloc((size_t)s.nout, 4);
        CHECK(dl_stdit3_run(m, s.x, &s.cond, got) == DL_OK, "%s run: %s", v, dl_last_error());
        double mn = INFINITY, mx = -INFINITY;
        for (int64_t i = 0; i < s.nout; i++) mn = fmin(mn, s.want[i]), mx = fmax(mx, s.want[i]);
        double e = test_rel_err(got, s.want, s.nout), p = test_psnr(got, s.want, s.nout, mx - mn);
        printf("  stdit3 %s sample %d %s output: max err %.2e of max|ref|, PSNR %.1f dB (range %.2f)\n", v, b,
               dl_dtype_name(dt), e, p, mx - mn);
        if (dt == DL_F32) {
            /* 9 conditioning / embedding taps, one per block, final */
            CHECK(ts.seen == 9 + 2 * depth, "%s: %d intermediates seen", v, ts.seen);
            CHECK(e <= 1e-4, "%s f32 output: %.3g (first divergent intermediate: %s)", v, e, ts.first[0] ? ts.first : "none");
        } else {
            CHECK(p >= 30, "%s bf16 output: %.1f dB", v, p);
            /* what bf16 arithmetic alone costs: against f32 at the timestep rounded as bf16 rounds it */
            dl_stdit3 *m32 = NULL;
            dl_stdit3_cond c = s.cond;
            c.timestep = dl_bf16_to_f32(dl_f32_to_bf16(c.timestep));
            float *ref = calloc((size_t)s.nout, 4);
            if (load(&m32, md, &s, DL_F32, NULL, 1) == DL_OK && dl_stdit3_run(m32, s.x, &c, ref) == DL_OK) {
                double p2 = test_psnr(got, ref, s.nout, mx - mn);
                printf("  stdit3 %s sample %d bf16 output against f32 at the bf16 timestep %g: PSNR %.1f dB\n", v, b, c.timestep, p2);
                CHECK(p2 >= 45, "%s bf16 against f32 at the same timestep: %.1f dB", v, p2);
            } else
                CHECK(0, "%s f32 at the bf16 timestep: %s", v, dl_last_error());
            dl_stdit3_free(m32);
            free(ref);
        }
        free(got);
    }
    dl_stdit3_free(m);
    dl_model_dir_free(md);
    sample_free(&s);
}

/* ---- batched CFG ------------------------------------------------------------------ */

/* One batch-2 program gives each branch what the one-branch program gives (the same
 * linears over twice the rows, attention per branch): sample 0's latents and
 * timestep with sample 0's and sample 1's captions (their own valid lengths) */
static void test_batch(const char *v, dl_dtype dt) {
    sample s0, s1;
    dl_model_dir *md;
    if (!sample_load(&s0, v, 0)) return;
    if (!sample_load(&s1, v, 1) || !open_dir(&md, v)) {
        sample_free(&s0);
        return;
    }
    dl_stdit3_cond c1 = s1.cond;
    c1.timestep = s0.cond.timestep; /* the branches share everything but the caption */
    dl_stdit3 *one = NULL, *two = NULL;
    const int64_t n = s0.nout;
    float *a0 = malloc((size_t)n * 4), *a1 = malloc((size_t)n * 4), *b0 = malloc((size_t)n * 4), *b1 = malloc((size_t)n * 4),
          *c0 = malloc((size_t)n * 4);
    int ok = load(&one, md, &s0, dt, NULL, 1) == DL_OK && load(&two, md, &s0, dt, NULL, 2) == DL_OK;
    CHECK(ok, "%s batch load: %s", v, dl_last_error());
    if (ok) {
        ok = dl_stdit3_run(one, s0.x, &s0.cond, a0) == DL_OK && dl_stdit3_run(one, s0.x, &c1, a1) == DL_OK &&
             dl_stdit3_run2(two, s0.x, &s0.cond, &c1, b0, b1) == DL_OK && dl_stdit3_run(two, s0.x, &s0.cond, c0) == DL_OK;
        CHECK(ok, "%s batch run: %s", v, dl_last_error());
        double e0 = test_rel_err(b0, a0, n), e1 = test_rel_err(b1, a1, n), e2 = test_rel_err(c0, a0, n), d = test_rel_err(a1, a0, n);
        int bitwise = !memcmp(a0, b0, (size_t)n * 4) && !memcmp(a1, b1, (size_t)n * 4) && !memcmp(a0, c0, (size_t)n * 4);
        printf("  stdit3 %s batched CFG %s: branch 0 %.2g, branch 1 %.2g, one-branch call %.2g (%s; the branches differ by %.2g)\n",
               v, dl_dtype_name(dt), e0, e1, e2, bitwise ? "bitwise equal" : "not bitwise", d);
        double bound = dt == DL_F32 ? 1e-6 : 1e-2;
        CHECK(ok && e0 <= bound && e1 <= bound && e2 <= bound && d > 0.01, "%s batch: %g %g %g (branches %g)", v, e0, e1, e2, d);
        CHECK(dl_stdit3_batch(two) == 2 && dl_stdit3_run2(one, s0.x, &s0.cond, &c1, b0, b1) == DL_ERR_INVALID,
              "run2 needs a batch-2 program");
        dl_stdit3_cond c2 = c1;
        c2.timestep += 1.f;
        CHECK(dl_stdit3_run2(two, s0.x, &s0.cond, &c2, b0, b1) == DL_ERR_INVALID, "branches with different timesteps refused");
    }
    dl_stdit3_free(one), dl_stdit3_free(two);
    free(a0), free(a1), free(b0), free(b1), free(c0);
    dl_model_dir_free(md);
    sample_free(&s0), sample_free(&s1);
}

/* ---- programs ---------------------------------------------------------------------- */

/* compile (record into an artifact) then load from it: the same output bytes; and the
 * tensor-parallel slices of the fused projections record under names of their own */
static void test_program(const char *v) {
    sample s;
    dl_model_dir *md;
    if (!sample_load(&s, v, 0)) return;
    if (!open_dir(&md, v)) {
        sample_free(&s);
        return;
    }
    const dl_dit_split tp2 = {.tp = 2, .cp = 1, .tp_rank = 1};
    for (int k = 0; k < 2; k++) {
        char dir[] = "/tmp/difflet_stdit3_prog_XXXXXX";
        if (!mkdtemp(dir)) {
            CHECK(0, "mkdtemp");
            break;
        }
        dl_checkpoint *ck = NULL;
        dl_artifact_writer *w = NULL;
        dl_artifact *art = NULL;
        dl_stdit3 *m1 = NULL, *m2 = NULL, *m3 = NULL;
        const dl_dit_split *sp = k ? &tp2 : NULL;
        int ok = dl_model_dir_checkpoint(md, "transformer", &ck) == DL_OK && dl_artifact_writer_open(&w, dir) == DL_OK;
        dl_wsrc rec = {.ck = ck, .rec = w};
        ok = ok && dl_stdit3_load(&m1, md, "transformer", s.lat[0], s.lat[1], s.lat[2], s.T, DL_F32, &rec, sp, 1) == DL_OK;
        if (w) ok = dl_artifact_writer_finish(w, "{}", rec.arena, 0) == DL_OK && ok;
        ok = ok && dl_artifact_open(&art, dir, 1) == DL_OK;
        dl_wsrc from = {.art = art};
        ok = ok && dl_stdit3_load(&m2, md, "transformer", s.lat[0], s.lat[1], s.lat[2], s.T, DL_F32, &from, sp, 1) == DL_OK;
        CHECK(ok, "%s %s program: %s", v, k ? "tp=2 rank 1" : "one-rank", dl_last_error());
        if (ok && !k) {
            float *a = malloc((size_t)s.nout * 4), *b = malloc((size_t)s.nout * 4);
            ok = load(&m3, md, &s, DL_F32, NULL, 1) == DL_OK && dl_stdit3_run(m3, s.x, &s.cond, a) == DL_OK &&
                 dl_stdit3_run(m2, s.x, &s.cond, b) == DL_OK;
            CHECK(ok && !memcmp(a, b, (size_t)s.nout * 4), "%s: program and checkpoint outputs differ: %s", v, dl_last_error());
            free(a), free(b);
        }
        if (ok && k) { /* a split model without communicators (compiled, not placed) cannot run */
            float *a = malloc((size_t)s.nout * 4);
            CHECK(dl_stdit3_run(m2, s.x, &s.cond, a) == DL_ERR_INVALID, "a tp=2 model ran without its communicator");
            free(a);
        }
        dl_stdit3_free(m1), dl_stdit3_free(m2), dl_stdit3_free(m3);
        dl_artifact_close(art);
        dl_ckpt_free(ck);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "rm %s", dir);
    }
    dl_model_dir_free(md);
    sample_free(&s);
}

/* ---- the probe ------------------------------------------------------------------------- */

static void test_probe(const char *v) {
    sample s;
    dl_model_dir *md;
    if (!sample_load(&s, v, 0)) return;
    if (!open_dir(&md, v)) {
        sample_free(&s);
        return;
    }
    dl_stdit3_probe *p = NULL;
    if (dl_stdit3_probe_load(&p, md, "transformer", s.lat[0], s.lat[1], s.lat[2], DL_F32, NULL, NULL) != DL_OK) {
        CHECK(0, "%s probe load: %s", v, dl_last_error());
    } else {
        double sc[6] = {-1, -1, -1, -1, -1, -1};
        float *x2 = malloc((size_t)s.n * 4);
        for (int64_t i = 0; i < s.n; i++) x2[i] = s.x[i] * 0.9f + 0.05f;
        dl_stdit3_cond later = s.cond;
        later.timestep *= 0.8f;
        int ok = dl_stdit3_probe_run(p, 0, s.x, &s.cond, &sc[0]) == DL_OK && /* first: 0 */
                 dl_stdit3_probe_run(p, 0, s.x, &s.cond, &sc[1]) == DL_OK && /* unchanged: 0 */
                 dl_stdit3_probe_run(p, 0, x2, &s.cond, &sc[2]) == DL_OK &&  /* other latents */
                 dl_stdit3_probe_run(p, 0, x2, &later, &sc[3]) == DL_OK &&   /* other timestep */
                 dl_stdit3_probe_run(p, 1, s.x, &s.cond, &sc[4]) == DL_OK;   /* slot 1's first */
        dl_stdit3_probe_reset(p);
        ok = ok && dl_stdit3_probe_run(p, 0, s.x, &s.cond, &sc[5]) == DL_OK;
        CHECK(ok, "%s probe run: %s", v, dl_last_error());
        printf("  stdit3 %s probe scores: first %g, unchanged %g, latents %.3g, timestep %.3g, slot 1 first %g, after reset %g\n",
               v, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]);
        CHECK(sc[0] == 0 && sc[1] == 0 && sc[2] > 0 && sc[3] > 0 && sc[4] == 0 && sc[5] == 0, "%s probe scores", v);
        CHECK(dl_stdit3_probe_run(p, 2, s.x, &s.cond, &sc[0]) == DL_ERR_INVALID, "slot 2 refused");
        later.timestep = NAN;
        CHECK(dl_stdit3_probe_run(p, 0, s.x, &later, &sc[0]) == DL_ERR_INVALID, "non-finite timestep refused by the probe");
        free(x2);
    }
    dl_stdit3_probe_free(p);
    dl_model_dir_free(md);
    sample_free(&s);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* a copy of model a with one transformer config field changed (json: the value) */
static dl_status load_with(const char *key, const char *json, const sample *s, const char *expect) {
    char dir[] = "/tmp/difflet_stdit3_cfg_XXXXXX", cfgp[300];
    if (!mkdtemp(dir)) return DL_ERR_IO;
    snprintf(cfgp, sizeof cfgp, DATA_DIR "/opensora/a/transformer/config.json");
    size_t len;
    char *txt = NULL;
    dl_status st = dl_file_read(cfgp, 1 << 20, &txt, &len);
    cJSON *cfg = st == DL_OK ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!cfg) return DL_ERR_IO;
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, key);
    cJSON_AddItemToObject(cfg, key, cJSON_Parse(json));
    char *out = cJSON_Print(cfg);
    test_write_folder(dir, "{\"_class_name\": \"OpenSoraPipeline\", \"transformer\": [\"opensora\", \"STDiT3\"]}", "transformer",
                      out, DATA_DIR "/opensora/a/transformer/model.safetensors", NULL, 0);
    free(out);
    cJSON_Delete(cfg);
    dl_model_dir *md;
    dl_stdit3 *m = NULL;
    dl_status s2 = dl_model_dir_open(&md, dir);
    if (s2 == DL_OK) s2 = load(&m, md, s, DL_F32, NULL, 1);
    CHECK(s2 != DL_OK && strstr(dl_last_error(), expect), "%s = %s: %s", key, json, dl_last_error());
    dl_stdit3_free(m);
    if (md) dl_model_dir_free(md);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
    return s2;
}

static void test_refusals(void) {
    sample s;
    dl_model_dir *md;
    if (!sample_load(&s, "a", 0)) return;
    if (!open_dir(&md, "a")) {
        sample_free(&s);
        return;
    }
    dl_stdit3 *m = NULL;
    float *out = malloc((size_t)s.nout * 4);
    if (load(&m, md, &s, DL_F32, NULL, 1) == DL_OK) {
        dl_stdit3_cond c = s.cond;
        c.valid = 0;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID, "valid 0 accepted");
        c.valid = s.T + 1;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID, "valid > txt_len accepted");
        c = s.cond, c.timestep = INFINITY;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID && strstr(dl_last_error(), "finite"), "inf timestep: %s",
              dl_last_error());
        c.timestep = NAN;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID, "NaN timestep accepted");
        c = s.cond, c.height = 0;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID, "height 0 accepted");
        c = s.cond, c.y = NULL;
        CHECK(dl_stdit3_run(m, s.x, &c, out) == DL_ERR_INVALID, "no caption accepted");
        CHECK(dl_stdit3_run(m, s.x, &s.cond, out) == DL_OK, "a good call after the refusals: %s", dl_last_error());
        CHECK(test_rel_err(out, s.want, s.nout) <= 1e-4, "a good call after the refusals differs");
        CHECK(dl_stdit3_caption_channels(m) == s.Ccap && dl_stdit3_max_length(m) == 16 && dl_stdit3_in_channels(m) == 4 &&
                  dl_stdit3_out_channels(m) == 8 && dl_stdit3_heads(m) == 4 && dl_stdit3_batch(m) == 1,
              "sizes");
        /* the null caption: y_embedding as stored */
        int64_t n;
        dl_checkpoint *ck;
        if (dl_model_dir_checkpoint(md, "transformer", &ck) == DL_OK) {
            float *ye = test_vec(ck, "y_embedder.y_embedding", &n, NULL);
            CHECK(ye && n == 16 * s.Ccap && !memcmp(ye, dl_stdit3_null_caption(m), (size_t)n * 4), "null caption");
            free(ye);
            dl_ckpt_free(ck);
        }
        dl_stdit3_free(m);
    } else
        CHECK(0, "load: %s", dl_last_error());
    m = NULL;
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 17, DL_F32, NULL, NULL, 1) == DL_ERR_INVALID &&
              strstr(dl_last_error(), "model_max_length"),
          "txt_len > model_max_length: %s", dl_last_error());
    CHECK(dl_stdit3_load(&m, md, "transformer", 0, 8, 12, 16, DL_F32, NULL, NULL, 1) == DL_ERR_INVALID, "empty grid accepted");
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 16, DL_F32, NULL, NULL, 3) == DL_ERR_INVALID, "batch 3 accepted");
    CHECK(dl_stdit3_load(&m, md, "vae", 10, 8, 12, 16, DL_F32, NULL, NULL, 1) == DL_ERR_UNSUPPORTED &&
              strstr(dl_last_error(), "not STDiT3"),
          "the VAE as a transformer: %s", dl_last_error());
    /* splits: a has 4 heads and 10 frames x 24 positions after patching */
    dl_dit_split tp3 = {.tp = 3, .cp = 1}, spl = {.tp = 2, .cp = 1, .sp = 1}, cp11 = {.tp = 1, .cp = 11};
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 16, DL_F32, NULL, &tp3, 1) == DL_ERR_INVALID &&
              strstr(dl_last_error(), "not divisible by tp=3"),
          "tp=3 for 4 heads: %s", dl_last_error());
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 16, DL_F32, NULL, &spl, 1) == DL_ERR_UNSUPPORTED &&
              strstr(dl_last_error(), "refused") && strstr(dl_last_error(), "(sp)"),
          "sp: %s", dl_last_error());
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 16, DL_F32, NULL, &cp11, 1) == DL_ERR_INVALID &&
              strstr(dl_last_error(), "refused") && strstr(dl_last_error(), "10 latent frames"),
          "cp=11 for 10 frames: %s", dl_last_error());
    dl_dit_split cp4 = {.tp = 1, .cp = 4, .cp_mode = DL_CP_ULYSSES, .cp_rank = 3};
    CHECK(dl_stdit3_load(&m, md, "transformer", 10, 8, 12, 16, DL_F32, NULL, &cp4, 1) == DL_OK,
          "cp=4 (Ulysses' head condition does not apply to DSP): %s", dl_last_error());
    dl_stdit3_free(m);
    /* config fields refused by name */
    load_with("skip_y_embedder", "true", &s, "skip_y_embedder");
    load_with("qk_norm", "false", &s, "qk_norm");
    load_with("num_heads", "3", &s, "not divisible by num_heads");
    load_with("patch_size", "[1, 0, 2]", &s, "patch_size");
    load_with("hidden_size", "\"64\"", &s, "hidden_size");
    load_with("mlp_ratio", "2.0", &s, "mlp.fc1.weight"); /* the checkpoint's shape against the config's */
    free(out);
    dl_model_dir_free(md);
    sample_free(&s);
}

int main(void) {
    test_parity("a", 0, 2, DL_F32);
    test_parity("a", 1, 2, DL_F32);
    test_parity("b", 0, 3, DL_F32);
    test_parity("b", 1, 3, DL_F32);
    for (int b = 0; b < 2; b++) {
        test_parity("a", b, 2, DL_BF16);
        test_parity("b", b, 3, DL_BF16);
    }
    test_batch("a", DL_F32);
    test_batch("b", DL_F32);
    test_batch("b", DL_BF16);
    test_program("a");
    test_probe("a");
    test_probe("b");
    test_refusals();
    return test_done("test_stdit3");
}
