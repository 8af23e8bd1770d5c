/* int8 linears (src/kernels/int8.c) against loops written here from the scheme's
 * definition:
 *  - W8A8: per-channel symmetric weights, per-row asymmetric u8 activations with the
 *    levels the CPU takes (255, or 127 without VNNI), integer products, rescale; the
 *    kernel must agree with this reference to float rounding (1e-5 of the largest
 *    output), and the quantized product must stay within a few percent of the f32 one;
 *  - weight-only: the dequantized weights times x in double, 1e-5 (on bf16 panels
 *    the dequantized weights rounded to bf16 first, as that scheme does);
 *  - bias, every activation, bf16 input and output, leading dimensions, a few rows
 *    (modulation vectors) and odd shapes; packed weights round-trip bit-exactly;
 *    missing scales refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "difflet/check.h"
#include "difflet/kernels.h"
#include "difflet/models.h"
#include "kernels/kernels_impl.h"
#include "kernels/onednn_impl.h"
#include "models/models_impl.h"
#include "test_util.h"

/* the scheme's weights, written out independently of the kernel */
static void ref_quant_w(const float *w, int64_t N, int64_t K, int8_t *q, double *s) {
    for (int64_t n = 0; n < N; n++) {
        double mx = 0;
        for (int64_t k = 0; k < K; k++) mx = fmax(mx, fabs(w[n * K + k]));
        s[n] = mx > 0 ? (float)(mx / 127.0) : 1.0;
        for (int64_t k = 0; k < K; k++) {
            float v = nearbyintf(w[n * K + k] / (float)s[n]); /* in float, as the scheme says */
            q[n * K + k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

static int g_dense_x; /* x rows without padding (oneDNN's bf16 brgemm takes no wider stride) */
static int g_bf16_panels; /* weight-only runs seen on bf16 panels */

static void test_shape(int64_t M, int64_t K, int64_t N, dl_quant quant, dl_dtype dt, dl_dtype ddt, dl_act act, int seed) {
    int64_t ldx = g_dense_x ? K : K + 5, ldy = N + 3;
    size_t xs = dl_dtype_size(dt), ys = dl_dtype_size(ddt);
    float *w = malloc((size_t)(N * K) * 4), *bias = malloc((size_t)N * 4), *xf = malloc((size_t)(M * K) * 4);
    void *x = malloc((size_t)(M * ldx) * xs), *y = malloc((size_t)(M * ldy) * ys), *y2 = malloc((size_t)(M * ldy) * ys);
    int8_t *q = malloc((size_t)(N * K));
    double *s = malloc((size_t)N * 8), *ref = malloc((size_t)(M * N) * 8), *f32 = malloc((size_t)(M * N) * 8);
    double *refb = malloc((size_t)(M * N) * 8); /* weight-only on bf16 panels: q s[n] rounded to bf16 once */
    dl_fill_uniform(DL_F32, w, N * K, -0.5f, 0.5f, (uint64_t)seed);
    dl_fill_uniform(DL_F32, bias, N, -1.f, 1.f, (uint64_t)seed + 1);
    dl_fill_uniform(dt, x, M * ldx, -1.f, 1.f, (uint64_t)seed + 2);
    for (int64_t m = 0; m < M; m++) /* a skewed row: the zero point matters */
        for (int64_t k = 0; k < K; k++) {
            float v = dl_load1(dt, x, m * ldx + k);
            if (m % 3 == 1) v = 0.25f * v + 0.6f;
            dl_store1(dt, x, m * ldx + k, v);
            xf[m * K + k] = dl_load1(dt, x, m * ldx + k);
        }
    ref_quant_w(w, N, K, q, s);
    int L = dl_q8_levels();
    for (int64_t m = 0; m < M; m++) {
        const float *xr = xf + m * K;
        double lo = 0, hi = 0;
        for (int64_t k = 0; k < K; k++) lo = fmin(lo, xr[k]), hi = fmax(hi, xr[k]);
        float a = (float)((hi - lo) / L);
        if (!(a > 0)) a = 1;
        float z = nearbyintf((float)-lo / a);
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, accf = 0, accb = 0;
            for (int64_t k = 0; k < K; k++) {
                accf += (double)xr[k] * w[n * K + k];
                accb += (double)xr[k] * dl_bf16_to_f32(dl_f32_to_bf16((float)q[n * K + k] * (float)s[n]));
                if (quant == DL_QUANT_W8A8) {
                    float v = xr[k] * (1.f / a) + z;
                    v = v < 0 ? 0 : v > L ? (float)L : v;
                    int xq = (int)(v + 0.5f);
                    acc += (double)(xq - (int)z) * q[n * K + k];
                } else {
                    acc += (double)xr[k] * q[n * K + k];
                }
            }
            double scale = quant == DL_QUANT_W8A8 ? (double)a * s[n] : s[n];
            ref[m * N + n] = test_act(act, acc * scale + bias[n]);
            f32[m * N + n] = test_act(act, accf + bias[n]);
            refb[m * N + n] = test_act(act, accb + bias[n]);
        }
    }
    dl_matmul *mm = NULL, *mm2 = NULL;
    dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = dt, .dst_dt = ddt, .act = act, .ldx = ldx, .ldy = ldy, .quant = quant};
    dl_status st = dl_matmul_new(&mm, &d, w, DL_F32, bias);
    CHECK(st == DL_OK, "%s M=%lld K=%lld N=%lld: %s", dl_quant_name(quant), (long long)M, (long long)K, (long long)N,
          dl_last_error());
    if (st != DL_OK) goto out;
    CHECK(dl_matmul_run(mm, x, y) == DL_OK, "run: %s", dl_last_error());
    if (quant == DL_QUANT_W8 && strstr(dl_gemm_name(mm), "bf16")) { /* the scheme of the bf16 panels */
        memcpy(ref, refb, (size_t)(M * N) * 8);
        g_bf16_panels++;
    }
    double worst = 0, mx = 0, qerr = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double got = dl_load1(ddt, y, m * ldy + n);
            worst = fmax(worst, fabs(got - ref[m * N + n]));
            qerr = fmax(qerr, fabs(got - f32[m * N + n]));
            mx = fmax(mx, fabs(ref[m * N + n]));
        }
    double tol = (ddt == DL_BF16 ? 1.0 / 128 : 1e-5) * (mx > 1 ? mx : 1);
    CHECK(worst <= tol, "%s %s->%s act %d M=%lld K=%lld N=%lld: %.3g off the scheme's reference (tol %.3g)",
          dl_quant_name(quant), dl_dtype_name(dt), dl_dtype_name(ddt), (int)act, (long long)M, (long long)K, (long long)N,
          worst, tol);
    /* the quantization itself: a few percent of the largest output at most */
    double qtol = (quant == DL_QUANT_W8A8 ? (L == 255 ? 0.03 : 0.05) : 0.02) * (mx > 1 ? mx : 1);
    CHECK(qerr <= qtol, "%s M=%lld K=%lld N=%lld: %.3g off the f32 product (allowed %.3g)", dl_quant_name(quant),
          (long long)M, (long long)K, (long long)N, qerr, qtol);
    /* packed round trip: the same bytes out */
    dl_packed pk;
    dl_matmul_packed(mm, &pk);
    CHECK(pk.aux && pk.aux_bytes == (size_t)N * 8, "packed aux");
    CHECK(dl_matmul_new_packed(&mm2, &d, &pk, bias) == DL_OK, "from packed: %s", dl_last_error());
    if (mm2) {
        dl_matmul_run(mm2, x, y2);
        int same = 1;
        for (int64_t m = 0; m < M; m++) same &= !memcmp((char *)y + m * ldy * ys, (char *)y2 + m * ldy * ys, (size_t)N * ys);
        CHECK(same, "packed weights give other bytes");
    }
    dl_packed noaux = pk;
    noaux.aux = NULL;
    dl_matmul *bad = NULL;
    CHECK(dl_matmul_new_packed(&bad, &d, &noaux, bias) == DL_ERR_FORMAT, "int8 weights without scales refused");
    dl_matmul_free(bad);
    bad = NULL;
    dl_matmul_desc dfloat = d; /* ... and by a float layer (its `#q8` entry lost): never read as floats */
    dfloat.quant = DL_QUANT_NONE;
    CHECK(dl_matmul_new_packed(&bad, &dfloat, &noaux, bias) == DL_ERR_FORMAT, "int8 weights refused by a float layer: %s",
          dl_last_error());
    dl_matmul_free(bad);
out:
    dl_matmul_free(mm), free(refb);
    dl_matmul_free(mm2);
    free(w), free(bias), free(xf), free(x), free(y), free(y2), free(q), free(s), free(ref), free(f32);
}

/* a NaN in one row of x makes that row of y NaN, as in f32, and leaves the others */
static void test_nan(dl_quant quant, int64_t M) {
    const int64_t K = 128, N = 40;
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4);
    dl_fill_uniform(DL_F32, w, N * K, -0.5f, 0.5f, 5);
    dl_fill_uniform(DL_F32, x, M * K, -1.f, 1.f, 6);
    x[1 * K + 7] = NAN;
    dl_matmul *mm = NULL;
    dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = DL_F32, .dst_dt = DL_F32, .quant = quant};
    int ok = dl_matmul_new(&mm, &d, w, DL_F32, NULL) == DL_OK && dl_matmul_run(mm, x, y) == DL_OK;
    int row1 = 1, others = 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            if (m == 1) row1 &= isnan(y[m * N + n]);
            else others &= isfinite(y[m * N + n]);
        }
    CHECK(ok && row1 && others, "%s M=%lld: NaN row -> NaN row %d, other rows finite %d", dl_quant_name(quant),
          (long long)M, row1, others);
    dl_matmul_free(mm);
    free(w), free(x), free(y);
}

