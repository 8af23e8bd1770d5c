/* The model registry (registry.h): the pipeline classes difflet serves and the
 * generic pipeline handle that forwards to an entry. Adding a model adds a line to
 * k_entries (docs/adding-a-model.md). */
#include "difflet/registry.h"
#include "difflet/comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const dl_model_entry dl_flux_entry;
extern const dl_model_entry dl_wan_entry;
extern const dl_model_entry dl_hunyuan_entry;
extern const dl_model_entry dl_qwenimage_entry;
extern const dl_model_entry dl_ltx2_entry;
extern const dl_model_entry dl_opensora_entry;

static const dl_model_entry *const k_entries[] = {&dl_flux_entry, &dl_wan_entry, &dl_qwenimage_entry, &dl_hunyuan_entry, &dl_ltx2_entry, &dl_opensora_entry};
enum { NENTRIES = sizeof k_entries / sizeof k_entries[0] };

const dl_model_entry *dl_registry_find(const char *cls) {
    for (int i = 0; cls && i < NENTRIES; i++)
        if (!strcmp(k_entries[i]->pipeline_class, cls)) return k_entries[i];
    return NULL;
}

int dl_registry_count(void) { return NENTRIES; }
const dl_model_entry *dl_registry_at(int i) { return i >= 0 && i < NENTRIES ? k_entries[i] : NULL; }

