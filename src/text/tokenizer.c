/* Tokenizer loading and the encode pipeline, as the tokenizers library runs it:
 *   split out added (special) tokens, matched in the raw text, leftmost-longest;
 *   normalise each other segment (the normaliser sequence of the file);
 *   pre-tokenise it into words (CLIP's pattern or Qwen2's, each piece mapped
 *   byte-level, whitespace split + Metaspace `▁`, or Gemma's cut after spaces);
 *   encode each word with the model (BPE or Unigram); add BOS/EOS as the
 *   post-processor says, truncate, pad (right or left).
 * Only the pipeline components that CLIP, T5, Qwen2 and Gemma tokenizers use are accepted;
 * any other is refused with its name, never silently skipped. */
#include <cjson/cJSON.h>
#include <string.h>

#include "text/text_impl.h"

#define META "\xe2\x96\x81" /* U+2581 ▁ */

static dl_status oom(void) { return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory"); }

void dl_tokenizer_free(dl_tokenizer *t) {
    if (!t) return;
    dl_bpe_free(t->bpe);
    dl_unigram_free(t->uni);
    dl_charsmap_free(&t->cm);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].s);
    free(t->added);
    free(t->added_ord);
    free(t);
}

dl_tok_kind dl_tokenizer_kind(const dl_tokenizer *t) { return t->kind; }
int32_t dl_tokenizer_vocab_size(const dl_tokenizer *t) { return t->vocab_size; }
int32_t dl_tokenizer_pad_id(const dl_tokenizer *t) { return t->pad; }
int32_t dl_tokenizer_eos_id(const dl_tokenizer *t) { return t->eos; }
int32_t dl_tokenizer_bos_id(const dl_tokenizer *t) { return t->bos; }

/* GPT-2's byte -> character table: printable bytes stand for themselves, the rest
 * map to U+0100 onwards in byte order. */
static void init_bytemap(dl_tokenizer *t) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        int cp = keep ? b : 256 + n++;
        if (cp < 0x80) {
            t->bytemap[b][0] = (char)cp;
            t->bytemap_len[b] = 1;
        } else {
            t->bytemap[b][0] = (char)(0xc0 | (cp >> 6));
            t->bytemap[b][1] = (char)(0x80 | (cp & 0x3f));
            t->bytemap_len[b] = 2;
        }
    }
}

dl_tokenizer *dl_tok_alloc(void) {
    dl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bos = t->eos = t->pad = -1;
    init_bytemap(t);
    return t;
}

dl_status dl_tok_add_special(dl_tokenizer *t, const char *s, int32_t id) { return dl_tok_add_token(t, s, id, 0, 0, 0, 0); }

dl_status dl_tok_add_token(dl_tokenizer *t, const char *s, int32_t id, int normalized, int lstrip, int rstrip,
                           int single_word) {
    if (!s || !*s || id < 0) return DL_OK;
    for (int i = 0; i < t->nadded; i++)
        if (!strcmp(t->added[i].s, s)) return DL_OK;
    if (t->nadded == TOK_MAX_ADDED) return dl_fail(DL_ERR_FORMAT, "tokenizer: more than %d added tokens", TOK_MAX_ADDED);
    if (t->nadded == t->added_cap) {
        int cap = t->added_cap ? 2 * t->added_cap : 64;
        added_tok *a = realloc(t->added, (size_t)cap * sizeof *a);
        if (!a) return oom();
        t->added = a, t->added_cap = cap;
    }
    free(t->added_ord); /* stale: rebuilt by dl_tok_index_added */
    t->added_ord = NULL;
    t->added[t->nadded].s = strdup(s);
    if (!t->added[t->nadded].s) return oom();
    t->added[t->nadded].n = strlen(s);
    t->added[t->nadded].id = id;
    t->added[t->nadded].normalized = normalized;
    t->added[t->nadded].lstrip = lstrip;
    t->added[t->nadded].rstrip = rstrip;
    t->added[t->nadded].single_word = single_word;
    t->nadded++;
    return DL_OK;
}

