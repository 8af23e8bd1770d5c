/* FluxPipeline's host flow (diffusers):
 *   encode: CLIP pooled embedding (77 tokens) and T5 sequence embedding
 *           (max_sequence_length tokens), both padded as the reference pads them;
 *   latents: initial noise [C, h, w] packed 2x2 into [N, 4C] tokens;
 *   loop:   v = transformer(latents, sigma) (twice with true CFG: v = vn + s(vp - vn));
 *           latents += (sigma_next - sigma) * v;
 *   decode: unpack, z / scaling_factor + shift_factor, VAE decode, (x/2 + 0.5)
 *           clamped to [0, 1], x255 rounded.
 *
 * Parallel execution: the replica's host rank runs this flow; before each denoiser
 * evaluation it broadcasts the step (op, branches, timestep, guidance, valid text
 * length) and the latents; every rank runs its part of the transformer. With cfg=2
 * the branch-1 group runs the negative prompt and its first rank sends the output
 * (or probe score) to the host. Step-cache decisions are the host's; at the end of a
 * request every rank reports a hash of the steps it ran per branch and the host
 * checks them against its decisions. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/pipeline.h"
#include "difflet/program.h"
#include "difflet/text.h"

struct dl_flux_pipeline {
    dl_flux_shape shape;
    dl_model_dir *dir;
    dl_tokenizer *tok, *tok2;
    dl_clip_text *clip;
    dl_t5_encoder *t5;
    dl_flux *tr;
    dl_vae_decoder *vae;
    dl_flowmatch fm;
    int64_t lh, lw, C, N, T, Cp; /* latent grid, latent channels, tokens, text length, packed channels */
    int clip_len;
    float *lat, *v, *v2, *sigmas;
    float *sc_buf[4];            /* step cache: prev and delta for each CFG branch */
    float *pe, *pooled, *ne, *npooled; /* prompt / negative embeddings */
    float *hidden77, *unpacked, *img;
    int32_t *ids;
    dl_artifact *art[4]; /* the programs' mapped weights, kept while the models live */
    char prog_id[4][17];
    const dl_par_place *par; /* NULL: one rank */
    int host, parallel;      /* this rank runs the host flow; the replica has > 1 rank */
    int64_t Jd, Pd;          /* text widths as the transformer takes them */
    uint64_t ran[2];         /* hash chain of the steps this rank ran, per branch */
    int nran[2];
};

enum { OP_STOP = 0, OP_REQUEST, OP_PROBE, OP_RUN, OP_END };
typedef struct {
    int32_t op, mask, L, two, step; /* mask: branches; two: the request has two passes */
    float t, guidance;
} step_msg;

int dl_flux_pipeline_is_host(const dl_flux_pipeline *p) { return p->host; }

static void note_ran(dl_flux_pipeline *p, int b, int step) {
    p->ran[b] = (p->ran[b] ^ (uint64_t)(step + 1)) * 0x100000001b3ull;
    p->nran[b]++;
}

/* does this rank evaluate branch b? (cfg=2: only its group's branch) */
static int serves(const dl_flux_pipeline *p, int b) { return !p->par || p->par->cfg.cfg == 1 || p->par->branch == b; }

/* the rank that sends branch 1's results to the host: branch 1's first rank */
static int cfg_partner(const dl_flux_pipeline *p) {
    return p->par && p->par->cfg.cfg == 2 && p->par->branch == 1 && p->par->split.tp_rank == 0 &&
           p->par->split.cp_rank == 0;
}

static dl_status send_msg(dl_flux_pipeline *p, int op, int mask, int two, int step, float t, float g) {
    if (!p->parallel) return DL_OK;
    step_msg m = {.op = op, .mask = mask, .L = (int32_t)p->T, .two = two, .step = step, .t = t, .guidance = g};
    dl_status s = dl_comm_bcast(p->par->replica_comm, &m, sizeof m, 0);
    if (s == DL_OK && (op == OP_PROBE || op == OP_RUN))
        s = dl_comm_bcast(p->par->replica_comm, p->lat, (size_t)(p->N * p->Cp) * 4, 0);
    return s;
}

