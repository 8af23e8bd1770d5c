/* RoPE tables. The rotation itself is a kernel (dl_rope_t); the tables depend only
 * on positions, so a program builds them once per shape. Angles are computed in
 * f64 as diffusers does (get_1d_rotary_pos_embed with freqs_dtype=float64). */
#include "kernels/kernels_impl.h"

#include <math.h>

/* One axis of `dim` dims: angle_i = pos * theta^(-2i/dim), i < dim/2. */
static void axis_angles(double pos, int dim, double theta, float *c, float *s) {
    for (int i = 0; i < dim / 2; i++) {
        double freq = 1.0 / pow(theta, (double)(2 * i) / (double)dim);
        double ang = pos * freq;
        c[i] = (float)cos(ang);
        s[i] = (float)sin(ang);
    }
}

void dl_rope_table_axes(const float *ids, int64_t seq, int n_axes, const int *axes_dim,
                        double theta, float *cos_t, float *sin_t) {
    int half = 0;
    for (int a = 0; a < n_axes; a++) half += axes_dim[a] / 2;
    for (int64_t t = 0; t < seq; t++) {
        int off = 0;
        for (int a = 0; a < n_axes; a++) {
            axis_angles((double)ids[t * n_axes + a], axes_dim[a], theta,
                        cos_t + t * half + off, sin_t + t * half + off);
            off += axes_dim[a] / 2;
        }
    }
}

/* The same with get_1d_rotary_pos_embed's default freqs_dtype (float32), as
 * HunyuanVideoRotaryPosEmbed calls it: freq_i = 1 / theta^(f32(2i) / dim) and the
 * angle pos * freq_i rounded to f32 before cos / sin (torch's f32 pow, outer
 * product and cos). */
void dl_rope_table_axes_f32(const float *ids, int64_t seq, int n_axes, const int *axes_dim, double theta,
                            float *cos_t, float *sin_t) {
    int half = 0;
    for (int a = 0; a < n_axes; a++) half += axes_dim[a] / 2;
    for (int64_t t = 0; t < seq; t++) {
        int off = 0;
        for (int a = 0; a < n_axes; a++) {
            const int dim = axes_dim[a];
            for (int i = 0; i < dim / 2; i++) {
                float e = (float)(2 * i) / (float)dim;
                float freq = 1.0f / powf((float)theta, e);
                float ang = ids[t * n_axes + a] * freq;
                cos_t[t * half + off + i] = cosf(ang);
                sin_t[t * half + off + i] = sinf(ang);
            }
            off += dim / 2;
        }
    }
}

void dl_rope_table_wan(int64_t frames, int64_t height, int64_t width, int64_t head_dim,
                       double theta, float *cos_t, float *sin_t) {
    int hw = (int)(2 * (head_dim / 6)), f = (int)(head_dim - 2 * hw);
    int dims[3] = {f, hw, hw};
    int64_t half = head_dim / 2, t = 0;
    for (int64_t i = 0; i < frames; i++)
        for (int64_t j = 0; j < height; j++)
            for (int64_t k = 0; k < width; k++, t++) {
                float ids[3] = {(float)i, (float)j, (float)k};
                dl_rope_table_axes(ids, 1, 3, dims, theta, cos_t + t * half, sin_t + t * half);
            }
}
