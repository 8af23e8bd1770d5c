/* HunyuanVideo's pieces (diffusers' HunyuanVideoTransformer3DModel and pipeline) as
 * they are built. */
#ifndef DIFFLET_HUNYUAN_H
#define DIFFLET_HUNYUAN_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the token refiner (transformer's `context_embedder`, HunyuanVideoTokenRefiner) --
 *   pooled = mean(text[0:valid])                                  // the masked mean
 *   temb   = timestep_embedder(proj(t)) + text_embedder(pooled)   // [D]
 *   x      = proj_in(text)                                        // [T, D]
 *   per block: x += gate_msa * attn(LN1(x)); x += gate_mlp * ff(LN2(x))
 *              (gate_msa | gate_mlp = norm_out.linear(silu(temb)); ff = Linear(silu(Linear)))
 * Attention mask as diffusers builds it: rows of real tokens attend to the real keys,
 * padded rows only to key 0 ("the first key is always kept"). Built for T text rows
 * (the transformer's text length); f32 or bf16 matmul inputs, f32 stream. */
typedef struct dl_hunyuan_refiner dl_hunyuan_refiner;
dl_status dl_hunyuan_refiner_load(dl_hunyuan_refiner **out, dl_model_dir *dir, const char *component, int64_t T,
                                  dl_dtype dt, dl_wsrc *src);
int64_t dl_hunyuan_refiner_width(const dl_hunyuan_refiner *m); /* D = heads x head dim */
/* text [T, in_channels] (the Llama embeddings), `valid` real rows first (1..T), t the
 * transformer's timestep; out [T, D] */
dl_status dl_hunyuan_refiner_run(dl_hunyuan_refiner *m, const float *text, int64_t valid, float t, float *out);
void dl_hunyuan_refiner_free(dl_hunyuan_refiner *m);


/* ---- the transformer (HunyuanVideoTransformer3DModel; math in hunyuan_video.c) ----
 * Built for a latent grid lat_frames x lat_h x lat_w (each divisible by the patch),
 * txt_len text rows, dtype f32 or bf16, this rank's place in a split (NULL: one
 * rank). Refused by name: image_condition_type (image-to-video), qk_norm other than
 * rms_norm; a split whose heads or MLP width tp does not divide. */
typedef struct dl_hunyuan_video dl_hunyuan_video;
dl_status dl_hunyuan_video_load(dl_hunyuan_video **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                int64_t lat_h, int64_t lat_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src,
                                const dl_dit_split *split);
/* latents [Cin, F, H, W]; text [T, text_embed_dim] (the Llama embeddings, `valid` real
 * rows first, 1..T); pooled [pooled_projection_dim] (CLIP); timestep as the pipeline
 * passes it (sigma x 1000); guidance the embedded guidance scale (the model sees
 * guidance x 1000, as the pipeline scales it; ignored without guidance_embeds);
 * out [Cout, F, H, W], complete on every rank of a split. */
dl_status dl_hunyuan_video_run(dl_hunyuan_video *m, const float *latents, const float *text, int64_t valid,
                               const float *pooled, float timestep, float guidance, float *out);
int64_t dl_hunyuan_video_in_channels(const dl_hunyuan_video *m);
int64_t dl_hunyuan_video_out_channels(const dl_hunyuan_video *m);
int64_t dl_hunyuan_video_heads(const dl_hunyuan_video *m);
int64_t dl_hunyuan_video_width(const dl_hunyuan_video *m);
int dl_hunyuan_video_has_guidance(const dl_hunyuan_video *m);
void dl_hunyuan_video_text_dims(const dl_hunyuan_video *m, int64_t *text, int64_t *pooled);
void dl_hunyuan_video_patch(const dl_hunyuan_video *m, int64_t patch[3]); /* (pt, p, p) */
void dl_hunyuan_video_free(dl_hunyuan_video *m);

/* The step-caching probe (Difflet §5), a separate program of the transformer's
 * weights: the conditioning, the patch embedding and the first dual block's image
 * modulation LN(x)(1 + scale1) + shift1 over this rank's video tokens; score: its
 * relative L1 change since the same CFG slot's previous probe (0 on a slot's first),
 * summed over the cp group. */
typedef struct dl_hunyuan_probe dl_hunyuan_probe;
dl_status dl_hunyuan_probe_load(dl_hunyuan_probe **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                                int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
dl_status dl_hunyuan_probe_run(dl_hunyuan_probe *p, int slot, const float *latents, const float *pooled, float timestep,
                               float guidance, double *score);
void dl_hunyuan_probe_reset(dl_hunyuan_probe *p);
void dl_hunyuan_probe_free(dl_hunyuan_probe *p);

#ifdef __cplusplus
}
#endif
#endif
