/* GEMV: y = x @ w^T (+ bias) for a few rows of x, in bfloat16 (AVX512-BF16) or float32 (AVX512F),
 * or bf16 weights against float32 x (AVX512F: the weights widened in the kernel).
 *
 * x: (m, k) bf16 row-major, w: (n, k) bf16 row-major (nn.Linear's layout), bias: (n,) bf16
 * or NULL, y: (m, n) bf16 row-major, any m >= 1 (in groups of 4 rows). Products are accumulated in float32 by
 * vdpbf16ps (pairs of bf16 products per lane) and rounded to bf16 once, to nearest even.
 *
 * Why: a decode step multiplies one activation row by every weight matrix, so it is a
 * matrix-vector product bound by reading the weights. ATen's bf16 path converts every
 * weight to float32 first and runs at about half the memory bandwidth on a 2-core
 * AVX512 machine; here each 64-byte load of weights feeds one instruction per row of x.
 * Four weight rows are processed together so x's vector is loaded once per four rows.
 *
 * Threads: this file computes a range of output columns (gemv_columns.h); the entry points
 * and their OpenMP threads are drivers/gemv_group.c's, the decode step's are its pool's.
 */
#include "common.h"
#include "../drivers/gemv_columns.h"

/* Software prefetch distance, in weight rows (two blocks of four) ahead of the rows being
 * read. Measured on the LM head (49152 x 576): one thread 6.7 -> 11 GB/s, two 25 -> 33
 * GB/s; the hardware prefetcher alone does not keep enough lines in flight. Prefetches
 * past the end of w are harmless (they never fault). */
#define PF 8

/* 4 weight rows starting at w, against M rows of x. */
#define DEFINE_BLOCK(M)                                                                      \
static void block4_m##M(const uint16_t *w, const uint16_t *x, int64_t k, float out[4][4]) { \
    __m512 acc[4][M];                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) acc[r][j] = _mm512_setzero_ps();                         \
    for (int64_t c = 0; c < k; c += 32) {                                                    \
        __mmask32 mask = (k - c >= 32) ? (__mmask32)0xffffffffu                              \
                                       : (__mmask32)((1u << (k - c)) - 1u);                 \
        _mm_prefetch((const char *)(w + PF * k + c), _MM_HINT_T0);                           \
        _mm_prefetch((const char *)(w + (PF + 1) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 2) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 3) * k + c), _MM_HINT_T0);                     \
        __m512bh wv0 = LOAD(w + c, mask), wv1 = LOAD(w + k + c, mask);                       \
        __m512bh wv2 = LOAD(w + 2 * k + c, mask), wv3 = LOAD(w + 3 * k + c, mask);           \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) {                                                        \
            __m512bh xv = LOAD(x + j * k + c, mask);                                         \
            acc[0][j] = _mm512_dpbf16_ps(acc[0][j], wv0, xv);                                \
            acc[1][j] = _mm512_dpbf16_ps(acc[1][j], wv1, xv);                                \
            acc[2][j] = _mm512_dpbf16_ps(acc[2][j], wv2, xv);                                \
            acc[3][j] = _mm512_dpbf16_ps(acc[3][j], wv3, xv);                                \
        }                                                                                    \
    }                                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);             \
}
DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)

static float dot_row(const uint16_t *w, const uint16_t *x, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        __mmask32 mask = (k - c >= 32) ? (__mmask32)0xffffffffu : (__mmask32)((1u << (k - c)) - 1u);
        acc = _mm512_dpbf16_ps(acc, LOAD(w + c, mask), LOAD(x + c, mask));
    }
    return _mm512_reduce_add_ps(acc);
}


/* ---------------------------------------------------------------- float32
 * The same product for float32 x, w, bias, y: one FMA per 16 floats and row of x. */

#define DEFINE_BLOCK_F32(M)                                                                   \
static void block4_f32_m##M(const float *w, const float *x, int64_t k, float out[4][4]) {    \
    __m512 acc[4][M];                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) acc[r][j] = _mm512_setzero_ps();                         \
    for (int64_t c = 0; c < k; c += 16) {                                                    \
        __mmask16 mask = lanes16(k - c); \
        _mm_prefetch((const char *)(w + PF * k + c), _MM_HINT_T0);                           \
        _mm_prefetch((const char *)(w + (PF + 1) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 2) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 3) * k + c), _MM_HINT_T0);                     \
        __m512 wv0 = LOADF(w + c, mask), wv1 = LOADF(w + k + c, mask);                       \
        __m512 wv2 = LOADF(w + 2 * k + c, mask), wv3 = LOADF(w + 3 * k + c, mask);           \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) {                                                        \
            __m512 xv = LOADF(x + j * k + c, mask);                                          \
            acc[0][j] = _mm512_fmadd_ps(wv0, xv, acc[0][j]);                                 \
            acc[1][j] = _mm512_fmadd_ps(wv1, xv, acc[1][j]);                                 \
            acc[2][j] = _mm512_fmadd_ps(wv2, xv, acc[2][j]);                                 \
            acc[3][j] = _mm512_fmadd_ps(wv3, xv, acc[3][j]);                                 \
        }                                                                                    \
    }                                                                                        \
    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                                              \
        _Pragma("GCC unroll 4") for (int j = 0; j < M; j++) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);             \
}
DEFINE_BLOCK_F32(1)
DEFINE_BLOCK_F32(2)
DEFINE_BLOCK_F32(3)
DEFINE_BLOCK_F32(4)

