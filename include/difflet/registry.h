/* The model registry: every pipeline class difflet serves, keyed on `_class_name`
 * in a diffusers folder's model_index.json, behind one interface. `generate`,
 * `compile`, `serve`, `profile measure`, `eval-cache` and the layout checks ask the
 * registry and never name a model; a new model is one entry (docs/adding-a-model.md).
 *
 * An entry says what the pipeline's components are (each a program), how its
 * shape is formed (image: width x height; video: width x height x frames), how it
 * loads, generates and serves the host's steps on the other ranks of a parallel
 * replica, which layouts it can split into, and what it outputs. */
#ifndef DIFFLET_REGISTRY_H
#define DIFFLET_REGISTRY_H

#include "difflet/pipeline.h"
#include "difflet/request.h"
#include "difflet/program.h"
#include "difflet/denoise.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shape a pipeline is loaded for (its programs' key) and how. */
typedef struct {
    int width, height, frames;  /* frames: 1 for image models (0: the model's default) */
    int max_sequence_length;    /* 0: the pipeline's own default */
    dl_dtype dt;
    dl_quant quant;             /* int8 linears in the transformer and text encoders (dt: the activations') */
    int cache;                  /* dl_cache_mode */
    int cfg_batch;              /* 1: the denoiser built for both CFG branches per call (batched CFG) */
    const dl_par_place *par;    /* NULL: one rank */
} dl_gen_shape;

/* One request, as the pipeline's __call__ takes it. */
typedef struct dl_gen_request {
    const char *prompt, *negative_prompt;
    int steps;
    float guidance;     /* guidance_scale */
    float true_cfg;     /* true_cfg_scale, where the pipeline has one */
    uint64_t seed;
    double fps;         /* video output rate (0: the model's default) */
    /* initial noise as diffusers takes it (--latents): tensors named after the
     * call arguments (`latents`, ...); NULL: drawn from the seed */
    const dl_checkpoint *init;
    /* image-to-image (pipelines that have it; NULL: text-to-image): the init image as
     * RGB bytes at the request's width x height, and for inpainting a mask of one byte
     * per pixel (diffusers' mask: luma >= 128 is repainted, the rest kept). strength
     * in (0, 1]: the share of the schedule that runs (diffusers' `strength`). With an
     * image, `init`'s `latents` is the noise the image is mixed with. */
    const uint8_t *image, *mask;
    int image_width, image_height; /* the image's (and mask's) size: must be the request's */
    double strength;
    const dl_stepcache_config *cache;
    int want_pixels; /* also the unrounded pixels (dl_media.pixels) */
    atomic_int *cancel; /* set from any thread: the request stops at the next step */
    void (*on_step)(void *ctx, int step, int steps, double elapsed);
    void (*on_decode)(void *ctx, int done, int total); /* chunked (video) decodes: after each chunk */
    void (*on_probe)(void *ctx, int step, int branch, double probe, double change);
    void *ctx;
    /* previews while denoising (OpenAI's partial_images, 0..3; image pipelines that
     * have them: FLUX): the VAE decode of the model's clean-image prediction
     * x0 = latents - sigma * v after evenly spaced steps, as RGB bytes */
    int partial_images;
    void (*on_partial)(void *ctx, int index, const uint8_t *rgb, int width, int height);
    /* DDiT (models whose entry is `resumable`): continue a preempted request at step
     * resume_step (>= 1) from the loop latents on_preempt handed over (resume_numel
     * values; NULL: from the start); with preempt, stop at the first step boundary at
     * which *preempt is set (from any thread): on_preempt(ctx, steps done, latents)
     * and DL_ERR_PREEMPTED, nothing decoded. The same request resumed on any layout
     * makes the output an uninterrupted run would (up to the layouts' own rounding).
     * Step caching must be off. */
    int resume_step;
    const float *resume_latents;
    int64_t resume_numel;
    atomic_int *preempt;
    void (*on_preempt)(void *ctx, int steps_done, const float *latents, int64_t n);
} dl_gen_request;

/* The call for a typed request (request.h): its prompt pointers are borrowed; a
 * request without a seed gets 0. Hooks, caching and noise are the caller's to add. */
void dl_gen_request_from(dl_gen_request *g, const dl_request *r);

