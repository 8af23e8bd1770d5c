/* Byte buffers, UTF-8 decoding and the Unicode classes the tokenizers need
 * (letters, numbers, White_Space), from utf8proc. */
#include <string.h>
#include <utf8proc.h>

#include "text/text_impl.h"

int dl_sbuf_put(sbuf *b, const void *data, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) return 0;
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

int dl_sbuf_putc32(sbuf *b, int32_t cp) {
    uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    return k > 0 && dl_sbuf_put(b, tmp, (size_t)k);
}

void dl_sbuf_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int dl_utf8_next(const char *s, size_t n, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) return -1;
    *cp = c;
    return (int)k;
}

int dl_utf8_valid(const char *s, size_t n) {
    size_t i = 0;
    int32_t cp;
    while (i < n) {
        int k = dl_utf8_next(s + i, n - i, &cp);
        if (k < 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

int dl_uni_is_letter(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

int dl_uni_is_number(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int dl_uni_is_space(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

int dl_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t v) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return 0;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = v;
    return 1;
}
