/* LTX2Vocoder (diffusers 0.42, pipelines/ltx2/vocoder.py): a HiFi-GAN / BigVGAN
 * style generator from a mel spectrogram [in_channels, T] (time last) to a
 * waveform [out_channels, samples], channels-first activations [C, T].
 *
 *   conv_in (k 7, pad 3) -> for each stage i: [leaky_relu(slope) when act_fn is
 *     leaky_relu] -> ConvTranspose1d(C, C / 2, k_i, stride s_i, pad (k_i - s_i) / 2)
 *     -> the mean of the stage's resnets, each run on the upsampled signal ->
 *   act_out -> conv_out (k 7, pad 3, bias when final_bias) -> tanh | clamp(-1, 1) | none
 *   resnet (kernel k, dilations d_0..): for each d: x += conv2(act2(conv1_d(act1(x))))
 *     with zero "same" padding (d (k - 1) split floor / ceil), conv2 undilated
 *   activations: leaky_relu(slope); snake x + sin^2(x e^alpha) / (e^alpha + 1e-9);
 *     snakebeta x + sin^2(x e^alpha) / (e^beta + 1e-9); with antialias each one is
 *     AntiAliasAct1d: UpSample1d (replicate pad K/r - 1, transposed conv with the
 *     checkpoint's filter at stride r, times r, cut to r T), the activation,
 *     DownSample1d (replicate pad K/2 + K%2 - 1 | K/2, filter at stride r)
 *   act_out: leaky_relu(0.01) for leaky_relu (diffusers ignores the slope there);
 *     for snake / snakebeta always the anti-aliased snakebeta
 *
 * Convolutions run through oneDNN on host-padded inputs. A dilated conv (dilation
 * d) is an undilated 2-D conv over the padded signal viewed as [Tq / d, d] with a
 * [k, 1] kernel (Tq the padded length rounded up to a multiple of d), so every
 * conv is one oneDNN call with no kernel change; its output [To / d, d] is the
 * signal in order (To >= T; positions past T are never read). The anti-aliased
 * activation and the snakes are plain C loops (per channel, per-thread scratch).
 *
 * LTX2VocoderWithBWE (LTX-2.3) is two such generators (weights under `vocoder.`
 * and `bwe_generator.`, config keys plain and `bwe_`-prefixed) joined by a causal
 * STFT log-mel and a Hann-sinc resampler: see its section at the end. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "models/ltx2_audio_impl.h"

enum { MAX_STAGES = 8, MAX_RK = 8, MAX_DIL = 8 };

typedef enum { ACT_LEAKY, ACT_SNAKE, ACT_SNAKEBETA } act_kind;
typedef enum { FIN_NONE, FIN_TANH, FIN_CLAMP } fin_kind;

/* a 1-D conv at length T: padded [cin, tq] (signal at lp) -> [cout, to], positions [0, T) real */
typedef struct {
    dl_conv *c;
    int64_t cin, cout, k, d, T, tq, to, lp;
} conv1;

/* one activation over C channels */
typedef struct {
    act_kind kind;
    float slope;
    float *ea, *inv;      /* [C] e^alpha, 1 / (e^beta or e^alpha + 1e-9) */
    float *fup, *fdown;   /* [K] anti-aliasing filters, NULL: none */
} act;

typedef struct {
    int nd;
    conv1 c1[MAX_DIL], c2[MAX_DIL];
    act a1[MAX_DIL], a2[MAX_DIL];
} rblock;

typedef struct {
    dl_conv *up; /* ConvTranspose1d [cin, 1, tin] -> [cout, 1, tout] */
    int64_t cin, cout, tin, tout;
    rblock rb[MAX_RK];
} stage;

typedef struct bwe_part bwe_part;

/* one generator (LTX2Vocoder), or with bwe set an LTX2VocoderWithBWE whose
 * generators are bwe->g1, bwe->g2 (then only dt, T, in_ch, out_ch, rate, samples
 * and arena_bytes of this struct are used) */
struct dl_ltx2_vocoder {
    dl_dtype dt;
    char wp[32]; /* weight name prefix: "", "vocoder.", "bwe_generator." */
    bwe_part *bwe;
    int64_t in_ch, out_ch, rate, T, samples;
    act_kind kind;
    int anti, R, K, nst, nrk;
    float slope;
    fin_kind fin;
    conv1 cin, cout;
    stage st[MAX_STAGES];
    act aout;
    /* activations (one arena) */
    float *x;    /* f32 [C, T_i]: the stream; the mean of a stage's resnets */
    float *h;    /* f32 [C, T_i]: the upsampled signal */
    float *r;    /* f32 [C, T_i]: one resnet's running sum */
    void *p;     /* dt: padded conv input */
    void *y;     /* dt: conv output */
    float *scr;  /* f32 [threads, R T_max]: anti-aliasing scratch */
    int64_t scr_n;
    int nthreads;
    void *arena;
    size_t arena_bytes;
};

int64_t dl_ltx2_vocoder_in_channels(const dl_ltx2_vocoder *v) { return v->in_ch; }
int64_t dl_ltx2_vocoder_out_channels(const dl_ltx2_vocoder *v) { return v->out_ch; }
int64_t dl_ltx2_vocoder_sample_rate(const dl_ltx2_vocoder *v) { return v->rate; }
int64_t dl_ltx2_vocoder_samples(const dl_ltx2_vocoder *v) { return v->samples; }
size_t dl_ltx2_vocoder_activation_bytes(const dl_ltx2_vocoder *v) { return v->arena_bytes; }

static void act_free(act *a) { free(a->ea), free(a->inv), free(a->fup), free(a->fdown); }

static void bwe_free(bwe_part *b);

