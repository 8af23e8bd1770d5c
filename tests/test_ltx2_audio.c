/* LTX-2's audio VAE decoder and vocoder against diffusers (tests/data/ltx2_audio/
 * {a,b,c,d}/{audio_vae,vocoder}: random weights stored in bf16;
 * tests/data/ltx2_audio/vectors.safetensors: diffusers 0.42.1's outputs in f32,
 * written by tools/parity/make_ltx2_audio_vectors.py).
 * VAEs: a causality height, pixel norm, 3 levels, mid + level attention; b width,
 * 2 levels, 3 res blocks per level (output cut / zero-padded to 4 L - 3 x mel_bins);
 * c none with GroupNorm(32) and mid attention; d width-compatibility, one res
 * block per level. Vocoders: a leaky_relu (the released LTX-2 kernels 16 / 15 at
 * strides 6 / 5), b snakebeta anti-aliased with an odd k - s upsampler, c snake
 * with clamp, d leaky_relu slope 0.2, one stage. Plus the pipeline's audio tail
 * (packed latents -> VAE a -> vocoder a). LTX2VocoderWithBWE (tests/data/ltx2_audio/
 * {e,f}/vocoder): e snakebeta generators, STFT 64 / hop 16, 16 -> 48 kHz (56
 * samples padded to 64 for the STFT; 2 frames: one STFT frame); f leaky_relu stage
 * 1 with tanh, snake BWE generator, one channel, STFT 32 / 8, 24 -> 48 kHz.
 * Bars: f32 max|err| <= 1e-4 max|ref| per component; waveform SNR >= 40 dB f32,
 * >= 20 dB bf16; bf16 mel SNR >= 20 dB. Also: a second run gives the same bytes,
 * non-finite input refused, refusals with messages for broken configs (an unknown
 * class name; BWE configs whose generator sizes disagree with the STFT). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "difflet/ltx2_audio.h"
#include "test_util.h"

static dl_checkpoint *g_vec;
static int g_verbose;

/* signal to noise: 10 log10(sum want^2 / sum (got - want)^2) */
static double snr_db(const float *got, const float *want, int64_t n) {
    double sig = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return -INFINITY;
        sig += (double)want[i] * want[i];
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    }
    return err == 0 ? INFINITY : 10.0 * log10(sig / err);
}

/* f32: max|err| <= 1e-4 of max|ref| and (waveforms) SNR >= 40 dB; bf16: SNR >= 20 dB */
static void compare(const char *what, const char *key, dl_dtype dt, const float *got, const float *want, int64_t n,
                    int wave) {
    const double e = test_rel_err(got, want, n), db = snr_db(got, want, n);
    if (dt == DL_F32) {
        CHECK(e <= 1e-4, "%s %s f32: max|err| %.3g of max|ref|", key, what, e);
        if (wave) CHECK(db >= 40.0, "%s %s f32: SNR %.1f dB < 40", key, what, db);
    } else {
        CHECK(db >= 20.0, "%s %s bf16: SNR %.1f dB < 20", key, what, db);
    }
    if (g_verbose) printf("%s %s %s: max|err| %.3g of max|ref|, SNR %.1f dB\n", key, what, dl_dtype_name(dt), e, db);
}

static dl_model_dir *open_dir(const char *f) {
    char dir[256];
    snprintf(dir, sizeof dir, DATA_DIR "/ltx2_audio/%s", f);
    dl_model_dir *md = NULL;
    if (dl_model_dir_open(&md, dir) != DL_OK) CHECK(0, "%s", dl_last_error());
    return md;
}