const char *dl_registry_classes(void) {
    static char buf[512];
    if (!buf[0])
        for (int i = 0; i < NENTRIES; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", k_entries[i]->pipeline_class);
    return buf;
}

void dl_registry_defaults(const dl_model_entry *e, const char *model_dir, dl_model_defaults *d) {
    d->steps = (int)dl_model_default_int(model_dir, "num_inference_steps", 1, 100000, e->default_steps);
    d->guidance = (float)dl_model_default_num(model_dir, "guidance_scale", 0, 1000, e->default_guidance);
    d->true_cfg = e->default_true_cfg > 0 ? (float)dl_model_default_num(model_dir, "true_cfg_scale", 0, 1000, e->default_true_cfg) : 0;
    d->fps = e->default_fps > 0 ? dl_model_default_num(model_dir, "fps", 1e-3, 1000, e->default_fps) : 0;
}

dl_status dl_registry_lookup(const char *model_dir, const dl_model_entry **out) {
    *out = NULL;
    dl_model_dir *d;
    dl_status s = dl_model_dir_open(&d, model_dir);
    if (s != DL_OK) return s;
    const char *cls = dl_model_dir_class(d);
    *out = dl_registry_find(cls);
    if (!*out)
        s = dl_fail(DL_ERR_UNSUPPORTED, "`%s`: pipeline %s is not one difflet serves (%s)", model_dir, cls ? cls : "(none)",
                    dl_registry_classes());
    dl_model_dir_free(d);
    return s;
}

void dl_gen_request_from(dl_gen_request *g, const dl_request *r) {
    *g = (dl_gen_request){.prompt = r->prompt, .negative_prompt = r->negative_prompt, .steps = r->steps,
                          .guidance = (float)r->guidance, .true_cfg = (float)r->true_cfg,
                          .seed = r->seed >= 0 ? (uint64_t)r->seed : 0, .fps = r->fps, .image = r->image,
                          .mask = r->mask, .image_width = r->image_width, .image_height = r->image_height,
                          .strength = r->strength, .partial_images = r->partial_images};
}

struct dl_pipeline {
    const dl_model_entry *e;
    void *impl;
};

dl_status dl_pipeline_load(dl_pipeline **out, const char *model_dir, const dl_gen_shape *shape) {
    *out = NULL;
    const dl_model_entry *e;
    dl_status s = dl_registry_lookup(model_dir, &e);
    if (s != DL_OK) return s;
    dl_pipeline *p = calloc(1, sizeof *p);
    if (!p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    p->e = e;
    dl_gen_shape sh = *shape;
    if (!sh.frames) { /* 0: the model's default frame count */
        int w, h;
        dl_registry_default_shape(e, model_dir, &w, &h, &sh.frames);
    }
    if ((s = e->load(&p->impl, model_dir, &sh)) != DL_OK) {
        free(p);
        return s;
    }
    *out = p;
    return DL_OK;
}

void dl_pipeline_free(dl_pipeline *p) {
    if (!p) return;
    p->e->free(p->impl);
    free(p);
}

const dl_model_entry *dl_pipeline_entry(const dl_pipeline *p) { return p->e; }
int dl_pipeline_is_host(const dl_pipeline *p) { return p->e->is_host(p->impl); }
dl_status dl_pipeline_worker_one(dl_pipeline *p, int *stopped) { return p->e->worker_one(p->impl, stopped); }

dl_status dl_pipeline_worker(dl_pipeline *p) {
    int stopped = 0;
    dl_status s = DL_OK;
    while (s == DL_OK && !stopped) s = dl_pipeline_worker_one(p, &stopped);
    return s;
}

void dl_gen_timing_stage(dl_gen_timing *t, const char *name, double s) {
    for (int i = 0; i < t->nstages; i++)
        if (!strcmp(t->stage[i].name, name)) {
            t->stage[i].s += s;
            return;
        }
    if (t->nstages < DL_GEN_STAGES) t->stage[t->nstages].name = name, t->stage[t->nstages++].s = s;
}

dl_status dl_pipeline_generate(dl_pipeline *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm) {
    memset(out, 0, sizeof *out);
    dl_gen_timing t = {0};
    if ((r->resume_latents || r->preempt) && !p->e->resumable) {
        dl_status s = dl_fail(DL_ERR_UNSUPPORTED, "%s cannot resume or preempt a request (its scheduler keeps state "
                                                  "between steps)", p->e->pipeline_class);
        dl_pipeline_abandon(p);
        return s;
    }
    dl_status s = p->e->generate(p->impl, r, out, &t);
    if (s != DL_OK) dl_media_free(out);
    if (tm) *tm = t;
    return s;
}

dl_status dl_pipeline_generate_rgb(dl_pipeline *p, const dl_gen_request *r, uint8_t *rgb, dl_gen_timing *tm) {
    dl_media m;
    dl_status s = dl_pipeline_generate(p, r, &m, tm);
    if (s == DL_OK) memcpy(rgb, m.rgb, (size_t)m.width * (size_t)m.height * 3 * (size_t)m.frames);
    dl_media_free(&m);
    return s;
}

const char *dl_pipeline_program_id(const dl_pipeline *p, int component) { return p->e->program_id(p->impl, component); }

const char *dl_pipeline_layout_check(const char *model_dir, const dl_par_config *c, int passes, int world, char *buf,
                                     size_t n) {
    const char *why = dl_par_check(c, passes, world, buf, n);
    if (why) return why;
    const dl_model_entry *e;
    if (dl_registry_lookup(model_dir, &e) != DL_OK) {
        snprintf(buf, n, "%s", dl_last_error());
        return buf;
    }
    if (e->split_check) return e->split_check(model_dir, c, buf, n);
    return e->default_heads > 0 ? dl_registry_heads_check(model_dir, c, e->default_heads, buf, n) : NULL;
}

void dl_pipeline_abandon(dl_pipeline *p) {
    if (!dl_pipeline_is_host(p)) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dl_last_error());
    /* every pipeline refuses a request without a prompt before its loop, which ends the
     * request on the replica's other ranks */
    dl_gen_request none = {.steps = 1};
    dl_media m = {0};
    dl_gen_timing t = {0};
    p->e->generate(p->impl, &none, &m, &t);
    dl_media_free(&m);
    dl_fail(DL_ERR_INVALID, "%s", msg); /* the caller's message again */
}

int dl_registry_passes(const dl_model_entry *e, const char *model_dir, float guidance, float true_cfg, int negative) {
    if (e->passes) return e->passes(model_dir, guidance, true_cfg, negative);
    return (e->guidance_cfg ? guidance > 1.f : true_cfg > 1.f && negative) ? 2 : 1;
}

void dl_registry_default_shape(const dl_model_entry *e, const char *model_dir, int *w, int *h, int *frames) {
    if (e->default_shape) {
        e->default_shape(model_dir, w, h, frames);
        return;
    }
    *w = (int)dl_model_default_int(model_dir, "width", 16, 8192, e->default_width);
    *h = (int)dl_model_default_int(model_dir, "height", 16, 8192, e->default_height);
    *frames = e->output == DL_MEDIA_IMAGE ? 1
                                          : (int)dl_model_default_int(model_dir, "num_frames", 1, 100000,
                                                                      e->default_frames > 0 ? e->default_frames : 1);
}

const char *dl_registry_heads_check(const char *dir, const dl_par_config *c, int64_t default_heads, char *buf, size_t n) {
    int64_t heads = dl_json_file_int(dir, "transformer/config.json", "num_attention_heads", 1, 1 << 20, default_heads);
    dl_dit_split sp = {.tp = c->tp, .cp = c->cp, .sp = c->sp, .cp_mode = c->cp_mode};
    const char *why = dl_dit_split_check(&sp, heads, buf, n);
    if (why && why != buf) {
        snprintf(buf, n, "%s", why);
        return buf;
    }
    return why;
}

dl_status dl_pipeline_program(dl_model_dir *dir, const char *folder, const char *shape_json, const dl_gen_shape *shape,
                              int probe, int split, dl_program_build_fn build, void *ctx, dl_artifact **art, char *id) {
    const dl_par_place *par = shape->par;
    char *key = NULL, lay[96] = "";
    dl_status s;
    /* int8 covers the denoiser and the text encoders; the VAEs (and vocoders,
     * connectors) keep the activation dtype */
    dl_quant quant = !strncmp(folder, "transformer", 11) || !strncmp(folder, "text_encoder", 12) ? shape->quant : DL_QUANT_NONE;
    if (split && par && (par->cfg.tp > 1 || par->cfg.cp > 1)) { /* this rank's part: its weight slices and rows */
        dl_par_config one = par->cfg;
        one.dp = one.cfg = 1; /* replicas and CFG groups run identical programs */
        dl_par_format(&one, lay, sizeof lay);
        s = dl_program_key_par(dir, folder, shape_json, shape->dt, quant, probe, lay, par->split.tp_rank + par->cfg.tp * par->split.cp_rank,
                               &key, id);
    } else
        s = dl_program_key(dir, folder, shape_json, shape->dt, quant, probe, &key, id);
    if (s == DL_OK) s = dl_program_get(dir, folder, key, id, shape->cache, quant, build, ctx, art);
    free(key);
    return s;
}

dl_status dl_pipeline_host_generate(void *impl, int host, dl_denoise *loop, dl_pipeline_gen_fn gen, const dl_gen_request *r,
                                    dl_media *out, dl_gen_timing *tm) {
    if (!host) return dl_fail(DL_ERR_INVALID, "only the host rank generates; the others serve its steps");
    int ran = 0;
    *out = (dl_media){0};
    /* the pipelines on this path (Wan, Qwen-Image) have no image-to-image flow */
    dl_status s = r->image || r->mask ? dl_fail(DL_ERR_UNSUPPORTED, "this pipeline has no image-to-image or inpainting flow "
                                                                  "(FLUX models have)")
                                      : gen(impl, r, out, tm, &ran);
    if (!ran) dl_denoise_abandon(loop);
    return s;
}

dl_status dl_pipeline_read_latents(const dl_checkpoint *ck, int64_t n, const char *shape, float *out) {
    const dl_st_tensor *t = dl_ckpt_find(ck, "latents");
    if (!t || t->numel != n || (t->dtype != DL_ST_F32 && t->dtype != DL_ST_BF16 && t->dtype != DL_ST_F16))
        return dl_fail(DL_ERR_INVALID, "%s: needs a float tensor \"latents\" of %s values", dl_ckpt_label(ck), shape);
    return dl_ckpt_read(t, DL_F32, out);
}

dl_status dl_pipeline_media(dl_media *out, dl_media_kind kind, const float *planar, int64_t F, int64_t H, int64_t W,
                            double fps, int want_pixels) {
    return dl_pipeline_media_opts(out, kind, planar, F, H, W, fps, want_pixels, DL_TO_BYTES_ROUND);
}

dl_status dl_pipeline_media_opts(dl_media *out, dl_media_kind kind, const float *planar, int64_t F, int64_t H, int64_t W,
                                 double fps, int want_pixels, dl_to_bytes how) {
    const size_t n = (size_t)(F * H * W * 3);
    *out = (dl_media){.kind = kind, .width = (int)W, .height = (int)H, .frames = (int)F, .fps = fps};
    if (!(out->rgb = malloc(n)) || (want_pixels && !(out->pixels = malloc(n * sizeof(float))))) {
        dl_media_free(out);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int64_t f = 0; f < F; f++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++)
                for (int c = 0; c < 3; c++) {
                    float v = planar[((c * F + f) * H + y) * W + x];
                    int64_t at = ((f * H + y) * W + x) * 3 + c;
                    if (how == DL_TO_BYTES_TRUNC) {
                        v = (v < -1.f ? -1.f : v > 1.f ? 1.f : v) + 1.f;
                        v /= 2.f;
                        float b = v * 255.f + 0.5f;
                        out->rgb[at] = (uint8_t)(b < 0.f ? 0.f : b > 255.f ? 255.f : b);
                    } else {
                        v = v / 2.f + 0.5f;
                        v = v < 0.f ? 0.f : v > 1.f ? 1.f : v;
                        out->rgb[at] = (uint8_t)lrintf(v * 255.f);
                    }
                    if (out->pixels) out->pixels[at] = v;
                }
    return DL_OK;
}