void dl_ltx2_vocoder_free(dl_ltx2_vocoder *v) {
    if (!v) return;
    bwe_free(v->bwe);
    dl_conv_free(v->cin.c), dl_conv_free(v->cout.c);
    for (int i = 0; i < MAX_STAGES; i++) {
        stage *s = &v->st[i];
        dl_conv_free(s->up);
        for (int j = 0; j < MAX_RK; j++)
            for (int d = 0; d < MAX_DIL; d++) {
                dl_conv_free(s->rb[j].c1[d].c), dl_conv_free(s->rb[j].c2[d].c);
                act_free(&s->rb[j].a1[d]), act_free(&s->rb[j].a2[d]);
            }
    }
    act_free(&v->aout);
    dl_aligned_free(v->arena);
    free(v);
}

/* ---- loading ---------------------------------------------------------------------- */

typedef struct {
    size_t x, p, y;
} need;
#define GROW(f, v) (nd->f = nd->f > (size_t)(v) ? nd->f : (size_t)(v))

/* Conv1d `<base>.weight` [cout, cin, k] (and `.bias` when `bias`), dilation d, zero
 * "same" padding (pad 3 for k 7 likewise), at length T */
static dl_status conv1_load(dl_ltx2_vocoder *v, conv1 *c, dl_wsrc *ws, const char *base, int64_t cin, int64_t cout,
                            int64_t k, int64_t d, int64_t T, int bias, need *nd) {
    char n[300];
    const int64_t P = d * (k - 1);
    c->cin = cin, c->cout = cout, c->k = k, c->d = d, c->T = T, c->lp = P / 2;
    c->tq = (T + P + d - 1) / d * d, c->to = c->tq - P;
    dl_conv_desc desc = {.ndim = 2, .cin = cin, .cout = cout, .stride = {1, 1}, .dt = v->dt};
    if (d == 1) {
        desc.in[0] = 1, desc.in[1] = c->tq, desc.kernel[0] = 1, desc.kernel[1] = k;
    } else {
        desc.in[0] = c->tq / d, desc.in[1] = d, desc.kernel[0] = k, desc.kernel[1] = 1;
    }
    GROW(p, cin * c->tq);
    GROW(y, cout * c->to);
    const int64_t wsh[3] = {cout, cin, k}, bsh[1] = {cout};
    float *w = NULL, *b = NULL;
    dl_status s;
    snprintf(n, sizeof n, "%s%s.weight", v->wp, base);
    if ((s = dl_param_f32(ws, n, 3, wsh, &w))) return s;
    snprintf(n, sizeof n, "%s%s.bias", v->wp, base);
    if (bias) {
        s = dl_param_f32(ws, n, 1, bsh, &b);
    } else if (dl_ws_find(ws, n)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (final_bias is false)", dl_ws_label(ws), n);
    }
    if (!s) s = dl_conv_new(&c->c, &desc, w, DL_F32, b);
    free(w), free(b);
    return s;
}

/* an activation of `kind` over C channels under `pre` ("resnets.0.acts1.1."):
 * snakes read `alpha` (and `beta` when use_beta) and, anti-aliased, sit under
 * `act.` beside `upsample.filter` / `downsample.filter` [1, 1, K] */
static dl_status act_load(dl_ltx2_vocoder *v, act *a, dl_wsrc *ws, const char *pre, act_kind kind, int use_beta,
                          int anti, float slope, int64_t C) {
    char n[300];
    dl_status s;
    a->kind = kind, a->slope = slope;
    if (kind == ACT_LEAKY) return DL_OK;
    const int64_t csh[1] = {C}, fsh[3] = {1, 1, v->K};
    float *al = NULL, *be = NULL;
    snprintf(n, sizeof n, "%s%s%salpha", v->wp, pre, anti ? "act." : "");
    if ((s = dl_param_f32(ws, n, 1, csh, &al))) return s;
    snprintf(n, sizeof n, "%s%s%sbeta", v->wp, pre, anti ? "act." : "");
    if (use_beta && (s = dl_param_f32(ws, n, 1, csh, &be))) {
        free(al);
        return s;
    }
    a->ea = malloc((size_t)C * 4), a->inv = malloc((size_t)C * 4);
    if (!a->ea || !a->inv) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int64_t c = 0; !s && c < C; c++) { /* as SnakeBeta (logscale): in f32 */
        a->ea[c] = expf(al[c]);
        a->inv[c] = 1.0f / ((use_beta ? expf(be[c]) : a->ea[c]) + 1e-9f);
    }
    free(al), free(be);
    if (s || !anti) return s;
    snprintf(n, sizeof n, "%s%supsample.filter", v->wp, pre);
    if ((s = dl_param_f32(ws, n, 3, fsh, &a->fup))) return s;
    snprintf(n, sizeof n, "%s%sdownsample.filter", v->wp, pre);
    return dl_param_f32(ws, n, 3, fsh, &a->fdown);
}

/* resnet_dilations: a list of n lists of 1..MAX_DIL integers */
static dl_status read_dilations(const cJSON *cfg, const char *file, const char *key, int n, int64_t dil[][MAX_DIL],
                                int *nd) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!a) { /* diffusers' default [[1, 3, 5]] * 3 */
        if (n != 3) return dl_fail(DL_ERR_FORMAT, "`%s`: %s is absent but its kernel sizes have %d entries", file, key, n);
        for (int i = 0; i < 3; i++) dil[i][0] = 1, dil[i][1] = 3, dil[i][2] = 5, nd[i] = 3;
        return DL_OK;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return dl_fail(DL_ERR_FORMAT, "`%s`: %s must be a list of %d lists (one per resnet kernel size)", file, key, n);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) < 1 || cJSON_GetArraySize(e) > MAX_DIL)
            return dl_fail(DL_ERR_FORMAT, "`%s`: %s[%d] must be a list of 1 to %d integers", file, key, i, MAX_DIL);
        nd[i] = cJSON_GetArraySize(e);
        for (int j = 0; j < nd[i]; j++) {
            const cJSON *x = cJSON_GetArrayItem(e, j);
            if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > 64 || x->valuedouble != (int)x->valuedouble)
                return dl_fail(DL_ERR_FORMAT, "`%s`: %s[%d][%d] must be an integer in [1, 64]", file, key, i, j);
            dil[i][j] = (int64_t)x->valuedouble;
        }
    }
    return DL_OK;
}