enum { DL_GEN_STAGES = 12 };
typedef struct {
    double encode_s, denoise_s, decode_s, probe_s, cached_s, comm_s;
    int denoiser_calls, cached_steps, ranks;
    /* the request's stages in their order, where its pipeline times them apart (LTX-2);
     * names are static strings; nstages 0 elsewhere */
    int nstages;
    struct {
        const char *name;
        double s;
    } stage[DL_GEN_STAGES];
} dl_gen_timing;
/* adds s seconds to the stage `name` (appended when new; past DL_GEN_STAGES, dropped) */
void dl_gen_timing_stage(dl_gen_timing *t, const char *name, double s);

typedef struct dl_model_entry dl_model_entry;
struct dl_model_entry {
    const char *pipeline_class; /* model_index.json _class_name */
    dl_media_kind output;
    int default_steps;          /* the pipeline __call__'s num_inference_steps default */
    float default_guidance;     /* its guidance_scale default */
    float default_true_cfg;     /* its true_cfg_scale default (0: none, 1 is used) */
    double default_fps;         /* video pipelines: the export rate (0: images) */
    int image_to_image;         /* 1: requests may carry an init image and a mask (dl_gen_request.image) */
    int any_frames;             /* video: every frame count is valid (OpenSora); 0: k s + 1, s the VAE's
                                   scale_factor_temporal (4 when it does not say), as diffusers' pipelines round */
    int resumable;              /* 1: requests may be preempted and resumed (dl_gen_request's resume_*,
                                   preempt): its loop steps by Euler or a combine, no multistep state */
    int guidance_cfg;           /* 1: classifier-free guidance whenever guidance_scale > 1 (Wan);
                                   0: guidance is distilled, CFG is true_cfg_scale > 1 with a negative prompt (FLUX) */
    const char *const *components; /* its programs, in load order; the denoiser (the one every rank runs) last */
    int ncomponents;
    /* the size (and frame count) a model was made for: default_shape when the model
     * computes it, else the pipeline __call__'s default_width x default_height and
     * default_frames (1 for images), each overridable by the folder's difflet.json
     * `defaults` (width, height, num_frames); see dl_registry_default_shape */
    void (*default_shape)(const char *model_dir, int *width, int *height, int *frames);
    int default_width, default_height, default_frames;
    /* model-specific feasibility of a split (heads, tokens per rank, modes); NULL: the
     * shared heads check against transformer/config.json's num_attention_heads
     * (default_heads when it does not say) */
    const char *(*split_check)(const char *model_dir, const dl_par_config *c, char *buf, size_t n);
    int64_t default_heads;
    /* the denoiser passes a step makes for a request's guidance_scale, true_cfg_scale
     * and negative prompt (1 or more; cfg=2 places them on two rank groups); NULL:
     * 2 when guided (guidance_cfg above), else 1. LTX-2's guidance terms act at
     * guidance_scale 1 too. */
    int (*passes)(const char *model_dir, float guidance, float true_cfg, int negative);
    dl_status (*load)(void **impl, const char *model_dir, const dl_gen_shape *shape);
    void (*free)(void *impl);
    int (*is_host)(const void *impl);
    dl_status (*worker_one)(void *impl, int *stopped);
    dl_status (*generate)(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm);
    const char *(*program_id)(const void *impl, int component);
};

/* The denoiser passes per step of a request on a model (the entry's passes, see above). */
int dl_registry_passes(const dl_model_entry *e, const char *model_dir, float guidance, float true_cfg, int negative);
/* A model folder's default shape by its entry (see default_shape above). */
void dl_registry_default_shape(const dl_model_entry *e, const char *model_dir, int *width, int *height, int *frames);
/* The DiT split check every entry shares: `c` against the transformer's
 * num_attention_heads (transformer/config.json; default_heads when it does not say)
 * by dl_dit_split_check. NULL when feasible, else the reason in buf. */
const char *dl_registry_heads_check(const char *model_dir, const dl_par_config *c, int64_t default_heads, char *buf,
                                    size_t n);

/* One program of a pipeline being loaded (what every entry's load does per
 * component): its key from the component folder, the shape (shape_json), dtype and
 * probe flag, and for the denoiser on a split layout (split 1) this rank's place;
 * then loaded from the cache or built by build(ctx, ws) and cached. *art keeps the
 * mapped weights, id[17] gets the program id. */
dl_status dl_pipeline_program(dl_model_dir *dir, const char *folder, const char *shape_json, const dl_gen_shape *shape,
                              int probe, int split, dl_program_build_fn build, void *ctx, dl_artifact **art, char *id);
/* An entry's generate around the model's own: only the host generates, and a request
 * that fails before the loop ran still ends on every rank of the replica. */