static float dot_row_f32(const float *w, const float *x, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 mask = lanes16(k - c);
        acc = _mm512_fmadd_ps(LOADF(w + c, mask), LOADF(x + c, mask), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* ---------------------------------------------------------------- the columns
 * For one element type: columns [c0, c1) (weight rows) in blocks of 4, each block meeting
 * x four rows at a time (after the first group the block's weights are in L1), then the
 * rows left over one by one (dot_row: the same chain of products as a block's, so a value
 * does not depend on where a range starts). TO_F32 reads a bias value, FROM_F32 writes a
 * result. The threads are drivers/gemv_group.c's. */
static inline float f32_identity(float v) { return v; }

#define DEFINE_COLUMNS(NAME, T, BLOCK, DOT, TO_F32, FROM_F32)                                      \
void NAME(const T *x, const T *w, const T *bias, T *y, int64_t ldy, int64_t m, int64_t k, int64_t c0, \
          int64_t c1) {                                                                          \
    int64_t row = c0;                                                                            \
    for (; row + 4 <= c1; row += 4) {                                                            \
        const T *wb = w + row * k;                                                               \
        for (int64_t j0 = 0; j0 < m; j0 += 4) {                                                  \
            float out[4][4];                                                                     \
            int64_t rows = m - j0 < 4 ? m - j0 : 4;                                              \
            const T *xj = x + j0 * k;                                                            \
            switch (rows) {                                                                      \
                case 1: BLOCK##_m1(wb, xj, k, out); break;                                       \
                case 2: BLOCK##_m2(wb, xj, k, out); break;                                       \
                case 3: BLOCK##_m3(wb, xj, k, out); break;                                       \
                default: BLOCK##_m4(wb, xj, k, out); break;                                      \
            }                                                                                    \
            for (int r = 0; r < 4; r++) {                                                        \
                float add = bias ? TO_F32(bias[row + r]) : 0.0f;                                 \
                for (int64_t j = 0; j < rows; j++) y[(j0 + j) * ldy + row + r] = FROM_F32(out[r][j] + add); \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (; row < c1; row++) {                                                                    \
        float add = bias ? TO_F32(bias[row]) : 0.0f;                                             \
        for (int64_t j = 0; j < m; j++) y[j * ldy + row] = FROM_F32(DOT(w + row * k, x + j * k, k) + add); \
    }                                                                                            \
}

DEFINE_COLUMNS(gemv_columns_bf16, uint16_t, block4, dot_row, bf16_to_float, round_bf16)
DEFINE_COLUMNS(gemv_columns_f32, float, block4_f32, dot_row_f32, f32_identity, f32_identity)

/* ---------------------------------------------------------------- bf16 weights, float32 x
 * A BF16 file on an AVX-512 CPU without AVX512-BF16: each 16 weights widened exactly (a
 * zero-extension and a 16-bit shift) and multiplied by float32 x with one FMA. Four weight
 * rows meet one row of x at a time, and every row of x takes the same loop whatever m is
 * (an output does not depend on the batch it is in). */
static void widen_block4(const uint16_t *w, const float *x, int64_t k, float out[4]) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 mask = lanes16(k - c);
        _mm_prefetch((const char *)(w + PF * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (PF + 1) * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (PF + 2) * k + c), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (PF + 3) * k + c), _MM_HINT_T0);
        __m512 xv = LOADF(x + c, mask);
        acc0 = _mm512_fmadd_ps(load_bf16_as_f32(w + c, mask), xv, acc0);
        acc1 = _mm512_fmadd_ps(load_bf16_as_f32(w + k + c, mask), xv, acc1);
        acc2 = _mm512_fmadd_ps(load_bf16_as_f32(w + 2 * k + c, mask), xv, acc2);
        acc3 = _mm512_fmadd_ps(load_bf16_as_f32(w + 3 * k + c, mask), xv, acc3);
    }
    out[0] = _mm512_reduce_add_ps(acc0), out[1] = _mm512_reduce_add_ps(acc1);
    out[2] = _mm512_reduce_add_ps(acc2), out[3] = _mm512_reduce_add_ps(acc3);
}

static float widen_dot(const uint16_t *w, const float *x, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 mask = lanes16(k - c);
        acc = _mm512_fmadd_ps(load_bf16_as_f32(w + c, mask), LOADF(x + c, mask), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void gemv_columns_bf16_weights(const float *x, const uint16_t *w, const float *bias, float *y, int64_t ldy,
                               int64_t m, int64_t k, int64_t c0, int64_t c1) {
    int64_t row = c0;
    for (; row + 4 <= c1; row += 4) {
        const uint16_t *wb = w + row * k;
        for (int64_t j = 0; j < m; j++) {
            float out[4];
            widen_block4(wb, x + j * k, k, out);
            for (int r = 0; r < 4; r++) y[j * ldy + row + r] = out[r] + (bias ? bias[row + r] : 0.0f);
        }
    }
    for (; row < c1; row++)
        for (int64_t j = 0; j < m; j++) y[j * ldy + row] = widen_dot(w + row * k, x + j * k, k) + (bias ? bias[row] : 0.0f);
}