/* VAE fixture f on <key>.packed / .z -> <key>.mel: L latent frames, C channels, mel_bins */
static void test_vae(const char *f, const char *key, int64_t L, int64_t C, int64_t bins, dl_dtype dt) {
    char nm[64];
    dl_model_dir *md = open_dir(f);
    if (!md) return;
    dl_ltx2_audio_vae *m;
    if (dl_ltx2_audio_vae_load(&m, md, "audio_vae", L, dt, NULL) != DL_OK) {
        CHECK(0, "load %s: %s", f, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    const int64_t M = bins / 4, T = 4 * L - 3 > 1 ? 4 * L - 3 : 1, n = 2 * T * bins;
    int64_t ns;
    CHECK(dl_ltx2_audio_vae_latent_channels(m) == C && dl_ltx2_audio_vae_latent_frames(m) == L &&
              dl_ltx2_audio_vae_latent_mel_bins(m) == M && dl_ltx2_audio_vae_out_channels(m) == 2 &&
              dl_ltx2_audio_vae_mel_frames(m) == T && dl_ltx2_audio_vae_mel_bins(m) == bins &&
              dl_ltx2_audio_vae_sample_rate(m) == 16000 && dl_ltx2_audio_vae_hop_length(m) == 160 &&
              dl_ltx2_audio_vae_latents_mean(m, &ns) && ns == C * M && dl_ltx2_audio_vae_latents_std(m, NULL),
          "%s: shapes C %lld L %lld M %lld T %lld bins %lld stats %lld", key, (long long)dl_ltx2_audio_vae_latent_channels(m),
          (long long)dl_ltx2_audio_vae_latent_frames(m), (long long)dl_ltx2_audio_vae_latent_mel_bins(m),
          (long long)dl_ltx2_audio_vae_mel_frames(m), (long long)dl_ltx2_audio_vae_mel_bins(m), (long long)ns);
    int64_t np = 0, nz = 0, nw = 0;
    snprintf(nm, sizeof nm, "%s.packed", key);
    float *packed = test_vec(g_vec, nm, &np, NULL);
    snprintf(nm, sizeof nm, "%s.z", key);
    float *z = test_vec(g_vec, nm, &nz, NULL);
    snprintf(nm, sizeof nm, "%s.mel", key);
    float *want = test_vec(g_vec, nm, &nw, NULL);
    float *got = malloc((size_t)n * 4), *again = malloc((size_t)n * 4);
    if (!packed || !z || !want || !got || !again || np != L * C * M || nz != np || nw != n) {
        CHECK(0, "%s: vectors missing or of the wrong size", key);
        goto out;
    }
    CHECK(dl_ltx2_audio_vae_decode_z(m, z, got) == DL_OK, "%s", dl_last_error());
    compare("decode(z)", key, dt, got, want, n, 0);
    memset(again, 0xff, (size_t)n * 4);
    CHECK(dl_ltx2_audio_vae_decode(m, packed, again) == DL_OK, "%s", dl_last_error());
    compare("pipeline decode", key, dt, again, want, n, 0);
    memset(got, 0, (size_t)n * 4);
    CHECK(dl_ltx2_audio_vae_decode(m, packed, got) == DL_OK && !memcmp(got, again, (size_t)n * 4),
          "%s %s: a second decode differs", key, dl_dtype_name(dt));
    packed[np - 1] = NAN;
    CHECK(dl_ltx2_audio_vae_decode(m, packed, got) == DL_ERR_INVALID, "%s: non-finite latent refused", key);
    z[0] = INFINITY;
    CHECK(dl_ltx2_audio_vae_decode_z(m, z, got) == DL_ERR_INVALID, "%s: non-finite z refused", key);
    if (g_verbose) printf("%s %s: %zu bytes of activations\n", key, dl_dtype_name(dt), dl_ltx2_audio_vae_activation_bytes(m));
out:
    free(packed), free(z), free(want), free(got), free(again);
    dl_ltx2_audio_vae_free(m);
    dl_model_dir_free(md);
}

/* vocoder fixture f on <key>.mel [cin, T] -> <key>.wave [oc, samples] */
static void test_vocoder(const char *f, const char *key, int64_t T, int64_t cin, int64_t oc, int64_t samples, int64_t rate,
                         dl_dtype dt) {
    char nm[64];
    dl_model_dir *md = open_dir(f);
    if (!md) return;
    dl_ltx2_vocoder *v;
    if (dl_ltx2_vocoder_load(&v, md, "vocoder", T, dt, NULL) != DL_OK) {
        CHECK(0, "load vocoder %s: %s", f, dl_last_error());
        dl_model_dir_free(md);
        return;
    }
    CHECK(dl_ltx2_vocoder_in_channels(v) == cin && dl_ltx2_vocoder_out_channels(v) == oc &&
              dl_ltx2_vocoder_samples(v) == samples && dl_ltx2_vocoder_sample_rate(v) == rate,
          "%s: in %lld out %lld samples %lld rate %lld", key, (long long)dl_ltx2_vocoder_in_channels(v),
          (long long)dl_ltx2_vocoder_out_channels(v), (long long)dl_ltx2_vocoder_samples(v),
          (long long)dl_ltx2_vocoder_sample_rate(v));
    int64_t nm_ = 0, nw = 0;
    snprintf(nm, sizeof nm, "%s.mel", key);
    float *mel = test_vec(g_vec, nm, &nm_, NULL);
    snprintf(nm, sizeof nm, "%s.wave", key);
    float *want = test_vec(g_vec, nm, &nw, NULL);
    const int64_t n = oc * samples;
    float *got = malloc((size_t)n * 4), *again = malloc((size_t)n * 4);
    if (!mel || !want || !got || !again || nm_ != cin * T || nw != n) {
        CHECK(0, "%s: vectors missing or of the wrong size", key);
        goto out;
    }
    CHECK(dl_ltx2_vocoder_run(v, mel, got) == DL_OK, "%s", dl_last_error());
    compare("waveform", key, dt, got, want, n, 1);
    memset(again, 0xff, (size_t)n * 4);
    CHECK(dl_ltx2_vocoder_run(v, mel, again) == DL_OK && !memcmp(got, again, (size_t)n * 4),
          "%s %s: a second run differs", key, dl_dtype_name(dt));
    mel[nm_ / 2] = NAN;
    CHECK(dl_ltx2_vocoder_run(v, mel, got) == DL_ERR_INVALID, "%s: non-finite mel refused", key);
    if (g_verbose) printf("%s %s: %zu bytes of activations\n", key, dl_dtype_name(dt), dl_ltx2_vocoder_activation_bytes(v));
out:
    free(mel), free(want), free(got), free(again);
    dl_ltx2_vocoder_free(v);
    dl_model_dir_free(md);
}

/* LTX2Pipeline's audio tail: packed latents (L 3) -> VAE a -> vocoder a -> waveform */
static void test_pipeline(dl_dtype dt) {
    dl_model_dir *md = open_dir("a");
    if (!md) return;
    dl_ltx2_audio_vae *m = NULL;
    dl_ltx2_vocoder *v = NULL;
    float *packed = test_vec(g_vec, "pipe.packed", NULL, NULL), *want = test_vec(g_vec, "pipe.wave", NULL, NULL),
          *mel = NULL, *vin = NULL, *wave = NULL;
    if (dl_ltx2_audio_vae_load(&m, md, "audio_vae", 3, dt, NULL) != DL_OK ||
        dl_ltx2_vocoder_load(&v, md, "vocoder", dl_ltx2_audio_vae_mel_frames(m), dt, NULL) != DL_OK || !packed || !want) {
        CHECK(0, "pipeline: %s", dl_last_error());
        goto out;
    }
    const int64_t oc = dl_ltx2_audio_vae_out_channels(m), T = dl_ltx2_audio_vae_mel_frames(m), B = dl_ltx2_audio_vae_mel_bins(m);
    const int64_t n = dl_ltx2_vocoder_out_channels(v) * dl_ltx2_vocoder_samples(v);
    CHECK(dl_ltx2_vocoder_in_channels(v) == oc * B && n == 2 * 270, "pipeline: vocoder in %lld, %lld samples",
          (long long)dl_ltx2_vocoder_in_channels(v), (long long)n);
    mel = malloc((size_t)(oc * T * B) * 4), vin = malloc((size_t)(oc * T * B) * 4), wave = malloc((size_t)n * 4);
    if (!mel || !vin || !wave || n != 2 * 270) goto out;
    CHECK(dl_ltx2_audio_vae_decode(m, packed, mel) == DL_OK, "%s", dl_last_error());
    dl_ltx2_audio_mel_to_vocoder(mel, oc, T, B, vin);
    CHECK(dl_ltx2_vocoder_run(v, vin, wave) == DL_OK, "%s", dl_last_error());
    compare("waveform", "pipe", dt, wave, want, n, 1);
out:
    free(packed), free(want), free(mel), free(vin), free(wave);
    dl_ltx2_audio_vae_free(m);
    dl_ltx2_vocoder_free(v);
    dl_model_dir_free(md);
}

/* A folder whose component `comp` is config `cfg` over fixture fx's weights; load
 * gives `want` and a message containing `says`. */
static void bad_folder_in(const char *fx, const char *tmp, const char *comp, const char *cfg, dl_status want,
                          const char *says) {
    char w[512];
    snprintf(w, sizeof w, DATA_DIR "/ltx2_audio/%s/%s/diffusion_pytorch_model.safetensors", fx, comp);
    if (!test_write_folder(
            tmp,
            "{\"_class_name\": \"LTX2Pipeline\", \"audio_vae\": [\"diffusers\", \"AutoencoderKLLTX2Audio\"], "
            "\"vocoder\": [\"ltx2\", \"LTX2Vocoder\"]}",
            comp, cfg, w, NULL, 0))
        return;
    dl_model_dir *md;
    if (dl_model_dir_open(&md, tmp) != DL_OK) {
        CHECK(0, "%s", dl_last_error());
        return;
    }
    dl_status s;
    int got;
    if (!strcmp(comp, "vocoder")) {
        dl_ltx2_vocoder *v = NULL;
        s = dl_ltx2_vocoder_load(&v, md, comp, 5, DL_F32, NULL);
        got = v != NULL;
        dl_ltx2_vocoder_free(v);
    } else {
        dl_ltx2_audio_vae *m = NULL;
        s = dl_ltx2_audio_vae_load(&m, md, comp, 2, DL_F32, NULL);
        got = m != NULL;
        dl_ltx2_audio_vae_free(m);
    }
    CHECK(s == want && got == (want == DL_OK) && (want == DL_OK || strstr(dl_last_error(), says)),
          "%s config %s: status %d, \"%s\" (want %d, \"%s\")", comp, cfg, (int)s, dl_last_error(), (int)want, says);
    if (g_verbose && want != DL_OK) printf("refused: %s\n", dl_last_error());
    dl_model_dir_free(md);
}

static void bad_folder(const char *tmp, const char *comp, const char *cfg, dl_status want, const char *says) {
    bad_folder_in("a", tmp, comp, cfg, want, says);
}

#define VAE(extra)                                                                                                   \
    "{\"_class_name\": \"AutoencoderKLLTX2Audio\", \"base_channels\": 8, \"latent_channels\": 2, \"mel_bins\": 16, " \
    "\"num_res_blocks\": 1, \"attn_resolutions\": [64]" extra "}"
#define VAE_A VAE(", \"ch_mult\": [1, 2, 4], \"mid_block_add_attention\": true")
#define VOC(extra)                                                                                                     \
    "{\"_class_name\": \"LTX2Vocoder\", \"in_channels\": 32, \"hidden_channels\": 16, \"out_channels\": 2, "           \
    "\"resnet_kernel_sizes\": [3, 7], \"resnet_dilations\": [[1, 3, 5], [1, 3]]" extra "}"
#define VOC_A VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5]")
/* fixture e's LTX2VocoderWithBWE config with its BWE upsample factors, hop and mel channels */
#define BWE_E(uf, hop, nmel)                                                                                           \
    "{\"_class_name\": \"LTX2VocoderWithBWE\", \"in_channels\": 16, \"hidden_channels\": 16, \"out_channels\": 2, "    \
    "\"upsample_kernel_sizes\": [8, 4], \"upsample_factors\": [4, 2], \"resnet_kernel_sizes\": [3], "                 \
    "\"resnet_dilations\": [[1, 3]], \"bwe_in_channels\": 16, \"bwe_hidden_channels\": 16, \"bwe_out_channels\": 2, " \
    "\"bwe_upsample_kernel_sizes\": [12, 8, 4], \"bwe_upsample_factors\": " uf ", \"bwe_resnet_kernel_sizes\": [3, 5], "\
    "\"bwe_resnet_dilations\": [[1, 2], [1]], \"filter_length\": 64, \"hop_length\": " hop ", \"window_length\": 64, "  \
    "\"num_mel_channels\": " nmel "}"

static void test_refusals(void) {
    dl_model_dir *md = open_dir("a");
    if (md) {
        dl_ltx2_audio_vae *m = NULL;
        dl_ltx2_vocoder *v = NULL;
        CHECK(dl_ltx2_audio_vae_load(&m, md, "no_such_vae", 2, DL_F32, NULL) != DL_OK && !m &&
                  strstr(dl_last_error(), "no_such_vae"),
              "missing component: %s", dl_last_error());
        CHECK(dl_ltx2_audio_vae_load(&m, md, "audio_vae", 0, DL_F32, NULL) == DL_ERR_INVALID && !m, "zero frames refused");
        CHECK(dl_ltx2_audio_vae_load(&m, md, "audio_vae", 2, DL_F16, NULL) == DL_ERR_UNSUPPORTED && !m, "f16 refused");
        CHECK(dl_ltx2_vocoder_load(&v, md, "vocoder", 0, DL_F32, NULL) == DL_ERR_INVALID && !v, "zero mel frames refused");
        CHECK(dl_ltx2_vocoder_load(&v, md, "vocoder", 4, DL_F16, NULL) == DL_ERR_UNSUPPORTED && !v, "f16 refused");
        dl_model_dir_free(md);
    }
    char tmp[] = "/tmp/difflet_ltxa_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    bad_folder(tmp, "audio_vae", VAE_A, DL_OK, ""); /* the folder itself is fine */
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 8], \"mid_block_add_attention\": true"), DL_ERR_FORMAT,
               "decoder.conv_in.");
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 4]"), DL_ERR_FORMAT, "mid.attn_1");
    bad_folder(tmp, "audio_vae", "{\"_class_name\": \"AutoencoderKLLTX2Audio\", \"base_channels\": 8, \"latent_channels\": 2, "
               "\"mel_bins\": 16, \"num_res_blocks\": 1, \"attn_resolutions\": [], \"ch_mult\": [1, 2, 4], "
               "\"mid_block_add_attention\": true}", DL_ERR_FORMAT, "up.2.attn.0");
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [2, 4], \"mid_block_add_attention\": true"), DL_ERR_FORMAT, "decoder.");
    bad_folder(tmp, "audio_vae", "{\"_class_name\": \"AutoencoderKLLTX2Audio\", ", DL_ERR_FORMAT, "config.json"); /* not JSON */
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 4], \"mid_block_add_attention\": true, \"norm_type\": \"group\""),
               DL_ERR_FORMAT, "norm1.weight");
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 4], \"mid_block_add_attention\": true, \"norm_type\": \"layer\""),
               DL_ERR_UNSUPPORTED, "norm_type");
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 4], \"mid_block_add_attention\": true, \"causality_axis\": \"time\""),
               DL_ERR_UNSUPPORTED, "causality_axis");
    bad_folder(tmp, "audio_vae", VAE(", \"ch_mult\": [1, 2, 4], \"mid_block_add_attention\": true, \"causality_axis\": null"),
               DL_ERR_UNSUPPORTED, "causality_axis");
    bad_folder(tmp, "audio_vae", "{\"_class_name\": \"AutoencoderKLLTX2Audio\", \"base_channels\": 8, \"latent_channels\": 2, "
               "\"mel_bins\": null, \"num_res_blocks\": 1, \"attn_resolutions\": [64], \"ch_mult\": [1, 2, 4], "
               "\"mid_block_add_attention\": true}", DL_ERR_UNSUPPORTED, "mel_bins");
    bad_folder(tmp, "audio_vae", "{\"_class_name\": \"AutoencoderKLLTX2Video\"}", DL_ERR_UNSUPPORTED, "AutoencoderKLLTX2Video");
    bad_folder(tmp, "vocoder", VOC_A, DL_OK, "");
    bad_folder(tmp, "vocoder", "{\"_class_name\": \"LTX2VocoderV3\"}", DL_ERR_UNSUPPORTED, "LTX2VocoderV3");
    bad_folder(tmp, "vocoder", "{\"_class_name\": \"LTX2VocoderWithBWE\"}", DL_ERR_FORMAT, "vocoder.conv_in.weight");
    bad_folder_in("e", tmp, "vocoder", BWE_E("[6, 4, 2]", "16", "8"), DL_OK, "");
    bad_folder_in("e", tmp, "vocoder", BWE_E("[6, 4, 1]", "16", "8"), DL_ERR_FORMAT, "bwe_upsample_factors");
    bad_folder_in("e", tmp, "vocoder", BWE_E("[6, 4, 2]", "8", "8"), DL_ERR_FORMAT, "bwe_upsample_factors");
    bad_folder_in("e", tmp, "vocoder", BWE_E("[6, 4, 2]", "16", "4"), DL_ERR_FORMAT, "bwe_in_channels");
    bad_folder(tmp, "vocoder", VOC(", \"upsample_kernel_sizes\": [16, 15, 4], \"upsample_factors\": [6, 5, 2]"),
               DL_ERR_FORMAT, "upsamplers.2");
    bad_folder(tmp, "vocoder", VOC(", \"upsample_kernel_sizes\": [16], \"upsample_factors\": [6]"), DL_ERR_FORMAT,
               "upsamplers.1");
    bad_folder(tmp, "vocoder", VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6]"), DL_ERR_FORMAT,
               "upsample_factors");
    bad_folder(tmp, "vocoder", "{\"_class_name\": \"LTX2Vocoder\", \"in_channels\": [", DL_ERR_FORMAT, "config.json");
    bad_folder(tmp, "vocoder", VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5], \"act_fn\": \"gelu\""),
               DL_ERR_UNSUPPORTED, "act_fn");
    bad_folder(tmp, "vocoder",
               VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5], \"antialias\": true"),
               DL_ERR_UNSUPPORTED, "antialias");
    bad_folder(tmp, "vocoder",
               VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5], \"act_fn\": \"snakebeta\""),
               DL_ERR_FORMAT, "alpha");
    bad_folder(tmp, "vocoder",
               VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5], \"final_act_fn\": \"sigmoid\""),
               DL_ERR_UNSUPPORTED, "final_act_fn");
    bad_folder(tmp, "vocoder",
               VOC(", \"upsample_kernel_sizes\": [16, 15], \"upsample_factors\": [6, 5], \"final_bias\": false"),
               DL_ERR_FORMAT, "conv_out.bias");
    bad_folder(tmp, "vocoder",
               "{\"_class_name\": \"LTX2Vocoder\", \"in_channels\": 32, \"hidden_channels\": 16, \"out_channels\": 2, "
               "\"resnet_kernel_sizes\": [3, 7], \"resnet_dilations\": [[1, 3], [1, 3]], \"upsample_kernel_sizes\": [16, "
               "15], \"upsample_factors\": [6, 5]}",
               DL_ERR_FORMAT, "resnets.0.convs1.2");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "cleanup %s", tmp);
}

