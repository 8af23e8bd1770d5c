/* Byte-pair encoding of one word. Symbols start as the word's characters (the
 * last one carrying the end-of-word suffix, CLIP's `</w>`); the adjacent pair with
 * the lowest merge rank is merged, all its non-overlapping occurrences left to
 * right, until no pair has a rank. Symbols are then looked up in the vocabulary;
 * an unknown one becomes the unk id, or is dropped when there is none (as the
 * tokenizers library does). */
#include <string.h>

#include "text/text_impl.h"

struct bpe {
    dl_strmap *vocab; /* owned */
    dl_strmap *ranks; /* "a b" -> rank */
    int32_t unk;
    char *suffix;
};

dl_status dl_bpe_new(bpe **out, dl_strmap *vocab, char **merges, size_t nmerges, int32_t unk_id, const char *suffix) {
    *out = NULL;
    bpe *b = calloc(1, sizeof *b);
    if (!b) return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
    b->vocab = vocab;
    b->unk = unk_id;
    b->suffix = strdup(suffix ? suffix : "");
    b->ranks = dl_strmap_new(nmerges);
    if (!b->ranks || !b->suffix) {
        dl_bpe_free(b);
        return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; i < nmerges; i++) {
        int32_t dummy;
        size_t len = strlen(merges[i]);
        if (dl_strmap_get(b->ranks, merges[i], len, &dummy)) continue; /* first rank wins */
        if (dl_strmap_put(b->ranks, merges[i], len, (int32_t)i) != DL_OK) {
            dl_bpe_free(b);
            return DL_ERR_NOMEM;
        }
    }
    *out = b;
    return DL_OK;
}

void dl_bpe_free(bpe *b) {
    if (!b) return;
    dl_strmap_free(b->vocab);
    dl_strmap_free(b->ranks);
    free(b->suffix);
    free(b);
}

typedef struct {
    size_t off, len; /* into the symbol text buffer */
} sym;

dl_status dl_bpe_encode_word(const bpe *b, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap) {
    if (n == 0) return DL_OK;
    /* text = word + suffix; symbols index into it and grow by merging neighbours,
     * which stay contiguous, so a merged symbol is just a longer span */
    size_t sl = strlen(b->suffix), ns = 0;
    sbuf text = {0}, key = {0};
    sym *s = malloc((n + 1) * sizeof *s);
    dl_status st = DL_OK;
    if (!s || !dl_sbuf_put(&text, w, n) || !dl_sbuf_put(&text, b->suffix, sl)) {
        st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dl_utf8_next(w + i, n - i, &cp);
        if (k < 0) {
            st = dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            goto done;
        }
        s[ns++] = (sym){i, (size_t)k};
        i += (size_t)k;
    }
    s[ns - 1].len += sl;
    for (;;) {
        int32_t best = INT32_MAX;
        for (size_t i = 0; i + 1 < ns; i++) {
            key.n = 0;
            if (!dl_sbuf_put(&key, text.p + s[i].off, s[i].len) || !dl_sbuf_put(&key, " ", 1) ||
                !dl_sbuf_put(&key, text.p + s[i + 1].off, s[i + 1].len)) {
                st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
                goto done;
            }
            int32_t r;
            if (dl_strmap_get(b->ranks, key.p, key.n, &r) && r < best) best = r;
        }
        if (best == INT32_MAX) break;
        size_t o = 0;
        for (size_t i = 0; i < ns; i++) { /* merge every occurrence of the best pair */
            if (i + 1 < ns) {
                key.n = 0;
                dl_sbuf_put(&key, text.p + s[i].off, s[i].len);
                dl_sbuf_put(&key, " ", 1);
                dl_sbuf_put(&key, text.p + s[i + 1].off, s[i + 1].len);
                int32_t r;
                if (dl_strmap_get(b->ranks, key.p, key.n, &r) && r == best) {
                    s[o++] = (sym){s[i].off, s[i].len + s[i + 1].len};
                    i++;
                    continue;
                }
            }
            s[o++] = s[i];
        }
        ns = o;
    }
    for (size_t i = 0; i < ns; i++) {
        int32_t id;
        if (!dl_strmap_get(b->vocab, text.p + s[i].off, s[i].len, &id)) id = b->unk;
        if (id < 0) continue; /* no unknown token: the tokenizers library drops the symbol */
        if (!dl_ids_push(ids, nids, cap, id)) {
            st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
    }
done:
    free(s);
    dl_sbuf_free(&text);
    dl_sbuf_free(&key);
    return st;
}

dl_strmap *dl_bpe_vocab(const bpe *b) { return b->vocab; }
