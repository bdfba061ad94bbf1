/* The SwiGLU gate: gate = silu(gate) * up, in place in gate (count contiguous elements each), in float32
 * per element; for bf16 in PyTorch's order: silu rounded to bf16, then the product. One
 * pass instead of two ops, each a pass over memory with its own dispatch. */
#include "common.h"

static inline __m512 silu512(__m512 g) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

int inferpath_silu_mul_bf16(uint16_t *gate, const uint16_t *up, int64_t count, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (count >= 65536)
    for (int64_t c = 0; c < count; c += 16) {
        __mmask16 mask = lanes16(count - c);
        __m256i s = round_to_bf16(silu512(load_bf16_as_f32(gate + c, mask)));
        __m512 sf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s), 16));
        __m256i out = round_to_bf16(_mm512_mul_ps(sf, load_bf16_as_f32(up + c, mask)));
        _mm256_mask_storeu_epi16((void *)(gate + c), mask, out);
    }
    return 0;
}

int inferpath_silu_mul_f32(float *gate, const float *up, int64_t count, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (count >= 65536)
    for (int64_t c = 0; c < count; c += 16) {
        __mmask16 mask = lanes16(count - c);
        __m512 out = _mm512_mul_ps(silu512(LOADF(gate + c, mask)), LOADF(up + c, mask));
        _mm512_mask_storeu_ps(gate + c, mask, out);
    }
    return 0;
}
