/* Reading pictures a user gives (image-to-image and inpainting inputs): PNG, JPEG
 * or WebP, recognised by their first bytes, decoded to 8-bit RGBA; and resizing as
 * diffusers' VaeImageProcessor does it (PIL's Image.resize with LANCZOS: separable,
 * antialiased, horizontal pass then vertical, 8-bit rounding between the passes,
 * PIL's fixed-point coefficients), so a picture of another size becomes the same
 * tensor it would in diffusers. */
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

#include <jpeglib.h> /* after stdio.h: it needs size_t and FILE */

#include "difflet/io.h"

void dl_image_free(dl_image *im) {
    if (!im) return;
    free(im->px);
    *im = (dl_image){0};
}

static dl_status check_dims(long long w, long long h, const char *what) {
    if (w <= 0 || h <= 0 || w > DL_IMAGE_MAX_SIDE || h > DL_IMAGE_MAX_SIDE)
        return dl_fail(DL_ERR_INVALID, "%s image is %lldx%lld; sides must be 1..%d pixels", what, w, h, DL_IMAGE_MAX_SIDE);
    if (w * h > DL_IMAGE_MAX_PIXELS)
        return dl_fail(DL_ERR_INVALID, "%s image is %lldx%lld: more than %lld pixels", what, w, h, DL_IMAGE_MAX_PIXELS);
    return DL_OK;
}

static dl_status alloc_rgba(dl_image *out, int w, int h) {
    out->width = w, out->height = h, out->channels = 4;
    out->px = malloc((size_t)w * (size_t)h * 4);
    return out->px ? DL_OK : dl_fail(DL_ERR_NOMEM, "out of memory for a %dx%d image", w, h);
}

static dl_status decode_png(const uint8_t *d, size_t n, dl_image *out) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, d, n))
        return dl_fail(DL_ERR_INVALID, "the PNG image cannot be read: %s", im.message);
    dl_status s = check_dims(im.width, im.height, "the PNG");
    if (s == DL_OK) {
        im.format = PNG_FORMAT_RGBA;
        s = alloc_rgba(out, (int)im.width, (int)im.height);
    }
    if (s != DL_OK) {
        png_image_free(&im);
        return s;
    }
    if (!png_image_finish_read(&im, NULL, out->px, 0, NULL)) {
        dl_image_free(out);
        return dl_fail(DL_ERR_INVALID, "the PNG image cannot be decoded: %s", im.message);
    }
    return DL_OK;
}

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr;