/* seconds this rank spent communicating (every group it belongs to) */
static double comm_seconds(const dl_flux_pipeline *p) {
    if (!p->parallel) return 0;
    const dl_comm *c[4] = {p->par->replica_comm, p->par->cfg_comm, p->par->tp_comm, p->par->cp_comm};
    double t = 0;
    for (int i = 0; i < 4; i++) t += dl_comm_stats_get(c[i]).seconds;
    return t;
}

/* the request's text embeddings, host to every rank */
static dl_status send_text(dl_flux_pipeline *p, int two) {
    dl_comm *c = p->par->replica_comm;
    dl_status s;
    if ((s = dl_comm_bcast(c, p->pe, (size_t)(p->T * p->Jd) * 4, 0)) ||
        (s = dl_comm_bcast(c, p->pooled, (size_t)p->Pd * 4, 0)))
        return s;
    if (two && ((s = dl_comm_bcast(c, p->ne, (size_t)(p->T * p->Jd) * 4, 0)) ||
                (s = dl_comm_bcast(c, p->npooled, (size_t)p->Pd * 4, 0))))
        return s;
    return DL_OK;
}

/* End of a request: every rank's per-branch hash of the steps it ran, checked
 * against the host's decisions (*ranks: how many agreed). */
static dl_status check_ranks(dl_flux_pipeline *p, int *ranks) {
    *ranks = 1;
    if (!p->parallel) return DL_OK;
    dl_comm *c = p->par->replica_comm;
    int n = dl_comm_size(c);
    uint64_t mine[5] = {p->ran[0], p->ran[1], (uint64_t)p->nran[0], (uint64_t)p->nran[1],
                        (uint64_t)(serves(p, 0) | serves(p, 1) << 1)};
    uint64_t *all = malloc((size_t)n * sizeof mine);
    if (!all) return dl_fail(DL_ERR_NOMEM, "out of memory");
    dl_status s = dl_comm_allgather(c, mine, sizeof mine, all);
    for (int r = 1; s == DL_OK && p->host && r < n; r++) /* the host judges */
        for (int b = 0; b < 2; b++)
            if ((all[r * 5 + 4] >> b & 1) && (all[r * 5 + b] != p->ran[b] || all[r * 5 + 2 + b] != (uint64_t)p->nran[b]))
                s = dl_fail(DL_ERR_INVALID, "rank %d ran %llu denoiser steps of branch %d, the host decided %d: the ranks disagree",
                            r, (unsigned long long)all[r * 5 + 2 + b], b, p->nran[b]);
    free(all);
    if (s == DL_OK) *ranks = n;
    return s;
}

void dl_flux_pipeline_free(dl_flux_pipeline *p) {
    if (!p) return;
    if (p->host && p->parallel && p->tr) send_msg(p, OP_STOP, 0, 0, 0, 0, 0); /* release the workers */
    dl_tokenizer_free(p->tok), dl_tokenizer_free(p->tok2);
    dl_clip_text_free(p->clip), dl_t5_encoder_free(p->t5), dl_flux_free(p->tr), dl_vae_decoder_free(p->vae);
    for (int i = 0; i < 4; i++) dl_artifact_close(p->art[i]);
    dl_model_dir_free(p->dir);
    for (int i = 0; i < 4; i++) free(p->sc_buf[i]);
    free(p->lat), free(p->v), free(p->v2), free(p->sigmas), free(p->pe), free(p->pooled), free(p->ne);
    free(p->npooled), free(p->hidden77), free(p->unpacked), free(p->img), free(p->ids);
    free(p);
}

void dl_flux_pipeline_latent_shape(const dl_flux_pipeline *p, int64_t *tokens, int64_t *channels) {
    *tokens = p->N;
    *channels = p->Cp;
}

int dl_flux_pipeline_has_guidance(const dl_flux_pipeline *p) { return dl_flux_has_guidance(p->tr); }

typedef struct {
    dl_flux_pipeline *p;
    int which;
} build_ctx;

