/* Internals of the tokenizers: a growable byte buffer, UTF-8 and Unicode helpers
 * (utf8proc), the normalisers, and the two models (BPE, Unigram). */
#ifndef DIFFLET_TEXT_IMPL_H
#define DIFFLET_TEXT_IMPL_H

#include <stdint.h>
#include <stdlib.h>

#include "difflet/text.h"

/* ---- byte buffer ---- */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;
int dl_sbuf_put(sbuf *b, const void *data, size_t n); /* 0 on allocation failure */
int dl_sbuf_putc32(sbuf *b, int32_t cp);            /* UTF-8 encode */
void dl_sbuf_free(sbuf *b);

/* ---- UTF-8 / Unicode ---- */
/* Decode one code point at s[0..n); returns its length, or -1 if invalid. */
int dl_utf8_next(const char *s, size_t n, int32_t *cp);
int dl_uni_is_letter(int32_t cp);
int dl_uni_is_number(int32_t cp);
int dl_uni_is_space(int32_t cp); /* Unicode White_Space (Rust's char::is_whitespace) */

/* ---- normalisers: each maps text (in) to a new buffer (out) ---- */
typedef enum {
    NORM_NFC, NORM_NFKC, NORM_LOWER, NORM_WS_COLLAPSE /* \s+ -> " " */,
    NORM_SPACES_COLLAPSE /* " {2,}" -> " " */, NORM_PRECOMPILED, NORM_STRIP,
    NORM_SPACE_META /* " " -> "▁" (Gemma) */
} norm_kind;

/* SentencePiece's precompiled normalisation map: a darts-clone double array over
 * UTF-8 bytes and a blob of NUL-terminated replacement strings. */
typedef struct {
    uint32_t *units;
    size_t nunits;
    char *norm;
    size_t norm_len;
} charsmap;
dl_status dl_charsmap_parse(charsmap *c, const uint8_t *blob, size_t len);
void dl_charsmap_free(charsmap *c);

dl_status dl_normalize(norm_kind k, const charsmap *cm, const char *in, size_t n, sbuf *out);

/* ---- models ---- */
typedef struct bpe bpe;
/* vocab: token -> id; merges: "a b" lines in rank order. */
dl_status dl_bpe_new(bpe **out, dl_strmap *vocab, char **merges, size_t nmerges, int32_t unk_id, const char *suffix);
void dl_bpe_free(bpe *b);
/* The tokenizers library's BPE options, all off after dl_bpe_new: characters not in
 * the vocabulary as <0xXX> byte tokens, consecutive unknown characters as one unknown
 * token, a word found whole in the vocabulary taken as is. */
void dl_bpe_set_opts(bpe *b, int byte_fallback, int fuse_unk, int ignore_merges);
void dl_bpe_set_unk(bpe *b, int32_t unk_id); /* -1: unknown characters are dropped */
/* Encode one pre-tokenized word (already byte-level mapped); appends ids. */
dl_status dl_bpe_encode_word(const bpe *b, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap);

typedef struct unigram unigram;
/* pieces[i] with scores[i]; unk_id. */
dl_status dl_unigram_new(unigram **out, char **pieces, const double *scores, int32_t n, int32_t unk_id);
void dl_unigram_free(unigram *u);
dl_status dl_unigram_encode_word(const unigram *u, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap);

/* vocabulary lookups for special tokens */
dl_strmap *dl_bpe_vocab(const bpe *b);
int32_t dl_unigram_id(const unigram *u, const char *piece); /* -1 when absent */
const dl_strmap *dl_unigram_map(const unigram *u);

/* ---- the tokenizer (tokenizer.c runs it, tokenizer_load.c fills it) ---- */
enum { TOK_MAX_NORMS = 8, TOK_MAX_ADDED = 1 << 20 };

typedef struct {
    char *s;
    size_t n;
    int32_t id;
    int normalized;          /* matched in the normalized text, not the raw one */
    int lstrip, rstrip;      /* whitespace on that side belongs to the token */
    int single_word;         /* only between non-word characters */
} added_tok;

struct dl_tokenizer {
    dl_tok_kind kind;
    norm_kind norms[TOK_MAX_NORMS];
    int nnorm;
    charsmap cm;
    int clip_split, byte_level, ws_split, metaspace, meta_prepend /* 0 never 1 first 2 always */, meta_split;
    int qwen_split;      /* Qwen2's pattern (Split, Isolated) before byte-level */
    int split_digits;    /* its number runs: 1 digit (Qwen2) or up to 3 (Llama 3) */
    int space_split;     /* Split(" ", MergedWithPrevious): a piece ends after each space (Gemma) */
    int byte_level_regex; /* ByteLevel's own GPT-2 pattern (use_regex) is on */
    bpe *bpe;
    unigram *uni;
    added_tok *added; /* [nadded], malloc'd */
    int nadded, added_cap;
    int32_t *added_ord;    /* [nadded] indices into added, by first byte (dl_tok_index_added) */
    int added_first[257];  /* added_ord[added_first[c] .. added_first[c + 1]) start with byte c */
    int32_t bos, eos, pad, vocab_size;
    char bytemap[256][3]; /* byte-level: byte -> UTF-8 of its printable stand-in */
    uint8_t bytemap_len[256];
};

dl_tokenizer *dl_tok_alloc(void);
/* Register a token matched in the raw text before normalisation (special tokens). */
dl_status dl_tok_add_special(dl_tokenizer *t, const char *s, int32_t id);
/* The same with tokenizer.json's flags. */
dl_status dl_tok_add_token(dl_tokenizer *t, const char *s, int32_t id, int normalized, int lstrip, int rstrip,
                           int single_word);

/* Index the added tokens by first byte; after the last dl_tok_add_token, before encode
 * (without it encode scans them all). */
dl_status dl_tok_index_added(dl_tokenizer *t);

/* ids vector append */
int dl_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t v);

#endif