dl_status dl_tok_index_added(dl_tokenizer *t) {
    free(t->added_ord);
    t->added_ord = malloc(((size_t)t->nadded + 1) * sizeof *t->added_ord);
    if (!t->added_ord) return oom();
    int count[256] = {0};
    for (int a = 0; a < t->nadded; a++) count[(uint8_t)t->added[a].s[0]]++;
    t->added_first[0] = 0;
    for (int c = 0; c < 256; c++) t->added_first[c + 1] = t->added_first[c] + count[c];
    int fill[256];
    memcpy(fill, t->added_first, sizeof fill);
    for (int a = 0; a < t->nadded; a++) t->added_ord[fill[(uint8_t)t->added[a].s[0]]++] = a;
    return DL_OK;
}

/* ---- encode ------------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} idvec;

static dl_status encode_word(const dl_tokenizer *t, const char *w, size_t n, idvec *v) {
    if (t->kind == DL_TOK_BPE) return dl_bpe_encode_word(t->bpe, w, n, &v->ids, &v->n, &v->cap);
    return dl_unigram_encode_word(t->uni, w, n, &v->ids, &v->n, &v->cap);
}

/* One pre-tokenized piece s[0..n): mapped byte-wise (byte-level) into w, then encoded. */
static dl_status encode_piece(const dl_tokenizer *t, const char *s, size_t n, sbuf *w, idvec *v) {
    w->n = 0;
    if (!dl_sbuf_put(w, "", 0)) return oom();
    for (size_t b = 0; b < n; b++) {
        uint8_t c = (uint8_t)s[b];
        const char *src = t->byte_level ? t->bytemap[c] : s + b;
        if (!dl_sbuf_put(w, src, t->byte_level ? t->bytemap_len[c] : 1)) return oom();
    }
    return encode_word(t, w->p, w->n, v);
}

/* CLIP's pattern, leftmost-first alternation, whitespace dropped; each piece is then
 * mapped byte-wise (byte-level) and encoded. */
static dl_status clip_words(const dl_tokenizer *t, const char *s, size_t n, idvec *v) {
    /* the special tokens are matched in the raw text before this (added tokens); the
       pattern the tokenizers library runs has no alternation for them, so after lower
       casing "<|ENDOFTEXT|>" splits as "<|", "endoftext", "|>" (transformers 5) */
    static const char *lits[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    sbuf w = {0};
    dl_status st = DL_OK;
    size_t i = 0;
    while (i < n && st == DL_OK) {
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        size_t end = 0;
        for (size_t L = 0; L < sizeof lits / sizeof lits[0] && !end; L++) {
            size_t ll = strlen(lits[L]);
            if (ll <= n - i && !memcmp(s + i, lits[L], ll)) end = i + ll;
        }
        if (!end) {
            if (dl_uni_is_space(cp)) {
                i += (size_t)k;
                continue;
            }
            int cls = dl_uni_is_letter(cp) ? 1 : dl_uni_is_number(cp) ? 2 : 3;
            end = i + (size_t)k;
            if (cls != 2) /* letters run; other (not space, letter, number) run */
                while (end < n) {
                    int32_t c2;
                    int k2 = dl_utf8_next(s + end, n - end, &c2);
                    int cls2 = dl_uni_is_space(c2) ? 0 : dl_uni_is_letter(c2) ? 1 : dl_uni_is_number(c2) ? 2 : 3;
                    if (cls2 != cls) break;
                    end += (size_t)k2;
                }
        }
        st = encode_piece(t, s + i, end - i, &w, v);
        i = end;
    }
    dl_sbuf_free(&w);
    return st;
}

/* The code point at s[i..n) into *cp (0 at the end); its length (0 at the end; an
 * invalid byte counts as one, though encode only sees valid UTF-8). */
static size_t cp_at(const char *s, size_t n, size_t i, int32_t *cp) {
    *cp = 0;
    if (i >= n) return 0;
    int k = dl_utf8_next(s + i, n - i, cp);
    if (k <= 0) {
        *cp = 0xfffd;
        return 1;
    }
    return (size_t)k;
}

static int is_crlf(int32_t cp) { return cp == '\r' || cp == '\n'; }

/* The end of the run of code points from i on for which class(cp) holds. */
static size_t run_end(const char *s, size_t n, size_t i, int (*cls)(int32_t)) {
    int32_t cp;
    size_t k;
    while ((k = cp_at(s, n, i, &cp)) && cls(cp)) i += k;
    return i;
}

static int is_other(int32_t cp) { return !dl_uni_is_space(cp) && !dl_uni_is_letter(cp) && !dl_uni_is_number(cp); }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i..n): the match length or 0. Case-insensitive as
 * Oniguruma folds: ASCII either case, and U+017F (long s) folds to s. */
