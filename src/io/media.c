/* Media outputs: what a pipeline made (dl_media) written as the user asked.
 *   image -> PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp);
 *   video -> MP4: H.264 (FFmpeg's libavcodec, libx264) in yuv420p at the request's
 *            frame rate, with an AAC track when the model made sound (mono or stereo);
 *   frames -> DIR/frame_0000.png, ... (lossless, for parity);
 *   audio  -> WAV, 32-bit float PCM, mono or stereo.
 * dl_media's audio is interleaved [samples, channels]; AAC wants planar channels, so
 * each encoder frame is de-interleaved as it is filled. More than two channels are
 * refused: dl_media names no layout for them (which channel is the LFE?), and a
 * guessed one would be written as if it were known.
 * Every file is written atomically (temporary file beside the target, rename), so
 * a failed write never leaves a truncated file under the requested name. */
#include <errno.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <webp/encode.h>

#include <jpeglib.h> /* after stdio.h: it needs size_t and FILE */

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

#include "difflet/io.h"

void dl_media_free(dl_media *m) {
    if (!m) return;
    free(m->rgb);
    free(m->pixels);
    free(m->audio);
    memset(m, 0, sizeof *m);
}

int dl_media_audio_channels(const dl_media *m) { return m->audio_channels == 0 ? 1 : m->audio_channels; }

const char *dl_media_kind_name(dl_media_kind k) {
    return k == DL_MEDIA_VIDEO ? "video" : k == DL_MEDIA_VIDEO_AUDIO ? "video+audio" : "image";
}

static const char *ext_of(const char *path) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    return dot && (!slash || dot > slash) ? dot + 1 : "";
}

dl_status dl_media_format_from_path(const char *path, dl_media_format *f) {
    const char *e = ext_of(path);
    if (!strcasecmp(e, "png")) *f = DL_FMT_PNG;
    else if (!strcasecmp(e, "jpg") || !strcasecmp(e, "jpeg")) *f = DL_FMT_JPEG;
    else if (!strcasecmp(e, "webp")) *f = DL_FMT_WEBP;
    else if (!strcasecmp(e, "mp4")) *f = DL_FMT_MP4;
    else
        return dl_fail(DL_ERR_INVALID, "`%s`: unknown output format `.%s` (png, jpg, webp for images; mp4 for video)", path, e);
    return DL_OK;
}

/* ---- JPEG ------------------------------------------------------------------------- */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} jerr;

static void jpeg_fail(j_common_ptr c) { longjmp(((jerr *)c->err)->jb, 1); }

dl_status dl_jpeg_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (w <= 0 || h <= 0) return dl_fail(DL_ERR_INVALID, "JPEG: empty image");
    struct jpeg_compress_struct c;
    jerr err;
    unsigned char *buf = NULL;
    unsigned long n = 0;
    c.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = jpeg_fail;
    if (setjmp(err.jb)) {
        jpeg_destroy_compress(&c);
        free(buf);
        return dl_fail(DL_ERR_IO, "JPEG: libjpeg failed to encode");
    }
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &buf, &n);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * (size_t)w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *out = buf;
    *len = n;
    return DL_OK;
}

/* ---- WebP ------------------------------------------------------------------------- */
dl_status dl_webp_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (w <= 0 || h <= 0 || w > WEBP_MAX_DIMENSION || h > WEBP_MAX_DIMENSION)
        return dl_fail(DL_ERR_INVALID, "WebP: image %dx%d is outside 1..%d", w, h, WEBP_MAX_DIMENSION);
    uint8_t *enc = NULL;
    size_t n = quality >= 100 ? WebPEncodeLosslessRGB(rgb, w, h, w * 3, &enc)
                              : WebPEncodeRGB(rgb, w, h, w * 3, (float)quality, &enc);
    if (!n) return dl_fail(DL_ERR_IO, "WebP: libwebp failed to encode");
    /* the caller frees with free(): hand over a copy of libwebp's buffer */
    *out = malloc(n);
    if (*out) memcpy(*out, enc, n);
    WebPFree(enc);
    if (!*out) return dl_fail(DL_ERR_NOMEM, "WebP: out of memory");
    *len = n;
    return DL_OK;
}

