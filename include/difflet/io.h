/* difflet io: safetensors checkpoints (one file or sharded through an index) and
 * model folders in the diffusers layout (model_index.json + one folder per
 * component with config.json and weights).
 *
 * Everything read from disk is validated before use; a malformed file is an error
 * with a one-line message naming the file (and tensor), never a crash. */
#ifndef DIFFLET_IO_H
#define DIFFLET_IO_H

#include "difflet/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors ----------------------------------------------------------------- */

/* Every dtype the safetensors format names; only F32/F16/BF16 are computed with,
 * the others are parsed (checkpoints carry e.g. int64 position ids) and refused
 * only when read as floats. */
typedef enum {
    DL_ST_F32, DL_ST_F16, DL_ST_BF16, DL_ST_F64, DL_ST_I64, DL_ST_I32, DL_ST_I16, DL_ST_I8,
    DL_ST_U64, DL_ST_U32, DL_ST_U16, DL_ST_U8, DL_ST_BOOL, DL_ST_F8_E4M3, DL_ST_F8_E5M2,
    DL_ST_GGUF, /* not a safetensors dtype: a GGUF block-quantized tensor (qtype says which), read dequantized */
    DL_ST_COUNT
} dl_st_dtype;

const char *dl_st_dtype_name(dl_st_dtype dt); /* "F32", ... */
size_t dl_st_dtype_size(dl_st_dtype dt);

#define DL_ST_MAX_DIMS 8
/* Header larger than this is refused before it is read (the format's own limit). */
#define DL_ST_MAX_HEADER (100u << 20)

