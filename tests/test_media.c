/* Media outputs, read back by FFmpeg's own ffprobe: a synthetic frame sequence
 * (a square moving over a gradient, with a sine tone) as MP4 (size, frame count,
 * frame rate, H.264 yuv420p, AAC mono), a frame as PNG / JPEG / WebP (size, codec),
 * the tone as float WAV, the frame dump; a stereo tone (a loud left channel, a quiet
 * right one) as MP4 (AAC stereo: channels, rate, duration, and each channel's level
 * decoded back by ffmpeg, so swapped or mixed channels fail) and as WAV (ffprobe and
 * the header's fields and first interleaved samples, byte by byte); and the refusals
 * (odd sizes for H.264, an unknown extension, several frames into an image file,
 * three audio channels); and the same small clip written four times, the heap
 * dirtied with a different byte before each write, giving the same bytes (libx264's
 * macroblock-tree rate control read uninitialised memory on small frames). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/io.h"
#include "test_util.h"

static char g_tmp[256];

/* `ffprobe ... FILE` with -of default=nw=1, every line joined with ';' */
static int probe(const char *args, const char *file, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ffprobe -v error %s -of default=nw=1 '%s' 2>&1", args, file);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    size_t o = 0;
    char line[512];
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        o += (size_t)snprintf(out + o, o < n ? n - o : 0, "%s;", line);
    }
    return pclose(f) == 0;
}

/* audio: 0 none, 1 a mono 440 Hz tone (audio_channels left 0, as a mono producer
 * leaves it), 2 stereo: left 440 Hz at 0.4, right 660 Hz at 0.1, interleaved */
static dl_media synthetic(int w, int h, int frames, double fps, int audio) {
    dl_media m = {.kind = audio ? DL_MEDIA_VIDEO_AUDIO : DL_MEDIA_VIDEO, .width = w, .height = h, .frames = frames, .fps = fps};
    m.rgb = malloc((size_t)w * h * 3 * frames);
    for (int f = 0; f < frames; f++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                uint8_t *p = m.rgb + (((size_t)f * h + y) * w + x) * 3;
                int in = x >= 2 * f && x < 2 * f + 12 && y >= 10 && y < 22;
                p[0] = in ? 250 : (uint8_t)(x * 255 / w);
                p[1] = in ? 30 : (uint8_t)(y * 255 / h);
                p[2] = in ? 40 : 128;
            }
    if (audio) {
        m.audio_rate = 24000;
        m.audio_samples = (int64_t)(frames / fps * m.audio_rate);
        m.audio_channels = audio == 2 ? 2 : 0;
        m.audio = malloc((size_t)m.audio_samples * (size_t)audio * 4);
        for (int64_t i = 0; i < m.audio_samples; i++) {
            m.audio[i * audio] = 0.4f * sinf(2.f * 3.14159265f * 440.f * (float)i / 24000.f);
            if (audio == 2) m.audio[i * 2 + 1] = 0.1f * sinf(2.f * 3.14159265f * 660.f * (float)i / 24000.f);
        }
    }
    return m;
}