static size_t qwen_contraction(const char *s, size_t n, size_t i) {
    static const char *const suf[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (i >= n || s[i] != '\'') return 0;
    for (size_t a = 0; a < sizeof suf / sizeof suf[0]; a++) {
        size_t j = i + 1;
        const char *p = suf[a];
        for (; *p; p++) {
            int32_t cp;
            size_t k = cp_at(s, n, j, &cp);
            if (!k || !(cp == *p || cp == *p - 32 || (*p == 's' && cp == 0x17f))) break;
            j += k;
        }
        if (!*p) return j - i;
    }
    return 0;
}

/* The length of the match of Qwen2's pattern at s[i..n) (i < n), alternatives tried in
 * order as a backtracking engine does, the first that matches wins:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Llama 3's is the same with \p{N}{1,3} (digits: up to 3 numbers in a row).
 * Every code point is a letter, a number, whitespace or another, so one always does. */
static size_t qwen_match(const char *s, size_t n, size_t i, int digits) {
    size_t m = qwen_contraction(s, n, i);
    if (m) return m;
    int32_t c0, c1;
    size_t k0 = cp_at(s, n, i, &c0), k1 = cp_at(s, n, i + k0, &c1);
    if (dl_uni_is_letter(c0)) return run_end(s, n, i, dl_uni_is_letter) - i;
    if (!is_crlf(c0) && !dl_uni_is_number(c0) && k1 && dl_uni_is_letter(c1)) /* one leading non-letter */
        return run_end(s, n, i + k0, dl_uni_is_letter) - i;
    if (dl_uni_is_number(c0)) { /* up to `digits` number code points */
        size_t j = i + k0;
        for (int d = 1; d < digits && j < n; d++) {
            int32_t c;
            size_t k = cp_at(s, n, j, &c);
            if (!k || !dl_uni_is_number(c)) break;
            j += k;
        }
        return j - i;
    }
    size_t j = i + (c0 == ' ' && k1 && is_other(c1) ? k0 : 0), e = run_end(s, n, j, is_other);
    if (e > j) return run_end(s, n, e, is_crlf) - i;
    /* whitespace: the run [i, e) */
    e = run_end(s, n, i, dl_uni_is_space);
    size_t last_nl = 0, last_start = i;
    for (size_t p = i; p < e;) {
        int32_t cp;
        size_t k = cp_at(s, n, p, &cp);
        last_start = p;
        p += k;
        if (is_crlf(cp)) last_nl = p;
    }
    if (last_nl) return last_nl - i;            /* \s*[\r\n]+: up to the last CR/LF of the run */
    if (e == n || last_start == i) return e - i; /* \s+(?!\S) at the end, or \s+ of one char */
    return last_start - i;                      /* \s+(?!\S): the last char is left to the next piece */
}

/* Qwen2's Split (Isolated: the matches are the pieces), then byte-level, then BPE. */
static dl_status qwen_words(const dl_tokenizer *t, const char *s, size_t n, idvec *v) {
    sbuf w = {0};
    dl_status st = DL_OK;
    for (size_t i = 0; i < n && st == DL_OK;) {
        size_t m = qwen_match(s, n, i, t->split_digits);
        DL_ASSERT(m > 0 && m <= n - i);
        st = encode_piece(t, s + i, m, &w, v);
        i += m;
    }
    dl_sbuf_free(&w);
    return st;
}

/* Metaspace on one chunk: spaces become ▁, a ▁ is prepended per the scheme, and with
 * `split` the chunk is cut before every ▁. */
static dl_status metaspace_chunk(const dl_tokenizer *t, const char *s, size_t n, int first, idvec *v) {
    sbuf m = {0};
    dl_status st = DL_OK;
    /* spaces are replaced first, so a chunk starting with a space starts with ▁ */
    int starts_meta = (n >= 1 && s[0] == ' ') || (n >= 3 && !memcmp(s, META, 3));
    int prepend = !starts_meta && (t->meta_prepend == 2 || (t->meta_prepend == 1 && first));
    if ((prepend && !dl_sbuf_put(&m, META, 3)) || !dl_sbuf_put(&m, "", 0)) return oom();
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == ' ' ? dl_sbuf_put(&m, META, 3) : dl_sbuf_put(&m, s + i, 1))) {
            dl_sbuf_free(&m);
            return oom();
        }
    if (!t->meta_split) {
        st = encode_word(t, m.p, m.n, v);
    } else {
        size_t b = 0;
        for (size_t i = 3; i + 3 <= m.n && st == DL_OK; i++)
            if (!memcmp(m.p + i, META, 3)) { /* a piece ends before each ▁ (merged with next) */
                st = encode_word(t, m.p + b, i - b, v);
                b = i;
                i += 2;
            }
        if (st == DL_OK && b < m.n) st = encode_word(t, m.p + b, m.n - b, v);
    }
    dl_sbuf_free(&m);
    return st;
}