/* ---- WAV -------------------------------------------------------------------------- */
static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, v & 0xffff), put16(p + 2, v >> 16); }

dl_status dl_wav_write(const char *path, const float *samples, int64_t n, int channels, int rate) {
    if (channels < 1 || channels > 2)
        return dl_fail(DL_ERR_UNSUPPORTED, "WAV: %d channels: difflet writes mono or stereo", channels);
    if (n < 0 || rate <= 0 || (uint64_t)n * (uint64_t)channels * 4 > 0xffffff00u - 58 ||
        (uint64_t)rate * (uint64_t)channels * 4 > 0xffffffffu)
        return dl_fail(DL_ERR_INVALID, "WAV: %lld samples at %d Hz cannot be written", (long long)n, rate);
    const int64_t total = n * channels; /* f32 values, interleaved */
    const uint32_t block = (uint32_t)channels * 4, data = (uint32_t)total * 4;
    uint8_t h[58];
    memcpy(h, "RIFF", 4), put32(h + 4, 50 + data), memcpy(h + 8, "WAVE", 4);
    memcpy(h + 12, "fmt ", 4), put32(h + 16, 18);
    put16(h + 20, 3 /* WAVE_FORMAT_IEEE_FLOAT */), put16(h + 22, (uint32_t)channels), put32(h + 24, (uint32_t)rate);
    put32(h + 28, (uint32_t)rate * block), put16(h + 32, block), put16(h + 34, 32), put16(h + 36, 0);
    memcpy(h + 38, "fact", 4), put32(h + 42, 4), put32(h + 46, (uint32_t)n); /* samples per channel */
    memcpy(h + 50, "data", 4), put32(h + 54, data);
    dl_atomic_file f;
    dl_status s = dl_atomic_open(&f, path);
    if (s != DL_OK) return s;
    if ((s = dl_atomic_write(&f, h, sizeof h)) == DL_OK) {
        for (int64_t i = 0; i < total && s == DL_OK; i += 4096) { /* little-endian f32, whatever the host */
            uint8_t b[4096 * 4];
            int64_t k = total - i < 4096 ? total - i : 4096;
            for (int64_t j = 0; j < k; j++) {
                uint32_t u;
                memcpy(&u, samples + i + j, 4);
                put32(b + 4 * j, u);
            }
            s = dl_atomic_write(&f, b, (size_t)k * 4);
        }
    }
    if (s == DL_OK) return dl_atomic_commit(&f);
    dl_atomic_abort(&f);
    return s;
}

/* ---- MP4 (H.264 + AAC) ------------------------------------------------------------ */
typedef struct {
    AVFormatContext *oc;
    AVCodecContext *vc, *ac;
    AVStream *vs, *as;
    AVFrame *vf, *af;
    AVPacket *pkt;
    struct SwsContext *sws;
    uint8_t *stage; /* one RGB frame, rows padded with zeros (see mp4_video_frame) */
    int stage_stride;
} mp4;

static dl_status averr(int rc, const char *what) {
    char msg[AV_ERROR_MAX_STRING_SIZE] = "";
    av_strerror(rc, msg, sizeof msg);
    return dl_fail(DL_ERR_IO, "MP4: %s: %s", what, msg);
}

/* send one frame (NULL: flush) and write every packet the encoder gives back */
static dl_status encode(mp4 *x, AVCodecContext *c, AVStream *st, AVFrame *f) {
    int rc = avcodec_send_frame(c, f);
    if (rc < 0) return averr(rc, "encoding");
    for (;;) {
        rc = avcodec_receive_packet(c, x->pkt);
        if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return DL_OK;
        if (rc < 0) return averr(rc, "encoding");
        av_packet_rescale_ts(x->pkt, c->time_base, st->time_base);
        x->pkt->stream_index = st->index;
        rc = av_interleaved_write_frame(x->oc, x->pkt);
        if (rc < 0) return averr(rc, "writing a packet");
    }
}

