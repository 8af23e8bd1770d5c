/* oneDNN matmul and convolution against naive loops in double: f32 (1e-5 of the
 * largest output), bf16 inputs with f32 output (1e-5 relative: only the
 * accumulation order differs from the double reference on the same bf16 values,
 * up to K * 2^-24), bf16 output (one rounding: 2^-8 relative); fused activations;
 * leading dimensions; conv2d/conv3d with stride and padding; bad shapes refused.
 * f32 products of M >= 32 over plain weights go to OpenBLAS: on an AVX2 oneDNN (plain
 * f32 weights) the test checks that they did, and with --expect-onednn
 * (DIFFLET_GEMM=onednn) that none did; both paths meet the same bounds. Every
 * convolution, transposed convolution and matmul gives the same bytes at 1, 2 and 3
 * threads (a program's results must not depend on the process that runs it): the
 * shapes include those where oneDNN's im2col sgemm split its sums by thread (matmuls
 * not under --expect-onednn). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "difflet/check.h"
#include "difflet/kernels.h"
#include "kernels/kernels_impl.h"
#include "test_util.h"

static int g_expect_onednn;

static void test_matmul(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {37, 70, 45}, {64, 128, 96}, {130, 33, 257}, {300, 700, 260}};
    int blas = 0, big = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int cfg = 0; cfg < 3; cfg++) { /* f32; bf16 -> f32; bf16 -> bf16 */
            int64_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
            dl_dtype dt = cfg ? DL_BF16 : DL_F32, ddt = cfg == 2 ? DL_BF16 : DL_F32;
            int64_t ldx = K + 3, ldy = N + 5;
            dl_act act = (dl_act)((si + (size_t)cfg * 2) % 6);
            float *w = malloc((size_t)(N * K) * 4), *bias = malloc((size_t)N * 4);
            void *x = malloc((size_t)(M * ldx) * 4), *y = malloc((size_t)(M * ldy) * 4);
            dl_fill_uniform(DL_F32, w, N * K, -0.5f, 0.5f, 1 + si);
            dl_fill_uniform(DL_F32, bias, N, -1.f, 1.f, 2 + si);
            dl_fill_uniform(dt, x, M * ldx, -1.f, 1.f, 3 + si);
            dl_matmul *mm;
            dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = dt, .dst_dt = ddt, .act = act, .ldx = ldx, .ldy = ldy};
            /* the bias buffer handed over is scribbled on and freed: the matmul keeps its own copy */
            float *btmp = malloc((size_t)N * 4);
            memcpy(btmp, bias, (size_t)N * 4);
            const int use_bias = !(si == 4 && cfg != 1); /* the largest shape also runs without a bias */
            CHECK(dl_matmul_new(&mm, &d, w, DL_F32, use_bias ? btmp : NULL) == DL_OK, "matmul new: %s", dl_last_error());
            memset(btmp, 0xff, (size_t)N * 4);
            free(btmp);
            CHECK(dl_matmul_run(mm, x, y) == DL_OK, "matmul run: %s", dl_last_error());
            double worst = 0, mx = 0;
            double *ref = malloc((size_t)(M * N) * sizeof(double));
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = use_bias ? bias[j] : 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        double wv = dt == DL_BF16 ? dl_bf16_to_f32(dl_f32_to_bf16(w[j * K + k])) : w[j * K + k];
                        acc += (double)dl_load1(dt, x, i * ldx + k) * wv;
                    }
                    ref[i * N + j] = test_act(act, acc);
                    mx = fmax(mx, fabs(ref[i * N + j]));
                }
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double g = dl_load1(ddt, y, i * ldy + j), r = ref[i * N + j];
                    double allow = ddt == DL_BF16 ? fabs(r) / 256 + 1e-5 * mx : 1e-5 * mx + 1e-7;
                    worst = fmax(worst, fabs(g - r) / allow);
                }
            CHECK(worst <= 1.0, "matmul %lldx%lldx%lld %s->%s act %s: %.2fx bound", (long long)M, (long long)K,
                  (long long)N, dl_dtype_name(dt), dl_dtype_name(ddt), dl_act_name(act), worst);
            CHECK(dl_matmul_weight_bytes(mm) >= (size_t)(N * K) * dl_dtype_size(dt), "packed weights size");
            blas += !strcmp(dl_gemm_name(mm), "OpenBLAS");
            big += M >= 32;
            CHECK(M >= 32 || strcmp(dl_gemm_name(mm), "OpenBLAS"), "M=%lld stays in oneDNN", (long long)M);
            dl_matmul_free(mm);
            free(w), free(bias), free(x), free(y), free(ref);
        }
    if (g_expect_onednn)
        CHECK(blas == 0, "DIFFLET_GEMM=onednn: %d products went to OpenBLAS", blas);
    else if (!strcmp(dl_onednn_isa(), "avx2"))
        CHECK(blas == big, "AVX2: %d of the %d products with M >= 32 ran in OpenBLAS", blas, big);
    printf("matmul: %d of %d products in OpenBLAS (%s)\n", blas, big, dl_openblas_version());
    dl_matmul *mm;
    dl_matmul_desc bad = {.m = 0, .k = 4, .n = 4, .dt = DL_F32, .dst_dt = DL_F32};
    float w[16] = {0};
    CHECK(dl_matmul_new(&mm, &bad, w, DL_F32, NULL) == DL_ERR_INVALID && mm == NULL, "M=0 refused");
    bad.m = 4;
    bad.dt = DL_F16;
    CHECK(dl_matmul_new(&mm, &bad, w, DL_F32, NULL) == DL_ERR_UNSUPPORTED, "f16 compute refused: %s", dl_last_error());
}

