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

/* lane j of the result: the sum of v[j]'s 16 lanes (a tree of in-register shuffles: 46
 * instructions for 16 sums, where a horizontal sum apiece costs ~10) */
static inline __m512 sum16(const __m512 *v) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++)  /* 256-bit halves: [v2i (L0+L2, L1+L3), v2i+1 (...)] */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++)  /* 128-bit lane k: a partial of v[4i + k] */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++)
        y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* z's lane 4k + e holds the sum of v[4e + k] */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

#endif
