/* The float epilogue of a packed panel's int32 sums (gemm.c's layout: 32 columns, two
 * 16-lane halves), shared by gemm.c's VNNI tiles and avx512/amx_int8.c's tiles, so that
 * both apply the same float operations in the same order and give the same bits.
 * Include after <immintrin.h>, in AVX-512 code only. */
#ifndef INFERPATH_QUANT_PANEL_EPILOGUE_H
#define INFERPATH_QUANT_PANEL_EPILOGUE_H

#include "activations.h"
#include "prepared.h"

/* acc += s * scale * dx + sx * min: x's scale dx and sum sx for this row and block (half) given */
static inline __attribute__((always_inline)) void panel_accumulate_row(__m512 acc[2], __m512i s0, __m512i s1,
                                                                        __m512 sc0, __m512 sc1, __m512 mn0, __m512 mn1,
                                                                        float x_d, float x_s) {
    const __m512 dx = _mm512_set1_ps(x_d), sx = _mm512_set1_ps(x_s);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(sc0, dx), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(sc1, dx), acc[1]);
    acc[0] = _mm512_fmadd_ps(sx, mn0, acc[0]);
    acc[1] = _mm512_fmadd_ps(sx, mn1, acc[1]);
}

/* acc (x row j's two halves) += s * scale * x's d + x's sum * min, for block b (half: Q6_K's
 * half block, two_scales); sc, mn: the block's (half's) scales and mins, 16 columns each; xd:
 * x's d per block (q->xd, or q->xd1 for sums left unshifted: prepared.h). */
static inline __attribute__((always_inline)) void panel_accumulate(__m512 acc[2], __m512i s0, __m512i s1,
                                                                    __m512 sc0, __m512 sc1, __m512 mn0, __m512 mn1,
                                                                    const quant_matmul *q, const float *xd, int64_t j,
                                                                    int64_t b, int64_t nb, int half, int two_scales) {
    panel_accumulate_row(acc, s0, s1, sc0, sc1, mn0, mn1, xd[lane_of(j, b, nb, TILE_ROWS)],
                         two_scales ? q->xh[half_lane_of(j, b, nb, half, TILE_ROWS)] : q->xs[lane_of(j, b, nb, TILE_ROWS)]);
}

/* rows of acc + bias (cols floats, or NULL) into y's rows (n apart): columns [0, cols) */
static inline void panel_store(__m512 acc[][2], int rows, float *y, int64_t n, int cols, const float *bias) {
    const __mmask16 m0 = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1u);
    const __mmask16 m1 = cols >= 32 ? (__mmask16)0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1u);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int i = 0; i < rows; i++) {
        _mm512_mask_storeu_ps(y + i * n, m0, _mm512_add_ps(acc[i][0], b0));
        _mm512_mask_storeu_ps(y + i * n + 16, m1, _mm512_add_ps(acc[i][1], b1));
    }
}

#endif