static void test_conv(void) {
    static const dl_conv_desc cases[] = {
        {.ndim = 2, .cin = 5, .cout = 7, .in = {9, 11}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dt = DL_F32},
        {.ndim = 2, .cin = 4, .cout = 3, .in = {10, 7}, .kernel = {3, 3}, .stride = {2, 2}, .pad = {0, 0}, .dt = DL_F32},
        {.ndim = 2, .cin = 16, .cout = 8, .in = {6, 6}, .kernel = {1, 1}, .stride = {1, 1}, .pad = {0, 0}, .dt = DL_BF16},
        {.ndim = 3, .cin = 3, .cout = 4, .in = {4, 5, 6}, .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .pad = {1, 1, 1}, .dt = DL_F32},
        {.ndim = 2, .cin = 32, .cout = 16, .in = {8, 8}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dt = DL_BF16},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const dl_conv_desc *d = &cases[ci];
        int nd = d->ndim;
        int64_t in[3] = {1, 1, 1}, ks[3] = {1, 1, 1}, st[3] = {1, 1, 1}, pd[3] = {0, 0, 0}, out[3] = {1, 1, 1};
        for (int i = 0; i < nd; i++) { /* right-align into (D, H, W) */
            int j = 3 - nd + i;
            in[j] = d->in[i], ks[j] = d->kernel[i], st[j] = d->stride[i], pd[j] = d->pad[i];
            out[j] = dl_conv_out_dim(d, i);
        }
        int64_t isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2], ksz = ks[0] * ks[1] * ks[2];
        float *w = malloc((size_t)(d->cout * d->cin * ksz) * 4), *b = malloc((size_t)d->cout * 4);
        void *x = malloc((size_t)(d->cin * isz) * 4), *y = malloc((size_t)(d->cout * osz) * 4);
        dl_fill_uniform(DL_F32, w, d->cout * d->cin * ksz, -0.3f, 0.3f, 11);
        dl_fill_uniform(DL_F32, b, d->cout, -1.f, 1.f, 12);
        dl_fill_uniform(d->dt, x, d->cin * isz, -1.f, 1.f, 13);
        dl_conv *c;
        CHECK(dl_conv_new(&c, d, w, DL_F32, b) == DL_OK, "conv new: %s", dl_last_error());
        CHECK(dl_conv_run(c, x, y) == DL_OK, "conv run: %s", dl_last_error());
        double worst = 0, mx = 0;
        double *ref = calloc((size_t)(d->cout * osz), sizeof(double));
        for (int64_t co = 0; co < d->cout; co++)
            for (int64_t o0 = 0; o0 < out[0]; o0++)
                for (int64_t o1 = 0; o1 < out[1]; o1++)
                    for (int64_t o2 = 0; o2 < out[2]; o2++) {
                        double acc = b[co];
                        for (int64_t cj = 0; cj < d->cin; cj++)
                            for (int64_t k0 = 0; k0 < ks[0]; k0++)
                                for (int64_t k1 = 0; k1 < ks[1]; k1++)
                                    for (int64_t k2 = 0; k2 < ks[2]; k2++) {
                                        int64_t i0 = o0 * st[0] - pd[0] + k0, i1 = o1 * st[1] - pd[1] + k1,
                                                i2 = o2 * st[2] - pd[2] + k2;
                                        if (i0 < 0 || i1 < 0 || i2 < 0 || i0 >= in[0] || i1 >= in[1] || i2 >= in[2]) continue;
                                        float wv = w[((co * d->cin + cj) * ks[0] + k0) * ks[1] * ks[2] + k1 * ks[2] + k2];
                                        if (d->dt == DL_BF16) wv = dl_bf16_to_f32(dl_f32_to_bf16(wv));
                                        acc += (double)wv * dl_load1(d->dt, x, cj * isz + (i0 * in[1] + i1) * in[2] + i2);
                                    }
                        int64_t oi = co * osz + (o0 * out[1] + o1) * out[2] + o2;
                        ref[oi] = acc;
                        mx = fmax(mx, fabs(acc));
                    }
        for (int64_t i = 0; i < d->cout * osz; i++) {
            double g = dl_load1(d->dt, y, i);
            double allow = d->dt == DL_BF16 ? fabs(ref[i]) / 256 + 1e-5 * mx : 1e-5 * mx;
            worst = fmax(worst, fabs(g - ref[i]) / allow);
        }
        CHECK(worst <= 1.0, "conv%dd case %zu %s: %.2fx bound", nd, ci, dl_dtype_name(d->dt), worst);
        dl_conv_free(c);
        free(w), free(b), free(x), free(y), free(ref);
    }
    dl_conv *c;
    dl_conv_desc bad = cases[0];
    bad.in[0] = 1;
    bad.pad[0] = 0; /* kernel 3 > input 1 */
    float w[7 * 5 * 9] = {0};
    CHECK(dl_conv_new(&c, &bad, w, DL_F32, NULL) == DL_ERR_INVALID, "kernel larger than input refused: %s", dl_last_error());
    bad = cases[0];
    bad.ndim = 4;
    CHECK(dl_conv_new(&c, &bad, w, DL_F32, NULL) == DL_ERR_INVALID, "ndim 4 refused");
}

