/* Helpers shared by inferpath's CPU kernels (AVX512F/BW/VL, AVX512-BF16 for bf16).
 *
 * bf16 values travel as uint16_t bit patterns; arithmetic is float32. Rounding to bf16 is
 * to nearest even, as PyTorch rounds. Every kernel takes the thread count PyTorch uses: the
 * library links libgomp.so.1, which PyTorch has already loaded, so OpenMP regions here run
 * on PyTorch's own thread pool (no second set of spinning threads).
 */
#ifndef INFERPATH_COMMON_H
#define INFERPATH_COMMON_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline uint16_t round_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t u = v.u;
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40 : 0));
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

#define LOAD(ptr, mask) ((__m512bh)_mm512_maskz_loadu_epi16((mask), (const void *)(ptr)))

#define LOADF(ptr, mask) _mm512_maskz_loadu_ps((mask), (const void *)(ptr))

/* A mask of the first min(16, left) lanes (a row's tail). */
static inline __mmask16 lanes16(int64_t left) {
    return left >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << left) - 1u);
}

static inline __m512 load_bf16_as_f32(const uint16_t *p, __mmask16 mask) {
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m256i round_to_bf16(__m512 v) {  /* round to nearest even (finite values) */
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

static inline __m512 exp512(__m512 x) {  /* e^x, |rel err| < 2e-7 over the softmax range */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

#endif
