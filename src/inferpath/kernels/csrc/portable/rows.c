/* Row-wise kernels, portable: RMSNorm, the SwiGLU gate, RoPE on Q and K, greedy argmax.
 *
 * Contracts and rounding order are those of the avx512/ files of the same names (this is
 * their plain reference): RMSNorm normalises in float32, rounds to bf16, then multiplies
 * by the weight (Hugging Face's order); the gate rounds silu to bf16 before the product;
 * RoPE is rotate-half, computed in float32 and rounded once; argmax returns the first
 * maximum, or the first NaN (torch.argmax's answer).
 */
#include "common.h"

#define DEFINE_RMS_NORM(NAME, T, TO_F32, FROM_F32, ROUND_NORMED)                                   \
int NAME(const T *x, const T *w, T *y, int64_t m, int64_t n, float eps, int num_threads) {          \
    if (m < 1 || n < 1) return -1;                                                                  \
    _Pragma("omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)")       \
    for (int64_t row = 0; row < m; row++) {                                                         \
        const T *xr = x + row * n;                                                                  \
        T *yr = y + row * n;                                                                        \
        float sum = 0.0f;                                                                           \
        _Pragma("omp simd reduction(+:sum)")                                                        \
        for (int64_t c = 0; c < n; c++) sum += TO_F32(xr[c]) * TO_F32(xr[c]);                       \
        float scale = 1.0f / sqrtf(sum / (float)n + eps);                                           \
        for (int64_t c = 0; c < n; c++) yr[c] = FROM_F32(ROUND_NORMED(TO_F32(xr[c]) * scale) * TO_F32(w[c])); \
    }                                                                                               \
    return 0;                                                                                       \
}

static inline float through_bf16(float v) { return bf16_to_float(round_bf16(v)); }

DEFINE_RMS_NORM(inferpath_rms_norm_f32, float, f32_identity, f32_identity, f32_identity)
DEFINE_RMS_NORM(inferpath_rms_norm_bf16, uint16_t, bf16_to_float, round_bf16, through_bf16)

static inline float silu(float g) { return g / (1.0f + expf(-g)); }

#define DEFINE_SILU_MUL(NAME, T, TO_F32, FROM_F32, ROUND_SILU)                                     \
int NAME(const T *gate, int64_t gate_stride, const T *up, int64_t up_stride, T *out,                \
         int64_t out_stride, int64_t m, int64_t n, int num_threads) {                               \
    if (m < 1 || n < 1) return -1;                                                                  \
    _Pragma("omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)")       \
    for (int64_t r = 0; r < m; r++) {                                                               \
        const T *g = gate + r * gate_stride, *u = up + r * up_stride;                               \
        T *o = out + r * out_stride;                                                                \
        for (int64_t c = 0; c < n; c++) o[c] = FROM_F32(ROUND_SILU(silu(TO_F32(g[c]))) * TO_F32(u[c])); \
    }                                                                                               \
    return 0;                                                                                       \
}

DEFINE_SILU_MUL(inferpath_silu_mul_f32, float, f32_identity, f32_identity, f32_identity)
DEFINE_SILU_MUL(inferpath_silu_mul_bf16, uint16_t, bf16_to_float, round_bf16, through_bf16)

/* q: (T, H, D), k: (T, KVH, D) with row strides in elements; cos, sin: (T, D); outputs
 * contiguous. D % 32 == 0 (the contract the avx512 level needs; kept the same here). */
#define DEFINE_ROPE(NAME, T, TO_F32, FROM_F32)                                                     \
static void NAME##_heads(const T *x, int64_t heads, const T *cos, const T *sin, T *out, int64_t d) { \
    int64_t half = d / 2;                                                                           \
    for (int64_t h = 0; h < heads; h++) {                                                           \
        const T *xh = x + h * d;                                                                    \
        T *oh = out + h * d;                                                                        \
        for (int64_t c = 0; c < d; c++)                                                             \
            oh[c] = FROM_F32(TO_F32(xh[c]) * TO_F32(cos[c]) + TO_F32(xh[(c + half) % d]) * TO_F32(sin[c])); \
    }                                                                                               \
}                                                                                                   \
int NAME(const T *q, int64_t q_stride, int64_t heads, const T *k, int64_t k_stride, int64_t kv_heads, \
         const T *cos, const T *sin, T *q_out, T *k_out, int64_t tokens, int64_t d, int num_threads) { \
    if (tokens < 1 || d < 32 || d % 32) return -1;                                                  \
    _Pragma("omp parallel for num_threads(num_threads) schedule(static) if (tokens >= 64)")         \
    for (int64_t t = 0; t < tokens; t++) {                                                          \
        NAME##_heads(q + t * q_stride, heads, cos + t * d, sin + t * d, q_out + t * heads * d, d);  \
        NAME##_heads(k + t * k_stride, kv_heads, cos + t * d, sin + t * d, k_out + t * kv_heads * d, d); \
    }                                                                                               \
    return 0;                                                                                       \
}

DEFINE_ROPE(inferpath_rope_f32, float, f32_identity, f32_identity)
DEFINE_ROPE(inferpath_rope_bf16, uint16_t, bf16_to_float, round_bf16)

int inferpath_argmax_f32(const float *x, int64_t *out, int64_t m, int64_t n, int num_threads) {
    if (m < 1 || n < 1 || n > 2147483647LL) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m > 1 && m * n >= (1 << 18))
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * n;
        float best = -INFINITY;
        int64_t best_at = 0;
        for (int64_t c = 0; c < n; c++) {
            float v = row[c];
            if (v != v) { best_at = c; break; }  /* NaN: the first one wins */
            if (v > best) { best = v; best_at = c; }
        }
        out[r] = best_at;
    }
    return 0;
}
