/* Byte-pair encoding of one word, as the tokenizers library's BPE model does it.
 * Symbols start as the word's characters (the last one carrying the end-of-word
 * suffix, CLIP's `</w>`), each looked up in the vocabulary: a character that is not
 * there becomes its UTF-8 bytes as `<0xXX>` tokens (byte_fallback, Gemma), else the
 * unknown token (consecutive ones fused into one with fuse_unk), else it is dropped.
 * Then the adjacent pair with the lowest merge rank is merged, leftmost first, until
 * no pair has a rank: a heap of (rank, position) over a linked list of symbols, so a
 * word of n characters costs O(n log n) (Gemma's pipeline has no pre-tokenizer: a
 * whole prompt is one word). With ignore_merges a word that is itself in the
 * vocabulary is that one token. */
#include <stdio.h>
#include <string.h>

#include "text/text_impl.h"

struct bpe {
    dl_strmap *vocab; /* owned */
    dl_strmap *ranks; /* "a b" -> rank */
    int32_t unk;
    char *suffix;
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256]; /* <0xXX> ids, -1 where absent */
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
    for (int c = 0; c < 256; c++) {
        char tok[8];
        snprintf(tok, sizeof tok, "<0x%02X>", c);
        if (!dl_strmap_get(vocab, tok, 6, &b->byte_id[c])) b->byte_id[c] = -1;
    }
    *out = b;
    return DL_OK;
}

void dl_bpe_set_opts(bpe *b, int byte_fallback, int fuse_unk, int ignore_merges) {
    b->byte_fallback = byte_fallback;
    b->fuse_unk = fuse_unk;
    b->ignore_merges = ignore_merges;
}

void dl_bpe_set_unk(bpe *b, int32_t unk_id) { b->unk = unk_id; }

void dl_bpe_free(bpe *b) {
    if (!b) return;
    dl_strmap_free(b->vocab);
    dl_strmap_free(b->ranks);
    free(b->suffix);
    free(b);
}

typedef struct {
    size_t off, len;     /* its text in the symbol text buffer */
    int32_t id;          /* its vocabulary id */
    int64_t prev, next;  /* neighbours, -1 at the ends */
} sym;

typedef struct {
    int32_t rank;
    int64_t pos; /* the left symbol */
} cand;

static int cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* The merge rank of the pair (s[a], s[b]) or -1; key is scratch space. */
static int32_t pair_rank(const bpe *b, const char *text, const sym *s, int64_t a, int64_t c, sbuf *key, int *oom) {
    key->n = 0;
    if (!dl_sbuf_put(key, text + s[a].off, s[a].len) || !dl_sbuf_put(key, " ", 1) ||
        !dl_sbuf_put(key, text + s[c].off, s[c].len)) {
        *oom = 1;
        return -1;
    }
    int32_t r;
    return dl_strmap_get(b->ranks, key->p, key->n, &r) ? r : -1;
}