/* one generator's config defaults: diffusers' LTX2Vocoder, and the two that
 * LTX2VocoderWithBWE builds (its stage-1 `vocoder`, its `bwe_generator`) */
typedef struct {
    int64_t in, hid, out;
    const int64_t *uk, *uf;
    int nuk;
    const char *act, *fin;
    int anti, fbias;
    const char *rate_key; /* not prefixed */
    int64_t rate;
} gen_def;

static const int64_t voc_uk[] = {16, 15, 8, 4, 4}, voc_uf[] = {6, 5, 2, 2, 2};
static const int64_t s1_uk[] = {11, 4, 4, 4, 4, 4}, s1_uf[] = {5, 2, 2, 2, 2, 2};
static const int64_t bwe_uk[] = {12, 11, 4, 4, 4}, bwe_uf[] = {6, 5, 2, 2, 2};
static const gen_def DEF_VOC = {128, 1024, 2, voc_uk, voc_uf, 5, "leaky_relu", "tanh", 0, 1, "output_sampling_rate", 24000};
static const gen_def DEF_S1 = {128, 1536, 2, s1_uk, s1_uf, 6, "snakebeta", NULL, 1, 0, "input_sampling_rate", 16000};
static const gen_def DEF_BWE = {128, 512, 2, bwe_uk, bwe_uf, 5, "snakebeta", NULL, 1, 0, "output_sampling_rate", 48000};

/* "<kp><key>" into b */
static const char *pk(char *b, const char *kp, const char *key) {
    snprintf(b, 64, "%s%s", kp, key);
    return b;
}

/* Builds generator v (v->dt, v->T, v->wp set) from config keys prefixed kp
 * ("" or "bwe_") with defaults df, weights under v->wp; opens *ws from (src, dir,
 * component) once the config is checked, unless already open. */
