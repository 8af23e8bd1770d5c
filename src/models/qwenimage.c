/* QwenImageTransformer2DModel (diffusers): Qwen-Image's denoiser, built for a fixed
 * packed image grid and a maximum text length (the prompt's own length is the valid
 * key count: one program for every prompt). Text rows first, then image rows, as the
 * DiT library's joint stream keeps them.
 *
 *   temb = timestep_embedder(Timesteps(256, scale 1000)(t))    // t = sigma; [D]
 *   txt = txt_in(RMSNorm(prompt_embeds))                         // [T, D]
 *   img = img_in(packed latents)                                 // [N, D]
 *   block: the dual-stream block (img_mod.1 / txt_mod.1, img_mlp / txt_mlp) with text
 *          keys [L, T) never attended
 *   out = proj_out(LN(img)(1 + scale) + shift), scale, shift = norm_out.linear(silu(temb))
 * MSRoPE (scale_rope): per axis (frame, height, width) of head_dim split by
 * axes_dims_rope, angle p / 10000^(2k/d) in float32; image (0, r - ceil(h/2),
 * c - ceil(w/2)); text row j at p = max(h/2, w/2) + j on every axis; adjacent pairs
 * rotated (complex multiplication). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/qwenimage.h"
#include "models/models_impl.h"

struct dl_qwenimage {
    dl_dit c;                       /* the joint stream: sizes, split, shared activations */
    int64_t Cin, Cout, Jd, gh, gw;  /* packed channels in / out, text width, packed grid */
    int nl;
    int axes[3];
    lin t1, t2, txt_in, img_in, norm_out, proj_out;
    float *txt_norm;                /* [Jd] RMSNorm weight */
    dl_dit_dual *blk;
    /* activations of Qwen-Image's own (the stream's are in c) */
    void *f;                        /* [Sl, Fl] dt */
    void *in_lat, *in_txt;          /* [Nl, Cin], [T, Jd] dt */
    float *temb, *mod_img, *mod_txt, *tproj; /* [D], [6D], [6D], [256] */
    void *vec_in, *vec_h;           /* [D] dt: one-row matmul inputs */
    void *arena;
    float *probe_prev[2], *probe_cur; /* [Nl, D] each, allocated on first probe use */
    int probe_have[2];
};

int64_t dl_qwenimage_in_channels(const dl_qwenimage *m) { return m->Cin; }
int64_t dl_qwenimage_out_channels(const dl_qwenimage *m) { return m->Cout; }
int64_t dl_qwenimage_heads(const dl_qwenimage *m) { return m->c.H; }
int64_t dl_qwenimage_text_dim(const dl_qwenimage *m) { return m->Jd; }

void dl_qwenimage_free(dl_qwenimage *m) {
    if (!m) return;
    lin *ls[] = {&m->t1, &m->t2, &m->txt_in, &m->img_in, &m->norm_out, &m->proj_out};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) dl_lin_free(ls[i]);
    for (int i = 0; m->blk && i < m->nl; i++) dl_dit_dual_free(&m->blk[i]);
    free(m->blk), free(m->txt_norm);
    dl_dit_free(&m->c);
    void *bufs[] = {m->arena, m->probe_prev[0], m->probe_prev[1], m->probe_cur};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dl_aligned_free(bufs[i]);
    free(m);
}

/* MSRoPE of one row at positions p[3] (frame, height, width) into cos/sin [Dh/2] */
static void rope_row(const int axes[3], const int64_t p[3], float *cs, float *sn) {
    int k = 0;
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < axes[a] / 2; i++, k++) {
            float inv = 1.f / powf(10000.f, (float)(2 * i) / (float)axes[a]);
            float ang = (float)p[a] * inv;
            cs[k] = cosf(ang), sn[k] = sinf(ang);
        }
}

