/* RFC 8259's JSON grammar, checked before cJSON reads a document: cJSON is lenient
 * where an API must not be (it skips any byte up to 0x20 between tokens, NUL
 * included; takes raw control characters inside strings, numbers like 02 or 2.; and
 * a \u0000 escape silently ends its string). A request body that passes this check
 * means to cJSON exactly what it means to any other JSON reader. */
#include <stdio.h>
#include <string.h>

#include "difflet/base.h"

typedef struct {
    const unsigned char *p, *end;
    const char *err;
    int depth;
} jp;

static void ws(jp *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int fail(jp *j, const char *why) {
    if (!j->err) j->err = why;
    return 0;
}

static int hex4(jp *j, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++, j->p++) {
        if (j->p >= j->end) return fail(j, "a truncated \\u escape");
        unsigned c = *j->p, d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 16;
        if (d > 15) return fail(j, "a \\u escape with a non-hex digit");
        *v = *v * 16 + d;
    }
    return 1;
}

#define LONE_SURROGATE "a lone UTF-16 surrogate (\\uD800-\\uDFFF) inside a string: a character above U+FFFF is a high and a low surrogate together"

static int string(jp *j) {
    j->p++; /* the opening quote */
    while (j->p < j->end) {
        unsigned c = *j->p++;
        if (c == '"') return 1;
        if (c < 0x20) return fail(j, "a control character (below U+0020) inside a string: escape it");
        if (c != '\\') continue;
        if (j->p >= j->end) break;
        c = *j->p++;
        if (c == 'u') {
            unsigned v;
            if (!hex4(j, &v)) return 0;
            if (v == 0) return fail(j, "a \\u0000 (NUL) character inside a string");
            /* RFC 8259's grammar admits a lone surrogate, but it is no character (cJSON
               refuses it, other readers replace or keep it): a pair or nothing */
            if (v >= 0xDC00 && v <= 0xDFFF) return fail(j, LONE_SURROGATE);
            if (v >= 0xD800 && v <= 0xDBFF) {
                unsigned lo = 0;
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') return fail(j, LONE_SURROGATE);
                j->p += 2;
                if (!hex4(j, &lo)) return 0;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(j, LONE_SURROGATE);
            }
        } else if (!strchr("\"\\/bfnrt", (int)c)) {
            return fail(j, "an invalid escape inside a string");
        }
    }
    return fail(j, "an unterminated string");
}

static int digits(jp *j) {
    const unsigned char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    return j->p > s;
}

static int number(jp *j) {
    if (*j->p == '-') j->p++;
    if (j->p < j->end && *j->p == '0') {
        j->p++;
        if (j->p < j->end && *j->p >= '0' && *j->p <= '9') return fail(j, "a number with a leading zero");
    } else if (!digits(j)) {
        return fail(j, "an invalid number");
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!digits(j)) return fail(j, "a number with no digit after its decimal point");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (!digits(j)) return fail(j, "a number with an empty exponent");
    }
    return 1;
}

static int value(jp *j);

static int container(jp *j, int object) {
    if (++j->depth > 64) return fail(j, "nesting deeper than 64");
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == (object ? '}' : ']')) {
        j->p++;
        j->depth--;
        return 1;
    }
    for (;;) {
        if (object) {
            if (j->p >= j->end || *j->p != '"') return fail(j, "an object key that is not a string");
            if (!string(j)) return 0;
            ws(j);
            if (j->p >= j->end || *j->p != ':') return fail(j, "a missing ':' after an object key");
            j->p++;
            ws(j);
        }
        if (!value(j)) return 0;
        ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            ws(j);
            continue;
        }
        if (j->p < j->end && *j->p == (object ? '}' : ']')) {
            j->p++;
            j->depth--;
            return 1;
        }
        return fail(j, object ? "a missing ',' or '}' in an object" : "a missing ',' or ']' in an array");
    }
}

static int literal(jp *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n)) return fail(j, "an invalid literal");
    j->p += n;
    return 1;
}

static int value(jp *j) {
    if (j->p >= j->end) return fail(j, "a missing value");
    switch (*j->p) {
    case '{': return container(j, 1);
    case '[': return container(j, 0);
    case '"': return string(j);
    case 't': return literal(j, "true");
    case 'f': return literal(j, "false");
    case 'n': return literal(j, "null");
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return number(j);
        return fail(j, "an unexpected character");
    }
}

const char *dl_json_strict_check(const char *text, size_t len, size_t *at) {
    jp j = {(const unsigned char *)text, (const unsigned char *)text + len, NULL, 0};
    ws(&j);
    if (value(&j)) {
        ws(&j);
        if (j.p != j.end) fail(&j, "bytes after the JSON value");
    }
    if (at) *at = (size_t)(j.p - (const unsigned char *)text);
    return j.err;
}
