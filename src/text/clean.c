/* Prompt cleaning as the diffusers pipelines do it before tokenising:
 *   html.unescape (Python's: HTML5 named references, with the longest-prefix rule
 *   for names without ';'; numeric references with the HTML5 replacement rules),
 *   and WanPipeline's prompt_clean: unescape twice, str.strip (str.isspace), every
 *   run of Unicode White_Space (the `regex` module's \s) becomes one space, and
 *   str.strip again.
 * ftfy.fix_text, which the pipeline also applies when ftfy is installed, is not
 * reproduced (README status table). */
#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

#include "text/html_entities.inc"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static int cmp_entity(const void *k, const void *e) {
    return strcmp(k, ((const struct html_entity *)e)->name);
}

static const char *entity(const char *name) {
    const struct html_entity *e = bsearch(name, k_html5, NELEM(k_html5), sizeof k_html5[0], cmp_entity);
    return e ? e->value : NULL;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

/* a numeric reference's replacement (Python's _replace_charref) into b */
static int numeric(sbuf *b, unsigned long long num) {
    for (size_t i = 0; i < NELEM(k_invalid_charrefs); i++)
        if (k_invalid_charrefs[i].code == num) return dl_sbuf_put(b, k_invalid_charrefs[i].value, strlen(k_invalid_charrefs[i].value));
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return dl_sbuf_putc32(b, 0xFFFD);
    for (size_t i = 0; i < NELEM(k_invalid_codepoints); i++)
        if (k_invalid_codepoints[i] == num) return 1; /* dropped */
    return dl_sbuf_putc32(b, (int32_t)num);
}

/* one reference at s (s[0] == '&', n bytes left): appends its replacement and
 * returns the bytes consumed, or 0 when nothing matches (the '&' stays) */
static size_t reference(sbuf *b, const char *s, size_t n, int *ok) {
    size_t i = 1;
    if (i < n && s[i] == '#') {
        int hex = i + 1 < n && (s[i + 1] == 'x' || s[i + 1] == 'X');
        size_t d0 = i + 1 + (size_t)hex, d = d0;
        unsigned long long num = 0;
        int big = 0;
        while (d < n && (hex ? is_hex(s[d]) : (s[d] >= '0' && s[d] <= '9'))) {
            unsigned v = s[d] <= '9' ? (unsigned)(s[d] - '0') : (unsigned)((s[d] | 32) - 'a' + 10);
            if (num > 0x10FFFFull * 16) big = 1; /* past any code point: U+FFFD, as Python's big ints give */
            else num = num * (hex ? 16 : 10) + v;
            d++;
        }
        if (d == d0) return 0; /* "&#" or "&#x" without digits: not a reference */
        if (d < n && s[d] == ';') d++;
        *ok = numeric(b, big ? 0x110000ull : num);
        return d;
    }
    /* a name: up to 32 characters other than \t \n \f space < & # ;, then an optional ';' */
    size_t e = i;
    int chars = 0;
    while (e < n && chars < 32) {
        char c = s[e];
        if (c == '\t' || c == '\n' || c == '\f' || c == ' ' || c == '<' || c == '&' || c == '#' || c == ';') break;
        int32_t cp;
        int k = dl_utf8_next(s + e, n - e, &cp);
        e += (size_t)(k > 0 ? k : 1);
        chars++;
    }
    if (e == i) return 0;
    if (e < n && s[e] == ';') e++;
    char name[160];
    size_t len = e - i;
    if (len >= sizeof name) return 0;
    memcpy(name, s + i, len);
    name[len] = 0;
    const char *v = entity(name);
    if (v) {
        *ok = dl_sbuf_put(b, v, strlen(v));
        return e;
    }
    /* the longest prefix (at least 2 characters) that is a name, the rest kept */
    for (size_t x = len - 1; x >= 2 && x < len; x--) {
        name[x] = 0;
        if ((v = entity(name))) {
            *ok = dl_sbuf_put(b, v, strlen(v)) && dl_sbuf_put(b, s + i + x, len - x);
            return e;
        }
    }
    return 0;
}

static dl_status unescape(const char *in, size_t n, sbuf *out) {
    for (size_t i = 0; i < n;) {
        const char *amp = memchr(in + i, '&', n - i);
        size_t upto = amp ? (size_t)(amp - in) : n;
        if (!dl_sbuf_put(out, in + i, upto - i)) return dl_fail(DL_ERR_NOMEM, "out of memory");
        if (!amp) break;
        int ok = 1;
        size_t used = reference(out, amp, n - upto, &ok);
        if (!ok) return dl_fail(DL_ERR_NOMEM, "out of memory");
        if (!used) {
            if (!dl_sbuf_put(out, "&", 1)) return dl_fail(DL_ERR_NOMEM, "out of memory");
            used = 1;
        }
        i = upto + used;
    }
    return DL_OK;
}

dl_status dl_html_unescape(const char *in, size_t n, char **out) {
    sbuf b = {0};
    dl_status s = unescape(in, n, &b);
    if (s == DL_OK && !dl_sbuf_put(&b, "", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s != DL_OK) {
        dl_sbuf_free(&b);
        return s;
    }
    *out = b.p;
    return DL_OK;
}

/* Python's str.isspace: Unicode White_Space plus the separators U+001C..U+001F */
static int py_space(int32_t cp) { return (cp >= 0x1c && cp <= 0x1f) || dl_uni_is_space(cp); }

/* [a, b) of s without the str.isspace characters at either end */
static void strip(const char *s, size_t n, size_t *a, size_t *b) {
    size_t i = 0, end = 0;
    int seen = 0;
    *a = *b = 0;
    while (i < n) {
        int32_t cp;
        int k = dl_utf8_next(s + i, n - i, &cp);
        if (k <= 0) cp = -1, k = 1;
        if (cp < 0 || !py_space(cp)) {
            if (!seen) *a = i, seen = 1;
            end = i + (size_t)k;
        }
        i += (size_t)k;
    }
    *b = seen ? end : 0;
}

dl_status dl_text_clean_wan(const char *text, char **out) {
    *out = NULL;
    size_t n = strlen(text);
    if (n > DL_TOK_MAX_TEXT) return dl_fail(DL_ERR_INVALID, "prompt longer than %u bytes", DL_TOK_MAX_TEXT);
    if (!dl_utf8_valid(text, n)) return dl_fail(DL_ERR_INVALID, "the prompt is not valid UTF-8");
    sbuf a = {0}, b = {0}, c = {0};
    dl_status s = unescape(text, n, &a);
    if (s == DL_OK) s = unescape(a.p ? a.p : "", a.n, &b);
    /* basic_clean's strip, then whitespace_clean: `regex` \s+ (White_Space) -> " ", strip */
    size_t lo, hi;
    strip(b.p ? b.p : "", b.n, &lo, &hi);
    for (size_t i = lo; s == DL_OK && i < hi;) {
        int32_t cp;
        int k = dl_utf8_next(b.p + i, hi - i, &cp);
        if (k <= 0) cp = -1, k = 1; /* a reference made something odd: kept as it is */
        if (cp >= 0 && dl_uni_is_space(cp)) {
            while (i < hi && (k = dl_utf8_next(b.p + i, hi - i, &cp)) > 0 && dl_uni_is_space(cp)) i += (size_t)k;
            if (!dl_sbuf_put(&c, " ", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
            continue;
        }
        if (!dl_sbuf_put(&c, b.p + i, (size_t)k)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
        i += (size_t)k;
    }
    if (s == DL_OK) { /* the final strip */
        strip(c.p ? c.p : "", c.n, &lo, &hi);
        if (lo) memmove(c.p, c.p + lo, hi - lo);
        c.n = hi - lo;
        if (!dl_sbuf_put(&c, "", 1)) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    dl_sbuf_free(&a), dl_sbuf_free(&b);
    if (s != DL_OK) {
        dl_sbuf_free(&c);
        return s;
    }
    *out = c.p;
    return DL_OK;
}
