/* Unigram (SentencePiece) segmentation of one pre-tokenized piece: the Viterbi
 * path over character boundaries maximising the sum of piece scores. Where no
 * piece covers a single character, an unknown node of score (lowest score - 10)
 * covers it, and consecutive unknowns fuse into one unk id, as the tokenizers
 * library does. Ties keep the path found first (earlier start of the last piece). */
#include <math.h>
#include <string.h>

#include "text/text_impl.h"

struct unigram {
    dl_strmap *map; /* piece -> id */
    double *scores;
    int32_t n, unk;
    size_t max_len; /* longest piece in bytes */
    double unk_score;
};

dl_status dl_unigram_new(unigram **out, char **pieces, const double *scores, int32_t n, int32_t unk_id) {
    *out = NULL;
    unigram *u = calloc(1, sizeof *u);
    if (!u) return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
    u->map = dl_strmap_new((size_t)n);
    u->scores = malloc((size_t)n * sizeof *u->scores);
    if (!u->map || !u->scores) {
        dl_unigram_free(u);
        return dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
    }
    u->n = n;
    u->unk = unk_id;
    double mn = INFINITY;
    for (int32_t i = 0; i < n; i++) {
        size_t len = strlen(pieces[i]);
        u->scores[i] = scores[i];
        if (scores[i] < mn) mn = scores[i];
        if (len > u->max_len) u->max_len = len;
        int32_t prev;
        if (dl_strmap_get(u->map, pieces[i], len, &prev)) continue; /* first id wins */
        if (dl_strmap_put(u->map, pieces[i], len, i) != DL_OK) {
            dl_unigram_free(u);
            return DL_ERR_NOMEM;
        }
    }
    u->unk_score = mn - 10.0;
    *out = u;
    return DL_OK;
}

void dl_unigram_free(unigram *u) {
    if (!u) return;
    dl_strmap_free(u->map);
    free(u->scores);
    free(u);
}

dl_status dl_unigram_encode_word(const unigram *u, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap) {
    if (n == 0) return DL_OK;
    /* best[j]: best score of a path covering w[0..j); from[j]: where its last node
     * starts; id[j]: that node's id (u->unk for an unknown node) */
    double *best = malloc((n + 1) * sizeof *best);
    size_t *from = malloc((n + 1) * sizeof *from);
    int32_t *id = malloc((n + 1) * sizeof *id);
    int32_t *rev = malloc((n + 1) * sizeof *rev);
    dl_status st = DL_OK;
    if (!best || !from || !id || !rev) {
        st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    for (size_t j = 0; j <= n; j++) best[j] = -INFINITY;
    best[0] = 0.0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = dl_utf8_next(w + i, n - i, &cp);
        if (k < 0) {
            st = dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
            goto done;
        }
        size_t next = i + (size_t)k;
        int single = 0;
        for (size_t j = next; j <= n && j - i <= u->max_len;) {
            int32_t pid;
            if (dl_strmap_get(u->map, w + i, j - i, &pid)) {
                double sc = best[i] + u->scores[pid];
                if (sc > best[j]) {
                    best[j] = sc;
                    from[j] = i;
                    id[j] = pid;
                }
                if (j == next) single = 1;
            }
            if (j == n) break;
            int kk = dl_utf8_next(w + j, n - j, &cp); /* advance to the next character boundary */
            if (kk < 0) {
                st = dl_fail(DL_ERR_INVALID, "text is not valid UTF-8");
                goto done;
            }
            j += (size_t)kk;
        }
        if (!single) {
            double sc = best[i] + u->unk_score;
            if (sc > best[next]) {
                best[next] = sc;
                from[next] = i;
                id[next] = -1; /* unknown node */
            }
        }
        i = next;
    }
    size_t nr = 0;
    for (size_t j = n; j > 0; j = from[j]) rev[nr++] = id[j];
    int prev_unk = 0;
    for (size_t r = nr; r-- > 0;) {
        int is_unk = rev[r] < 0;
        if (is_unk && prev_unk) continue; /* fuse consecutive unknowns */
        prev_unk = is_unk;
        if (!dl_ids_push(ids, nids, cap, is_unk ? u->unk : rev[r])) {
            st = dl_fail(DL_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
    }
done:
    free(best), free(from), free(id), free(rev);
    return st;
}

int32_t dl_unigram_id(const unigram *u, const char *piece) {
    int32_t id;
    return dl_strmap_get(u->map, piece, strlen(piece), &id) ? id : -1;
}

const dl_strmap *dl_unigram_map(const unigram *u) { return u->map; }