dl_status dl_bpe_encode_word(const bpe *b, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap) {
    if (n == 0) return DL_OK;
    int32_t whole;
    if (b->ignore_merges && dl_strmap_get(b->vocab, w, n, &whole))
        return dl_ids_push(ids, nids, cap, whole) ? DL_OK : dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
    /* text: the symbols' texts, contiguous in word order, so a merged symbol is a
       longer span. Each input byte makes at most one symbol; each symbol, and each
       merge, pushes at most two heap entries. */
    size_t sl = strlen(b->suffix), ns = 0, nh = 0;
    sbuf text = {0}, key = {0};
    sym *s = malloc((n + sl + 1) * sizeof *s);
    cand *heap = malloc((3 * (n + sl) + 1) * sizeof *heap);
    dl_status st = DL_OK;
    /* unk_open: an unknown token is pending (pushed before the next known character or
       at the end, as the tokenizers library does; byte tokens do not push it) */
    int oom = !s || !heap, unk_open = 0;
    for (size_t i = 0; i <= n && !oom;) {
        int32_t cp, id;
        int k = 0;
        if (i < n && (k = dl_utf8_next(w + i, n - i, &cp)) < 0) {
            st = dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            goto done;
        }
        const char *piece = w + i;
        size_t off = text.n, plen = (size_t)k + (i + (size_t)k == n ? sl : 0);
        if (i < n && !(dl_sbuf_put(&text, piece, (size_t)k) && (plen == (size_t)k || dl_sbuf_put(&text, b->suffix, sl)))) {
            oom = 1;
            break;
        }
        int known = i < n && dl_strmap_get(b->vocab, text.p + off, plen, &id);
        text.n = off;
        int fallback = i < n && !known && b->byte_fallback;
        for (size_t j = 0; fallback && j < plen; j++) /* every byte of the piece as <0xXX>, if all are there */
            fallback = b->byte_id[(uint8_t)(j < (size_t)k ? piece[j] : b->suffix[j - (size_t)k])] >= 0;
        int unknown = i < n && !known && !fallback && b->unk >= 0; /* else dropped */
        /* the pending unknown token goes out before a known character, before a new one
           unless fuse_unk fuses them, and at the end; an unknown symbol's text is one
           byte no token has (0xff is never in UTF-8), so no merge matches it */
        if (unk_open && (known || i == n || (unknown && !b->fuse_unk))) {
            oom |= !dl_sbuf_put(&text, "\xff", 1);
            s[ns++] = (sym){text.n - 1, 1, b->unk, 0, 0};
            unk_open = 0;
        }
        if (i == n) break;
        i += (size_t)k;
        if (known) {
            size_t o2 = text.n;
            oom |= !dl_sbuf_put(&text, piece, (size_t)k) || (plen > (size_t)k && !dl_sbuf_put(&text, b->suffix, sl));
            s[ns++] = (sym){o2, plen, id, 0, 0};
        } else if (fallback) {
            for (size_t j = 0; j < plen && !oom; j++) {
                uint8_t c = (uint8_t)(j < (size_t)k ? piece[j] : b->suffix[j - (size_t)k]);
                char tok[8];
                snprintf(tok, sizeof tok, "<0x%02X>", c);
                oom |= !dl_sbuf_put(&text, tok, 6);
                s[ns++] = (sym){text.n - 6, 6, b->byte_id[c], 0, 0};
            }
        } else if (unknown) {
            unk_open = 1;
        }
    }
    if (oom) goto nomem;
    for (size_t i = 0; i < ns; i++) {
        s[i].prev = (int64_t)i - 1;
        s[i].next = i + 1 < ns ? (int64_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < ns; i++) {
        int32_t r = pair_rank(b, text.p, s, (int64_t)i, (int64_t)i + 1, &key, &oom);
        if (r >= 0) heap_push(heap, &nh, (cand){r, (int64_t)i});
    }
    while (nh && !oom) {
        cand c = heap_pop(heap, &nh);
        int64_t a = c.pos, nx = s[a].next;
        if (nx < 0) continue; /* a symbol merged away has no next either */
        /* stale when either side has grown since: the pair's rank is then another */
        if (pair_rank(b, text.p, s, a, nx, &key, &oom) != c.rank) continue;
        s[a].len += s[nx].len;
        if (!dl_strmap_get(b->vocab, text.p + s[a].off, s[a].len, &s[a].id)) s[a].id = b->unk;
        s[a].next = s[nx].next;
        s[nx].next = -1;
        if (s[a].next >= 0) s[s[a].next].prev = a;
        int32_t r;
        if (s[a].prev >= 0 && (r = pair_rank(b, text.p, s, s[a].prev, a, &key, &oom)) >= 0)
            heap_push(heap, &nh, (cand){r, s[a].prev});
        if (s[a].next >= 0 && (r = pair_rank(b, text.p, s, a, s[a].next, &key, &oom)) >= 0)
            heap_push(heap, &nh, (cand){r, a});
    }
    if (oom) goto nomem;
    for (int64_t i = ns ? 0 : -1; i >= 0; i = s[i].next) {
        if (s[i].id < 0) continue; /* no unknown token: the tokenizers library drops the symbol */
        if (!dl_ids_push(ids, nids, cap, s[i].id)) goto nomem;
    }
    goto done;
nomem:
    st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(s);
    free(heap);
    dl_sbuf_free(&text);
    dl_sbuf_free(&key);
    return st;
}

dl_strmap *dl_bpe_vocab(const bpe *b) { return b->vocab; }