static dl_status build_component(void *ctx, dl_wsrc *ws) {
    build_ctx *b = ctx;
    dl_flux_pipeline *p = b->p;
    dl_dtype dt = p->shape.dt;
    switch (b->which) {
    case 0: return dl_clip_text_load(&p->clip, p->dir, "text_encoder", p->clip_len, dt, ws);
    case 1: return dl_t5_encoder_load(&p->t5, p->dir, "text_encoder_2", p->T, dt, ws);
    case 2: return dl_vae_decoder_load(&p->vae, p->dir, "vae", p->lh, p->lw, dt, ws);
    default:
        return dl_flux_load_split(&p->tr, p->dir, "transformer", p->lh / 2, p->lw / 2, p->T, dt, ws,
                                  p->par ? &p->par->split : NULL);
    }
}

const char *dl_flux_pipeline_program_id(const dl_flux_pipeline *p, int component) {
    return component >= 0 && component < 4 ? p->prog_id[component] : "";
}

/* FluxPipeline's max_sequence_length default is 512; a model whose tokenizer_2
 * declares a shorter model_max_length (difflet-tiny: 32) was trained at that length */
static int default_t5_len(const char *model_dir) {
    return (int)dl_json_file_int(model_dir, "tokenizer_2/tokenizer_config.json", "model_max_length", 2, 511, 512);
}

int dl_flux_default_size(const char *model_dir) {
    return (int)dl_json_file_int(model_dir, "vae/config.json", "sample_size", 16, 8192, 1024);
}

int dl_flux_pipeline_max_sequence_length(const dl_flux_pipeline *p) { return (int)p->T; }