static dl_status pretok_and_encode(const dl_tokenizer *t, const char *s, size_t n, int first, idvec *v) {
    if (t->space_split) { /* a piece ends after each space (none are left after Gemma's normalizer) */
        dl_status st = DL_OK;
        for (size_t b = 0, i = 0; i < n && st == DL_OK; i++)
            if (s[i] == ' ' || i + 1 == n) {
                st = encode_word(t, s + b, i + 1 - b, v);
                b = i + 1;
            }
        return st;
    }
    if (t->qwen_split) return qwen_words(t, s, n, v);
    if (t->clip_split || t->byte_level) return clip_words(t, s, n, v);
    if (!t->metaspace) return encode_word(t, s, n, v);
    if (!t->ws_split) return metaspace_chunk(t, s, n, first, v);
    dl_status st = DL_OK;
    size_t i = 0;
    while (i < n && st == DL_OK) { /* whitespace split, each word through Metaspace */
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        if (dl_uni_is_space(cp)) {
            i += (size_t)k;
            continue;
        }
        size_t e = i + (size_t)k;
        while (e < n) {
            int k2 = dl_utf8_next(s + e, n - e, &cp);
            if (dl_uni_is_space(cp)) break;
            e += (size_t)k2;
        }
        st = metaspace_chunk(t, s + i, e - i, first && i == 0, v);
        i = e;
    }
    return st;
}

/* tokenizers' word characters (single_word tokens need none beside them) */
static int word_char(int32_t cp) { return cp == '_' || dl_uni_is_letter(cp) || dl_uni_is_number(cp); }

static int32_t cp_before(const char *s, size_t at) { /* the code point ending at `at` (0 at the start) */
    size_t b = at;
    while (b > 0 && ((uint8_t)s[b - 1] & 0xc0) == 0x80) b--;
    if (b == 0) return 0;
    b--;
    int32_t cp = 0;
    dl_utf8_next(s + b, at - b, &cp);
    return cp;
}