dl_status dl_qwenimage_load(dl_qwenimage **out, dl_model_dir *dir, const char *component, int64_t grid_h,
                            int64_t grid_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split) {
    *out = NULL;
    char file[512], p[128];
    snprintf(file, sizeof file, "%s/config.json", component);
    const cJSON *cfg;
    dl_status s = dl_model_dir_config(dir, component, &cfg);
    if (s != DL_OK) return s;
    dl_qwenimage *m = calloc(1, sizeof *m);
    if (!m) return dl_fail(DL_ERR_NOMEM, "out of memory");
    m->c.sp = split ? *split : (dl_dit_split){.tp = 1, .cp = 1};
    dl_wsrc *ck = NULL;
    int64_t patch, nl, out_ch;
    int guid, zero_cond, add_t, layer3d;
    const cJSON *axes = cJSON_GetObjectItemCaseSensitive(cfg, "axes_dims_rope");
    if ((s = dl_cfg_int(cfg, file, "patch_size", 2, &patch)) || (s = dl_cfg_int(cfg, file, "in_channels", 64, &m->Cin)) ||
        (s = dl_cfg_int(cfg, file, "out_channels", 16, &out_ch)) || (s = dl_cfg_int(cfg, file, "num_layers", 60, &nl)) ||
        (s = dl_cfg_int(cfg, file, "attention_head_dim", 128, &m->c.Dh)) ||
        (s = dl_cfg_int(cfg, file, "num_attention_heads", 24, &m->c.H)) ||
        (s = dl_cfg_int(cfg, file, "joint_attention_dim", 3584, &m->Jd)) ||
        (s = dl_cfg_bool(cfg, file, "guidance_embeds", 0, &guid)) ||
        (s = dl_cfg_bool(cfg, file, "zero_cond_t", 0, &zero_cond)) ||
        (s = dl_cfg_bool(cfg, file, "use_additional_t_cond", 0, &add_t)) ||
        (s = dl_cfg_bool(cfg, file, "use_layer3d_rope", 0, &layer3d)))
        goto fail;
    if (guid || zero_cond || add_t || layer3d) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: %s is set: that Qwen-Image variant (edit / layered) is not supported yet", file,
                    guid ? "guidance_embeds" : zero_cond ? "zero_cond_t" : add_t ? "use_additional_t_cond" : "use_layer3d_rope");
        goto fail;
    }
    m->axes[0] = 16, m->axes[1] = 56, m->axes[2] = 56;
    if (axes) {
        if (!cJSON_IsArray(axes) || cJSON_GetArraySize(axes) != 3) {
            s = dl_fail(DL_ERR_FORMAT, "`%s`: axes_dims_rope must be 3 integers", file);
            goto fail;
        }
        for (int i = 0; i < 3; i++) m->axes[i] = (int)cJSON_GetArrayItem(axes, i)->valuedouble;
    }
    if (patch != 2) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: patch_size %lld is not supported (Qwen-Image packs 2x2)", file, (long long)patch);
        goto fail;
    }
    if (m->axes[0] + m->axes[1] + m->axes[2] != m->c.Dh || m->axes[0] % 2 || m->axes[1] % 2 || m->axes[2] % 2) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: axes_dims_rope (%d, %d, %d) must be even and sum to attention_head_dim %lld", file,
                    m->axes[0], m->axes[1], m->axes[2], (long long)m->c.Dh);
        goto fail;
    }
    m->nl = (int)nl;
    m->Cout = 4 * out_ch;
    m->c.D = m->c.H * m->c.Dh;
    m->c.F = 4 * m->c.D;
    m->c.dt = dt;
    m->c.T = m->c.L = txt_len;
    m->c.N = grid_h * grid_w;
    m->c.S = m->c.T + m->c.N;
    m->gh = grid_h, m->gw = grid_w;
    if (m->c.D <= 0 || nl <= 0 || m->Cin <= 0 || out_ch <= 0 || m->Jd <= 0) {
        s = dl_fail(DL_ERR_FORMAT, "`%s`: inconsistent sizes", file);
        goto fail;
    }
    if (grid_h <= 0 || grid_w <= 0 || txt_len <= 0) {
        s = dl_fail(DL_ERR_INVALID, "Qwen-Image transformer: empty image grid or text");
        goto fail;
    }
    char why[256];
    const char *bad = dl_dit_split_check(&m->c.sp, m->c.H, why, sizeof why);
    if (bad) {
        s = dl_fail(DL_ERR_INVALID, "parallel split refused: %s", bad);
        goto fail;
    }
    if ((s = dl_dit_plan(&m->c)) != DL_OK) goto fail;
    if ((s = dl_ws_open(&ck, src, dir, component)) != DL_OK) goto fail;
    const int64_t D = m->c.D, T = m->c.T, Nl = m->c.Nl, Sl = m->c.Sl, Dl = m->c.Dl, Fl = m->c.Fl;
    if ((s = dl_lin_named(&m->t1, ck, "time_text_embed.timestep_embedder.linear_1", 1, 256, D, dt, dt, DL_ACT_SILU, 0, NULL)) ||
        (s = dl_lin_named(&m->t2, ck, "time_text_embed.timestep_embedder.linear_2", 1, D, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_param_vec(ck, "txt_norm.weight", m->Jd, &m->txt_norm)) ||
        (s = dl_lin_named(&m->txt_in, ck, "txt_in", T, m->Jd, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->img_in, ck, "img_in", Nl, m->Cin, D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->norm_out, ck, "norm_out.linear", 1, D, 2 * D, dt, DL_F32, DL_ACT_NONE, 0, NULL)) ||
        (s = dl_lin_named(&m->proj_out, ck, "proj_out", Nl, D, m->Cout, dt, DL_F32, DL_ACT_NONE, 0, NULL)))
        goto fail;
    if (!(m->blk = calloc((size_t)m->nl, sizeof *m->blk))) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    static const dl_dit_dual_names names = {"img_mod.1", "txt_mod.1", "img_mlp.net.0.proj", "img_mlp.net.2",
                                            "txt_mlp.net.0.proj", "txt_mlp.net.2"};
    for (int i = 0; i < m->nl; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.", i);
        if ((s = dl_dit_dual_load(&m->blk[i], &m->c, ck, p, &names))) goto fail;
    }
    /* MSRoPE tables of the local rows: text rows, then this rank's image rows */
    const int64_t hd = m->c.Dh / 2, maxv = grid_h / 2 > grid_w / 2 ? grid_h / 2 : grid_w / 2;
    m->c.rope_cos = malloc((size_t)(Sl * hd) * sizeof(float));
    m->c.rope_sin = malloc((size_t)(Sl * hd) * sizeof(float));
    if (!m->c.rope_cos || !m->c.rope_sin) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t j = 0; j < T; j++) {
        int64_t pos[3] = {maxv + j, maxv + j, maxv + j};
        rope_row(m->axes, pos, m->c.rope_cos + j * hd, m->c.rope_sin + j * hd);
    }
    for (int64_t r = 0; r < Nl; r++) {
        int64_t n = m->c.n0 + r, y = n / grid_w, x = n % grid_w;
        int64_t pos[3] = {0, y - (grid_h - grid_h / 2), x - (grid_w - grid_w / 2)};
        rope_row(m->axes, pos, m->c.rope_cos + (T + r) * hd, m->c.rope_sin + (T + r) * hd);
    }
    size_t es = dl_dtype_size(dt);
    act_plan pl = {0};
    dl_plan_add(&pl, &m->c.x, (size_t)(m->c.xn * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.o, (size_t)(Sl * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->c.h, (size_t)(Sl * D) * es, 1, 2);
    dl_plan_add(&pl, &m->c.qkv, (size_t)(Sl * 3 * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->c.att, (size_t)(Sl * Dl) * es, 1, 1);
    dl_plan_add(&pl, &m->f, (size_t)(Sl * Fl) * es, 1, 1);
    dl_plan_add(&pl, &m->in_lat, (size_t)(Nl * m->Cin) * es, 0, 0);
    dl_plan_add(&pl, &m->in_txt, (size_t)(T * m->Jd) * es, 0, 0);
    dl_plan_add(&pl, &m->temb, (size_t)D * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_img, (size_t)(6 * D) * 4, 0, 2);
    dl_plan_add(&pl, &m->mod_txt, (size_t)(6 * D) * 4, 1, 1);
    dl_plan_add(&pl, &m->tproj, 256 * 4, 0, 0);
    dl_plan_add(&pl, &m->vec_in, (size_t)(D > 256 ? D : 256) * es, 0, 2);
    dl_plan_add(&pl, &m->vec_h, (size_t)D * es, 0, 0);
    dl_plan_attn_scratch(&pl, &m->c.scratch, dt, m->c.S, m->c.H, m->c.Dh, 0, 1, 1);
    if ((s = dl_plan_commit(&pl, ck, &m->arena)) != DL_OK || (s = dl_dit_alloc(&m->c)) != DL_OK) goto fail;
    dl_ws_close(ck);
    *out = m;
    return DL_OK;
fail:
    dl_ws_close(ck);
    dl_qwenimage_free(m);
    return s;
}

#define RUN(l, x, y)                                         \
    do {                                                     \
        if ((s = lin_run((l), (x), (y))) != DL_OK) return s; \
    } while (0)
#define TRY(e)                            \
    do {                                  \
        if ((s = (e)) != DL_OK) return s; \
    } while (0)

/* temb, and silu(temb) in vec_in, for t (= timestep / 1000): Timesteps(256) with
 * scale 1000 applied after the frequencies, as diffusers does */
static dl_status conditioning(dl_qwenimage *m, float t) {
    const int64_t D = m->c.D;
    dl_status s;
    for (int i = 0; i < 128; i++) {
        float e = expf(-logf(10000.f) * (float)i / 128.f), a = (t * e) * 1000.f;
        m->tproj[i] = cosf(a), m->tproj[128 + i] = sinf(a);
    }
    dl_convert_t(m->c.dt, m->vec_in, DL_F32, m->tproj, 256, 0, 1);
    RUN(&m->t1, m->vec_in, m->vec_h);
    RUN(&m->t2, m->vec_h, m->temb);
    for (int64_t i = 0; i < D; i++) m->c.o[i] = m->temb[i] / (1.f + expf(-m->temb[i]));
    dl_convert_t(m->c.dt, m->vec_in, DL_F32, m->c.o, D, 0, 1);
    return DL_OK;
}

dl_status dl_qwenimage_run(dl_qwenimage *m, const float *latents, const float *txt, int64_t valid, float t, float *out) {
    const int64_t D = m->c.D, T = m->c.T;
    const size_t es = dl_dtype_size(m->c.dt);
    dl_status s;
    if (!isfinite(t)) return dl_fail(DL_ERR_INVALID, "Qwen-Image transformer: the timestep is not finite");
    if (valid < 1 || valid > T)
        return dl_fail(DL_ERR_INVALID, "Qwen-Image transformer: %lld valid text rows is outside 1..%lld", (long long)valid,
                       (long long)T);
    m->c.L = valid;
    TRY(conditioning(m, t));
    /* text: RMSNorm then txt_in; image: img_in (with SP, into o, then the shard) */
    const float *nw = m->txt_norm;
    DL_PAR(dl_rmsnorm_x_t(m->c.dt, m->in_txt, DL_F32, txt, T, m->Jd, nw, 1e-6f, ith, nth));
    to_dt(m->c.dt, m->in_lat, latents + m->c.n0 * m->Cin, m->c.Nl * m->Cin);
    float *emb = dl_dit_sp_on(&m->c) ? m->c.o : m->c.x;
    RUN(&m->txt_in, m->in_txt, emb);
    RUN(&m->img_in, m->in_lat, emb + T * D);
    if (dl_dit_sp_on(&m->c)) memcpy(m->c.x, m->c.o + m->c.xa * D, (size_t)(m->c.xn * D) * 4);
    for (int i = 0; i < m->nl; i++) TRY(dl_dit_dual_run(&m->c, &m->blk[i], m->vec_in, m->mod_img, m->mod_txt, m->f));
    RUN(&m->norm_out, m->vec_in, m->mod_img); /* scale, shift */
    dl_dit_ln_mod(&m->c, NULL, NULL, m->mod_img, m->mod_img + D);
    TRY(dl_dit_gather_h(&m->c));
    RUN(&m->proj_out, (char *)m->c.h + (size_t)(T * D) * es, out + m->c.n0 * m->Cout);
    return dl_dit_gather_image_rows(&m->c, out, m->Cout); /* every rank's image rows */
}

void dl_qwenimage_probe_reset(dl_qwenimage *m) { m->probe_have[0] = m->probe_have[1] = 0; }

dl_status dl_qwenimage_probe(dl_qwenimage *m, int slot, const float *latents, float t, double *score) {
    const int64_t D = m->c.D, Nl = m->c.Nl, T = m->c.T;
    dl_status s;
    *score = 0;
    if (slot < 0 || slot > 1) return dl_fail(DL_ERR_INVALID, "probe: slot %d (0 or 1)", slot);
    if (!m->probe_cur) { /* once per model: the probe's own persistent buffers */
        for (int i = 0; i < 2; i++) m->probe_prev[i] = dl_aligned_alloc((size_t)(Nl * D) * 4);
        m->probe_cur = dl_aligned_alloc((size_t)(Nl * D) * 4);
        if (!m->probe_prev[0] || !m->probe_prev[1] || !m->probe_cur) return dl_fail(DL_ERR_NOMEM, "probe: out of memory");
    }
    TRY(conditioning(m, t));
    to_dt(m->c.dt, m->in_lat, latents + m->c.n0 * m->Cin, Nl * m->Cin);
    float *x = m->c.o + T * D; /* o holds every local row, whatever x holds */
    RUN(&m->img_in, m->in_lat, x);
    RUN(&m->blk[0].mod_img, m->vec_in, m->mod_img); /* shift1, scale1, ... */
    float *cur = m->probe_cur, *sc = m->mod_img + D, *sh = m->mod_img;
    DL_PAR(dl_layernorm_x_t(DL_F32, cur, DL_F32, x, Nl, D, NULL, NULL, sc, sh, 1e-6f, ith, nth));
    if (m->probe_have[slot] && (s = dl_dit_probe_score(&m->c, cur, m->probe_prev[slot], Nl * D, score))) return s;
    memcpy(m->probe_prev[slot], cur, (size_t)(Nl * D) * 4);
    m->probe_have[slot] = 1;
    return DL_OK;
}