static void test_mp4(void) {
    char path[400], out[2048];
    dl_media m = synthetic(64, 48, 24, 12.0, 1);
    snprintf(path, sizeof path, "%s/clip.mp4", g_tmp);
    CHECK(dl_media_write(path, &m, 100) == DL_OK, "mp4 with audio: %s", dl_last_error());
    CHECK(probe("-select_streams v:0 -count_frames -show_entries stream=codec_name,width,height,pix_fmt,r_frame_rate,nb_read_frames",
                path, out, sizeof out),
          "ffprobe video: %s", out);
    CHECK(strstr(out, "codec_name=h264") && strstr(out, "width=64") && strstr(out, "height=48") &&
              strstr(out, "pix_fmt=yuv420p") && strstr(out, "r_frame_rate=12/1") && strstr(out, "nb_read_frames=24"),
          "H.264 64x48 yuv420p, 24 frames at 12 fps: %s", out);
    CHECK(probe("-select_streams a:0 -show_entries stream=codec_name,sample_rate,channels", path, out, sizeof out) &&
              strstr(out, "codec_name=aac") && strstr(out, "sample_rate=24000") && strstr(out, "channels=1"),
          "an AAC mono 24 kHz track: %s", out);
    CHECK(probe("-show_entries format=duration", path, out, sizeof out) && fabs(atof(strchr(out, '=') + 1) - 2.0) < 0.1,
          "two seconds long: %s", out);
    /* without sound, at a fractional rate */
    dl_media v = synthetic(32, 32, 5, 23.976, 0);
    snprintf(path, sizeof path, "%s/silent.mp4", g_tmp);
    CHECK(dl_media_write(path, &v, 100) == DL_OK, "silent mp4: %s", dl_last_error());
    CHECK(probe("-count_frames -show_entries stream=codec_type,nb_read_frames,avg_frame_rate", path, out, sizeof out) &&
              strstr(out, "nb_read_frames=5") && !strstr(out, "codec_type=audio") && strstr(out, "avg_frame_rate=2997"),
          "5 frames, no audio stream, 23.976 fps: %s", out);
    /* frame dump */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/frames", g_tmp);
    CHECK(dl_media_save_frames(dir, &v) == DL_OK, "frames: %s", dl_last_error());
    snprintf(path, sizeof path, "%s/frame_0004.png", dir);
    CHECK(access(path, R_OK) == 0 && probe("-show_entries stream=codec_name,width,height", path, out, sizeof out) &&
              strstr(out, "codec_name=png") && strstr(out, "width=32"),
          "frame_0004.png: %s", out);
    /* refusals, nothing left behind */
    dl_media odd = synthetic(33, 32, 2, 10, 0);
    snprintf(path, sizeof path, "%s/odd.mp4", g_tmp);
    CHECK(dl_media_write(path, &odd, 100) == DL_ERR_INVALID && strstr(dl_last_error(), "even"), "odd width refused: %s",
          dl_last_error());
    CHECK(access(path, F_OK) != 0, "a refused video leaves no file");
    snprintf(path, sizeof path, "%s/clip.png", g_tmp);
    CHECK(dl_media_write(path, &v, 100) == DL_ERR_INVALID && strstr(dl_last_error(), "mp4"), "5 frames into a PNG refused: %s",
          dl_last_error());
    snprintf(path, sizeof path, "%s/clip.gif", g_tmp);
    CHECK(dl_media_write(path, &v, 100) == DL_ERR_INVALID && strstr(dl_last_error(), ".gif"), "gif refused: %s",
          dl_last_error());
    v.fps = 0;
    snprintf(path, sizeof path, "%s/nofps.mp4", g_tmp);
    CHECK(dl_media_write(path, &v, 100) == DL_ERR_INVALID, "no frame rate refused");
    /* the tone as WAV */
    snprintf(path, sizeof path, "%s/tone.wav", g_tmp);
    CHECK(dl_wav_write(path, m.audio, m.audio_samples, dl_media_audio_channels(&m), m.audio_rate) == DL_OK, "wav: %s",
          dl_last_error());
    CHECK(probe("-show_entries stream=codec_name,sample_rate,channels,duration", path, out, sizeof out) &&
              strstr(out, "codec_name=pcm_f32le") && strstr(out, "sample_rate=24000") && strstr(out, "channels=1") &&
              strstr(out, "duration=2.0"),
          "float mono WAV, 24 kHz, 2 s: %s", out);
    dl_media_free(&m), dl_media_free(&odd);
    dl_media_free(&v);
}

static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get32(const uint8_t *p) { return get16(p) | get16(p + 2) << 16; }

/* each channel's RMS of what ffmpeg decodes from `file`, as f32 at its own layout */
static int decoded_rms(const char *file, int ch, double *rms) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ffmpeg -v error -i '%s' -map 0:a:0 -f f32le -acodec pcm_f32le -", file);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    double sum[2] = {0, 0};
    int64_t n = 0;
    float v[2];
    while (fread(v, 4, (size_t)ch, f) == (size_t)ch) {
        for (int c = 0; c < ch; c++) sum[c] += (double)v[c] * v[c];
        n++;
    }
    int ok = pclose(f) == 0 && n > 0;
    for (int c = 0; c < ch; c++) rms[c] = n ? sqrt(sum[c] / (double)n) : 0;
    return ok;
}