static size_t space_len(const char *s, size_t n) { /* whitespace at the start of s */
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        if (k <= 0 || !dl_uni_is_space(cp)) break;
        i += (size_t)k;
    }
    return i;
}

typedef dl_status (*piece_fn)(const dl_tokenizer *t, const char *s, size_t n, int first, idvec *v);

/* Cut s[0..n) at the added tokens whose `normalized` flag is `norm` (leftmost, then
 * longest; single_word, lstrip and rstrip as the tokenizers library applies them):
 * the text between goes to piece(), each token's id onto v. */
static dl_status split_added(const dl_tokenizer *t, const char *s, size_t n, int norm, int first, idvec *v, piece_fn piece) {
    dl_status st = DL_OK;
    size_t i = 0, seg = 0;
    while (i <= n && st == DL_OK) {
        int best = -1;
        size_t at = n;
        for (size_t p = i; p < n && best < 0; p++) {
            if (p > i && ((uint8_t)s[p] & 0xc0) == 0x80) continue; /* code point starts only */
            int lo = t->added_ord ? t->added_first[(uint8_t)s[p]] : 0;
            int hi = t->added_ord ? t->added_first[(uint8_t)s[p] + 1] : t->nadded;
            for (int q = lo; q < hi; q++) {
                int a = t->added_ord ? t->added_ord[q] : q;
                const added_tok *k = &t->added[a];
                if (k->normalized != norm || k->n > n - p || memcmp(s + p, k->s, k->n)) continue;
                if (k->single_word) {
                    int32_t after = 0;
                    if (p + k->n < n) dl_utf8_next(s + p + k->n, n - p - k->n, &after);
                    if (word_char(cp_before(s, p)) || word_char(after)) continue;
                }
                if (best < 0 || k->n > t->added[best].n) best = a, at = p;
            }
        }
        size_t end = at;
        if (best >= 0 && t->added[best].lstrip) /* the whitespace before belongs to the token */
            while (end > seg) {
                size_t b = end;
                while (b > seg && ((uint8_t)s[b - 1] & 0xc0) == 0x80) b--;
                if (b == seg) break;
                b--;
                if (space_len(s + b, end - b) != end - b) break;
                end = b;
            }
        if (end > seg) st = piece(t, s + seg, end - seg, first && seg == 0, v);
        if (best < 0 || st != DL_OK) break;
        if (!dl_ids_push(&v->ids, &v->n, &v->cap, t->added[best].id)) st = oom();
        i = seg = at + t->added[best].n;
        if (t->added[best].rstrip) i = seg = seg + space_len(s + seg, n - seg);
    }
    return st;
}

/* normalize a raw piece, then cut it at the added tokens matched in normalized text */
static dl_status encode_segment(const dl_tokenizer *t, const char *s, size_t n, int first, idvec *v) {
    sbuf a = {0}, b = {0};
    dl_status st = DL_OK;
    if (!dl_sbuf_put(&a, s, n)) return oom();
    for (int i = 0; i < t->nnorm && st == DL_OK; i++) {
        st = dl_normalize(t->norms[i], &t->cm, a.p, a.n, &b);
        sbuf tmp = a;
        a = b;
        b = tmp;
    }
    if (st == DL_OK) st = split_added(t, a.p, a.n, 1, first, v, pretok_and_encode);
    dl_sbuf_free(&a);
    dl_sbuf_free(&b);
    return st;
}

dl_status dl_tokenizer_encode(const dl_tokenizer *t, const char *text, size_t len, int max_len, int pad,
                              int32_t *ids, int *n_valid) {
    *n_valid = 0;
    int specials = (t->bos >= 0) + (t->eos >= 0);
    if (max_len < specials + 1) return dl_fail(DL_ERR_INVALID, "tokenizer: max_len %d is too small", max_len);
    dl_status st = dl_tokenizer_encode_opts(t, text, len, max_len, 0, ids, n_valid);
    if (st == DL_OK && pad)
        for (int o = *n_valid; o < max_len; o++) ids[o] = t->pad;
    return st;
}