static dl_status gen_load(dl_ltx2_vocoder *v, const cJSON *cfg, const char *file, const char *kp, const gen_def *df,
                          dl_wsrc **wsp, dl_wsrc *src, dl_model_dir *dir, const char *component) {
    char p[300], kb[16][64];
    const dl_dtype dt = v->dt;
    const char *actn, *fin = NULL;
    dl_status s;
    dl_wsrc *ws = *wsp;
    need nds = {0}, *nd = &nds;
    int64_t hid, ar, ak, uk[MAX_STAGES], uf[MAX_STAGES], rk[MAX_RK], dil[MAX_RK][MAX_DIL];
    int nuk = 0, nuf = 0, nrk = 0, ndil[MAX_RK], fbias;
    double slope;
    static const int64_t rk_def[] = {3, 7, 11};
    if ((s = dl_cfg_int(cfg, file, pk(kb[0], kp, "in_channels"), df->in, &v->in_ch)) ||
        (s = dl_cfg_int(cfg, file, pk(kb[1], kp, "hidden_channels"), df->hid, &hid)) ||
        (s = dl_cfg_int(cfg, file, pk(kb[2], kp, "out_channels"), df->out, &v->out_ch)) ||
        (s = la_cfg_ints(cfg, file, pk(kb[3], kp, "upsample_kernel_sizes"), df->uk, df->nuk, MAX_STAGES, uk, &nuk)) ||
        (s = la_cfg_ints(cfg, file, pk(kb[4], kp, "upsample_factors"), df->uf, df->nuk, MAX_STAGES, uf, &nuf)) ||
        (s = la_cfg_ints(cfg, file, pk(kb[5], kp, "resnet_kernel_sizes"), rk_def, 3, MAX_RK, rk, &nrk)) ||
        (s = read_dilations(cfg, file, pk(kb[6], kp, "resnet_dilations"), nrk, dil, ndil)) ||
        (s = dl_cfg_str(cfg, file, pk(kb[7], kp, "act_fn"), df->act, &actn)) ||
        (s = dl_cfg_float(cfg, file, pk(kb[8], kp, "leaky_relu_negative_slope"), 0.1, &slope)) ||
        (s = dl_cfg_bool(cfg, file, pk(kb[9], kp, "antialias"), df->anti, &v->anti)) ||
        (s = dl_cfg_int(cfg, file, pk(kb[10], kp, "antialias_ratio"), 2, &ar)) ||
        (s = dl_cfg_int(cfg, file, pk(kb[11], kp, "antialias_kernel_size"), 12, &ak)) ||
        (s = dl_cfg_bool(cfg, file, pk(kb[12], kp, "final_bias"), df->fbias, &fbias)) ||
        (s = dl_cfg_int(cfg, file, df->rate_key, df->rate, &v->rate)))
        goto fail;
    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(cfg, pk(kb[13], kp, "final_act_fn"));
    if (!fa) fin = df->fin;
    else if (cJSON_IsString(fa)) fin = fa->valuestring;
    else if (!cJSON_IsNull(fa)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: %sfinal_act_fn must be a string or null", file, kp);
        goto fail;
    }
    v->fin = !fin ? FIN_NONE : !strcmp(fin, "tanh") ? FIN_TANH : !strcmp(fin, "clamp") ? FIN_CLAMP : FIN_NONE;
    if (fin && v->fin == FIN_NONE) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %sfinal_act_fn \"%s\" is not supported (tanh, clamp, null)", file, kp, fin);
        goto fail;
    }
    if (!strcmp(actn, "leaky_relu")) v->kind = ACT_LEAKY;
    else if (!strcmp(actn, "snake")) v->kind = ACT_SNAKE;
    else if (!strcmp(actn, "snakebeta")) v->kind = ACT_SNAKEBETA;
    else {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %sact_fn \"%s\" is not supported (snakebeta, snake, leaky_relu)", file, kp, actn);
        goto fail;
    }
    if (v->kind == ACT_LEAKY && v->anti) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: act_fn leaky_relu with antialias is not supported (diffusers' ResBlock "
                    "nests its second activations' anti-aliasing there)", file);
        goto fail;
    }
    if (nuk != nuf) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: %supsample_kernel_sizes has %d entries, %supsample_factors %d", file, kp, nuk, kp, nuf);
        goto fail;
    }
    if (v->in_ch < 1 || v->in_ch > 8192 || hid < (1 << nuk) || hid > 16384 || v->out_ch < 1 || v->out_ch > 16 || ar < 1 ||
        ar > 8 || ak < ar || ak > 64 || ak / ar < 1 || v->rate < 1 || !isfinite(slope)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: needs in_channels in [1, 8192], hidden_channels in [2^stages, 16384], out_channels "
                    "in [1, 16], antialias_ratio in [1, 8], antialias_kernel_size in [ratio, 64], a positive rate", file);
        goto fail;
    }
    for (int i = 0; i < nuk; i++)
        if (uf[i] < 1 || uk[i] < uf[i] || uk[i] > 256) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: upsampler %d needs 1 <= factor (%lld) <= kernel size (%lld) <= 256", file, i,
                        (long long)uf[i], (long long)uk[i]);
            goto fail;
        }
    for (int j = 0; j < nrk; j++)
        if (rk[j] < 1 || rk[j] > 64) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: %sresnet_kernel_sizes[%d] must be in [1, 64]", file, kp, j);
            goto fail;
        }
    v->nst = nuk, v->nrk = nrk, v->R = (int)ar, v->K = (int)ak, v->slope = (float)slope;
    v->nthreads = omp_get_max_threads();
    if (!ws && (s = dl_ws_open(&ws, src, dir, component)) != DL_OK) goto fail;
    *wsp = ws;
    const int anti = v->anti, snake = v->kind != ACT_LEAKY, beta = v->kind == ACT_SNAKEBETA;
    if ((s = conv1_load(v, &v->cin, ws, "conv_in", v->in_ch, hid, 7, 1, v->T, 1, nd))) goto fail;
    GROW(x, hid * v->T);
    int64_t C = hid, T = v->T;
    for (int i = 0; i < v->nst; i++) {
        stage *st = &v->st[i];
        st->cin = C, st->cout = C / 2, st->tin = T;
        dl_conv_desc d = {.ndim = 2, .cin = C, .cout = C / 2, .in = {1, T}, .kernel = {1, uk[i]}, .stride = {1, uf[i]},
                          .pad = {0, (uk[i] - uf[i]) / 2}, .dt = dt};
        st->tout = dl_deconv_out_dim(&d, 1);
        if (st->tout > ((int64_t)1 << 28)) {
            s = dl_fail(DL_ERR_INVALID, "LTX-2 vocoder: %lld mel frames give over 2^28 samples", (long long)v->T);
            goto fail;
        }
        const int64_t wsh[3] = {C, C / 2, uk[i]}, bsh[1] = {C / 2};
        float *w = NULL, *b = NULL;
        snprintf(p, sizeof p, "%supsamplers.%d.weight", v->wp, i);
        if (!(s = dl_param_f32(ws, p, 3, wsh, &w))) {
            snprintf(p, sizeof p, "%supsamplers.%d.bias", v->wp, i);
            if (!(s = dl_param_f32(ws, p, 1, bsh, &b))) s = dl_deconv_new(&st->up, &d, w, DL_F32, b);
        }
        free(w), free(b);
        if (s) goto fail;
        GROW(p, C * T);
        GROW(y, (C / 2) * st->tout);
        C /= 2, T = st->tout;
        GROW(x, C * T);
        for (int j = 0; j < nrk; j++) {
            rblock *rb = &st->rb[j];
            const int r = i * nrk + j;
            rb->nd = ndil[j];
            for (int k = 0; k < rb->nd; k++) {
                char b1[300];
                snprintf(b1, sizeof b1, "resnets.%d.convs1.%d", r, k);
                if ((s = conv1_load(v, &rb->c1[k], ws, b1, C, C, rk[j], dil[j][k], T, 1, nd))) goto fail;
                snprintf(b1, sizeof b1, "resnets.%d.convs2.%d", r, k);
                if ((s = conv1_load(v, &rb->c2[k], ws, b1, C, C, rk[j], 1, T, 1, nd))) goto fail;
                snprintf(b1, sizeof b1, "resnets.%d.acts1.%d.", r, k);
                if ((s = act_load(v, &rb->a1[k], ws, b1, v->kind, beta, anti, v->slope, C))) goto fail;
                snprintf(b1, sizeof b1, "resnets.%d.acts2.%d.", r, k);
                if ((s = act_load(v, &rb->a2[k], ws, b1, v->kind, beta, anti, v->slope, C))) goto fail;
            }
            snprintf(p, sizeof p, "%sresnets.%d.convs1.%d.weight", v->wp, r, rb->nd);
            if (dl_ws_find(ws, p)) {
                s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (resnet_dilations[%d] has %d entries)", dl_ws_label(ws), p,
                            j, rb->nd);
                goto fail;
            }
        }
    }
    snprintf(p, sizeof p, "%supsamplers.%d.weight", v->wp, v->nst);
    if (dl_ws_find(ws, p)) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: unexpected %s (upsample_factors has %d entries)", dl_ws_label(ws), p, v->nst);
        goto fail;
    }
    /* act_out: diffusers' LeakyReLU() (slope 0.01), or an anti-aliased snakebeta for both snakes */
    if ((s = act_load(v, &v->aout, ws, "act_out.", snake ? ACT_SNAKEBETA : ACT_LEAKY, 1, 1, 0.01f, C))) goto fail;
    if ((s = conv1_load(v, &v->cout, ws, "conv_out", C, v->out_ch, 7, 1, T, fbias, nd))) goto fail;
    v->samples = T;
    v->scr_n = snake ? (int64_t)v->R * T : 0; /* the anti-aliased activations' longest upsampled signal */
    const size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &v->x, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &v->h, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &v->r, nd->x * 4, 0, 0);
    dl_plan_add(&pl, &v->p, nd->p * es, 0, 0);
    dl_plan_add(&pl, &v->y, nd->y * es, 0, 0);
    dl_plan_add(&pl, &v->scr, (size_t)v->nthreads * (size_t)v->scr_n * 4, 0, 0);
    if ((s = dl_plan_commit(&pl, ws, &v->arena)) != DL_OK) goto fail;
    v->arena_bytes = pl.total;
    return DL_OK;
