/* Qwen-Image's text encoder: the language-model path of transformers'
 * Qwen2_5_VLForConditionalGeneration for text-only prompts (src/models/qwen2.c).
 * The vision tower and lm_head are never loaded. */
#ifndef DIFFLET_QWEN_H
#define DIFFLET_QWEN_H

#include "difflet/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Qwen2.5-VL text decoder (transformers) ---------------------------------------
 * Token embedding; per layer RMSNorm, causal grouped-query self-attention (q/k/v with
 * biases, o without) with rotary embeddings (multimodal RoPE, which for text alone is
 * rotate_half RoPE at the 1-D position), RMSNorm, SwiGLU MLP; final RMSNorm.
 * Config from <component>/config.json: the text fields in `text_config` (transformers
 * 5) or at the top level (transformers 4, the published Qwen/Qwen-Image). Tensor
 * names `model.language_model.*` or `model.*`, whichever the checkpoint has (one file
 * or shards). Built for at most max_len tokens (1..65536); f32, or bf16 weights and
 * matmul inputs with an f32 residual stream and norms. */
typedef struct dl_qwen2_text dl_qwen2_text;
dl_status dl_qwen2_text_load(dl_qwen2_text **out, dl_model_dir *dir, const char *component, int64_t max_len,
                             dl_dtype dt, dl_wsrc *src);
int64_t dl_qwen2_text_width(const dl_qwen2_text *m);   /* hidden_size */
int64_t dl_qwen2_text_vocab(const dl_qwen2_text *m);   /* vocab_size: ids must be below it */
int64_t dl_qwen2_text_max_len(const dl_qwen2_text *m); /* max_len it was built for */
int dl_qwen2_text_layers(const dl_qwen2_text *m);
/* ids [n], 1 <= n <= max_len, one unpadded prompt: hidden [n, D] = transformers'
 * hidden_states[-1] (after the final norm) of input_ids = ids. Only rows [0, n) of
 * hidden are written; the work done scales with n (attention over [0, n), matmuls
 * on n rounded up to whole chunks of min(max_len, 128) rows). DL_ERR_INVALID for n
 * outside 1..max_len or an id outside the vocabulary (naming its position).
 * Allocates nothing. */
dl_status dl_qwen2_text_run(dl_qwen2_text *m, const int32_t *ids, int64_t n, float *hidden);
/* transformers' hidden_states[k] instead (k in 0..layers: 0 the embeddings, k < layers
 * layer k's raw output, k = layers the final normed output, as _run gives), for ids
 * right-padded after `valid` (1..n) tokens: attention_mask = 1 for the first `valid`,
 * so every row attends to the valid keys up to itself (the padded rows to all valid
 * ones). What HunyuanVideo reads of its Llama text encoder (hidden_states[-(skip + 1)]). */
dl_status dl_qwen2_text_run_hidden(dl_qwen2_text *m, const int32_t *ids, int64_t n, int64_t valid, int k, float *hidden);
void dl_qwen2_text_free(dl_qwen2_text *m);

/* HunyuanVideoPipeline._get_llama_prompt_embeds: the prompt put in the template (its
 * `{}`, as str.format fills it), tokenized with the tokenizer's specials, truncated or
 * right-padded to max_sequence_length + crop_start, the text encoder's
 * hidden_states[-(skip + 1)], the first crop_start rows dropped. embeds
 * [max_sequence_length, D]; mask [max_sequence_length]: 1 for real tokens. The text
 * encoder must be built for at least max_sequence_length + crop_start tokens. */
struct dl_tokenizer;
dl_status dl_hunyuan_llama_embeds(const struct dl_tokenizer *tok, dl_qwen2_text *te, const char *prompt, const char *tmpl,
                                  int crop_start, int max_sequence_length, int skip, float *embeds, int32_t *mask);

#ifdef __cplusplus
}
#endif
#endif
