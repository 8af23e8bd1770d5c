/* difflet text: the tokenizers of the text encoders, reproducing what the Python
 * reference (tokenizers / transformers) gives, id for id.
 *   - byte-level BPE with CLIP's pipeline (NFC, whitespace collapse, lower case,
 *     CLIP's pre-tokenisation pattern, `</w>` word ends, BOS/EOS), from vocab.json +
 *     merges.txt or tokenizer.json;
 *   - SentencePiece Unigram with T5's pipeline (precompiled normalisation map,
 *     Metaspace `▁`, Viterbi segmentation, EOS), from tokenizer.json or spiece.model;
 *   - byte-level BPE with Qwen2's pipeline (Qwen-Image: NFC, Qwen2's pre-tokenisation
 *     pattern, no BOS/EOS), from tokenizer.json or vocab.json + merges.txt;
 *   - BPE with byte fallback and Gemma's pipeline (LTX-2's Gemma 3: spaces to `▁`, no
 *     pre-tokenisation, `<0xXX>` byte tokens for characters outside the vocabulary,
 *     BOS), from tokenizer.json. */
#ifndef DIFFLET_TEXT_H
#define DIFFLET_TEXT_H

#include "difflet/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DL_TOK_BPE = 0, DL_TOK_UNIGRAM } dl_tok_kind;

typedef struct dl_tokenizer dl_tokenizer;

/* Load from a tokenizer folder (e.g. FLUX's tokenizer/ or tokenizer_2/): uses
 * tokenizer.json if present, else vocab.json + merges.txt (BPE), else spiece.model
 * (Unigram). tokenizer_config.json's `tokenizer_class` picks what transformers 5
 * rebuilds: Qwen2Tokenizer / Qwen2TokenizerFast get Qwen2's pipeline and its added
 * tokens (ids as transformers numbers them) from either tokenizer.json or vocab.json
 * + merges.txt; GemmaTokenizer / GemmaTokenizerFast get Gemma's from tokenizer.json
 * (its vocabulary, merges and, unless the config says add_bos_token / add_eos_token,
 * post-processor), the added tokens as for Qwen2; T5Tokenizer gets T5's; vocab.json +
 * merges.txt of any other class are read as CLIP's. Errors name the file. */
dl_status dl_tokenizer_load(dl_tokenizer **out, const char *dir);
void dl_tokenizer_free(dl_tokenizer *t);

dl_tok_kind dl_tokenizer_kind(const dl_tokenizer *t);
int32_t dl_tokenizer_vocab_size(const dl_tokenizer *t);
int32_t dl_tokenizer_pad_id(const dl_tokenizer *t);
/* The EOS / BOS ids encode adds (-1 when none: Qwen2 adds neither). */
int32_t dl_tokenizer_eos_id(const dl_tokenizer *t);
int32_t dl_tokenizer_bos_id(const dl_tokenizer *t); /* -1 when none */

/* Prompt size limit: longer input is refused (DL_ERR_INVALID). */
#define DL_TOK_MAX_TEXT (1u << 20)

/* Encode `text` (UTF-8, `len` bytes) with the model's special tokens, truncated to
 * `max_len` ids (special tokens kept); when `pad` is set the rest of ids[0..max_len)
 * is the pad id. *n_valid: ids before padding. ids holds max_len entries. Invalid
 * UTF-8 is an error. */
dl_status dl_tokenizer_encode(const dl_tokenizer *t, const char *text, size_t len, int max_len,
                              int pad, int32_t *ids, int *n_valid);

/* Python's str.strip() on UTF-8 s[0, n): [*a, *b) without the str.isspace characters
 * (Unicode White_Space and U+001C..U+001F) at either end. */
void dl_text_strip(const char *s, size_t n, size_t *a, size_t *b);

/* dl_tokenizer_encode_opts flags */
enum {
    DL_TOK_PAD = 1,     /* pad on the right: ids[*n_valid..max_len) are the pad id */
    DL_TOK_PAD_LEFT = 2 /* pad on the left: ids[0..max_len - *n_valid) are the pad id and the
                           encoded ids end at max_len (transformers' padding_side "left", as
                           LTX2Pipeline pads Gemma's prompts) */
};
/* dl_tokenizer_encode with flags: without padding flags ids[0..*n_valid) are set and
 * the rest of ids[0..max_len) is left alone. Truncation is transformers' with
 * truncation=True: the first max_len - (number of special tokens) ids of the text are
 * kept, then BOS / EOS added, so max_len may be as small as that number (the text then
 * contributes no id; at least 1). Padding is refused when the tokenizer has no pad
 * token, and DL_TOK_PAD with DL_TOK_PAD_LEFT. dl_tokenizer_encode(..., pad, ...) is this
 * with flags pad ? DL_TOK_PAD : 0, except that it refuses max_len below special tokens
 * + 1 and pads with dl_tokenizer_pad_id even when that is -1. */