typedef struct {
    const char *name;
    dl_st_dtype dtype;
    int ndim;
    int64_t shape[DL_ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* inside the read-only mapping; NOT aligned in general */
    size_t nbytes;
    const char *file; /* the file it came from, for messages */
    uint32_t qtype;   /* DL_ST_GGUF: the GGUF (ggml) block type of data */
} dl_st_tensor;

/* A checkpoint: one .safetensors file, or the shards named by a
 * *.safetensors.index.json, all mapped read-only. Tensors are sorted by name. */
typedef struct dl_checkpoint dl_checkpoint;

/* `path`: a .safetensors file or a .safetensors.index.json. `label` (may be NULL)
 * is how messages name it (e.g. "text_encoder_2/model.safetensors"). */
dl_status dl_ckpt_open(dl_checkpoint **out, const char *path, const char *label);
void dl_ckpt_free(dl_checkpoint *ck);

int dl_ckpt_count(const dl_checkpoint *ck);
const dl_st_tensor *dl_ckpt_at(const dl_checkpoint *ck, int i);
/* NULL when absent. */
const dl_st_tensor *dl_ckpt_find(const dl_checkpoint *ck, const char *name);
const char *dl_ckpt_label(const dl_checkpoint *ck);

/* The tensor `name` with exactly this shape, or an error such as
 * "`text_encoder_2/model.safetensors`: tensor `x.weight` has shape [4096, 10240],
 *  config expects [4096, 8192]" (also for a missing tensor or a non-float dtype). */
dl_status dl_ckpt_expect(const dl_checkpoint *ck, const char *name, int ndim,
                         const int64_t *shape, const dl_st_tensor **out);

/* Copy a float tensor (F32, F16, BF16) into `dst` converted to `dt`. */
dl_status dl_ckpt_read(const dl_st_tensor *t, dl_dtype dt, void *dst);

/* XXH3 of every tensor's name, dtype, shape and bytes, in name order: the
 * checkpoint's content identity (program keys). */
uint64_t dl_ckpt_content_hash(const dl_checkpoint *ck);

/* A checkpoint assembled from described tensors (GGUF import: renamed and split views
 * of another file's data): new, add each (name copied; data must outlive the
 * checkpoint: give what it points into to dl_ckpt_keep, released with the
 * checkpoint, last kept first), then seal (sorts; a duplicate name is an error). */
dl_status dl_ckpt_new_virtual(dl_checkpoint **out, const char *label);
dl_status dl_ckpt_add(dl_checkpoint *ck, const dl_st_tensor *t);
dl_status dl_ckpt_keep(dl_checkpoint *ck, void *p, void (*release)(void *)); /* on failure p is released */
dl_status dl_ckpt_seal(dl_checkpoint *ck);
/* A GGUF file (src/io/gguf_ckpt.c) as a checkpoint of diffusers names: FLUX files
 * in Black Forest Labs' names are renamed and split as diffusers' converter does,
 * files already in diffusers names are taken as they are; block-quantized tensors
 * are read dequantized (dl_ckpt_read). */
dl_status dl_ckpt_open_gguf(dl_checkpoint **out, const char *path, const char *label);

/* Writer: collect tensors (the data is referenced, not copied, until save), then
 * write the file atomically (temporary file, fsync, rename). */
typedef struct dl_st_writer dl_st_writer;
dl_st_writer *dl_st_writer_new(void);
void dl_st_writer_free(dl_st_writer *w);
dl_status dl_st_writer_add(dl_st_writer *w, const char *name, dl_st_dtype dt, int ndim,
                           const int64_t *shape, const void *data);
dl_status dl_st_writer_meta(dl_st_writer *w, const char *key, const char *value);
dl_status dl_st_writer_save(dl_st_writer *w, const char *path);

/* ---- images ------------------------------------------------------------------------ */

/* 8-bit RGB (row-major, width*height*3) to PNG bytes (malloc'd) or to a file,
 * written atomically. */
dl_status dl_png_encode(const uint8_t *rgb, int width, int height, uint8_t **out, size_t *len);
dl_status dl_png_write(const char *path, const uint8_t *rgb, int width, int height);

/* ---- pictures given as input (image_read.c): image-to-image and masks ---------------- */
#define DL_IMAGE_MAX_SIDE 8192
#define DL_IMAGE_MAX_PIXELS ((long long)4096 * 4096) /* a decoded picture's bound: a small file may claim a huge one */
#define DL_IMAGE_MAX_BYTES ((size_t)64 << 20)
typedef struct {
    int width, height, channels; /* channels: 4 (RGBA) as decoded; 1 or 3 after conversion */
    uint8_t *px;                 /* row-major, interleaved, malloc'd */
} dl_image;
void dl_image_free(dl_image *im);
/* PNG, JPEG or WebP (by their first bytes) to 8-bit RGBA; anything else, a
 * corrupt file, a side over DL_IMAGE_MAX_SIDE or more than DL_IMAGE_MAX_PIXELS pixels
 * is refused with a message (before anything is decoded). */
dl_status dl_image_decode(const uint8_t *data, size_t n, dl_image *out);
dl_status dl_image_read(const char *path, dl_image *out);
typedef enum {
    DL_IMAGE_RGB = 0,     /* PIL's convert("RGB"): alpha dropped */
    DL_IMAGE_LUMA,        /* PIL's convert("L"): a diffusers mask (white repaints) */
    DL_IMAGE_TRANSPARENT  /* OpenAI's mask: 255 where fully transparent (edited), else 0 */
} dl_image_mode;
dl_status dl_image_convert(const dl_image *in, dl_image_mode mode, dl_image *out);
/* Any pixel with alpha below 255 */
int dl_image_has_transparency(const dl_image *im);
/* Resized as PIL's Image.resize(LANCZOS) resizes 8-bit pictures (diffusers'
 * VaeImageProcessor default), any channel count. */
dl_status dl_image_resize(const dl_image *in, int width, int height, dl_image *out);
/* What VaeImageProcessor.preprocess does to a PIL picture before its tensor:
 * converted (mode), then resized to width x height when it has another size;
 * *out: width*height*(3 or 1) bytes, malloc'd. */
dl_status dl_image_prepare(const dl_image *in, dl_image_mode mode, int width, int height, uint8_t **out);

/* ---- media (media.c) ------------------------------------------------------------
 * What one generation made: frames x height x width x 3 bytes of RGB (an image is
 * one frame), optionally the same unrounded in [0, 1], and for models that make
 * sound f32 samples, interleaved when there are several channels. */
typedef enum { DL_MEDIA_IMAGE = 0, DL_MEDIA_VIDEO, DL_MEDIA_VIDEO_AUDIO } dl_media_kind;
const char *dl_media_kind_name(dl_media_kind k);
typedef struct {
    dl_media_kind kind;
    int width, height, frames;
    double fps;
    uint8_t *rgb;
    float *pixels; /* when asked for: the same in [0, 1] before rounding */
    float *audio;          /* [audio_samples, channels], interleaved (L R L R ... for stereo) */
    int64_t audio_samples; /* per channel: the duration is audio_samples / audio_rate */
    int audio_rate;        /* Hz */
    int audio_channels;    /* 0 or 1: mono (what a zeroed dl_media says); 2: stereo */
} dl_media;
/* m's channel count: audio_channels, 1 when it is 0 */
int dl_media_audio_channels(const dl_media *m);
void dl_media_free(dl_media *m); /* frees the buffers (malloc'd) */

typedef enum { DL_FMT_PNG = 0, DL_FMT_JPEG, DL_FMT_WEBP, DL_FMT_MP4 } dl_media_format;
/* From the file name's extension (png, jpg/jpeg, webp, mp4); others are refused. */
dl_status dl_media_format_from_path(const char *path, dl_media_format *f);
/* An image in memory (caller frees *out): PNG, or JPEG / WebP at `quality` 0..100
 * (WebP 100: lossless). */
dl_status dl_media_encode_image(const uint8_t *rgb, int w, int h, dl_media_format f, int quality, uint8_t **out,
                                size_t *len);
dl_status dl_jpeg_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **out, size_t *len);
dl_status dl_webp_encode(const uint8_t *rgb, int w, int h, int quality, uint8_t **out, size_t *len);
/* H.264 (yuv420p, even sizes) at m->fps, with an AAC track when m has audio (mono or
 * stereo; more channels are refused). */