dl_status dl_flux_pipeline_load(dl_flux_pipeline **out, const char *model_dir, const dl_flux_shape *shape) {
    *out = NULL;
    dl_flux_pipeline *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->shape = *shape;
    char path[4096];
    dl_status s = dl_model_dir_open(&p->dir, model_dir);
    if (s != DL_OK) goto fail;
    if (!p->shape.max_sequence_length) p->shape.max_sequence_length = default_t5_len(model_dir);
    if (strcmp(dl_model_dir_class(p->dir), "FluxPipeline")) {
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not a FluxPipeline", model_dir, dl_model_dir_class(p->dir));
        goto fail;
    }
    if (p->shape.max_sequence_length < 2 || p->shape.max_sequence_length > 512) {
        s = dl_fail(DL_ERR_INVALID, "max_sequence_length must be in 2..512, got %d", p->shape.max_sequence_length);
        goto fail;
    }
    /* the VAE first: its scale decides which sizes are valid */
    const cJSON *vcfg;
    if ((s = dl_model_dir_config(p->dir, "vae", &vcfg))) goto fail;
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(vcfg, "block_out_channels");
    int levels = cJSON_GetArraySize(boc), scale = levels > 0 ? 1 << (levels - 1) : 1;
    int mult = 2 * scale;
    if (shape->width <= 0 || shape->height <= 0 || shape->width % mult || shape->height % mult ||
        shape->width > 8192 || shape->height > 8192) {
        s = dl_fail(DL_ERR_INVALID, "size %dx%d: width and height must be positive multiples of %d (2 x the VAE's %dx) up to 8192",
                    shape->width, shape->height, mult, scale);
        goto fail;
    }
    p->lh = shape->height / scale;
    p->lw = shape->width / scale;
    p->T = p->shape.max_sequence_length;
    p->clip_len = 77;
    p->par = shape->par;
    p->host = !p->par || dl_comm_rank(p->par->replica_comm) == 0;
    p->parallel = p->par && dl_comm_size(p->par->replica_comm) > 1;
    if (p->host) {
        snprintf(path, sizeof path, "%s/tokenizer", model_dir);
        if ((s = dl_tokenizer_load(&p->tok, path))) goto fail;
        snprintf(path, sizeof path, "%s/tokenizer_2", model_dir);
        if ((s = dl_tokenizer_load(&p->tok2, path))) goto fail;
    }
    /* each component is a program: loaded from the cache, or compiled and cached; with
     * parallel execution the host alone runs the text encoders and the VAE, and each
     * rank its own part of the transformer (its slice of the weights, its rows) */
    static const char *comps[4] = {"text_encoder", "text_encoder_2", "vae", "transformer"};
    for (int c = p->host ? 0 : 3; c < 4 && s == DL_OK; c++) {
        char shp[256], *key = NULL, lay[96] = "";
        if (p->par && (p->par->cfg.tp > 1 || p->par->cfg.cp > 1)) {
            dl_par_config one = p->par->cfg;
            one.dp = one.cfg = 1; /* replicas and CFG groups run identical programs */
            dl_par_format(&one, lay, sizeof lay);
        }
        if (c == 0) snprintf(shp, sizeof shp, "{\"seq\":%d}", p->clip_len);
        else if (c == 1) snprintf(shp, sizeof shp, "{\"seq\":%lld}", (long long)p->T);
        else if (c == 2) snprintf(shp, sizeof shp, "{\"height\":%d,\"width\":%d}", shape->height, shape->width);
        else snprintf(shp, sizeof shp, "{\"height\":%d,\"text\":%lld,\"width\":%d}", shape->height, (long long)p->T, shape->width);
        if (c == 3 && *lay) /* this rank's part: its weight slices and rows */
            s = dl_program_key_par(p->dir, comps[c], shp, shape->dt, 0, lay,
                                   p->par->split.tp_rank + p->par->cfg.tp * p->par->split.cp_rank, &key, p->prog_id[c]);
        else
            s = dl_program_key(p->dir, comps[c], shp, shape->dt, 0, &key, p->prog_id[c]);
        build_ctx b = {p, c};
        if (s == DL_OK) s = dl_program_get(p->dir, comps[c], key, p->prog_id[c], shape->cache, build_component, &b, &p->art[c]);
        free(key);
    }
    if (s == DL_OK) s = dl_flowmatch_load(p->dir, &p->fm);
    if (s != DL_OK) goto fail;
    dl_flux_text_dims(p->tr, &p->Jd, &p->Pd);
    p->C = p->vae ? dl_vae_latent_channels(p->vae) : dl_flux_in_channels(p->tr) / 4;
    p->N = (p->lh / 2) * (p->lw / 2);
    p->Cp = 4 * p->C;
    if (dl_flux_in_channels(p->tr) != p->Cp || dl_flux_out_channels(p->tr) != p->Cp) {
        s = dl_fail(DL_ERR_FORMAT, "transformer in/out channels (%lld/%lld) are not 4 x the VAE's %lld latent channels",
                    (long long)dl_flux_in_channels(p->tr), (long long)dl_flux_out_channels(p->tr), (long long)p->C);
        goto fail;
    }
    if (p->host && (dl_t5_encoder_width(p->t5) != p->Jd || dl_clip_text_width(p->clip) != p->Pd)) {
        s = dl_fail(DL_ERR_FORMAT, "text encoder widths (T5 %lld, CLIP %lld) are not the transformer's joint/pooled dims (%lld, %lld)",
                    (long long)dl_t5_encoder_width(p->t5), (long long)dl_clip_text_width(p->clip), (long long)p->Jd,
                    (long long)p->Pd);
        goto fail;
    }
    const int64_t D2 = p->Jd, D1 = p->Pd;
    p->lat = malloc((size_t)(p->N * p->Cp) * 4);
    p->v = malloc((size_t)(p->N * p->Cp) * 4);
    p->v2 = malloc((size_t)(p->N * p->Cp) * 4);
    p->sigmas = malloc(10001 * 4);
    for (int i = 0; i < 4; i++)
        if (!(p->sc_buf[i] = malloc((size_t)(p->N * p->Cp) * 4))) {
            s = dl_fail(DL_ERR_NOMEM, "out of memory");
            goto fail;
        }
    p->pe = malloc((size_t)(p->T * D2) * 4), p->ne = malloc((size_t)(p->T * D2) * 4);
    p->pooled = malloc((size_t)D1 * 4), p->npooled = malloc((size_t)D1 * 4);
    p->hidden77 = malloc((size_t)(p->clip_len * D1) * 4);
    p->unpacked = malloc((size_t)(p->N * p->Cp) * 4);
    p->img = malloc((size_t)(3 * shape->width * shape->height) * 4);
    p->ids = malloc((size_t)(p->T > p->clip_len ? p->T : p->clip_len) * sizeof *p->ids);
    if (!p->lat || !p->v || !p->v2 || !p->sigmas || !p->pe || !p->ne || !p->pooled || !p->npooled || !p->hidden77 ||
        !p->unpacked || !p->img || !p->ids) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = p;
    return DL_OK;
fail:
    dl_flux_pipeline_free(p);
    return s;
}

