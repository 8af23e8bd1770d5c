/* LTX-2's text encoder: the language model of transformers'
 * Gemma3ForConditionalGeneration on text alone, every hidden state kept
 * (src/models/gemma3.c). The vision tower and lm_head are never loaded. */
#ifndef DIFFLET_GEMMA3_H
#define DIFFLET_GEMMA3_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Gemma 3 text decoder (transformers 5 Gemma3TextModel) -------------------------
 * Scaled token embedding; per layer RMSNorm (1 + w), grouped-query self-attention
 * with per-head q/k RMSNorm and rotary embeddings, causal, on sliding-window or
 * full layers (layer_types) with their own RoPE; post-attention RMSNorm, residual;
 * pre-feedforward RMSNorm, gelu_tanh(gate) * up MLP, post-feedforward RMSNorm,
 * residual; final RMSNorm.
 * Config from <component>/config.json: model_type "gemma3" (fields in text_config)
 * or "gemma3_text" (top level); transformers 5 (layer_types, rope_parameters per
 * layer type) or 4 (sliding_window_pattern, rope_theta, rope_local_base_freq,
 * rope_scaling) spellings; missing fields take Gemma3TextConfig's defaults. Refused
 * by name: use_bidirectional_attention, attention_bias, a hidden_activation other
 * than gelu_pytorch_tanh, RoPE types other than default / linear,
 * partial_rotary_factor != 1, an unknown layer type. Tensors `model.language_model.*`
 * (transformers >= 4.52), `language_model.model.*` (the original Hub checkpoints),
 * `model.*` (Gemma3ForCausalLM) or bare, one file or shards, each checked against
 * the config's shape. Built for at most max_len tokens (1..65536); dt f32, or bf16
 * weights and matmul inputs with an f32 residual stream and norms (the embedding
 * scale rounded to bf16 then, as transformers' bf16 model does). */
typedef struct dl_gemma3_text dl_gemma3_text;
dl_status dl_gemma3_text_load(dl_gemma3_text **out, dl_model_dir *dir, const char *component, int64_t max_len,
                              dl_dtype dt, dl_wsrc *src);
int64_t dl_gemma3_text_width(const dl_gemma3_text *m);   /* hidden_size D */
int64_t dl_gemma3_text_vocab(const dl_gemma3_text *m);   /* vocab_size: ids must be below it */
int64_t dl_gemma3_text_max_len(const dl_gemma3_text *m); /* max_len it was built for */
int dl_gemma3_text_layers(const dl_gemma3_text *m);      /* L: run_all writes L + 1 states */
/* ids [n], 1 <= n <= max_len, LEFT-padded: the first pad_left positions (0 <=
 * pad_left < n) are padding (attention_mask 0), the rest the prompt. Writes
 * hidden [L + 1, n, D] f32, layer-major: hidden[k] = transformers'
 * hidden_states[k] of (input_ids = ids, attention_mask) — k = 0 the scaled
 * embeddings, 0 < k < L layer k-1's output, k = L the last layer's output through
 * the final norm. (LTX2Pipeline packs the same numbers token-major as
 * [n, D * (L + 1)] with index d * (L + 1) + k.) Positions are 0..n-1 whatever the
 * padding; padded rows are computed as transformers' sdpa path computes them:
 * their queries see no key, so their attention output is zero. DL_ERR_INVALID for
 * n, pad_left or an id out of range (naming its position). Allocates nothing. */
dl_status dl_gemma3_text_run_all(dl_gemma3_text *m, const int32_t *ids, int64_t n, int64_t pad_left, float *hidden);
void dl_gemma3_text_free(dl_gemma3_text *m);

#ifdef __cplusplus
}
#endif
#endif
