/* AutoencoderKLHunyuanVideo decoder (diffusers; the HunyuanVideo causal 3-D VAE),
 * src/models/hunyuan_vae.c.
 *
 * Decodes as diffusers' vae.decode does with its default settings: a clip of more
 * than 4 latent frames runs the temporal tiling (tiles of 5 latent frames every 3,
 * each decoded from scratch, blended over 4 video frames), a shorter one is decoded
 * whole; spatial tiling (off by default in diffusers) is not run. Built for a fixed
 * latent size and dtype (f32 or bf16 weights and convolution inputs; norms, residual
 * sums, blending and the output in f32); every convolution and activation buffer is
 * made at load, so decoding allocates nothing and memory is bounded by one tile,
 * whatever the number of frames. Refused by name: up_block_types other than
 * HunyuanVideoUpBlock3D, act_fn other than silu, out_channels other than 3,
 * temporal_compression_ratio other than 4, a spatial_compression_ratio the up
 * blocks cannot give. */
#ifndef DIFFLET_HUNYUAN_VAE_H
#define DIFFLET_HUNYUAN_VAE_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_hunyuan_vae dl_hunyuan_vae;

/* Reads <component>/config.json and the decoder's weights (`decoder.*`,
 * `post_quant_conv.*`; from `src`, a program's weight source, or NULL: the
 * component's checkpoint), checks every tensor's shape against the config, and
 * builds the decoder for a latent of lat_frames x lat_h x lat_w. Bad sizes are
 * DL_ERR_INVALID, a dtype other than f32 / bf16 DL_ERR_UNSUPPORTED; a config or
 * checkpoint that disagrees is an error naming the field or tensor. */
dl_status dl_hunyuan_vae_load(dl_hunyuan_vae **out, dl_model_dir *dir, const char *component, int64_t lat_frames,
                              int64_t lat_h, int64_t lat_w, dl_dtype dt, dl_wsrc *src);
/* Latent channels (config latent_channels). */
int64_t dl_hunyuan_vae_latent_channels(const dl_hunyuan_vae *m);
/* Video pixels per latent pixel along each axis (config spatial_compression_ratio). */
int dl_hunyuan_vae_scale_spatial(const dl_hunyuan_vae *m);
/* Video frames per latent frame after the first (temporal_compression_ratio, 4). */
int dl_hunyuan_vae_scale_temporal(const dl_hunyuan_vae *m);
/* Output frames: (lat_frames - 1) * scale_temporal + 1. */
int64_t dl_hunyuan_vae_frames(const dl_hunyuan_vae *m);
/* Config scaling_factor (0.476986 when absent): the pipeline divides its latents by
 * it before decoding; dl_hunyuan_vae_decode takes them already divided. */
float dl_hunyuan_vae_scaling_factor(const dl_hunyuan_vae *m);
/* Tiles one decode runs (the progress total): 1 for at most 4 latent frames, else
 * one per 3 latent frames (a last tile of one latent frame, which adds no video
 * frame in diffusers, is not run). */
int dl_hunyuan_vae_tiles(const dl_hunyuan_vae *m);
/* Bytes held for decoding, fixed at load: activations of one tile plus the blend
 * buffers (weights not counted). */
size_t dl_hunyuan_vae_activation_bytes(const dl_hunyuan_vae *m);

/* z: [latent_channels, lat_frames, lat_h, lat_w] f32, already divided by the
 * scaling factor (what the pipeline hands vae.decode); video: [3, frames, lat_h *
 * scale, lat_w * scale] f32, not clamped (diffusers' decode(z).sample; the pipeline
 * post-processes it). Every tile is decoded from scratch, so decoding the same z
 * twice gives the same bytes; on_chunk (may be NULL) is called with ctx after each
 * tile (done of total). One decode at a time per model. A non-finite latent is
 * DL_ERR_INVALID. */
dl_status dl_hunyuan_vae_decode(dl_hunyuan_vae *m, const float *z, float *video,
                                void (*on_chunk)(void *ctx, int done, int total), void *ctx);
void dl_hunyuan_vae_free(dl_hunyuan_vae *m);

#ifdef __cplusplus
}
#endif
#endif
