/* Qwen-Image (diffusers' QwenImagePipeline): the QwenImageTransformer2DModel
 * denoiser. The text encoder is qwen.h's, the VAE wan_vae.h's (Qwen-Image's VAE is
 * the Wan family's causal 3-D VAE on one frame). */
#ifndef DIFFLET_QWENIMAGE_H
#define DIFFLET_QWENIMAGE_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Built for a packed image grid (latent height / 2 x latent width / 2) and at most
 * txt_len text rows; `split` NULL for one rank (TP, SP, CP as FLUX's). */
typedef struct dl_qwenimage dl_qwenimage;
dl_status dl_qwenimage_load(dl_qwenimage **out, dl_model_dir *dir, const char *component, int64_t grid_h,
                            int64_t grid_w, int64_t txt_len, dl_dtype dt, dl_wsrc *src, const dl_dit_split *split);
int64_t dl_qwenimage_in_channels(const dl_qwenimage *m);  /* packed: 4 x latent channels */
int64_t dl_qwenimage_out_channels(const dl_qwenimage *m); /* per token: 4 x out_channels */
int64_t dl_qwenimage_heads(const dl_qwenimage *m);
int64_t dl_qwenimage_text_dim(const dl_qwenimage *m);     /* joint_attention_dim */
/* latents: [N, in] packed; txt: [txt_len, text_dim] with `valid` rows of prompt (the
 * rest never attended, whatever they hold); t: the pipeline's timestep / 1000
 * (sigma); out: [N, out] on every rank. */
dl_status dl_qwenimage_run(dl_qwenimage *m, const float *latents, const float *txt, int64_t valid, float t, float *out);
/* The step-caching probe, fused (Difflet §5): the first block's modulated image
 * input and its relative L1 change since the CFG slot's previous probe. */
dl_status dl_qwenimage_probe(dl_qwenimage *m, int slot, const float *latents, float t, double *score);
void dl_qwenimage_probe_reset(dl_qwenimage *m);
void dl_qwenimage_free(dl_qwenimage *m);

#ifdef __cplusplus
}
#endif
#endif