static dl_status mp4_open_video(mp4 *x, const dl_media *m) {
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_H264);
    if (!codec) return dl_fail(DL_ERR_UNSUPPORTED, "MP4: this FFmpeg has no H.264 encoder (libavcodec built without libx264)");
    if (m->width % 2 || m->height % 2)
        return dl_fail(DL_ERR_INVALID, "MP4: H.264 in yuv420p needs an even width and height, got %dx%d", m->width, m->height);
    AVRational fr = av_d2q(m->fps, 1000000);
    if (!(x->vs = avformat_new_stream(x->oc, NULL)) || !(x->vc = avcodec_alloc_context3(codec)))
        return dl_fail(DL_ERR_NOMEM, "MP4: out of memory");
    x->vc->width = m->width;
    x->vc->height = m->height;
    x->vc->pix_fmt = AV_PIX_FMT_YUV420P;
    x->vc->time_base = av_inv_q(fr);
    x->vc->framerate = fr;
    x->vc->gop_size = 12;
    if (x->oc->oformat->flags & AVFMT_GLOBALHEADER) x->vc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    av_opt_set(x->vc->priv_data, "preset", "medium", 0);
    av_opt_set(x->vc->priv_data, "crf", "18", 0);
    /* libx264's macroblock-tree rate control reads uninitialised memory on small frames
     * (a 64x64 clip written twice in one process gave two different files; the bytes
     * follow MALLOC_PERTURB_, with the ffmpeg command line too): off, so that the same
     * video always makes the same MP4. */
    if (av_opt_set(x->vc->priv_data, "x264-params", "mbtree=0", 0) < 0)
        return dl_fail(DL_ERR_UNSUPPORTED, "MP4: this FFmpeg's H.264 encoder takes no x264-params");
    int rc = avcodec_open2(x->vc, codec, NULL);
    if (rc < 0) return averr(rc, "opening the H.264 encoder");
    if ((rc = avcodec_parameters_from_context(x->vs->codecpar, x->vc)) < 0) return averr(rc, "stream parameters");
    x->vs->time_base = x->vc->time_base;
    x->vs->avg_frame_rate = fr;
    if (!(x->vf = av_frame_alloc())) return dl_fail(DL_ERR_NOMEM, "MP4: out of memory");
    x->vf->format = AV_PIX_FMT_YUV420P;
    x->vf->width = m->width;
    x->vf->height = m->height;
    if ((rc = av_frame_get_buffer(x->vf, 0)) < 0) return averr(rc, "frame buffer");
    x->sws = sws_getContext(m->width, m->height, AV_PIX_FMT_RGB24, m->width, m->height, AV_PIX_FMT_YUV420P,
                            SWS_BICUBIC | SWS_ACCURATE_RND, NULL, NULL, NULL);
    x->stage_stride = (m->width * 3 + 64 + 63) / 64 * 64;
    x->stage = av_mallocz((size_t)x->stage_stride * (size_t)(m->height + 1));
    return x->sws && x->stage ? DL_OK : dl_fail(DL_ERR_NOMEM, "MP4: cannot create the colour converter");
}

static dl_status mp4_open_audio(mp4 *x, const dl_media *m) {
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_AAC);
    if (!codec) return dl_fail(DL_ERR_UNSUPPORTED, "MP4: this FFmpeg has no AAC encoder");
    if (!(x->as = avformat_new_stream(x->oc, NULL)) || !(x->ac = avcodec_alloc_context3(codec)))
        return dl_fail(DL_ERR_NOMEM, "MP4: out of memory");
    x->ac->sample_fmt = AV_SAMPLE_FMT_FLTP;
    x->ac->sample_rate = m->audio_rate;
    x->ac->bit_rate = dl_media_audio_channels(m) == 2 ? 192000 : 128000; /* stereo: 96 kb/s a channel */
    x->ac->ch_layout = dl_media_audio_channels(m) == 2 ? (AVChannelLayout)AV_CHANNEL_LAYOUT_STEREO
                                                      : (AVChannelLayout)AV_CHANNEL_LAYOUT_MONO;
    x->ac->time_base = (AVRational){1, m->audio_rate};
    if (x->oc->oformat->flags & AVFMT_GLOBALHEADER) x->ac->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    int rc = avcodec_open2(x->ac, codec, NULL);
    if (rc < 0) return averr(rc, "opening the AAC encoder (sample rate?)");
    if ((rc = avcodec_parameters_from_context(x->as->codecpar, x->ac)) < 0) return averr(rc, "stream parameters");
    x->as->time_base = x->ac->time_base;
    if (!(x->af = av_frame_alloc())) return dl_fail(DL_ERR_NOMEM, "MP4: out of memory");
    x->af->format = AV_SAMPLE_FMT_FLTP;
    x->af->nb_samples = x->ac->frame_size;
    x->af->sample_rate = m->audio_rate;
    av_channel_layout_copy(&x->af->ch_layout, &x->ac->ch_layout);
    return (rc = av_frame_get_buffer(x->af, 0)) < 0 ? averr(rc, "audio frame buffer") : DL_OK;
}