fail:
    return s;
}
#undef GROW

/* ---- running ---------------------------------------------------------------------- */

static inline float act1(const act *a, int64_t c, float x) {
    if (a->kind == ACT_LEAKY) return x > 0 ? x : x * a->slope;
    const float sn = sinf(x * a->ea[c]);
    return x + a->inv[c] * (sn * sn);
}

/* dst[c, lp + t] (dt, channel stride ldd) = act(src[c, t]) for t < T, src (sdt, stride lds) */
static void act_run(dl_ltx2_vocoder *v, const act *a, int64_t C, int64_t T, dl_dtype sdt, const void *src, int64_t lds,
                    void *dst, int64_t ldd, int64_t lp) {
    const dl_dtype dt = v->dt;
    if (!a->fup) {
        DL_PAR({
            int64_t c0, c1;
            dl_split(C, ith, nth, &c0, &c1);
            for (int64_t c = c0; c < c1; c++)
                for (int64_t t = 0; t < T; t++) la_st(dt, dst, c * ldd + lp + t, act1(a, c, la_ld(sdt, src, c * lds + t)));
        });
        return;
    }
    /* AntiAliasAct1d: u = r * conv_transpose(replicate-pad(x, pu), fup, stride r)[plu : plu + rT];
     * a = act(u); out[n] = sum_k a[clamp(r n + k - pld)] fdown[k] */
    const int64_t R = v->R, K = v->K, pu = K / R - 1, plu = pu * R + (K - R) / 2, pld = K / 2 + K % 2 - 1, RT = R * T;
    float *scr = v->scr;
    const int64_t sn = v->scr_n;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        DL_ASSERT(ith < v->nthreads); /* the scratch was sized for the pool at load */
        float *u = scr + (size_t)ith * (size_t)sn;
        for (int64_t c = c0; c < c1; c++) {
            for (int64_t n = 0; n < RT; n++) {
                const int64_t o = n + plu; /* output index in the full transposed conv */
                int64_t jlo = o - K + 1 > 0 ? (o - K + 1 + R - 1) / R : 0, jhi = o / R;
                if (jhi > T + 2 * pu - 1) jhi = T + 2 * pu - 1;
                float acc = 0;
                for (int64_t j = jlo; j <= jhi; j++) {
                    int64_t t = j - pu;
                    t = t < 0 ? 0 : t >= T ? T - 1 : t;
                    acc += la_ld(sdt, src, c * lds + t) * a->fup[o - R * j];
                }
                u[n] = act1(a, c, (float)R * acc);
            }
            for (int64_t n = 0; n < T; n++) {
                float acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t i = R * n + k - pld;
                    i = i < 0 ? 0 : i >= RT ? RT - 1 : i;
                    acc += u[i] * a->fdown[k];
                }
                la_st(dt, dst, c * ldd + lp + n, acc);
            }
        }
    });
}

/* the zero padding of p for conv c: [0, lp) and [lp + T, tq) of each channel */
static void pad_zero(dl_ltx2_vocoder *v, const conv1 *c) {
    const size_t es = dl_dtype_size(v->dt);
    char *p = v->p;
    for (int64_t ch = 0; ch < c->cin; ch++) {
        char *row = p + (size_t)(ch * c->tq) * es;
        memset(row, 0, (size_t)c->lp * es);
        memset(row + (size_t)(c->lp + c->T) * es, 0, (size_t)(c->tq - c->lp - c->T) * es);
    }
}

/* y = conv(act(src)) with src [cin, T] (sdt, stride lds) */
static dl_status conv_act_run(dl_ltx2_vocoder *v, conv1 *c, const act *a, dl_dtype sdt, const void *src, int64_t lds) {
    if (a) {
        act_run(v, a, c->cin, c->T, sdt, src, lds, v->p, c->tq, c->lp);
    } else {
        const dl_dtype dt = v->dt;
        void *p = v->p;
        const int64_t T = c->T, tq = c->tq, lp = c->lp, C = c->cin;
        DL_PAR({
            int64_t c0, c1;
            dl_split(C, ith, nth, &c0, &c1);
            for (int64_t ch = c0; ch < c1; ch++)
                for (int64_t t = 0; t < T; t++) la_st(dt, p, ch * tq + lp + t, la_ld(sdt, src, ch * lds + t));
        });
    }
    pad_zero(v, c);
    return dl_conv_run(c->c, v->p, v->y);
}

/* dst[c, t] (f32, stride T) (+)= y[c, t] (stride ldy) for t < T */
static void add_y(dl_ltx2_vocoder *v, float *dst, int64_t C, int64_t T, int64_t ldy, int accumulate) {
    const dl_dtype dt = v->dt;
    const void *y = v->y;
    DL_PAR({
        int64_t c0, c1;
        dl_split(C, ith, nth, &c0, &c1);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t t = 0; t < T; t++) dst[c * T + t] = (accumulate ? dst[c * T + t] : 0.f) + la_ld(dt, y, c * ldy + t);
    });
}

