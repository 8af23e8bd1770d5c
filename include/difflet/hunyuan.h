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

#ifdef __cplusplus
}
#endif
#endif