static void test_stereo(void) {
    char path[400], out[2048];
    dl_media m = synthetic(64, 48, 24, 12.0, 2);
    CHECK(dl_media_audio_channels(&m) == 2, "stereo media: %d channels", dl_media_audio_channels(&m));
    snprintf(path, sizeof path, "%s/stereo.mp4", g_tmp);
    CHECK(dl_media_write(path, &m, 100) == DL_OK, "mp4 with stereo audio: %s", dl_last_error());
    CHECK(probe("-select_streams a:0 -show_entries stream=codec_name,sample_rate,channels,channel_layout", path, out,
                sizeof out) &&
              strstr(out, "codec_name=aac") && strstr(out, "sample_rate=24000") && strstr(out, "channels=2") &&
              strstr(out, "channel_layout=stereo"),
          "an AAC stereo 24 kHz track: %s", out);
    CHECK(probe("-select_streams a:0 -show_entries stream=duration", path, out, sizeof out) && strchr(out, '=') &&
              fabs(atof(strchr(out, '=') + 1) - 2.0) < 0.1,
          "the audio stream two seconds long: %s", out);
    /* the levels in: left 0.4 / sqrt 2 = 0.283, right 0.1 / sqrt 2 = 0.071 */
    double rms[2] = {0, 0};
    CHECK(decoded_rms(path, 2, rms) && fabs(rms[0] - 0.283) < 0.03 && fabs(rms[1] - 0.071) < 0.01,
          "decoded levels left %.3f right %.3f, want 0.283 / 0.071", rms[0], rms[1]);
    /* WAV: ffprobe, then the header and the first samples byte by byte */
    snprintf(path, sizeof path, "%s/stereo.wav", g_tmp);
    CHECK(dl_wav_write(path, m.audio, m.audio_samples, 2, m.audio_rate) == DL_OK, "stereo wav: %s", dl_last_error());
    CHECK(probe("-show_entries stream=codec_name,sample_rate,channels,duration", path, out, sizeof out) &&
              strstr(out, "codec_name=pcm_f32le") && strstr(out, "sample_rate=24000") && strstr(out, "channels=2") &&
              strstr(out, "duration=2.0"),
          "float stereo WAV, 24 kHz, 2 s: %s", out);
    uint8_t h[58 + 40] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(h, 1, 58 + 16, f) : 0;
    if (f) fclose(f);
    const uint32_t data = (uint32_t)m.audio_samples * 8;
    CHECK(got == 58 + 16 && !memcmp(h, "RIFF", 4) && get32(h + 4) == 50 + data && !memcmp(h + 8, "WAVE", 4) &&
              get16(h + 20) == 3 && get16(h + 22) == 2 && get32(h + 24) == 24000 && get32(h + 28) == 24000 * 8 &&
              get16(h + 32) == 8 && get16(h + 34) == 32 && get32(h + 46) == (uint32_t)m.audio_samples &&
              !memcmp(h + 50, "data", 4) && get32(h + 54) == data,
          "WAV header: float, 2 channels, 24000 Hz, %u bytes/s, block %u, %u frames, %u data bytes", get32(h + 28),
          get16(h + 32), get32(h + 46), get32(h + 54));
    int same = got == 58 + 16;
    for (int i = 0; i < 4 && same; i++) { /* L0 R0 L1 R1 */
        uint32_t u = get32(h + 58 + 4 * i), want;
        memcpy(&want, m.audio + i, 4);
        same = u == want;
    }
    CHECK(same, "WAV data: the first samples interleaved L R L R as given");
    /* mono through the same writer: one channel, block 4 */
    memset(h, 0, sizeof h);
    CHECK(dl_wav_write(path, m.audio, 10, 1, 24000) == DL_OK, "mono wav: %s", dl_last_error());
    f = fopen(path, "rb");
    got = f ? fread(h, 1, sizeof h, f) : 0;
    if (f) fclose(f);
    CHECK(got == 58 + 40 && get16(h + 22) == 1 && get32(h + 28) == 24000 * 4 && get16(h + 32) == 4 && get32(h + 54) == 40,
          "mono WAV: %zu bytes, %u channel(s), block %u, %u data bytes", got, get16(h + 22), get16(h + 32), get32(h + 54));
    /* three channels: refused by name, nothing left behind */
    CHECK(dl_wav_write(path, m.audio, 10, 3, 24000) == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "3 channels"),
          "3-channel WAV refused: %s", dl_last_error());
    m.audio_channels = 3;
    m.audio_samples /= 3;
    snprintf(path, sizeof path, "%s/three.mp4", g_tmp);
    CHECK(dl_media_write(path, &m, 100) == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "3 audio channels"),
          "3-channel MP4 refused: %s", dl_last_error());
    CHECK(access(path, F_OK) != 0, "a refused stereo+ video leaves no file");
    dl_media_free(&m);
}

