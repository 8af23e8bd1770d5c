/* FLUX.1: FluxTransformer2DModel (models/flux.c, on the DiT library) and FluxPipeline
 * (pipeline/flux_pipeline.c, registered as "FluxPipeline"). Everything else reaches
 * FLUX through the registry (registry.h); this header is for its tests and the
 * FLUX-width benchmarks. */
#ifndef DIFFLET_FLUX_H
#define DIFFLET_FLUX_H

#include <stdatomic.h>

#include "difflet/models.h"
#include "difflet/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- FluxTransformer2DModel (diffusers) ------------------------------------------
 * Built for a packed latent grid of grid_h x grid_w tokens and txt_len text tokens
 * (patch_size 1; RoPE ids as FluxPipeline makes them: text zeros, image (0, row,
 * col)). Double-stream and single-stream blocks, guidance embedding when the config
 * has guidance_embeds. */
typedef struct dl_flux dl_flux;
dl_status dl_flux_load(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                       int64_t txt_len, dl_dtype dt, dl_wsrc *src);
int64_t dl_flux_in_channels(const dl_flux *m);
int64_t dl_flux_out_channels(const dl_flux *m);
int64_t dl_flux_width(const dl_flux *m);
int dl_flux_has_guidance(const dl_flux *m);
/* Number of double blocks; *n_single gets the single ones. */
int dl_flux_blocks(const dl_flux *m, int *n_single);
/* One denoiser evaluation. latents: [N, in_channels] packed; txt: [txt_len,
 * joint_attention_dim]; pooled: [pooled_projection_dim]; timestep as FluxPipeline
 * passes it (sigma, i.e. t / 1000); guidance ignored without a guidance embedding.
 * out: [N, out_channels]. block_out (may be NULL): after each block, the joint
 * stream [txt_len + N, width] (text rows first). */
dl_status dl_flux_run(dl_flux *m, const float *latents, const float *txt, const float *pooled, float timestep,
                      float guidance, float *out, float *block_out);
void dl_flux_free(dl_flux *m);