/* the activation calibration's measure (src/models/int8_calib.c): the mean over input
 * channels of what W8A8's asymmetric per-token quantization over L levels loses,
 * computed here by hand; a token with one outlier channel (the others round to 0) makes
 * its layer weight-only; so does an infinity; a layer under the threshold stays W8A8;
 * a layer made but never run is not written */
static void test_calibration(void) {
    const int L = dl_q8_levels();
    dl_int8_calib_begin();
    const int a = dl_calib_register("comp", "blocks.0.fc.weight#packed"), b = dl_calib_register("comp", "blocks.1.fc.weight#packed"),
              c = dl_calib_register("other", "x.weight#packed"), d = dl_calib_register("comp", "never.weight#packed");
    CHECK(a == 1 && b == 2 && c == 3 && d == 4 && dl_calib_register("comp", "blocks.0.fc.weight#packed") == a, "ids %d %d %d %d", a, b, c, d);
    float x[2][64];
    double err[64] = {0}, sum[64] = {0}, want = 0;
    for (int r = 0; r < 2; r++) {
        float lo = 0, hi = 0;
        for (int j = 0; j < 64; j++) x[r][j] = sinf(0.37f * (float)(j + 64 * r)) * (r ? 3.f : 1.f), lo = fminf(lo, x[r][j]), hi = fmaxf(hi, x[r][j]);
        const double s = ((double)hi - lo) / L, z = nearbyint(-lo / s);
        for (int j = 0; j < 64; j++) {
            const double q = fmin(fmax(nearbyint(x[r][j] / s) + z, 0), L), e = x[r][j] - (q - z) * s;
            err[j] += e * e, sum[j] += (double)x[r][j] * x[r][j];
        }
    }
    for (int j = 0; j < 64; j++) want += sqrt(err[j] / sum[j]) / 64; /* the mean of the channels' relative errors */
    dl_calib_observe(a, x, 2, 64, 64, DL_F32);
    float big[64];
    for (int j = 0; j < 64; j++) big[j] = j == 3 ? 1000.f : 0.01f * (float)j; /* one outlier: a large error */
    dl_calib_observe(b, big, 1, 64, 64, DL_F32);
    float inf[64] = {0};
    inf[5] = INFINITY;
    dl_calib_observe(c, inf, 1, 64, 64, DL_F32);
    char path[] = "/tmp/difflet-calib-XXXXXX";
    int fd = mkstemp(path), layers = 0, wo = 0;
    if (fd >= 0) close(fd);
    CHECK(dl_int8_calib_write(path, 0.05, "{\"model\": \"t\"}", &layers, &wo) == DL_OK && layers == 3 && wo == 2,
          "written: %d layers, %d weight-only (%s)", layers, wo, dl_last_error());
    cJSON *j = NULL;
    if (dl_json_read_object(path, "calibration", &j) == DL_OK) {
        const cJSON *cm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "components"), "comp");
        const cJSON *la = cJSON_GetObjectItemCaseSensitive(cm, "blocks.0.fc.weight"), *lb = cJSON_GetObjectItemCaseSensitive(cm, "blocks.1.fc.weight");
        const cJSON *lc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "components"), "other"), "x.weight");
        const double ea = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(la, "act_error"));
        CHECK(fabs(ea - want) < 1e-9 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(la, "scheme")), "int8"),
              "the measure: %g, by hand %g", ea, want);
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lb, "scheme")), "int8-wo"), "the outlier layer is weight-only");
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lc, "scheme")), "int8-wo") &&
                  cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lc, "nonfinite_tokens")) == 1,
              "a non-finite row makes the layer weight-only");
        CHECK(!cJSON_GetObjectItemCaseSensitive(cm, "never.weight") && cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "levels")) == L,
              "a layer never run is not written; the levels are");
        cJSON_Delete(j);
    } else {
        CHECK(0, "read back: %s", dl_last_error());
    }
    unlink(path);
    dl_int8_calib_end();
    dl_calib_observe(a, x, 2, 64, 64, DL_F32); /* after the end: not counted, no crash */
    CHECK(dl_calib_register("comp", "y#packed") == 0, "off: nothing registers");
}

