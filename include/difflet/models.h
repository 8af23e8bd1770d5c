/* difflet models: one architecture per file, parameters named as in the
 * diffusers / transformers checkpoints, config read from the component's
 * config.json and checked against every tensor before any compute.
 *
 * A model is built for a fixed sequence length and dtype (f32 or bf16 weights and
 * matmul inputs; residual stream and outputs in f32): weights are packed and all
 * activation buffers allocated at load, so running allocates nothing. */
#ifndef DIFFLET_MODELS_H
#define DIFFLET_MODELS_H

#include "difflet/io.h"
#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CLIPTextModel (transformers) --------------------------------------------------
 * Token + position embeddings, pre-LN layers with causal self-attention and an MLP
 * (quick_gelu / gelu / gelu_new), final layer norm; pooled output at the EOS
 * position (first max id when config eos_token_id == 2, as transformers does for
 * older configs; else the first id equal to eos_token_id). Tensor names with or
 * without the `text_model.` prefix. */
typedef struct dl_clip_text dl_clip_text;
dl_status dl_clip_text_load(dl_clip_text **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                            dl_dtype dt);
int64_t dl_clip_text_width(const dl_clip_text *m);
int dl_clip_text_layers(const dl_clip_text *m);
/* ids: [seq_len]. hidden: [seq_len, width] last_hidden_state; pooled: [width] (may be
 * NULL). all_hidden (may be NULL): [(layers + 1), seq_len, width], the embeddings
 * and each layer's output, as transformers' hidden_states. */
dl_status dl_clip_text_run(dl_clip_text *m, const int32_t *ids, float *hidden, float *pooled, float *all_hidden);
void dl_clip_text_free(dl_clip_text *m);

/* ---- T5EncoderModel (transformers; v1.1 gated-gelu or original relu) ------------
 * RMS layer norms, self-attention without scaling plus the relative position bias of
 * the first layer (bidirectional buckets), gated-GELU or ReLU feed-forward, final
 * norm. Every position is attended (FLUX passes no attention mask). */
typedef struct dl_t5_encoder dl_t5_encoder;
dl_status dl_t5_encoder_load(dl_t5_encoder **out, dl_model_dir *dir, const char *component, int64_t seq_len,
                             dl_dtype dt);
int64_t dl_t5_encoder_width(const dl_t5_encoder *m);
int dl_t5_encoder_layers(const dl_t5_encoder *m);
/* hidden: [seq_len, d_model]; all_hidden as for CLIP (the last entry is after the
 * final norm, as transformers reports it). */
dl_status dl_t5_encoder_run(dl_t5_encoder *m, const int32_t *ids, float *hidden, float *all_hidden);
void dl_t5_encoder_free(dl_t5_encoder *m);

/* T5's bucket of a relative position (memory - query), as transformers computes it. */
int32_t dl_t5_bucket(int64_t rel, int bidirectional, int num_buckets, int max_distance);

#ifdef __cplusplus
}
#endif
#endif