/* pooled CLIP embedding and T5 sequence embedding of one prompt */
static dl_status encode(dl_flux_pipeline *p, const char *prompt, float *seq, float *pooled) {
    int n;
    dl_status s = dl_tokenizer_encode(p->tok, prompt, strlen(prompt), p->clip_len, 1, p->ids, &n);
    if (s == DL_OK) s = dl_clip_text_run(p->clip, p->ids, p->hidden77, pooled, NULL);
    if (s == DL_OK) s = dl_tokenizer_encode(p->tok2, prompt, strlen(prompt), (int)p->T, 1, p->ids, &n);
    if (s == DL_OK) s = dl_t5_encoder_run(p->t5, p->ids, seq, NULL);
    return s;
}

/* Branch b's evaluation (probe or denoiser) on this rank and, with cfg=2, the
 * partner's result for branch 1 on the host. */
static dl_status eval_branch(dl_flux_pipeline *p, int op, int b, int step, float tin, float g, float *out,
                             double *score) {
    const float *emb = b ? p->ne : p->pe, *pool = b ? p->npooled : p->pooled;
    dl_status s = DL_OK;
    if (serves(p, b)) {
        if (op == OP_PROBE) s = dl_flux_probe(p->tr, b, p->lat, pool, tin, g, score);
        else {
            s = dl_flux_run(p->tr, p->lat, emb, pool, tin, g, out, NULL);
            if (s == DL_OK) note_ran(p, b, step);
        }
        if (s == DL_OK && b == 1 && cfg_partner(p)) { /* to the host */
            dl_comm *c = p->par->cfg_comm;
            s = op == OP_PROBE ? dl_comm_send(c, score, sizeof *score, 0, 11)
                               : dl_comm_send(c, out, (size_t)(p->N * p->Cp) * 4, 0, 12);
        }
    } else if (p->host) { /* cfg=2: branch 1 ran on the other group */
        dl_comm *c = p->par->cfg_comm;
        if (op == OP_PROBE) s = dl_comm_recv(c, score, sizeof *score, 1, 11);
        else {
            s = dl_comm_recv(c, out, (size_t)(p->N * p->Cp) * 4, 1, 12);
            if (s == DL_OK) note_ran(p, b, step);
        }
    }
    return s;
}

dl_status dl_flux_pipeline_worker_one(dl_flux_pipeline *p, int *stopped) {
    *stopped = 0;
    if (p->host) return dl_fail(DL_ERR_INVALID, "the host rank runs the pipeline, not the worker loop");
    for (;;) {
        step_msg m;
        dl_status s = dl_comm_bcast(p->par->replica_comm, &m, sizeof m, 0);
        if (s != DL_OK) return s;
        switch (m.op) {
        case OP_STOP: *stopped = 1; return DL_OK;
        case OP_REQUEST:
            if ((s = send_text(p, m.two))) return s;
            dl_flux_probe_reset(p->tr);
            p->ran[0] = p->ran[1] = 0;
            p->nran[0] = p->nran[1] = 0;
            break;
        case OP_PROBE:
        case OP_RUN:
            if ((s = dl_comm_bcast(p->par->replica_comm, p->lat, (size_t)(p->N * p->Cp) * 4, 0))) return s;
            if ((s = dl_flux_set_text_valid(p->tr, m.L))) return s;
            for (int b = 0; b < 2; b++) {
                double score = 0;
                if ((m.mask >> b & 1) && serves(p, b) && (s = eval_branch(p, m.op, b, m.step, m.t, m.guidance, p->v, &score)))
                    return s;
            }
            break;
        case OP_END: {
            int ranks;
            return check_ranks(p, &ranks); /* the request is over */
        }
        default: return dl_fail(DL_ERR_INVALID, "worker: unknown step message %d", m.op);
        }
    }
}

