/* Reference attention: one query row at a time, keys in order, streaming softmax
 * (running max m, running sum l, unnormalised accumulator). Clear, not fast. */
#include "kernels/kernels_impl.h"

#include <math.h>

void dl_attn_ref_rows(const dl_attn_args *a, int64_t h, int64_t q0, int64_t q1) {
    const int64_t D = a->head_dim;
    float acc[1024];
    DL_ASSERT(D <= 1024);
    for (int64_t q = q0; q < q1; q++) {
        int64_t qo = q * a->q_stride + h * D;
        float m = -INFINITY, l = 0.f;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.f;
        int64_t kend = a->causal && q + 1 < a->kv_end ? q + 1 : a->kv_end;
        const float *brow = a->bias_rel ? a->bias_rel + h * (a->sq + a->sk - 1) + a->sq - 1 - q : NULL;
        for (int64_t k = a->kv_begin; k < kend; k++) {
            int64_t ko = k * a->k_stride + h * D, vo = k * a->v_stride + h * D;
            float s = 0.f;
            for (int64_t d = 0; d < D; d++) s += dl_load1(a->dt, a->q, qo + d) * dl_load1(a->dt, a->k, ko + d);
            s *= a->scale;
            if (brow) s += brow[k];
            if (s > m) { /* new running max: rescale what was accumulated */
                float r = expf(m - s);
                l *= r;
                for (int64_t d = 0; d < D; d++) acc[d] *= r;
                m = s;
            }
            float p = expf(s - m);
            l += p;
            for (int64_t d = 0; d < D; d++) acc[d] += p * dl_load1(a->dt, a->v, vo + d);
        }
        if (a->o_part) {
            for (int64_t d = 0; d < D; d++) a->o_part[(q * a->heads + h) * D + d] = acc[d];
            a->m[h * a->sq + q] = m;
            a->l[h * a->sq + q] = l;
        } else {
            float inv = l > 0.f ? 1.f / l : 0.f;
            int64_t oo = q * a->out_stride + h * D;
            for (int64_t d = 0; d < D; d++) dl_store1(a->dt, a->out, oo + d, acc[d] * inv);
        }
    }
}