int main(void) {
    dl_cpu();
    test_calibration();
    int L = dl_q8_levels();
    CHECK(L == 255 || L == 127, "levels %d", L);
    /* where the CPU has an exact int8 dot product and oneDNN may use it, the probe must find it */
    const char *lim = getenv("ONEDNN_MAX_CPU_ISA");
    if ((dl_cpu()->vnni || dl_cpu()->amx_int8) && !(lim && *lim))
        CHECK(L == 255, "a VNNI/AMX CPU measured %d activation levels, not 255", L);
    printf("int8 activations on this CPU (%s): %d levels\n", dl_cpu_model(), L);
    static const int64_t shapes[][3] = {{1, 256, 96}, {3, 300, 513}, {37, 70, 45}, {64, 512, 300}, {130, 96, 257}};
    int seed = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int qq = 0; qq < 2; qq++)
            for (int cfg = 0; cfg < 3; cfg++) { /* f32; bf16 -> f32; bf16 -> bf16 */
                dl_dtype dt = cfg ? DL_BF16 : DL_F32, ddt = cfg == 2 ? DL_BF16 : DL_F32;
                dl_act act = (dl_act)((i + (size_t)cfg) % 6);
                test_shape(shapes[i][0], shapes[i][1], shapes[i][2], qq ? DL_QUANT_W8 : DL_QUANT_W8A8, dt, ddt, act, seed);
                seed += 7;
            }
    /* several weight-only panels (2,048 channels each) and W8A8 at the same width */
    test_shape(20, 96, 4500, DL_QUANT_W8, DL_F32, DL_F32, DL_ACT_NONE, 77);
    test_shape(20, 96, 4500, DL_QUANT_W8A8, DL_BF16, DL_BF16, DL_ACT_SILU, 78);
    /* weight-only over dense bf16 rows: bf16 panels where oneDNN multiplies bf16 natively */
    g_dense_x = 1;
    test_shape(64, 512, 300, DL_QUANT_W8, DL_BF16, DL_F32, DL_ACT_NONE, 91);
    test_shape(20, 96, 4500, DL_QUANT_W8, DL_BF16, DL_BF16, DL_ACT_GELU_TANH, 92);
    test_shape(130, 96, 257, DL_QUANT_W8, DL_BF16, DL_F32, DL_ACT_SILU, 93);
    g_dense_x = 0;
    const char *isa = dl_onednn_isa();
    if (!strcmp(isa, "avx512-bf16") || !strcmp(isa, "avx512-amx"))
        CHECK(g_bf16_panels >= 3, "weight-only int8 over dense bf16 rows ran on bf16 panels (%d of 3)", g_bf16_panels);
    /* the zero-point correction over a long K: exact column sums */
    test_shape(16, 3072, 64, DL_QUANT_W8A8, DL_F32, DL_F32, DL_ACT_NONE, 99);
    for (int qq = 0; qq < 2; qq++) {
        test_nan(qq ? DL_QUANT_W8 : DL_QUANT_W8A8, 4);
        test_nan(qq ? DL_QUANT_W8 : DL_QUANT_W8A8, 20);
    }
    /* a non-finite weight poisons its output channel only (as in f32), in both schemes */
    for (int qq = 0; qq < 2; qq++) {
        const int64_t M = 12, K = 64, N = 24;
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4);
        dl_fill_uniform(DL_F32, w, N * K, -0.5f, 0.5f, 8);
        dl_fill_uniform(DL_F32, x, M * K, -1.f, 1.f, 9);
        w[5 * K + 3] = NAN;
        w[9 * K + 0] = INFINITY;
        dl_matmul *mm = NULL;
        dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = DL_F32, .dst_dt = DL_F32, .quant = qq ? DL_QUANT_W8 : DL_QUANT_W8A8};
        int ok = dl_matmul_new(&mm, &d, w, DL_F32, NULL) == DL_OK && dl_matmul_run(mm, x, y) == DL_OK, right = ok;
        for (int64_t m = 0; m < M && ok; m++)
            for (int64_t n = 0; n < N; n++) right &= (n == 5 || n == 9) ? isnan(y[m * N + n]) : isfinite(y[m * N + n]);
        CHECK(right, "%s: NaN/inf weights poison their channels only", dl_quant_name(d.quant));
        CHECK(isinf(dl_q8_weight_error(w, N, K)), "the weight error of non-finite weights is infinite");
        dl_matmul_free(mm);
        free(w), free(x), free(y);
    }
    /* K past the exact epilogue's limit is refused by name */
    {
        dl_matmul *mm = NULL;
        dl_matmul_desc d = {.m = 1, .k = 40000, .n = 1, .dt = DL_F32, .dst_dt = DL_F32, .quant = DL_QUANT_W8A8};
        float *w = calloc(40000, 4);
        CHECK(dl_matmul_new(&mm, &d, w, DL_F32, NULL) == DL_ERR_UNSUPPORTED && strstr(dl_last_error(), "K=40000"),
              "K=40000: %s", dl_last_error());
        dl_matmul_free(mm);
        free(w);
    }
    return test_done("int8");
}
