/* The float epilogue of a packed panel's int32 sums (gemm.c's layout: 32 columns, two
 * 16-lane halves), shared by gemm.c's VNNI tiles and avx512/amx_int8.c's tiles, so that
 * both apply the same float operations in the same order and give the same bits.
 * Include after <immintrin.h>, in AVX-512 code only. */
#ifndef INFERPATH_QUANT_PANEL_EPILOGUE_H
#define INFERPATH_QUANT_PANEL_EPILOGUE_H

#include "activations.h"
#include "prepared.h"

/* acc += s * scale * dx (x's scale dx for this row and block, or half block) */
static inline __attribute__((always_inline)) void panel_scale_row(__m512 acc[2], __m512i s0, __m512i s1, __m512 sc0,
                                                                  __m512 sc1, float x_d) {
    const __m512 dx = _mm512_set1_ps(x_d);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(sc0, dx), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(sc1, dx), acc[1]);
}

/* acc += sx * min (x's sum sx for this row and block, or half block) */
static inline __attribute__((always_inline)) void panel_min_row(__m512 acc[2], __m512 mn0, __m512 mn1, float x_s) {
    const __m512 sx = _mm512_set1_ps(x_s);
    acc[0] = _mm512_fmadd_ps(sx, mn0, acc[0]);
    acc[1] = _mm512_fmadd_ps(sx, mn1, acc[1]);
}

/* acc += s * scale * dx + sx * min: a block's two terms, in that order */
static inline __attribute__((always_inline)) void panel_accumulate_row(__m512 acc[2], __m512i s0, __m512i s1,
                                                                       __m512 sc0, __m512 sc1, __m512 mn0, __m512 mn1,
                                                                       float x_d, float x_s) {
    panel_scale_row(acc, s0, s1, sc0, sc1, x_d);
    panel_min_row(acc, mn0, mn1, x_s);
}

/* The order of a row's float terms per block is r8.c's (its row tiles serve a prompt's tail
 * under R8_GEMM_MIN_ROWS rows, after a prefix-cache hit, and must give the cold prompt's
 * bits): the scale term then the min term; for Q6_K (two_scales, a term per 16-value half)
 * both halves' scale terms, then both halves' min terms. */

/* acc += the block's min terms, after its last scale term: min: its mins (GEMM_PANEL floats a
 * half: the panel's layout); x_s0: x's sum over the block (Q6_K: over half 0), x_s1 over half 1 */
static inline __attribute__((always_inline)) void panel_block_mins(__m512 acc[2], const float *min, int two_scales,
                                                                   float x_s0, float x_s1) {
    panel_min_row(acc, _mm512_load_ps(min), _mm512_load_ps(min + 16), x_s0);
    if (two_scales) panel_min_row(acc, _mm512_load_ps(min + GEMM_PANEL), _mm512_load_ps(min + GEMM_PANEL + 16), x_s1);
}

/* Q8_0's sums (signed weights met as w + 128): 128 times x row j's block sum in the dots'
 * units (q8_rows' c) off, exactly, as r8_pair.c takes it off */
static inline __attribute__((always_inline)) void panel_signed8_sums(__m512i s[2], const quant_matmul *q, int64_t j,
                                                                     int64_t b, int64_t nb) {
    const __m512i off = _mm512_set1_epi32(SIGNED8_OFFSET * q->xc[lane_of(j, b, nb, TILE_ROWS)]);
    s[0] = _mm512_sub_epi32(s[0], off), s[1] = _mm512_sub_epi32(s[1], off);
}

/* acc += s * scale * dx for block b's half ``half`` (0 where one scale a block); where it
 * is the block's last, then its min terms (panel_block_mins). sc: the half's scales (16
 * columns each); min: the block's mins; xd: x's d per block (q->xd, or q->xd1 for sums
 * left unshifted). */
static inline __attribute__((always_inline)) void panel_accumulate(__m512 acc[2], __m512i s0, __m512i s1,
                                                                    __m512 sc0, __m512 sc1, const float *min,
                                                                    const quant_matmul *q, const float *xd, int64_t j,
                                                                    int64_t b, int64_t nb, int half, int two_scales) {
    panel_scale_row(acc, s0, s1, sc0, sc1, xd[lane_of(j, b, nb, TILE_ROWS)]);
    if (half != two_scales) return;  /* Q6_K's half 0: its min term after half 1's scale term */
    if (two_scales)
        panel_block_mins(acc, min, 1, q->xh[half_lane_of(j, b, nb, 0, TILE_ROWS)], q->xh[half_lane_of(j, b, nb, 1, TILE_ROWS)]);
    else
        panel_block_mins(acc, min, 0, q->xs[lane_of(j, b, nb, TILE_ROWS)], 0.0f);
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
