/* RMSNorm: y = weight * (x / sqrt(mean(x^2) + eps)) for m rows of n, in one pass over memory per
 * row and no temporaries. For bf16 the order is Hugging Face's: normalise in float32,
 * round to bf16, then multiply by the bf16 weight and round again. PyTorch spends four to
 * six ops (and their dispatch, and float32 temporaries) on what is one pass here; rows are
 * split over threads once there are enough of them. */
#include "common.h"

int inferpath_rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t m, int64_t n,
                            float eps, int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t row = 0; row < m; row++) {
        const uint16_t *xr = x + row * n;
        uint16_t *yr = y + row * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            __m512 v = load_bf16_as_f32(xr + c, mask);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float scale = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
        __m512 s = _mm512_set1_ps(scale);
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            __m256i normed = round_to_bf16(_mm512_mul_ps(load_bf16_as_f32(xr + c, mask), s));
            __m512 nf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(normed), 16));
            __m256i out = round_to_bf16(_mm512_mul_ps(nf, load_bf16_as_f32(w + c, mask)));
            _mm256_mask_storeu_epi16((void *)(yr + c), mask, out);
        }
    }
    return 0;
}

int inferpath_rms_norm_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps,
                           int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t row = 0; row < m; row++) {
        const float *xr = x + row * n;
        float *yr = y + row * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            __m512 v = LOADF(xr + c, mask);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        __m512 s = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            _mm512_mask_storeu_ps(yr + c, mask, _mm512_mul_ps(_mm512_mul_ps(LOADF(xr + c, mask), s),
                                                               LOADF(w + c, mask)));
        }
    }
    return 0;
}
