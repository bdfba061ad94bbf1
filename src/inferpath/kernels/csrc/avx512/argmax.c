/* Greedy argmax: out[r] = index of the largest of x[r, :n] (float32), the first one on ties and the first
 * NaN if there is one: torch.argmax's answer. Rows are split over threads when there are several and
 * 256 K values or more: a decode step's one row stays on the calling thread (waking the team cost more). */
#include "common.h"

int inferpath_argmax_f32(const float *x, int64_t *out, int64_t m, int64_t n, int num_threads) {
    if (m < 1 || n < 1 || n > 2147483647LL) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m > 1 && m * n >= (1 << 18))
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * n;
        __m512 best = _mm512_set1_ps(-INFINITY);
        __m512i best_at = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        __m512i at = best_at;
        int64_t nan_at = -1;
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = lanes16(n - c);
            __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mask, row + c);
            __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            if (nan) { nan_at = c + __builtin_ctz(nan); break; }
            __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
            best = _mm512_mask_mov_ps(best, greater, v);
            best_at = _mm512_mask_mov_epi32(best_at, greater, at);
            at = _mm512_add_epi32(at, _mm512_set1_epi32(16));
        }
        if (nan_at >= 0) { out[r] = nan_at; continue; }
        float top = _mm512_reduce_max_ps(best);
        __mmask16 is_top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
        out[r] = _mm512_mask_reduce_min_epi32(is_top, best_at);
    }
    return 0;
}
