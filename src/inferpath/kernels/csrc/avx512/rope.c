/* RoPE on Q and K in one pass: out = x * cos + roll(x, D/2) * signed_sin per head, the
 * rotate-half convention of model/rope.py, in float32 and rounded once.
 *
 * q: (T, H, D) and k: (T, KVH, D) with their own row strides in elements (they may be
 * views into a fused QKV output); cos and signed sin: (T, D) rows for the step's
 * positions; q_out (T, H, D) and k_out (T, KVH, D) contiguous. Requires D % 32 == 0, so a
 * half-head is whole 16-lane vectors. PyTorch needs a roll (a copy), a multiply and an
 * addcmul, each its own pass, for each of q and k. */
#include "common.h"

static inline __m512 load16(const void *p, int is_bf16) {
    return is_bf16 ? load_bf16_as_f32((const uint16_t *)p, 0xffff) : _mm512_loadu_ps((const float *)p);
}

static inline void store16(void *p, __m512 v, int is_bf16) {
    if (is_bf16) _mm256_storeu_si256((__m256i *)p, round_to_bf16(v));
    else _mm512_storeu_ps((float *)p, v);
}

static void rotate_heads(const char *x, int64_t heads, const char *cos, const char *sin, char *out, int64_t d,
                         int64_t elem, int is_bf16) {
    int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++) {
        const char *xh = x + h * d * elem;
        char *oh = out + h * d * elem;
        for (int64_t c = 0; c < d; c += 16) {
            int64_t partner = (c + half) % d;
            __m512 v = _mm512_mul_ps(load16(xh + c * elem, is_bf16), load16(cos + c * elem, is_bf16));
            v = _mm512_fmadd_ps(load16(xh + partner * elem, is_bf16), load16(sin + c * elem, is_bf16), v);
            store16(oh + c * elem, v, is_bf16);
        }
    }
}

static int rope(const void *q, int64_t q_stride, int64_t heads, const void *k, int64_t k_stride, int64_t kv_heads,
                const void *cos, const void *sin, void *q_out, void *k_out, int64_t tokens, int64_t d,
                int num_threads, int is_bf16) {
    if (tokens < 1 || d < 32 || d % 32) return -1;
    int64_t elem = is_bf16 ? 2 : 4;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        const char *c = (const char *)cos + t * d * elem, *s = (const char *)sin + t * d * elem;
        rotate_heads((const char *)q + t * q_stride * elem, heads, c, s, (char *)q_out + t * heads * d * elem,
                     d, elem, is_bf16);
        rotate_heads((const char *)k + t * k_stride * elem, kv_heads, c, s,
                     (char *)k_out + t * kv_heads * d * elem, d, elem, is_bf16);
    }
    return 0;
}

int inferpath_rope_bf16(const uint16_t *q, int64_t q_stride, int64_t heads, const uint16_t *k, int64_t k_stride,
                        int64_t kv_heads, const uint16_t *cos, const uint16_t *sin, uint16_t *q_out,
                        uint16_t *k_out, int64_t tokens, int64_t d, int num_threads) {
    return rope(q, q_stride, heads, k, k_stride, kv_heads, cos, sin, q_out, k_out, tokens, d, num_threads, 1);
}

int inferpath_rope_f32(const float *q, int64_t q_stride, int64_t heads, const float *k, int64_t k_stride,
                       int64_t kv_heads, const float *cos, const float *sin, float *q_out, float *k_out,
                       int64_t tokens, int64_t d, int num_threads) {
    return rope(q, q_stride, heads, k, k_stride, kv_heads, cos, sin, q_out, k_out, tokens, d, num_threads, 0);
}