static dl_status mp4_video_frame(mp4 *x, const dl_media *m, int i) {
    int rc = av_frame_make_writable(x->vf);
    if (rc < 0) return averr(rc, "frame buffer");
    /* swscale's SIMD input readers load whole vectors, past a row's last pixel: read
     * in place, the last row of the last frame ran off the end of m->rgb (valgrind: an
     * invalid read of 16 bytes, 4 past the end). Rows padded with zeros are read instead. */
    const size_t row = (size_t)m->width * 3;
    const uint8_t *frame = m->rgb + (size_t)i * row * (size_t)m->height;
    for (int y = 0; y < m->height; y++) memcpy(x->stage + (size_t)y * (size_t)x->stage_stride, frame + (size_t)y * row, row);
    const uint8_t *src[1] = {x->stage};
    int stride[1] = {x->stage_stride};
    sws_scale(x->sws, src, stride, 0, m->height, x->vf->data, x->vf->linesize);
    x->vf->pts = i;
    return encode(x, x->vc, x->vs, x->vf);
}

static dl_status mp4_audio_frame(mp4 *x, const dl_media *m, int64_t at) {
    int rc = av_frame_make_writable(x->af);
    if (rc < 0) return averr(rc, "audio frame buffer");
    const int ch = dl_media_audio_channels(m);
    int64_t n = m->audio_samples - at < x->af->nb_samples ? m->audio_samples - at : x->af->nb_samples;
    for (int c = 0; c < ch; c++) { /* interleaved [samples, ch] into planar: one plane per channel */
        float *dst = (float *)x->af->data[c];
        const float *src = m->audio + at * ch + c;
        for (int64_t i = 0; i < n; i++) dst[i] = src[i * ch];
        memset(dst + n, 0, (size_t)(x->af->nb_samples - n) * 4); /* the last frame: silence after the end */
    }
    x->af->pts = at;
    return encode(x, x->ac, x->as, x->af);
}

static void mp4_close(mp4 *x) {
    if (x->oc && x->oc->pb) avio_closep(&x->oc->pb);
    avformat_free_context(x->oc);
    avcodec_free_context(&x->vc);
    avcodec_free_context(&x->ac);
    av_frame_free(&x->vf);
    av_frame_free(&x->af);
    av_packet_free(&x->pkt);
    sws_freeContext(x->sws);
    av_free(x->stage);
}