/* As dl_flux_load, building this rank's part (its weight slices, its rows). */
dl_status dl_flux_load_split(dl_flux **out, dl_model_dir *dir, const char *component, int64_t grid_h, int64_t grid_w,
                             int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
int64_t dl_flux_heads(const dl_flux *m);
/* joint_attention_dim (T5 width) and pooled_projection_dim (CLIP width) */
void dl_flux_text_dims(const dl_flux *m, int64_t *joint, int64_t *pooled);
/* Valid text tokens [0, valid) of txt_len (the rest is padding and is never
 * attended); txt_len by default. Every rank of a split model must set the same. */
dl_status dl_flux_set_text_valid(dl_flux *m, int64_t valid);
/* The step-caching probe, fused into the denoiser: the first block's modulated
 * image input (x_embedder, then LN * (1 + scale) + shift of block 0) for these
 * inputs, compared with the last call of the same slot (0 or 1, one per CFG
 * branch): *score = relative L1 change (0 on a slot's first call). On a split
 * model it is collective over the cp group (sums reduced in rank order, so every
 * rank gets the same score bit for bit). */
dl_status dl_flux_probe(dl_flux *m, int slot, const float *latents, const float *pooled, float timestep,
                        float guidance, double *score);
void dl_flux_probe_reset(dl_flux *m);
/* Memory the probe holds (its feature buffers), once used. */
size_t dl_flux_probe_bytes(const dl_flux *m);

/* ---- FluxPipeline ------------------------------------------------------------------ */
typedef struct dl_flux_pipeline dl_flux_pipeline;

typedef struct {
    int width, height;    /* pixels; multiples of 2 * the VAE's scale (16 for FLUX) */
    int max_sequence_length; /* T5 tokens; 0: tokenizer_2's model_max_length if below 512, else 512 */
    dl_dtype dt;
    dl_quant quant;          /* int8 linears in the transformer and text encoders */
    int cache;               /* dl_cache_mode (program.h): 0 = load or compile and cache */
    /* Parallel execution (NULL: one rank). Every rank of a replica loads the pipeline
     * with its place: the replica's first rank (the host) loads the tokenizers, text
     * encoders and VAE and runs the host flow; every rank loads its part of the
     * transformer (its own program: the split is in the key) and, if not the host,
     * serves the host's steps in dl_flux_pipeline_worker. */
    const dl_par_place *par;
} dl_flux_shape;

/* Load every component of a diffusers FluxPipeline folder for this shape. */
dl_status dl_flux_pipeline_load(dl_flux_pipeline **out, const char *model_dir, const dl_flux_shape *shape);
/* The host's free also releases the replica's workers. */
void dl_flux_pipeline_free(dl_flux_pipeline *p);
/* 1 on the rank that runs the host flow (always, without parallel execution). */
int dl_flux_pipeline_is_host(const dl_flux_pipeline *p);
/* A non-host rank: execute the host's denoiser steps until it stops (its free). */
dl_status dl_flux_pipeline_worker(dl_flux_pipeline *p);
/* The same for one request: returns when the host ends it (or, *stopped set, when
 * the host frees the pipeline). */
dl_status dl_flux_pipeline_worker_one(dl_flux_pipeline *p, int *stopped);
/* Packed latent token count and channels (the shape of an initial latent). */
void dl_flux_pipeline_latent_shape(const dl_flux_pipeline *p, int64_t *tokens, int64_t *channels);
int dl_flux_pipeline_has_guidance(const dl_flux_pipeline *p);
int dl_flux_pipeline_max_sequence_length(const dl_flux_pipeline *p);
/* The program id of component 0..3 (CLIP, T5, VAE, transformer). */
const char *dl_flux_pipeline_program_id(const dl_flux_pipeline *p, int component);
/* The size a model was made for: its VAE's sample_size (1024 for FLUX.1). */
int dl_flux_default_size(const char *model_dir);

typedef struct {
    const char *prompt;          /* used for both text encoders, as FluxPipeline's prompt_2 = prompt */
    const char *negative_prompt; /* with true_cfg > 1: true classifier-free guidance */
    int steps;
    float guidance;              /* distilled guidance (models with guidance_embeds) */
    float true_cfg;              /* > 1 with a negative prompt: two passes per step */
    uint64_t seed;
    const float *init_latents;   /* packed [tokens, channels] or NULL (then dl_randn(seed)); with an
                                    image: the noise mixed into it */
    /* FluxImg2ImgPipeline / FluxInpaintPipeline (NULL: FluxPipeline): the init image,
     * RGB bytes at the pipeline's size; the mask, one byte per pixel (>= 128: repaint);
     * strength in (0, 1] */
    const uint8_t *image, *mask;
    double strength;
    int partial_images; /* 0..3 previews (dl_gen_request) */
    void (*on_partial)(void *ctx, int index, const uint8_t *rgb, int width, int height);
    const dl_stepcache_config *cache; /* NULL or mode off: every step runs the denoiser */
    atomic_int *cancel;          /* checked before every step: nonzero stops with DL_ERR_CANCELLED */
    /* called after each step (may be NULL) */
    void (*on_step)(void *ctx, int step, int steps, double elapsed);
    void *ctx;
    /* calibration (may be NULL): per step and branch, the probe score and the
     * relative L1 change of the denoiser output (full steps only) */
    void (*on_probe)(void *ctx, int step, int branch, double probe, double change);
} dl_flux_request;

typedef struct {
    double encode_s, denoise_s, decode_s, probe_s, cached_s; /* cached_s: time in estimated steps */
    int transformer_calls, cached_steps;
    int ranks;          /* ranks of the replica that checked they ran exactly the decided steps */
    double comm_s;      /* host: seconds in communication (parallel execution) */
} dl_flux_timing;

/* Generate one image: rgb is height*width*3 bytes (row-major, RGB); image (may be
 * NULL) the same as floats in [0, 1] before rounding. */
dl_status dl_flux_generate(dl_flux_pipeline *p, const dl_flux_request *r, uint8_t *rgb, float *image,
                           dl_flux_timing *timing);

#ifdef __cplusplus
}
#endif
#endif