static dl_status gen_run(dl_ltx2_vocoder *v, const float *mel, float *wave) {
    const int64_t n = v->in_ch * v->T;
    dl_status s;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(mel[i])) return dl_fail(DL_ERR_INVALID, "LTX-2 vocoder: mel is not finite at %lld", (long long)i);
    if ((s = conv_act_run(v, &v->cin, NULL, DL_F32, mel, v->T))) return s;
    add_y(v, v->x, v->cin.cout, v->T, v->cin.to, 0); /* x: [hidden, T] */
    for (int i = 0; i < v->nst; i++) {
        stage *st = &v->st[i];
        const int64_t C = st->cout, T = st->tout, ci = st->cin, ti = st->tin;
        { /* p = [leaky_relu](x) in dt; y = upsampler(p); h = y */
            const dl_dtype dt = v->dt;
            const float *x = v->x, sl = v->slope;
            const int leaky = v->kind == ACT_LEAKY;
            void *p = v->p;
            DL_PAR({
                int64_t i0, i1;
                dl_split(ci * ti, ith, nth, &i0, &i1);
                for (int64_t k = i0; k < i1; k++) la_st(dt, p, k, leaky && x[k] < 0 ? x[k] * sl : x[k]);
            });
        }
        if ((s = dl_conv_run(st->up, v->p, v->y))) return s;
        add_y(v, v->h, C, T, T, 0);
        for (int j = 0; j < v->nrk; j++) { /* x = mean over resnets of resnet_j(h) */
            rblock *rb = &st->rb[j];
            memcpy(v->r, v->h, (size_t)(C * T) * 4);
            for (int k = 0; k < rb->nd; k++) {
                if ((s = conv_act_run(v, &rb->c1[k], &rb->a1[k], DL_F32, v->r, T))) return s;
                if ((s = conv_act_run(v, &rb->c2[k], &rb->a2[k], v->dt, v->y, rb->c1[k].to))) return s;
                add_y(v, v->r, C, T, rb->c2[k].to, 1);
            }
            float *x = v->x;
            const float *r = v->r;
            const float nr = (float)v->nrk;
            const int first = j == 0, last = j == v->nrk - 1;
            DL_PAR({
                int64_t i0, i1;
                dl_split(C * T, ith, nth, &i0, &i1);
                for (int64_t k = i0; k < i1; k++) {
                    const float a = (first ? 0.f : x[k]) + r[k];
                    x[k] = last ? a / nr : a;
                }
            });
        }
    }
    const int64_t T = v->samples, oc = v->out_ch;
    if ((s = conv_act_run(v, &v->cout, &v->aout, DL_F32, v->x, T))) return s;
    const dl_dtype dt = v->dt;
    for (int64_t c = 0; c < oc; c++)
        for (int64_t t = 0; t < T; t++) {
            float w = la_ld(dt, v->y, c * v->cout.to + t);
            if (v->fin == FIN_TANH) w = tanhf(w);
            else if (v->fin == FIN_CLAMP) w = w < -1.f ? -1.f : w > 1.f ? 1.f : w;
            wave[c * T + t] = w;
        }
    return DL_OK;
}

/* ---- LTX2VocoderWithBWE ------------------------------------------------------------
 *
 *   x    = g1(mel)                                 [oc, n1] at input_sampling_rate
 *   xp   = x zero-padded right to np = hop ceil(n1 / hop)
 *   spec = conv1d(left-pad(xp, max(0, win - hop)), forward_basis [2F, 1, N], stride hop)
 *   mag  = sqrt(re^2 + im^2)                       [F, frames] per channel
 *   lmel = log(max(mel_basis [nmel, F] @ mag, 1e-5)) -> [oc nmel, frames] (row c nmel + m)
 *   res  = g2(lmel)                                [oc, R np], R = out_rate // in_rate
 *   skip = UpSample1d(R, hann)(xp): replicate-pad by w = ceil(6 / 0.99), transposed
 *          conv with the Hann-windowed sinc filter (2 w R + 1 taps) at stride R, times
 *          R, cut [2 w R, -(2 w R + 1 - R))
 *   wave = clamp(res + skip, -1, 1)[:, : n1 out_rate // in_rate]
 * The generators run in the model dtype; the STFT (a plain DFT-basis dot product
 * per frame, as diffusers' conv1d with the checkpoint's forward_basis), the mel,
 * the resampler and the sum in f32 with double accumulation of each dot product,
 * so the error against diffusers' f32 is rounding order only (the test fixtures:
 * max|err| about 3e-7 of max|ref|, SNR about 130 dB, in f32; 47-52 dB in bf16).
 * inverse_basis is stored but unused by diffusers' forward, and is not read. The
 * resampler's filter is not stored: it is rebuilt here in f32, as at diffusers'
 * load. O(oc frames F N) for the STFT: about 0.5 G multiply-adds for 10 s of the
 * released config (N 512, hop 80), parallel over (channel, frame). */

struct bwe_part {
    dl_ltx2_vocoder *g1, *g2;
    int64_t hop, N, F, lpad, nmel, frames, n1, np, R, K, w, pl;
    float *fb;   /* [2F, N] forward_basis: real rows, then imaginary */
    float *mb;   /* [nmel, F] mel_basis */
    float *rf;   /* [K] resampler filter */
    float *x1;   /* [oc, np] stage-1 waveform, zero-padded */
    float *lmel; /* [oc nmel, frames] */
    float *res;  /* [oc, R np] */
    float *mag;  /* [threads, F] */
    int nthreads;
};

static void bwe_free(bwe_part *b) {
    if (!b) return;
    dl_ltx2_vocoder_free(b->g1), dl_ltx2_vocoder_free(b->g2);
    free(b->fb), free(b->mb), free(b->rf), free(b->x1), free(b->lmel), free(b->res), free(b->mag);
    free(b);
}