dl_status dl_mp4_write(const char *path, const dl_media *m) {
    if (!m->rgb || m->frames < 1 || !(m->fps > 0 && m->fps <= 1000))
        return dl_fail(DL_ERR_INVALID, "MP4: needs at least one frame and a frame rate in (0, 1000], got %d frames at %g fps",
                       m->frames, m->fps);
    int audio = m->audio && m->audio_samples > 0;
    if (audio && (m->audio_rate < 8000 || m->audio_rate > 96000))
        return dl_fail(DL_ERR_INVALID, "MP4: audio rate %d Hz is outside 8000..96000", m->audio_rate);
    if (audio && (dl_media_audio_channels(m) < 1 || dl_media_audio_channels(m) > 2))
        return dl_fail(DL_ERR_UNSUPPORTED,
                       "MP4: %d audio channels: the AAC track is mono or stereo (dl_media names no layout for more)",
                       dl_media_audio_channels(m));
    if (dl_log_get_level() > DL_LOG_DEBUG) av_log_set_level(AV_LOG_ERROR); /* encoder statistics only when debugging */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    mp4 x = {0};
    dl_status s = DL_OK;
    int rc = avformat_alloc_output_context2(&x.oc, NULL, "mp4", tmp);
    if (rc < 0 || !x.oc) s = averr(rc, "creating the container");
    if (s == DL_OK && !(x.pkt = av_packet_alloc())) s = dl_fail(DL_ERR_NOMEM, "MP4: out of memory");
    if (s == DL_OK) s = mp4_open_video(&x, m);
    if (s == DL_OK && audio) s = mp4_open_audio(&x, m);
    if (s == DL_OK && (rc = avio_open(&x.oc->pb, tmp, AVIO_FLAG_WRITE)) < 0) s = averr(rc, tmp);
    if (s == DL_OK && (rc = avformat_write_header(x.oc, NULL)) < 0) s = averr(rc, "writing the header");
    /* interleave by time: the next video frame or audio frame, whichever starts first */
    int vi = 0;
    int64_t at = 0;
    while (s == DL_OK && (vi < m->frames || (audio && at < m->audio_samples))) {
        int video_next = vi < m->frames &&
                         (!audio || at >= m->audio_samples || av_compare_ts(vi, x.vc->time_base, at, x.ac->time_base) <= 0);
        if (video_next) s = mp4_video_frame(&x, m, vi++);
        else {
            s = mp4_audio_frame(&x, m, at);
            at += x.af->nb_samples;
        }
    }
    if (s == DL_OK) s = encode(&x, x.vc, x.vs, NULL);
    if (s == DL_OK && audio) s = encode(&x, x.ac, x.as, NULL);
    if (s == DL_OK && (rc = av_write_trailer(x.oc)) < 0) s = averr(rc, "writing the trailer");
    mp4_close(&x);
    if (s == DL_OK && rename(tmp, path) != 0) s = dl_fail(DL_ERR_IO, "MP4: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s != DL_OK) unlink(tmp);
    return s;
}

/* ---- dispatch ----------------------------------------------------------------------- */
dl_status dl_media_encode_image(const uint8_t *rgb, int w, int h, dl_media_format f, int quality, uint8_t **out,
                                size_t *len) {
    if (quality < 0 || quality > 100) return dl_fail(DL_ERR_INVALID, "output compression %d is outside 0..100", quality);
    switch (f) {
    case DL_FMT_PNG: return dl_png_encode(rgb, w, h, out, len);
    case DL_FMT_JPEG: return dl_jpeg_encode(rgb, w, h, quality, out, len);
    case DL_FMT_WEBP: return dl_webp_encode(rgb, w, h, quality, out, len);
    default: return dl_fail(DL_ERR_INVALID, "not an image format");
    }
}

dl_status dl_media_write(const char *path, const dl_media *m, int quality) {
    dl_media_format f = DL_FMT_PNG;
    dl_status s = dl_media_format_from_path(path, &f);
    if (s != DL_OK) return s;
    if (f == DL_FMT_MP4) return dl_mp4_write(path, m);
    if (m->frames != 1)
        return dl_fail(DL_ERR_INVALID, "`%s`: %d frames do not fit an image file: write .mp4 (or --save-frames DIR)", path,
                       m->frames);
    uint8_t *data;
    size_t len;
    if ((s = dl_media_encode_image(m->rgb, m->width, m->height, f, quality, &data, &len)) != DL_OK) return s;
    s = dl_file_write_atomic(path, data, len);
    free(data);
    return s;
}

dl_status dl_media_save_frames(const char *dir, const dl_media *m) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dl_fail(DL_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    dl_status s = DL_OK;
    size_t fb = (size_t)m->width * (size_t)m->height * 3;
    for (int i = 0; i < m->frames && s == DL_OK; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/frame_%04d.png", dir, i);
        s = dl_png_write(path, m->rgb + (size_t)i * fb, m->width, m->height);
    }
    return s;
}
