/* PNG output through libpng: 8-bit RGB, written atomically (temporary file beside
 * the target, fsync, rename), so a failed or interrupted write never leaves a
 * truncated picture under the requested name. */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/io.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} membuf;

static void mem_write(png_structp png, png_bytep data, png_size_t len) {
    membuf *b = png_get_io_ptr(png);
    if (b->oom) return;
    if (b->n + len > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 65536;
        while (c < b->n + len) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

static void mem_flush(png_structp png) { (void)png; }

dl_status dl_png_encode(const uint8_t *rgb, int width, int height, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (width <= 0 || height <= 0) return dl_fail(DL_ERR_INVALID, "PNG: empty image");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    membuf b = {0};
    png_bytep *rows = NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        return dl_fail(DL_ERR_NOMEM, "PNG: cannot create the encoder");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(rows);
        free(b.p);
        return dl_fail(DL_ERR_IO, "PNG: libpng failed to encode");
    }
    png_set_write_fn(png, &b, mem_write, mem_flush);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    rows = malloc((size_t)height * sizeof *rows);
    if (!rows) png_error(png, "out of memory");
    for (int y = 0; y < height; y++) rows[y] = (png_bytep)(rgb + (size_t)y * (size_t)width * 3);
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    if (b.oom) {
        free(b.p);
        return dl_fail(DL_ERR_NOMEM, "PNG: out of memory");
    }
    *out = b.p;
    *len = b.n;
    return DL_OK;
}

dl_status dl_png_write(const char *path, const uint8_t *rgb, int width, int height) {
    uint8_t *data;
    size_t len;
    dl_status s = dl_png_encode(rgb, width, height, &data, &len);
    if (s != DL_OK) return s;
    s = dl_file_write_atomic(path, data, len);
    free(data);
    return s;
}