dl_status dl_mp4_write(const char *path, const dl_media *m);
/* By the extension of `path`; an image format needs exactly one frame. Atomic. */
dl_status dl_media_write(const char *path, const dl_media *m, int quality);
/* DIR/frame_0000.png, ... (DIR is created when missing). */
dl_status dl_media_save_frames(const char *dir, const dl_media *m);
/* 32-bit float PCM WAV of n samples per channel, `channels` (1 or 2) interleaved as
 * dl_media's audio is. Atomic. */
dl_status dl_wav_write(const char *path, const float *samples, int64_t n, int channels, int rate);

/* ---- diffusers model folders ------------------------------------------------------ */

typedef struct dl_model_dir dl_model_dir;
struct cJSON;

/* A JSON file whose top level is an object (up to 64 MiB). Errors name `shown` (NULL:
 * the path): missing, unreadable, or not a valid JSON object (with the byte offset). */
dl_status dl_json_read_object(const char *path, const char *shown, struct cJSON **out);
/* The number `key` of the JSON object in file dir/rel when it is in [lo, hi], else
 * (missing file or field, or out of range) def. */
int64_t dl_json_file_int(const char *dir, const char *rel, const char *key, int64_t lo, int64_t hi, int64_t def);
/* A model's own generation default: the number `key` of the "defaults" object in
 * DIR/difflet.json (a file difflet reads beside model_index.json, for models trained
 * for settings other than their pipeline's defaults, such as difflet-tiny's 32 text
 * tokens), when in [lo, hi]; else def, the diffusers pipeline's own default. */
int64_t dl_model_default_int(const char *dir, const char *key, int64_t lo, int64_t hi, int64_t def);
/* The same for a number that need not be whole (guidance_scale, fps). */
double dl_model_default_num(const char *dir, const char *key, double lo, double hi, double def);

/* Reads DIR/model_index.json. */
dl_status dl_model_dir_open(dl_model_dir **out, const char *dir);
/* A model reference as users have them: a folder, or a Hub repository id
 * ("org/name", optionally "@revision": a branch or tag under refs/, or a commit
 * hash) resolved offline in the local Hugging Face cache ($HF_HUB_CACHE, else
 * $HF_HOME/hub, else ~/.cache/huggingface/hub: models--org--name/snapshots/<commit>/,
 * whose files link to blobs). Never downloads. `out` gets the folder; a missing
 * reference is an error naming where it looked. */
dl_status dl_model_resolve(const char *ref, char *out, size_t n);
void dl_model_dir_free(dl_model_dir *m);
const char *dl_model_dir_path(const dl_model_dir *m);
/* The pipeline class ("FluxPipeline"). */
const char *dl_model_dir_class(const dl_model_dir *m);
/* Number of components and their names, in model_index.json order. */
int dl_model_dir_ncomponents(const dl_model_dir *m);
const char *dl_model_dir_component_name(const dl_model_dir *m, int i);
/* The component's class ("FluxTransformer2DModel"), or NULL if it is not listed
 * (or listed as null). */
const char *dl_model_dir_component_class(const dl_model_dir *m, const char *component);
/* DIR/<component>/config.json, parsed and cached (owned by m). An error names the
 * file when it is missing or is not valid JSON. */
dl_status dl_model_dir_config(dl_model_dir *m, const char *component, const struct cJSON **cfg);
/* The component's weights: <component>/{diffusion_pytorch_model,model}.safetensors
 * or their .safetensors.index.json. Caller frees. */
dl_status dl_model_dir_checkpoint(const dl_model_dir *m, const char *component,
                                  dl_checkpoint **ck);

/* Typed config fields with messages naming the file and key. `def` is used when the
 * key is absent; a present key of the wrong type is an error. */
dl_status dl_cfg_int(const struct cJSON *cfg, const char *file, const char *key, int64_t def,
                     int64_t *out);
dl_status dl_cfg_float(const struct cJSON *cfg, const char *file, const char *key, double def,
                       double *out);
dl_status dl_cfg_bool(const struct cJSON *cfg, const char *file, const char *key, int def,
                      int *out);
/* Returns the string (owned by cfg) or def. */
dl_status dl_cfg_str(const struct cJSON *cfg, const char *file, const char *key, const char *def,
                     const char **out);

#ifdef __cplusplus
}
#endif
#endif