/* Packed weights taken out of one primitive and used in place by another give the
 * same bits (the program artifact path); a wrong size is refused. */
static void test_packed(void) {
    for (int dti = 0; dti < 2; dti++) {
        dl_dtype dt = dti ? DL_BF16 : DL_F32;
        const int64_t M = 33, K = 96, N = 80;
        float *w = malloc((size_t)(N * K) * 4), *b = malloc((size_t)N * 4);
        void *x = malloc((size_t)(M * K) * 4), *y1 = malloc((size_t)(M * N) * 4), *y2 = malloc((size_t)(M * N) * 4);
        dl_fill_uniform(DL_F32, w, N * K, -0.5f, 0.5f, 1);
        dl_fill_uniform(DL_F32, b, N, -1.f, 1.f, 2);
        dl_fill_uniform(dt, x, M * K, -1.f, 1.f, 3);
        dl_matmul_desc d = {.m = M, .k = K, .n = N, .dt = dt, .dst_dt = DL_F32, .act = DL_ACT_GELU_TANH};
        dl_matmul *a, *c;
        CHECK(dl_matmul_new(&a, &d, w, DL_F32, b) == DL_OK, "%s", dl_last_error());
        dl_packed pk;
        dl_matmul_packed(a, &pk);
        void *copy = dl_aligned_alloc(pk.bytes);
        memcpy(copy, pk.data, pk.bytes);
        dl_packed cp = pk;
        cp.data = copy;
        CHECK(dl_matmul_new_packed(&c, &d, &cp, b) == DL_OK, "%s", dl_last_error());
        dl_matmul_run(a, x, y1);
        dl_matmul_run(c, x, y2);
        CHECK(!memcmp(y1, y2, (size_t)(M * N) * 4), "%s: packed round trip gives the same bits", dl_dtype_name(dt));
        dl_packed in;
        dl_matmul_packed(c, &in);
        CHECK(in.data == copy, "%s: packed weights are used in place", dl_dtype_name(dt));
        dl_matmul *bad;
        cp.bytes -= 4;
        CHECK(dl_matmul_new_packed(&bad, &d, &cp, b) == DL_ERR_FORMAT && strstr(dl_last_error(), "bytes"),
              "wrong packed size refused: %s", dl_last_error());
        cp.bytes += 4;
        cp.layout_bytes -= 8;
        CHECK(dl_matmul_new_packed(&bad, &d, &cp, b) == DL_ERR_FORMAT, "truncated layout record refused: %s",
              dl_last_error());
        cp.layout_bytes = 0;
        CHECK(dl_matmul_new_packed(&bad, &d, &cp, b) == DL_ERR_FORMAT, "missing layout record refused: %s",
              dl_last_error());
        /* weights recorded in a layout this process does not pick (plain [N, K]): still
           loaded, reordered or pinned, with the same result up to summation order */
        void *plain = dl_aligned_alloc((size_t)(N * K) * dl_dtype_size(dt));
        uint8_t rec[512];
        dl_kernels()->convert(dt, plain, DL_F32, w, N * K);
        dl_packed pp = {.data = plain, .bytes = (size_t)(N * K) * dl_dtype_size(dt), .layout = rec,
                        .layout_bytes = dl_onednn_plain_record(K, N, dt, rec)};
        dl_matmul *e;
        CHECK(pp.layout_bytes && dl_matmul_new_packed(&e, &d, &pp, b) == DL_OK, "plain record: %s", dl_last_error());
        dl_matmul_run(e, x, y2);
        double worst = 0, mx = 0;
        for (int64_t i = 0; i < M * N; i++) {
            worst = fmax(worst, fabs(((float *)y1)[i] - ((float *)y2)[i]));
            mx = fmax(mx, fabs(((float *)y1)[i]));
        }
        CHECK(worst <= 1e-5 * mx, "%s: weights in another recorded layout give the same product (%g of %g)",
              dl_dtype_name(dt), worst, mx);
        dl_matmul_free(e);
        dl_aligned_free(plain);
        dl_matmul_free(a), dl_matmul_free(c);
        dl_aligned_free(copy);
        /* conv */
        dl_conv_desc cd = {.ndim = 2, .cin = 8, .cout = 16, .in = {9, 7}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dt = dt};
        dl_conv *c1, *c2;
        CHECK(dl_conv_new(&c1, &cd, w, DL_F32, b) == DL_OK, "%s", dl_last_error());
        dl_conv_packed(c1, &pk);
        copy = dl_aligned_alloc(pk.bytes);
        memcpy(copy, pk.data, pk.bytes);
        cp = pk;
        cp.data = copy;
        CHECK(dl_conv_new_packed(&c2, &cd, &cp, b) == DL_OK, "%s", dl_last_error());
        dl_conv_run(c1, x, y1);
        dl_conv_run(c2, x, y2);
        CHECK(!memcmp(y1, y2, (size_t)(16 * 63) * dl_dtype_size(dt)), "conv packed round trip");
        dl_conv_free(c1), dl_conv_free(c2);
        dl_aligned_free(copy);
        free(w), free(b), free(x), free(y1), free(y2);
    }
}