dl_status dl_tokenizer_encode_opts(const dl_tokenizer *t, const char *text, size_t len, int max_len, unsigned flags,
                                   int32_t *ids, int *n_valid) {
    *n_valid = 0;
    int specials = (t->bos >= 0) + (t->eos >= 0);
    if (max_len < specials || max_len < 1)
        return dl_fail(DL_ERR_INVALID, "tokenizer: max_len %d is less than the %d special tokens it adds", max_len, specials);
    if ((flags & DL_TOK_PAD) && (flags & DL_TOK_PAD_LEFT))
        return dl_fail(DL_ERR_INVALID, "tokenizer: DL_TOK_PAD and DL_TOK_PAD_LEFT together");
    if ((flags & (DL_TOK_PAD | DL_TOK_PAD_LEFT)) && t->pad < 0)
        return dl_fail(DL_ERR_INVALID, "tokenizer: padding asked for, but the tokenizer has no pad token");
    if (len > DL_TOK_MAX_TEXT)
        return dl_fail(DL_ERR_INVALID, "prompt is %zu bytes, more than the %u allowed", len, DL_TOK_MAX_TEXT);
    if (!dl_utf8_valid(text, len)) return dl_fail(DL_ERR_INVALID, "prompt is not valid UTF-8");
    idvec v = {0};
    dl_status st = split_added(t, text, len, 0, 1, &v, encode_segment);
    if (st != DL_OK) {
        free(v.ids);
        return st;
    }
    /* truncation keeps the first ids of the text and the special tokens (transformers'
       truncation=True, truncation_side "right") */
    size_t body = v.n, room = (size_t)(max_len - specials);
    if (body > room) body = room;
    int n = specials + (int)body;
    int o = flags & DL_TOK_PAD_LEFT ? max_len - n : 0; /* left padding: the ids end at max_len */
    for (int k = 0; k < o; k++) ids[k] = t->pad;
    if (t->bos >= 0) ids[o++] = t->bos;
    for (size_t k = 0; k < body; k++) ids[o++] = v.ids[k];
    if (t->eos >= 0) ids[o++] = t->eos;
    if (flags & DL_TOK_PAD)
        while (o < max_len) ids[o++] = t->pad;
    *n_valid = n;
    free(v.ids);
    return DL_OK;
}

typedef struct {
    char **p;
    int32_t n;
    int oom;
} piece_ctx;

static void put_piece(void *ctx, const char *key, size_t len, int32_t id) {
    piece_ctx *c = ctx;
    if (id < 0 || id >= c->n || c->p[id]) return;
    if (!(c->p[id] = malloc(len + 1))) {
        c->oom = 1;
        return;
    }
    memcpy(c->p[id], key, len);
    c->p[id][len] = 0;
}

dl_status dl_tokenizer_pieces(const dl_tokenizer *t, char ***pieces, int32_t *n) {
    int32_t size = t->vocab_size;
    for (int i = 0; i < t->nadded; i++) size = t->added[i].id + 1 > size ? t->added[i].id + 1 : size;
    piece_ctx c = {calloc((size_t)size, sizeof(char *)), size, 0};
    if (!c.p) return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < t->nadded; i++) put_piece(&c, t->added[i].s, t->added[i].n, t->added[i].id);
    const dl_strmap *m = t->kind == DL_TOK_BPE ? dl_bpe_vocab(t->bpe) : dl_unigram_map(t->uni);
    if (m) dl_strmap_foreach(m, put_piece, &c);
    if (c.oom) {
        dl_tokenizer_pieces_free(c.p, c.n);
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    *pieces = c.p;
    *n = c.n;
    return DL_OK;
}

void dl_tokenizer_pieces_free(char **pieces, int32_t n) {
    for (int32_t i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
}