static void jpeg_fail(j_common_ptr c) {
    jerr *e = (jerr *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

static dl_status decode_jpeg(const uint8_t *d, size_t n, dl_image *out) {
    struct jpeg_decompress_struct c;
    jerr e;
    uint8_t *volatile row = NULL;
    c.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpeg_fail;
    e.msg[0] = 0;
    if (setjmp(e.jb)) {
        jpeg_destroy_decompress(&c);
        free(row);
        dl_image_free(out);
        return dl_fail(DL_ERR_INVALID, "the JPEG image cannot be decoded: %s", e.msg);
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, d, (unsigned long)n);
    jpeg_read_header(&c, TRUE);
    c.out_color_space = JCS_RGB;
    dl_status s = check_dims(c.image_width, c.image_height, "the JPEG");
    if (s == DL_OK) s = alloc_rgba(out, (int)c.image_width, (int)c.image_height);
    if (s == DL_OK && !(row = malloc((size_t)c.image_width * 3))) s = dl_fail(DL_ERR_NOMEM, "out of memory");
    if (s != DL_OK) {
        jpeg_destroy_decompress(&c);
        dl_image_free(out);
        return s;
    }
    jpeg_start_decompress(&c);
    while (c.output_scanline < c.output_height) {
        JSAMPROW r = row;
        uint8_t *dst = out->px + (size_t)c.output_scanline * (size_t)out->width * 4;
        jpeg_read_scanlines(&c, &r, 1);
        for (int x = 0; x < out->width; x++)
            dst[4 * x] = row[3 * x], dst[4 * x + 1] = row[3 * x + 1], dst[4 * x + 2] = row[3 * x + 2], dst[4 * x + 3] = 255;
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    free(row);
    return DL_OK;
}

static dl_status decode_webp(const uint8_t *d, size_t n, dl_image *out) {
    int w, h;
    if (!WebPGetInfo(d, n, &w, &h)) return dl_fail(DL_ERR_INVALID, "the WebP image cannot be read");
    dl_status s = check_dims(w, h, "the WebP");
    if (s == DL_OK) s = alloc_rgba(out, w, h);
    if (s != DL_OK) return s;
    if (!WebPDecodeRGBAInto(d, n, out->px, (size_t)w * (size_t)h * 4, w * 4)) {
        dl_image_free(out);
        return dl_fail(DL_ERR_INVALID, "the WebP image cannot be decoded");
    }
    return DL_OK;
}

dl_status dl_image_decode(const uint8_t *d, size_t n, dl_image *out) {
    *out = (dl_image){0};
    if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) return decode_png(d, n, out);
    if (n >= 3 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff) return decode_jpeg(d, n, out);
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return decode_webp(d, n, out);
    return dl_fail(DL_ERR_INVALID, "the image is not a PNG, JPEG or WebP file (%zu bytes)", n);
}

dl_status dl_image_read(const char *path, dl_image *out) {
    *out = (dl_image){0};
    char *d;
    size_t n;
    dl_status s = dl_file_read(path, DL_IMAGE_MAX_BYTES, &d, &n);
    if (s != DL_OK) return s;
    s = dl_image_decode((const uint8_t *)d, n, out);
    free(d);
    if (s != DL_OK) return dl_fail(s, "%s: %s", path, dl_last_error());
    return DL_OK;
}

dl_status dl_image_convert(const dl_image *im, dl_image_mode mode, dl_image *out) {
    const size_t n = (size_t)im->width * (size_t)im->height;
    const int C = im->channels, oc = mode == DL_IMAGE_RGB ? 3 : 1;
    *out = (dl_image){im->width, im->height, oc, malloc(n * (size_t)oc)};
    if (!out->px) return dl_fail(DL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = im->px + i * (size_t)C;
        uint8_t *d = out->px + i * (size_t)oc;
        switch (mode) {
        case DL_IMAGE_RGB: /* PIL's convert("RGB"): alpha dropped */
            for (int c = 0; c < 3; c++) d[c] = p[C >= 3 ? c : 0];
            break;
        case DL_IMAGE_LUMA: /* PIL's convert("L"): ITU-R 601-2 luma in 16-bit fixed point */
            d[0] = C >= 3 ? (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16) : p[0];
            break;
        case DL_IMAGE_TRANSPARENT: /* OpenAI's mask: fully transparent pixels are the ones to edit */
            d[0] = C == 4 && p[3] == 0 ? 255 : 0;
            break;
        }
    }
    return DL_OK;
}

int dl_image_has_transparency(const dl_image *im) {
    if (im->channels != 4) return 0;
    const size_t n = (size_t)im->width * (size_t)im->height;
    for (size_t i = 0; i < n; i++)
        if (im->px[4 * i + 3] != 255) return 1;
    return 0;
}

dl_status dl_image_prepare(const dl_image *im, dl_image_mode mode, int width, int height, uint8_t **out) {
    *out = NULL;
    dl_image c, r;
    dl_status s = dl_image_convert(im, mode, &c);
    if (s != DL_OK) return s;
    if (c.width == width && c.height == height) {
        *out = c.px;
        return DL_OK;
    }
    s = dl_image_resize(&c, width, height, &r);
    dl_image_free(&c);
    if (s == DL_OK) *out = r.px;
    return s;
}

/* ---- PIL's LANCZOS resample ------------------------------------------------------ */
#define PREC 22 /* PIL's PRECISION_BITS for 8-bit images: 32 - 8 - 2 */

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}
static double lanczos(double x) { return x > -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

/* per output index: the first input index, the count, and `ksize` fixed-point weights */
static dl_status coeffs(int in, int out, int *ksize, int **bounds, int32_t **kk) {
    double scale = (double)in / out, fs = scale < 1.0 ? 1.0 : scale, support = 3.0 * fs;
    int ks = (int)ceil(support) * 2 + 1;
    *bounds = malloc((size_t)out * 2 * sizeof **bounds);
    *kk = malloc((size_t)out * (size_t)ks * sizeof **kk);
    double *k = malloc((size_t)ks * sizeof *k);
    if (!*bounds || !*kk || !k) {
        free(*bounds), free(*kk), free(k);
        *bounds = NULL, *kk = NULL;
        return dl_fail(DL_ERR_NOMEM, "out of memory");
    }
    for (int xx = 0; xx < out; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            k[x] = lanczos((x + xmin - center + 0.5) * ss);
            ww += k[x];
        }
        for (int x = 0; x < ks; x++) {
            double v = x < xmax && ww != 0.0 ? k[x] / ww : 0.0;
            (*kk)[(size_t)xx * (size_t)ks + (size_t)x] = (int32_t)(v < 0 ? v * (1 << PREC) - 0.5 : v * (1 << PREC) + 0.5);
        }
        (*bounds)[2 * xx] = xmin, (*bounds)[2 * xx + 1] = xmax;
    }
    free(k);
    *ksize = ks;
    return DL_OK;
}

static uint8_t clip8(int64_t v) {
    v >>= PREC;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

dl_status dl_image_resize(const dl_image *in, int w, int h, dl_image *out) {
    *out = (dl_image){0};
    dl_status s = check_dims(w, h, "the resized");
    if (s != DL_OK) return s;
    const int C = in->channels, W0 = in->width, H0 = in->height;
    int kx, ky, *bx = NULL, *by = NULL;
    int32_t *cx = NULL, *cy = NULL;
    uint8_t *mid = NULL;
    if ((s = coeffs(W0, w, &kx, &bx, &cx)) || (s = coeffs(H0, h, &ky, &by, &cy))) goto done;
    /* the rows the vertical pass reads: PIL resamples only those horizontally */
    int y0 = by[0], y1 = by[2 * (h - 1)] + by[2 * (h - 1) + 1];
    mid = malloc((size_t)(y1 - y0) * (size_t)w * (size_t)C);
    out->px = malloc((size_t)w * (size_t)h * (size_t)C);
    if (!mid || !out->px) {
        s = dl_fail(DL_ERR_NOMEM, "out of memory");
        goto done;
    }
    out->width = w, out->height = h, out->channels = C;
    for (int y = y0; y < y1; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < C; c++) {
                int64_t acc = (int64_t)1 << (PREC - 1);
                const int32_t *k = cx + (size_t)x * (size_t)kx;
                for (int i = 0; i < bx[2 * x + 1]; i++)
                    acc += (int64_t)in->px[((size_t)y * (size_t)W0 + (size_t)(bx[2 * x] + i)) * (size_t)C + (size_t)c] * k[i];
                mid[((size_t)(y - y0) * (size_t)w + (size_t)x) * (size_t)C + (size_t)c] = clip8(acc);
            }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < C; c++) {
                int64_t acc = (int64_t)1 << (PREC - 1);
                const int32_t *k = cy + (size_t)y * (size_t)ky;
                for (int i = 0; i < by[2 * y + 1]; i++)
                    acc += (int64_t)mid[((size_t)(by[2 * y] + i - y0) * (size_t)w + (size_t)x) * (size_t)C + (size_t)c] * k[i];
                out->px[((size_t)y * (size_t)w + (size_t)x) * (size_t)C + (size_t)c] = clip8(acc);
            }
done:
    free(bx), free(by), free(cx), free(cy), free(mid);
    if (s != DL_OK) dl_image_free(out);
    return s;
}