/* UpSample1d(ratio R, window_type "hann"): the filter as diffusers computes it in f32 */
static void hann_sinc(float *f, int64_t K, int64_t R, int64_t w) {
    const float rolloff = 0.99f, pi = (float)M_PI;
    for (int64_t k = 0; k < K; k++) {
        const float t = ((float)k / (float)R - (float)w) * rolloff;
        const float tc = t < -6.f ? -6.f : t > 6.f ? 6.f : t;
        const float c = cosf(tc * pi / 6.f / 2.f), win = c * c;
        const float sinc = t == 0.f ? 1.f : sinf(pi * t) / (pi * t);
        f[k] = sinc * win * rolloff / (float)R;
    }
}

static dl_status bwe_load(dl_ltx2_vocoder *v, const cJSON *cfg, const char *file, dl_wsrc **ws, dl_wsrc *src,
                          dl_model_dir *dir, const char *component) {
    dl_status s;
    bwe_part *b = calloc(1, sizeof *b);
    if (!b) return dl_fail(DL_ERR_NOMEM, "out of memory");
    v->bwe = b;
    int64_t win, in_rate, out_rate;
    if ((s = dl_cfg_int(cfg, file, "filter_length", 512, &b->N)) || (s = dl_cfg_int(cfg, file, "hop_length", 80, &b->hop)) ||
        (s = dl_cfg_int(cfg, file, "window_length", 512, &win)) ||
        (s = dl_cfg_int(cfg, file, "num_mel_channels", 64, &b->nmel)) ||
        (s = dl_cfg_int(cfg, file, "input_sampling_rate", 16000, &in_rate)) ||
        (s = dl_cfg_int(cfg, file, "output_sampling_rate", 48000, &out_rate)))
        return s;
    if (b->N < 2 || b->N > 8192 || b->hop < 1 || b->hop > 8192 || win < 1 || win > 8192 || b->nmel < 1 || b->nmel > 1024 ||
        in_rate < 1 || out_rate < in_rate || out_rate / in_rate > 16)
        return dl_fail(DL_ERR_FORMAT, "`%s`: needs filter_length in [2, 8192], hop_length and window_length in [1, 8192], "
                       "num_mel_channels in [1, 1024], 1 <= output_sampling_rate / input_sampling_rate <= 16", file);
    if (!(b->g1 = calloc(1, sizeof *b->g1)) || !(b->g2 = calloc(1, sizeof *b->g2)))
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    b->g1->dt = b->g2->dt = v->dt;
    b->g1->T = v->T;
    snprintf(b->g1->wp, sizeof b->g1->wp, "vocoder.");
    snprintf(b->g2->wp, sizeof b->g2->wp, "bwe_generator.");
    if ((s = gen_load(b->g1, cfg, file, "", &DEF_S1, ws, src, dir, component))) return s;
    const int64_t oc = b->g1->out_ch;
    b->F = b->N / 2 + 1, b->n1 = b->g1->samples, b->np = (b->n1 + b->hop - 1) / b->hop * b->hop;
    b->lpad = win > b->hop ? win - b->hop : 0;
    if (b->np + b->lpad < b->N)
        return dl_fail(DL_ERR_INVALID, "LTX-2 BWE vocoder: %lld mel frames give %lld samples, under one STFT window (%lld)",
                       (long long)v->T, (long long)b->np, (long long)(b->N - b->lpad));
    b->frames = (b->np + b->lpad - b->N) / b->hop + 1;
    b->g2->T = b->frames;
    if ((s = gen_load(b->g2, cfg, file, "bwe_", &DEF_BWE, ws, src, dir, component))) return s;
    if (b->g2->in_ch != oc * b->nmel || b->g2->out_ch != oc)
        return dl_fail(DL_ERR_FORMAT, "`%s`: bwe_in_channels %lld must be out_channels x num_mel_channels (%lld) and "
                       "bwe_out_channels %lld out_channels (%lld)", file, (long long)b->g2->in_ch,
                       (long long)(oc * b->nmel), (long long)b->g2->out_ch, (long long)oc);
    b->R = out_rate / in_rate;
    if (b->g2->samples != b->R * b->np)
        return dl_fail(DL_ERR_FORMAT, "`%s`: the BWE generator makes %lld samples from %lld frames, the resampler %lld "
                       "(bwe_upsample_factors must multiply to hop_length x output / input rate)", file,
                       (long long)b->g2->samples, (long long)b->frames, (long long)(b->R * b->np));
    const int64_t fsh[3] = {2 * b->F, 1, b->N}, msh[2] = {b->nmel, b->F};
    if ((s = dl_param_f32(*ws, "mel_stft.stft_fn.forward_basis", 3, fsh, &b->fb)) ||
        (s = dl_param_f32(*ws, "mel_stft.mel_basis", 2, msh, &b->mb)))
        return s;
    b->w = 7; /* ceil(lowpass_filter_width 6 / rolloff 0.99) */
    b->K = 2 * b->w * b->R + 1, b->pl = 2 * b->w * b->R;
    b->nthreads = omp_get_max_threads();
    const int64_t want = b->n1 * out_rate / in_rate;
    v->in_ch = b->g1->in_ch, v->out_ch = oc, v->rate = out_rate;
    v->samples = want < b->R * b->np ? want : b->R * b->np;
    b->rf = malloc((size_t)b->K * 4);
    b->x1 = malloc((size_t)(oc * b->np) * 4);
    b->lmel = malloc((size_t)(oc * b->nmel * b->frames) * 4);
    b->res = malloc((size_t)(oc * b->R * b->np) * 4);
    b->mag = malloc((size_t)b->nthreads * (size_t)b->F * 4);
    if (!b->rf || !b->x1 || !b->lmel || !b->res || !b->mag) return dl_fail(DL_ERR_NOMEM, "out of memory");
    hann_sinc(b->rf, b->K, b->R, b->w);
    v->arena_bytes = b->g1->arena_bytes + b->g2->arena_bytes +
                     (size_t)(b->K + oc * b->np + oc * b->nmel * b->frames + oc * b->R * b->np) * 4 +
                     (size_t)b->nthreads * (size_t)b->F * 4;
    return DL_OK;
}