/* one primitive's output at `threads` threads (created and run there) */
static void *thread_run(int kind, const void *desc, const float *w, const float *b, const void *x, size_t ybytes,
                        int threads) {
    dl_set_threads(threads);
    void *y = calloc(1, ybytes);
    dl_status s;
    if (kind == 2) {
        dl_matmul *m = NULL;
        s = dl_matmul_new(&m, desc, w, DL_F32, b);
        if (s == DL_OK) s = dl_matmul_run(m, x, y);
        dl_matmul_free(m);
    } else {
        dl_conv *c = NULL;
        s = kind ? dl_deconv_new(&c, desc, w, DL_F32, b) : dl_conv_new(&c, desc, w, DL_F32, b);
        if (s == DL_OK) s = dl_conv_run(c, x, y);
        dl_conv_free(c);
    }
    CHECK(s == DL_OK, "thread-count case: %s", dl_last_error());
    return y;
}

static void test_threads(void) {
    const int nt0 = dl_threads();
    static const struct {
        int kind; /* 0 conv, 1 deconv */
        dl_conv_desc d;
    } cv[] = {
        {0, {.ndim = 2, .cin = 16, .cout = 3, .in = {40, 56}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}}},
        {0, {.ndim = 2, .cin = 512, .cout = 32, .in = {5, 5}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}}},
        {0, {.ndim = 2, .cin = 128, .cout = 8, .in = {16, 16}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}}},
        {0, {.ndim = 2, .cin = 8, .cout = 4, .in = {64, 64}, .kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1}}},
        {0, {.ndim = 2, .cin = 3, .cout = 32, .in = {33, 31}, .kernel = {3, 3}, .stride = {2, 2}, .pad = {1, 1}}},
        {0, {.ndim = 3, .cin = 4, .cout = 16, .in = {5, 8, 12}, .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .pad = {0, 1, 1}}},
        {0, {.ndim = 3, .cin = 96, .cout = 8, .in = {6, 16, 19}, .kernel = {3, 3, 3}, .stride = {1, 1, 1}, .pad = {0, 1, 1}}},
        {1, {.ndim = 2, .cin = 64, .cout = 8, .in = {16, 16}, .kernel = {2, 2}, .stride = {2, 2}, .pad = {0, 0}}},
        {1, {.ndim = 3, .cin = 32, .cout = 4, .in = {3, 8, 8}, .kernel = {3, 2, 2}, .stride = {1, 2, 2}, .pad = {1, 0, 0}}},
    };
    for (int di = 0; di < 2; di++)
        for (size_t ci = 0; ci < sizeof cv / sizeof cv[0]; ci++) {
            dl_conv_desc d = cv[ci].d;
            d.dt = di ? DL_BF16 : DL_F32;
            int64_t isz = d.cin, osz = d.cout, wn = d.cin * d.cout;
            for (int i = 0; i < d.ndim; i++) {
                isz *= d.in[i], wn *= d.kernel[i];
                osz *= cv[ci].kind ? dl_deconv_out_dim(&d, i) : dl_conv_out_dim(&d, i);
            }
            float *w = malloc((size_t)wn * 4), *b = malloc((size_t)d.cout * 4);
            void *x = malloc((size_t)isz * 4);
            dl_fill_uniform(DL_F32, w, wn, -0.3f, 0.3f, 21);
            dl_fill_uniform(DL_F32, b, d.cout, -1.f, 1.f, 22);
            dl_fill_uniform(d.dt, x, isz, -1.f, 1.f, 23);
            size_t yb = (size_t)osz * dl_dtype_size(d.dt);
            void *y1 = thread_run(cv[ci].kind, &d, w, b, x, yb, 1);
            for (int t = 2; t <= 3; t++) {
                void *yt = thread_run(cv[ci].kind, &d, w, b, x, yb, t);
                CHECK(!memcmp(y1, yt, yb), "%s%dd case %zu %s: %d threads give other bytes than 1",
                      cv[ci].kind ? "deconv" : "conv", d.ndim, ci, dl_dtype_name(d.dt), t);
                free(yt);
            }
            free(y1), free(w), free(b), free(x);
        }
    static const int64_t mm[][3] = {{1, 3072, 64}, {7, 4096, 16}, {35, 288, 32}, {300, 1024, 3}, {64, 12288, 256}};
    /* DIFFLET_GEMM=onednn keeps every product in oneDNN, whose sgemm (below AVX-512)
     * splits a few rows' sums by thread: the comparison knob does not promise this */
    for (int di = 0; di < 2 && !g_expect_onednn; di++)
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
            dl_matmul_desc d = {.m = mm[i][0], .k = mm[i][1], .n = mm[i][2], .dt = di ? DL_BF16 : DL_F32, .dst_dt = DL_F32};
            float *w = malloc((size_t)(d.k * d.n) * 4);
            void *x = malloc((size_t)(d.m * d.k) * 4);
            dl_fill_uniform(DL_F32, w, d.k * d.n, -0.3f, 0.3f, 24);
            dl_fill_uniform(d.dt, x, d.m * d.k, -1.f, 1.f, 25);
            size_t yb = (size_t)(d.m * d.n) * 4;
            void *y1 = thread_run(2, &d, w, NULL, x, yb, 1);
            for (int t = 2; t <= 3; t++) {
                void *yt = thread_run(2, &d, w, NULL, x, yb, t);
                CHECK(!memcmp(y1, yt, yb), "matmul %lldx%lldx%lld %s: %d threads give other bytes than 1",
                      (long long)d.m, (long long)d.k, (long long)d.n, dl_dtype_name(d.dt), t);
                free(yt);
            }
            free(y1), free(w), free(x);
        }
    dl_set_threads(nt0);
}

int main(int argc, char **argv) {
    g_expect_onednn = argc > 1 && !strcmp(argv[1], "--expect-onednn");
    printf("oneDNN %s\n", dl_onednn_version());
    test_matmul();
    test_conv();
    test_packed();
    test_threads();
    return test_done("test_onednn");
}