dl_status dl_tokenizer_encode_opts(const dl_tokenizer *t, const char *text, size_t len, int max_len,
                                   unsigned flags, int32_t *ids, int *n_valid);

/* The token string of every id (vocabulary and added tokens; NULL where an id has
 * none), as transformers' convert_ids_to_tokens shows them: *pieces[0..*n) malloc'd,
 * freed with dl_tokenizer_pieces_free. */
dl_status dl_tokenizer_pieces(const dl_tokenizer *t, char ***pieces, int32_t *n);
void dl_tokenizer_pieces_free(char **pieces, int32_t n);

/* Python's html.unescape of s[0..n) (HTML5 named and numeric character references,
 * as the standard library replaces them), NUL-terminated into *out (malloc'd). */
dl_status dl_html_unescape(const char *s, size_t n, char **out);
/* WanPipeline's prompt_clean as diffusers runs it with ftfy installed (ftfy 6.3.1):
 * ftfy.fix_text with its default settings, then html.unescape twice, str.strip,
 * runs of Unicode White_Space to one space, str.strip. *out malloc'd. Invalid
 * UTF-8 and prompts over DL_TOK_MAX_TEXT bytes are DL_ERR_INVALID. ftfy's
 * mojibake repair (fix_encoding) is not reproduced: see dl_text_clean_wan_opts. */
dl_status dl_text_clean_wan(const char *text, char **out);

/* ftfy.fix_text(text) with its default settings (ftfy 6.3.1) but the mojibake
 * repair, as dl_text_clean_wan applies it; *out malloc'd, *maybe_mojibake (may be
 * NULL) as for dl_text_clean_wan_opts. */
dl_status dl_text_ftfy_fix(const char *text, char **out, int *maybe_mojibake);

/* dl_text_clean_wan_opts flags */
enum {
    DL_CLEAN_NO_FTFY = 1 /* prompt_clean as diffusers runs it without ftfy installed */
};
/* dl_text_clean_wan with flags (0: the same as dl_text_clean_wan). When
 * maybe_mojibake is not NULL, *maybe_mojibake is 0 when the result is exactly
 * Python's, and 1 when the prompt holds characters ftfy's mojibake detector looks
 * at (Latin-1 letters and symbols, some Greek and Cyrillic, box drawing, ...): then
 * ftfy might have re-decoded part of it, which this function does not do. Always
 * 0 with DL_CLEAN_NO_FTFY. */
dl_status dl_text_clean_wan_opts(const char *text, unsigned flags, char **out, int *maybe_mojibake);

/* OpenSora 1.2's prompt cleaning before T5 (Open-Sora v1.2.0 text_preprocessing:
 * DeepFloyd IF / PixArt's clean_caption applied twice, on Python 3.11 with ftfy
 * 6.3.1 and beautifulsoup4 4.15.0): unquote_plus, strip and lower case, URLs,
 * BeautifulSoup(html.parser).text, @names, CJK blocks, dashes and quotes
 * normalised, IP addresses, ids, file names and shop boilerplate removed,
 * punctuation spacing, whitespace collapsed, quotes and punctuation at the ends
 * stripped. *out malloc'd. Invalid UTF-8 and prompts over DL_TOK_MAX_TEXT bytes
 * (also text grown past it before ftfy runs) are DL_ERR_INVALID, and so is markup
 * the reference's HTML parser rejects (a "<![" that opens no known marked
 * section: Python raises ParserRejectedMarkup).
 * Known divergence: ftfy's mojibake repair (fix_encoding) is not reproduced (see
 * dl_text_clean_wan_opts), so text ftfy would re-decode comes out un-repaired;
 * and NFC is utf8proc's (Unicode 15). */
dl_status dl_text_clean_caption(const char *text, char **out);
/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points past
 * U+10FFFF). */
int dl_utf8_valid(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