static dl_status bwe_run(dl_ltx2_vocoder *v, const float *mel, float *wave) {
    bwe_part *b = v->bwe;
    dl_status s;
    const int64_t oc = v->out_ch, np = b->np, n1 = b->n1, F = b->F, N = b->N, hop = b->hop, lpad = b->lpad;
    const int64_t nmel = b->nmel, frames = b->frames;
    if ((s = gen_run(b->g1, mel, b->res))) return s; /* res as scratch: [oc, n1] */
    for (int64_t c = 0; c < oc; c++) {
        memcpy(b->x1 + c * np, b->res + c * n1, (size_t)n1 * 4);
        memset(b->x1 + c * np + n1, 0, (size_t)(np - n1) * 4);
    }
    { /* causal STFT magnitude and log-mel, one (channel, frame) per task */
        const float *x1 = b->x1, *fb = b->fb, *mb = b->mb;
        float *lmel = b->lmel, *mag = b->mag;
        const int nthr = b->nthreads;
        DL_PAR({
            int64_t i0, i1;
            dl_split(oc * frames, ith, nth, &i0, &i1);
            DL_ASSERT(ith < nthr);
            float *m = mag + (size_t)ith * (size_t)F;
            for (int64_t i = i0; i < i1; i++) {
                const int64_t c = i / frames, f = i % frames, o = f * hop - lpad;
                const float *x = x1 + c * np;
                const int64_t j0 = o < 0 ? -o : 0;
                for (int64_t k = 0; k < F; k++) {
                    double re = 0, im = 0;
                    const float *br = fb + k * N, *bi = fb + (F + k) * N;
                    for (int64_t j = j0; j < N; j++) re += (double)x[o + j] * br[j], im += (double)x[o + j] * bi[j];
                    m[k] = (float)sqrt(re * re + im * im);
                }
                for (int64_t q = 0; q < nmel; q++) {
                    double a = 0;
                    for (int64_t k = 0; k < F; k++) a += (double)mb[q * F + k] * m[k];
                    const float mf = (float)a;
                    lmel[(c * nmel + q) * frames + f] = logf(mf > 1e-5f ? mf : 1e-5f);
                }
            }
        });
    }
    if ((s = gen_run(b->g2, b->lmel, b->res))) return s; /* res: [oc, R np] */
    { /* wave = clamp(res + UpSample1d(xp), -1, 1) over the kept samples */
        const int64_t R = b->R, K = b->K, w = b->w, pl = b->pl, S = v->samples, L = R * np;
        const float *x1 = b->x1, *rf = b->rf, *res = b->res;
        DL_PAR({
            int64_t i0, i1;
            dl_split(oc * S, ith, nth, &i0, &i1);
            for (int64_t i = i0; i < i1; i++) {
                const int64_t c = i / S, n = i % S, o = n + pl; /* index in the full transposed conv */
                int64_t jlo = o - K + 1 > 0 ? (o - K + 1 + R - 1) / R : 0, jhi = o / R;
                if (jhi > np + 2 * w - 1) jhi = np + 2 * w - 1;
                double acc = 0;
                for (int64_t j = jlo; j <= jhi; j++) {
                    int64_t t = j - w;
                    t = t < 0 ? 0 : t >= np ? np - 1 : t;
                    acc += (double)x1[c * np + t] * rf[o - R * j];
                }
                const float y = res[c * L + n] + (float)R * (float)acc;
                wave[c * S + n] = y < -1.f ? -1.f : y > 1.f ? 1.f : y;
            }
        });
    }
    return DL_OK;
}

dl_status dl_ltx2_vocoder_run(dl_ltx2_vocoder *v, const float *mel, float *wave) {
    return v->bwe ? bwe_run(v, mel, wave) : gen_run(v, mel, wave);
}

dl_status dl_ltx2_vocoder_load(dl_ltx2_vocoder **out, dl_model_dir *dir, const char *component, int64_t mel_frames,
                               dl_dtype dt, dl_wsrc *src) {
    *out = NULL;
    char file[512];
    snprintf(file, sizeof file, "%s/config.json", component);
    if (mel_frames < 1 || mel_frames > (1 << 20))
        return dl_fail(DL_ERR_INVALID, "LTX-2 vocoder: %lld mel frames is out of range [1, 2^20]", (long long)mel_frames);
    if (dt != DL_F32 && dt != DL_BF16)
        return dl_fail(DL_ERR_UNSUPPORTED, "LTX-2 vocoder: dtype %s is not supported (f32, bf16)", dl_dtype_name(dt));
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    const char *cls;
    if ((s = dl_cfg_str(cfg, file, "_class_name", "LTX2Vocoder", &cls))) return s;
    const int with_bwe = !strcmp(cls, "LTX2VocoderWithBWE");
    if (!with_bwe && strcmp(cls, "LTX2Vocoder"))
        return dl_fail(DL_ERR_UNSUPPORTED, "`%s`: _class_name \"%s\" is neither LTX2Vocoder nor LTX2VocoderWithBWE", file,
                       cls);
    dl_ltx2_vocoder *v = calloc(1, sizeof *v);
    if (!v) return dl_fail(DL_ERR_NOMEM, "out of memory");
    v->dt = dt, v->T = mel_frames;
    dl_wsrc *ws = NULL;
    s = with_bwe ? bwe_load(v, cfg, file, &ws, src, dir, component)
                 : gen_load(v, cfg, file, "", &DEF_VOC, &ws, src, dir, component);
    dl_ws_close(ws);
    if (s) {
        dl_ltx2_vocoder_free(v);
        return s;
    }
    *out = v;
    return DL_OK;
}
