/* The typed generation request: one value parsed once from CLI arguments or from
 * HTTP JSON, validated once against one set of limits, stored as JSON in the job
 * store and sent unchanged over the socket to the model process, where it becomes
 * the pipeline call (dl_gen_request). Field names are the HTTP API's. */
#ifndef DIFFLET_REQUEST_H
#define DIFFLET_REQUEST_H

#include <cjson/cJSON.h>

#include "difflet/io.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_STEPS_MAX 10000        /* the engine's bound; a deployment may set a lower one */
#define DL_PROMPT_MAX_BYTES 65536 /* likewise */
#define DL_SEED_MAX ((int64_t)1 << 53) /* seeds are exact in JSON numbers below this */

typedef struct {
    char *prompt, *negative_prompt; /* owned (dl_request_free); negative_prompt NULL when absent */
    int width, height, frames;      /* 0: the model's default */
    double fps;                     /* video output rate; 0: the model's default */
    int steps;
    double guidance, true_cfg;      /* guidance_scale, true_cfg_scale */
    int64_t seed;                   /* -1: none given (the server draws one per job) */
    int max_sequence_length;        /* 0: the pipeline's default */
    char cache[256];                /* step caching spec; "": the deployment's default */
    dl_media_format output_format;  /* png, jpeg, webp (mp4 for video) */
    int output_compression;         /* 0..100 */
    /* image-to-image / inpainting (owned; NULL: none): RGB and one-byte-per-pixel
     * mask at image_width x image_height; in JSON "image" and "mask" are base64 PNG */
    uint8_t *image, *mask;
    int image_width, image_height;
    double strength;                /* (0, 1]; default 0.6 */
    int partial_images;             /* 0..3 previews while denoising (streamed answers) */
} dl_request;

typedef struct {
    int max_steps;         /* <= DL_STEPS_MAX */
    int max_prompt_bytes;  /* <= DL_PROMPT_MAX_BYTES */
    int allow_calibrated;  /* calibrated caching names a file: not from the network */
} dl_request_limits;

/* The engine's own limits (CLI, model process). */
extern const dl_request_limits dl_request_engine_limits;

/* Defaults as the FLUX pipelines' __call__ has them: 28 steps, guidance 3.5, true CFG
 * 1, no seed, PNG at compression 100. */
void dl_request_init(dl_request *r);
void dl_request_free(dl_request *r);
dl_status dl_request_set_prompt(dl_request *r, const char *prompt, const char *negative);
/* Take ownership of an init image (RGB) and optional mask (L) of width x height. */
void dl_request_set_image(dl_request *r, uint8_t *rgb, uint8_t *mask, int width, int height, double strength);

/* The request fields of a JSON object (other fields are the caller's): prompt,
 * negative_prompt, size ("WxH") or width and height, frames, fps, steps,
 * guidance_scale, true_cfg_scale, seed, max_sequence_length, cache, output_format,
 * output_compression, image and mask (base64 PNG at the request's size), strength,
 * partial_images. Types, ranges and UTF-8 are checked; on failure the message
 * says what is wrong and *param names the field. */
dl_status dl_request_from_json(const cJSON *j, const dl_request_limits *lim, dl_request *r, char *param, size_t pn);
/* Every field, as from_json reads it back (width and height, not size). */
cJSON *dl_request_to_json(const dl_request *r);
/* The checks from_json makes, for a request built otherwise (the CLI). */
dl_status dl_request_validate(const dl_request *r, const dl_request_limits *lim, char *param, size_t pn);
/* "WxH" strictly: decimal digits, one 'x', decimal digits, nothing else, 1..8192. */
int dl_parse_size(const char *s, int *w, int *h);

#ifdef __cplusplus
}
#endif
#endif