dl_status dl_flux_pipeline_worker(dl_flux_pipeline *p) {
    int stopped = 0;
    dl_status s = DL_OK;
    while (s == DL_OK && !stopped) s = dl_flux_pipeline_worker_one(p, &stopped);
    return s;
}

static dl_status generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                          dl_flux_timing *timing, int *ended);

/* Every call ends the request on every rank exactly once (OP_END), also when it
 * fails before the workers heard of it: a serving replica's ranks wait for that end. */
dl_status dl_flux_generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                           dl_flux_timing *timing) {
    if (!p->host) return dl_fail(DL_ERR_INVALID, "only the host rank generates; the others run dl_flux_pipeline_worker");
    int ended = 0;
    dl_status s = generate(p, r, rgb, image, timing, &ended);
    if (p->parallel && !ended) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dl_last_error()); /* keep the request's own error */
        int ranks;
        if (send_msg(p, OP_END, 0, 0, 0, 0, 0) == DL_OK) check_ranks(p, &ranks);
        if (s != DL_OK) dl_fail(s, "%s", msg);
    }
    return s;
}

static dl_status generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                          dl_flux_timing *timing, int *ended) {
    dl_flux_timing tm = {0};
    if (!r->prompt) return dl_fail(DL_ERR_INVALID, "a prompt is required");
    if (r->steps <= 0 || r->steps > 10000) return dl_fail(DL_ERR_INVALID, "steps must be in 1..10000, got %d", r->steps);
    if (!isfinite(r->guidance) || !isfinite(r->true_cfg))
        return dl_fail(DL_ERR_INVALID, "guidance and true_cfg must be finite numbers");
    int cfg = r->true_cfg > 1.f && r->negative_prompt != NULL;
    if (p->par && p->par->cfg.cfg == 2 && !cfg)
        return dl_fail(DL_ERR_INVALID, "cfg=2 runs the two CFG passes on separate ranks, but this request has one pass "
                                       "(true CFG needs true_cfg > 1 and a negative prompt)");
    double t0 = dl_now();
    dl_status s = encode(p, r->prompt, p->pe, p->pooled);
    if (s == DL_OK && cfg) s = encode(p, r->negative_prompt, p->ne, p->npooled);
    if (s != DL_OK) return s;
    tm.encode_s = dl_now() - t0;
    double mu = dl_flowmatch_mu(&p->fm, p->N);
    if ((s = dl_flowmatch_sigmas(&p->fm, r->steps, mu, p->sigmas))) return s;
    /* from here on every exit ends the request on every rank (OP_END) */
    double c0 = comm_seconds(p);
    if (p->parallel && ((s = send_msg(p, OP_REQUEST, 0, cfg, 0, 0, 0)) || (s = send_text(p, cfg)))) return s;
    p->ran[0] = p->ran[1] = 0;
    p->nran[0] = p->nran[1] = 0;

    /* initial latents: given (packed), or noise [C, h, w] packed as diffusers packs */
    const int64_t N = p->N, Cp = p->Cp, C = p->C, gh = p->lh / 2, gw = p->lw / 2;
    if (r->init_latents) {
        memcpy(p->lat, r->init_latents, (size_t)(N * Cp) * 4);
    } else {
        dl_randn(r->seed, p->unpacked, N * Cp);
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < p->lh; y++)
                for (int64_t x = 0; x < p->lw; x++)
                    p->lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)] =
                        p->unpacked[(c * p->lh + y) * p->lw + x];
    }
    /* step cache: fresh state for this request, one per CFG branch */
    static const dl_stepcache_config off = {0};
    const dl_stepcache_config *sc = r->cache ? r->cache : &off;
    int probing = sc->mode == DL_STEPCACHE_CALIBRATED || r->on_probe;
    dl_stepcache_state st[2];
    for (int b = 0; b < 2; b++) {
        st[b] = (dl_stepcache_state){.prev = p->sc_buf[2 * b], .delta = p->sc_buf[2 * b + 1], .n = N * Cp};
        dl_stepcache_reset(&st[b]);
    }
    if (probing) dl_flux_probe_reset(p->tr);
    const int nb = 1 + cfg, all = cfg ? 3 : 1;
    t0 = dl_now();
    for (int i = 0; i < r->steps; i++) {
        if (r->cancel && *r->cancel) {
            s = dl_fail(DL_ERR_CANCELLED, "cancelled at step %d of %d", i, r->steps);
            break;
        }
        /* the pipeline hands the transformer t / 1000 with t = sigma * num_train_timesteps, in f32 */
        float t = p->sigmas[i] * (float)p->fm.num_train_timesteps;
        float tin = t / 1000.f;
        double score[2] = {0, 0};
        if (probing) { /* branch 0: the prompt; 1: the negative prompt */
            double tp = dl_now();
            s = send_msg(p, OP_PROBE, all, cfg, i, tin, r->guidance);
            for (int b = 0; b < nb && s == DL_OK; b++) s = eval_branch(p, OP_PROBE, b, i, tin, r->guidance, NULL, &score[b]);
            if (s != DL_OK) break;
            tm.probe_s += dl_now() - tp;
        }
        int run = 0;
        for (int b = 0; b < nb; b++)
            if (!dl_stepcache_decide(sc, &st[b], i, r->steps, score[b])) run |= 1 << b;
        if (run && (s = send_msg(p, OP_RUN, run, cfg, i, tin, r->guidance))) break;
        for (int b = 0; b < nb; b++) {
            float *out = b ? p->v2 : p->v;
            double change = -1;
            if (run >> b & 1) {
                if ((s = eval_branch(p, OP_RUN, b, i, tin, r->guidance, out, NULL))) break;
                tm.transformer_calls++;
                change = dl_stepcache_full(sc, &st[b], out);
            } else {
                double tc = dl_now();
                dl_stepcache_estimate(&st[b], out);
                tm.cached_s += dl_now() - tc;
                tm.cached_steps++;
            }
            if (r->on_probe) r->on_probe(r->ctx, i, b, score[b], change);
        }
        if (s != DL_OK) break;
        if (cfg)
            for (int64_t k = 0; k < N * Cp; k++) p->v[k] = p->v2[k] + r->true_cfg * (p->v[k] - p->v2[k]);
        float dt = p->sigmas[i + 1] - p->sigmas[i];
        for (int64_t k = 0; k < N * Cp; k++) p->lat[k] = p->lat[k] + dt * p->v[k];
        if (r->on_step) r->on_step(r->ctx, i + 1, r->steps, dl_now() - t0);
    }
    /* every rank reports what it ran, even after a cancel (it keeps them in step) */
    dl_status e = send_msg(p, OP_END, 0, cfg, 0, 0, 0);
    *ended = 1;
    if (e == DL_OK) e = check_ranks(p, &tm.ranks);
    if (s == DL_OK) s = e;
    if (s != DL_OK) return s;
    if (p->parallel) tm.comm_s = comm_seconds(p) - c0;
    tm.denoise_s = dl_now() - t0;

    /* unpack, unscale, decode */
    t0 = dl_now();
    float sf = (float)dl_vae_scaling_factor(p->vae), sh = (float)dl_vae_shift_factor(p->vae);
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < p->lh; y++)
            for (int64_t x = 0; x < p->lw; x++) {
                float v = p->lat[((y / 2) * gw + x / 2) * Cp + c * 4 + (y % 2) * 2 + (x % 2)];
                p->unpacked[(c * p->lh + y) * p->lw + x] = v / sf + sh;
            }
    (void)gh;
    if ((s = dl_vae_decode(p->vae, p->unpacked, p->img))) return s;
    const int64_t H = p->shape.height, W = p->shape.width;
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) {
                float v = p->img[(c * H + y) * W + x] / 2.f + 0.5f;
                v = v < 0.f ? 0.f : v > 1.f ? 1.f : v;
                if (image) image[(y * W + x) * 3 + c] = v;
                if (rgb) rgb[(y * W + x) * 3 + c] = (uint8_t)lrintf(v * 255.f);
            }
    tm.decode_s = dl_now() - t0;
    if (timing) *timing = tm;
    return DL_OK;
}
