/* The typed request: JSON in and out, strict sizes, one set of checks with the
 * parameter named, limits a deployment lowers. */
#include <stdlib.h>
#include <string.h>

#include "difflet/request.h"
#include "test_util.h"

static dl_status parse(const char *json, const dl_request_limits *lim, dl_request *r, char *param) {
    cJSON *j = cJSON_Parse(json);
    dl_status s = dl_request_from_json(j, lim, r, param, 64);
    cJSON_Delete(j);
    return s;
}

int main(void) {
    dl_request r;
    char param[64];
    const dl_request_limits *eng = &dl_request_engine_limits, net = {50, 100, 0};
    CHECK(parse("{\"prompt\":\"a fox\",\"negative_prompt\":\"blur\",\"size\":\"64x32\",\"steps\":7,\"guidance_scale\":2.5,"
                "\"true_cfg_scale\":4,\"seed\":12345678901234,\"cache\":\"cadence:2\",\"output_format\":\"webp\","
                "\"output_compression\":60,\"frames\":9,\"fps\":12.5,\"max_sequence_length\":64}",
                eng, &r, param) == DL_OK,
          "a full request: %s", dl_last_error());
    CHECK(!strcmp(r.prompt, "a fox") && !strcmp(r.negative_prompt, "blur") && r.width == 64 && r.height == 32 &&
              r.steps == 7 && r.guidance == 2.5 && r.true_cfg == 4 && r.seed == 12345678901234LL &&
              !strcmp(r.cache, "cadence:2") && r.output_format == DL_FMT_WEBP && r.output_compression == 60 &&
              r.frames == 9 && r.fps == 12.5 && r.max_sequence_length == 64,
          "every field read");
    /* to_json and back gives the same request */
    cJSON *j = dl_request_to_json(&r);
    dl_request b;
    CHECK(dl_request_from_json(j, eng, &b, param, sizeof param) == DL_OK && b.width == 64 && b.seed == r.seed &&
              !strcmp(b.negative_prompt, "blur") && b.fps == 12.5 && b.output_format == DL_FMT_WEBP,
          "round trip: %s", dl_last_error());
    cJSON_Delete(j);
    dl_request_free(&b);
    dl_request_free(&r);
    CHECK(parse("{\"prompt\":\"x\"}", eng, &r, param) == DL_OK && r.steps == 28 && r.guidance == 3.5 && r.seed == -1 &&
              r.width == 0 && r.output_format == DL_FMT_PNG && r.output_compression == 100 && !r.negative_prompt,
          "defaults");
    dl_request_free(&r);
    static const struct {
        const char *json, *param, *msg;
    } bad[] = {
        {"{\"steps\":3}", "prompt", "required"},
        {"{\"prompt\":\"x\",\"steps\":51}", "steps", "from 1 to 50"},
        {"{\"prompt\":\"x\",\"steps\":2.5}", "steps", "integer"},
        {"{\"prompt\":\"x\",\"steps\":\"4\"}", "steps", "integer"},
        {"{\"prompt\":\"x\",\"size\":\"64x64x64\"}", "size", "WxH"},
        {"{\"prompt\":\"x\",\"size\":\" +64x064junk\"}", "size", "WxH"},
        {"{\"prompt\":\"x\",\"size\":\"0x64\"}", "size", "WxH"},
        {"{\"prompt\":\"x\",\"seed\":9007199254740992}", "seed", "2^53"},
        {"{\"prompt\":\"x\",\"seed\":-3}", "seed", "non-negative"},
        {"{\"prompt\":\"x\",\"guidance_scale\":\"high\"}", "guidance_scale", "number"},
        {"{\"prompt\":\"x\",\"true_cfg_scale\":1000}", "true_cfg_scale", "0..100"},
        {"{\"prompt\":\"x\",\"cache\":\"calibrated:/etc/passwd\"}", "cache", "cadence"},
        {"{\"prompt\":\"x\",\"cache\":\"sometimes\"}", "cache", "cadence"},
        {"{\"prompt\":\"x\",\"output_format\":\"gif\"}", "output_format", "jpeg"},
        {"{\"prompt\":\"x\",\"output_compression\":101}", "output_compression", "0 to 100"},
        {"{\"prompt\":\"\\u00ff\\u00ff\",\"negative_prompt\":5}", "negative_prompt", "string"},
        {"{\"prompt\":\"x\",\"fps\":-1}", "fps", "(0, 1000]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dl_status s = parse(bad[i].json, &net, &r, param);
        CHECK(s == DL_ERR_INVALID && !strcmp(param, bad[i].param) && strstr(dl_last_error(), bad[i].msg),
              "%s: param `%s`, %s", bad[i].json, param, dl_last_error());
    }
    char big[200];
    memset(big, 'a', sizeof big);
    big[150] = 0;
    dl_request_init(&r);
    dl_request_set_prompt(&r, big, NULL);
    CHECK(dl_request_validate(&r, &net, param, sizeof param) == DL_ERR_INVALID && strstr(dl_last_error(), "at most 100"),
          "a deployment's prompt limit: %s", dl_last_error());
    CHECK(dl_request_validate(&r, eng, param, sizeof param) == DL_OK, "within the engine's");
    dl_request_set_prompt(&r, "a\xff", NULL);
    CHECK(dl_request_validate(&r, eng, param, sizeof param) == DL_ERR_INVALID && strstr(dl_last_error(), "UTF-8"),
          "invalid UTF-8 refused");
    /* an image request whose strength leaves no step to run (diffusers' get_timesteps):
       refused as a bad strength, not a server error in the model process */
    static uint8_t px[3 * 16 * 16];
    dl_request_set_prompt(&r, "x", NULL);
    r.steps = 2;
    dl_request_set_image(&r, px, NULL, 16, 16, 1e-17);
    CHECK(dl_request_validate(&r, eng, param, sizeof param) == DL_ERR_INVALID && !strcmp(param, "strength"),
          "a strength that leaves no step: %s", dl_last_error());
    r.strength = 0.5;
    CHECK(dl_request_validate(&r, eng, param, sizeof param) == DL_OK, "strength 0.5 of 2 steps runs one: %s", dl_last_error());
    r.image = NULL;
    dl_request_free(&r);
    int w, h;
    CHECK(dl_parse_size("1024x768", &w, &h) && w == 1024 && h == 768 && !dl_parse_size("1024X768", &w, &h) &&
              !dl_parse_size("8193x8", &w, &h) && !dl_parse_size("x8", &w, &h) && !dl_parse_size("8x", &w, &h),
          "strict sizes");
    return test_done("test_request");
}