int main(void) {
    g_verbose = getenv("DIFFLET_TEST_VERBOSE") != NULL;
    if (dl_ckpt_open(&g_vec, DATA_DIR "/ltx2_audio/vectors.safetensors", "vectors") != DL_OK) {
        fprintf(stderr, "%s\n", dl_last_error());
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        const dl_dtype dt = k ? DL_BF16 : DL_F32;
        test_vae("a", "a.five", 5, 2, 16, dt);
        test_vae("a", "a.one", 1, 2, 16, dt);
        test_vae("b", "b.three", 3, 4, 8, dt);
        test_vae("b", "b.one", 1, 4, 8, dt);
        test_vae("c", "c.four", 4, 2, 64, dt);
        test_vae("d", "d.six", 6, 2, 8, dt);
        test_vocoder("a", "va.seven", 7, 32, 2, 7 * 30, 24000, dt);
        test_vocoder("b", "vb.six", 6, 16, 2, 6 * 10 + 1, 16000, dt);
        test_vocoder("b", "vb.one", 1, 16, 2, 11, 16000, dt);
        test_vocoder("c", "vc.nine", 9, 12, 1, 9 * 8, 8000, dt);
        test_vocoder("d", "vd.five", 5, 16, 2, 10, 22050, dt);
        test_pipeline(dt);
        test_vocoder("e", "we.seven", 7, 16, 2, 7 * 8 * 3, 48000, dt);
        test_vocoder("e", "we.two", 2, 16, 2, 2 * 8 * 3, 48000, dt);
        test_vocoder("f", "wf.six", 6, 12, 1, 6 * 10 * 2, 48000, dt);
    }
    test_refusals();
    dl_ckpt_free(g_vec);
    return test_done("test_ltx2_audio");
}
