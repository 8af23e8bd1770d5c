/* Standard base64 (RFC 4648, '+' '/', padded): images travel inside JSON as it. */
#include <stdlib.h>
#include <string.h>

#include "difflet/base.h"

char *dl_b64_encode(const uint8_t *d, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        *p++ = t[v >> 18], *p++ = t[(v >> 12) & 63];
        *p++ = i + 1 < n ? t[(v >> 6) & 63] : '=';
        *p++ = i + 2 < n ? t[v & 63] : '=';
    }
    *p = 0;
    return o;
}

static int val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

dl_status dl_b64_decode(const char *s, size_t n, uint8_t **out, size_t *len) {
    *out = NULL, *len = 0;
    if (n % 4) return dl_fail(DL_ERR_INVALID, "base64: the length %zu is not a multiple of 4", n);
    uint8_t *o = malloc(n / 4 * 3 + 1);
    if (!o) return dl_fail(DL_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        int a = val(s[i]), b = val(s[i + 1]), c = pad >= 2 ? 0 : val(s[i + 2]), d = pad >= 1 ? 0 : val(s[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0 || (pad && i + 4 != n)) {
            free(o);
            return dl_fail(DL_ERR_INVALID, "base64: invalid character near byte %zu", i);
        }
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        o[k++] = (uint8_t)(v >> 16);
        if (pad < 2) o[k++] = (uint8_t)(v >> 8);
        if (pad < 1) o[k++] = (uint8_t)v;
    }
    *out = o, *len = k;
    return DL_OK;
}