static void test_images(void) {
    dl_media m = synthetic(40, 24, 1, 0, 0);
    m.kind = DL_MEDIA_IMAGE;
    static const char *ext[] = {"png", "jpg", "jpeg", "webp"}, *codec[] = {"png", "mjpeg", "mjpeg", "webp"};
    for (int i = 0; i < 4; i++) {
        char path[300], out[1024];
        snprintf(path, sizeof path, "%s/a.%s", g_tmp, ext[i]);
        CHECK(dl_media_write(path, &m, 80) == DL_OK, "%s: %s", ext[i], dl_last_error());
        char want[64];
        snprintf(want, sizeof want, "codec_name=%s", codec[i]);
        CHECK(probe("-show_entries stream=codec_name,width,height", path, out, sizeof out) && strstr(out, want) &&
                  strstr(out, "width=40") && strstr(out, "height=24"),
              "%s read back 40x24: %s", ext[i], out);
    }
    /* compression: a lower quality gives a smaller JPEG; WebP 100 is lossless */
    uint8_t *a, *b;
    size_t na, nb;
    CHECK(dl_media_encode_image(m.rgb, 40, 24, DL_FMT_JPEG, 95, &a, &na) == DL_OK &&
              dl_media_encode_image(m.rgb, 40, 24, DL_FMT_JPEG, 10, &b, &nb) == DL_OK && nb < na,
          "JPEG quality 10 (%zu bytes) below 95 (%zu)", nb, na);
    free(a), free(b);
    CHECK(dl_media_encode_image(m.rgb, 40, 24, DL_FMT_JPEG, 101, &a, &na) == DL_ERR_INVALID, "quality 101 refused");
    dl_media_free(&m);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca = 0, cb = 0;
    while (same && (ca = fgetc(fa)) != EOF) same = (cb = fgetc(fb)) == ca;
    if (same) same = fgetc(fb) == EOF;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* a 64x64 clip of 9 frames as a tiny video model makes them: a flat background, a
 * disc moving right with soft edges, a little noise */
static dl_media small_clip(void) {
    dl_media m = {.kind = DL_MEDIA_VIDEO, .width = 64, .height = 64, .frames = 9, .fps = 8};
    m.rgb = malloc(64 * 64 * 3 * 9);
    uint32_t r = 12345;
    for (int f = 0; f < 9; f++)
        for (int y = 0; y < 64; y++)
            for (int x = 0; x < 64; x++) {
                float dx = (float)x - (14.f + 4.5f * (float)f), dy = (float)y - 30.f;
                float in = 1.f - fminf(fmaxf(sqrtf(dx * dx + dy * dy) - 8.f, 0.f), 1.f);
                uint8_t *p = m.rgb + (((size_t)f * 64 + y) * 64 + x) * 3;
                const float bg[3] = {40, 80, 220}, fg[3] = {220, 40, 40};
                for (int c = 0; c < 3; c++) {
                    r = r * 1664525u + 1013904223u;
                    float v = bg[c] + in * (fg[c] - bg[c]) + (float)(r >> 29) - 3.5f;
                    p[c] = (uint8_t)fminf(fmaxf(v, 0.f), 255.f);
                }
            }
    return m;
}

/* many blocks the allocator hands out again, filled with `byte` and freed */
static void dirty_heap(int byte) {
    enum { N = 4000 };
    static void *blk[N];
    for (int i = 0; i < N; i++)
        if ((blk[i] = malloc((size_t)(64 + (i * 7919) % 60000)))) memset(blk[i], byte, (size_t)(64 + (i * 7919) % 60000));
    for (int i = N - 1; i >= 0; i--) free(blk[i]);
}

static void test_mp4_deterministic(void) {
    dl_media m = small_clip();
    char first[300], path[300];
    snprintf(first, sizeof first, "%s/same0.mp4", g_tmp);
    for (int k = 0; k < 4; k++) {
        dirty_heap(0x11 + 0x3c * k);
        snprintf(path, sizeof path, "%s/same%d.mp4", g_tmp, k);
        CHECK(dl_media_write(path, &m, 100) == DL_OK, "mp4 write %d: %s", k, dl_last_error());
        if (k) CHECK(same_file(first, path), "the same clip written again (write %d, heap dirtied) gives the same bytes", k);
    }
    dl_media_free(&m);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/difflet-media-XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    if (system("command -v ffprobe > /dev/null") != 0) {
        fprintf(stderr, "test_media: ffprobe is missing (make deps installs ffmpeg)\n");
        return 1;
    }
    test_images();
    test_mp4();
    test_stereo();
    test_mp4_deterministic();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return test_done("test_media");
}