typedef dl_status (*dl_pipeline_gen_fn)(void *impl, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm, int *ran);
dl_status dl_pipeline_host_generate(void *impl, int host, dl_denoise *loop, dl_pipeline_gen_fn gen, const dl_gen_request *r,
                                    dl_media *out, dl_gen_timing *tm);

/* `--latents`: the tensor `latents` of the initial noise (f32, bf16 or f16) with n
 * values into out; `shape` names the expected shape in the error. */
dl_status dl_pipeline_read_latents(const dl_checkpoint *ck, int64_t n, const char *shape, float *out);
/* A decoded [3, frames, height, width] output in [-1, 1] as a dl_media (x / 2 + 0.5
 * clamped to [0, 1], x255 rounded; pixels kept when asked): kind, size and fps set,
 * the buffers the caller's to free (dl_media_free). */
dl_status dl_pipeline_media(dl_media *out, dl_media_kind kind, const float *planar, int64_t frames, int64_t height,
                            int64_t width, double fps, int want_pixels);
/* How a decoded [-1, 1] value becomes a byte: diffusers' (x / 2 + 0.5 clamped, x255
 * rounded to nearest) or OpenSora's save_sample ((clamp(x, -1, 1) + 1) / 2,
 * x255 + 0.5 truncated) */
typedef enum { DL_TO_BYTES_ROUND = 0, DL_TO_BYTES_TRUNC } dl_to_bytes;
dl_status dl_pipeline_media_opts(dl_media *out, dl_media_kind kind, const float *planar, int64_t frames, int64_t height,
                                 int64_t width, double fps, int want_pixels, dl_to_bytes how);

/* A model folder's request defaults: its entry's (the pipeline __call__'s) unless the
 * folder's difflet.json says otherwise, for a model trained for other settings
 * (difflet-tiny-video: 20 steps at 8 fps). Keys: num_inference_steps, guidance_scale,
 * true_cfg_scale, fps. */
typedef struct {
    int steps;
    float guidance, true_cfg; /* true_cfg 0: the pipeline has none */
    double fps;               /* 0: an image pipeline */
} dl_model_defaults;
void dl_registry_defaults(const dl_model_entry *e, const char *model_dir, dl_model_defaults *d);

/* The entry for a pipeline class, or NULL. */
const dl_model_entry *dl_registry_find(const char *pipeline_class);
/* The entry for a model folder (its model_index.json), or an error naming the
 * class and the classes difflet serves. */
dl_status dl_registry_lookup(const char *model_dir, const dl_model_entry **out);
/* Entries in registration order, for listings. */
int dl_registry_count(void);
const dl_model_entry *dl_registry_at(int i);
/* The classes difflet serves, comma separated. */
const char *dl_registry_classes(void);

/* ---- a loaded pipeline of any registered class ---------------------------------- */
typedef struct dl_pipeline dl_pipeline;
dl_status dl_pipeline_load(dl_pipeline **out, const char *model_dir, const dl_gen_shape *shape);
void dl_pipeline_free(dl_pipeline *p); /* the host's free also releases the replica's workers */
const dl_model_entry *dl_pipeline_entry(const dl_pipeline *p);
int dl_pipeline_is_host(const dl_pipeline *p);
/* A non-host rank: the host's steps for one request, or (*stopped) the host's stop. */
dl_status dl_pipeline_worker_one(dl_pipeline *p, int *stopped);
dl_status dl_pipeline_worker(dl_pipeline *p);
/* Host: one request; `out` is filled (and owned by the caller) on success. */
dl_status dl_pipeline_generate(dl_pipeline *p, const dl_gen_request *r, dl_media *out, dl_gen_timing *tm);
/* Host: end a request refused before it ran (the replica's other ranks wait for its
 * end); the caller's error message stays the last one. No-op on other ranks. */
void dl_pipeline_abandon(dl_pipeline *p);
const char *dl_pipeline_program_id(const dl_pipeline *p, int component);
/* The same into a caller's buffer of frames x height x width x 3 bytes (the loaded
 * shape): for evaluation loops that keep many pictures. */
dl_status dl_pipeline_generate_rgb(dl_pipeline *p, const dl_gen_request *r, uint8_t *rgb, dl_gen_timing *tm);

/* Can `model_dir` run layout `c` with `passes` denoiser evaluations per step on
 * `world` ranks? NULL when it can, else the reason (in buf). */
const char *dl_pipeline_layout_check(const char *model_dir, const dl_par_config *c, int passes, int world, char *buf,
                                     size_t n);

#ifdef __cplusplus
}
#endif
#endif
