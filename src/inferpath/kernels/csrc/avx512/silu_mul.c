/* The SwiGLU gate: out = silu(gate) * up over m rows of n, each operand with its own row
 * stride (in elements), so it reads the two halves of a fused gate/up projection in place
 * and may write over gate. float32 per element; for bf16 in PyTorch's order: silu rounded
 * to bf16, then the product. One pass instead of two ops, each a pass over memory with its
 * own dispatch. Rows are split over threads once there are enough elements. */
#include "common.h"

static inline __m512 silu512(__m512 g) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

int inferpath_silu_mul_bf16(const uint16_t *gate, int64_t gate_stride, const uint16_t *up, int64_t up_stride,
                            uint16_t *out, int64_t out_stride, int64_t m, int64_t n, int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t r = 0; r < m; r++) {
        const uint16_t *g = gate + r * gate_stride, *u = up + r * up_stride;
        uint16_t *o = out + r * out_stride;
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            __m256i s = round_to_bf16(silu512(load_bf16_as_f32(g + c, mask)));
            __m512 sf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s), 16));
            _mm256_mask_storeu_epi16((void *)(o + c), mask,
                                     round_to_bf16(_mm512_mul_ps(sf, load_bf16_as_f32(u + c, mask))));
        }
    }
    return 0;
}

int inferpath_silu_mul_f32(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                           float *out, int64_t out_stride, int64_t m, int64_t n, int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t r = 0; r < m; r++) {
        const float *g = gate + r * gate_stride, *u = up + r * up_stride;
        float *o = out + r * out_stride;
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            _mm512_mask_storeu_ps(o + c, mask, _mm512_mul_ps(silu512(LOADF(g + c, mask)), LOADF(u + c, mask)));
        }
    }
    return 0;
}
