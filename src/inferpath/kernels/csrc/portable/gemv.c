/* GEMV, portable: columns of y = x @ w^T (+ bias) for any number of rows of x, float32 or bf16,
 * or float32 x against bf16 weights (a BF16 file on a CPU without bf16 arithmetic).
 *
 * The same contract as avx512/gemv.c: x (m, k), w (n, k) row-major (nn.Linear's layout),
 * bias (n,) or NULL, y (m, n); products accumulate in float32 and are rounded once. Each
 * weight row meets x four rows at a time, so after the first group it is read from L1.
 * This file computes a range of output columns (drivers/gemv_columns.h); the entry points
 * and their threads are drivers/gemv_group.c's, the decode step's are its pool's.
 */
#include "common.h"
#include "../drivers/gemv_columns.h"

#define DEFINE_GEMV(NAME, T, TO_F32, FROM_F32)                                                     \
static void NAME##_rows4(const T *w, const T *x, int64_t k, float out[4]) {                         \
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;                                               \
    _Pragma("omp simd reduction(+:a0, a1, a2, a3)")                                                 \
    for (int64_t c = 0; c < k; c++) {                                                               \
        float wv = TO_F32(w[c]);                                                                    \
        a0 += wv * TO_F32(x[c]);                                                                    \
        a1 += wv * TO_F32(x[k + c]);                                                                \
        a2 += wv * TO_F32(x[2 * k + c]);                                                            \
        a3 += wv * TO_F32(x[3 * k + c]);                                                            \
    }                                                                                               \
    out[0] = a0; out[1] = a1; out[2] = a2; out[3] = a3;                                             \
}                                                                                                   \
static float NAME##_dot(const T *w, const T *x, int64_t k) {                                        \
    float acc = 0.0f;                                                                               \
    _Pragma("omp simd reduction(+:acc)")                                                            \
    for (int64_t c = 0; c < k; c++) acc += TO_F32(w[c]) * TO_F32(x[c]);                             \
    return acc;                                                                                     \
}                                                                                                   \
void NAME(const T *x, const T *w, const T *bias, T *y, int64_t ldy, int64_t m, int64_t k, int64_t c0, \
          int64_t c1) {                                                                             \
    for (int64_t row = c0; row < c1; row++) {                                                       \
        const T *wr = w + row * k;                                                                  \
        float add = bias ? TO_F32(bias[row]) : 0.0f;                                                \
        int64_t j = 0;                                                                              \
        for (; j + 4 <= m; j += 4) {                                                                \
            float out[4];                                                                           \
            NAME##_rows4(wr, x + j * k, k, out);                                                    \
            for (int r = 0; r < 4; r++) y[(j + r) * ldy + row] = FROM_F32(out[r] + add);            \
        }                                                                                           \
        for (; j < m; j++) y[j * ldy + row] = FROM_F32(NAME##_dot(wr, x + j * k, k) + add);         \
    }                                                                                               \
}

DEFINE_GEMV(gemv_columns_f32, float, f32_identity, f32_identity)
DEFINE_GEMV(gemv_columns_bf16, uint16_t, bf16_to_float, round_bf16)

/* ------------------------------------------------- bf16 weights, float32 activations
 * x, bias, y float32; w bfloat16, widened exactly (a 16-bit shift) inside the loop and
 * multiplied in float32, so a decode step reads 2 bytes a weight. Four weight rows at a
 * time; every output is one accumulation chain over k whatever m is and wherever a column
 * range starts, so an output does not depend on the batch it is in.
 *
 * At the avx2 level the block is written with intrinsics (the compiler's version of the
 * loop below kept its sums on the stack and ran at half the float32 GEMV's bandwidth): a
 * block of 4 weight rows meets x two rows at a time, 8 lanes a step, one accumulator per
 * output (4 weight rows x 1 row of x are enough independent FMA chains to outrun memory),
 * and the 8 lanes are summed by one fixed tree. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define WIDEN_PF 8  /* prefetch distance in weight rows: two blocks ahead */

static inline __m256 widen8(const uint16_t *w) {
    __m128i h = _mm_loadu_si128((const __m128i *)w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* lane r: the sum of the 8 lanes of v[r] */
static inline __m128 sum8x4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 4 weight rows (w, k apart) against M (1 or 2) rows of x (k apart): out[j][r] */
static inline __attribute__((always_inline)) void widen_block(const uint16_t *w, const float *x, int64_t k, int M,
                                                               float out[2][4]) {
    __m256 acc[2][4];
    for (int j = 0; j < 2; j++)
        for (int r = 0; r < 4; r++) acc[j][r] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
        for (int r = 0; r < 4; r++) __builtin_prefetch(w + (WIDEN_PF + r) * k + c);
        __m256 w0 = widen8(w + c), w1 = widen8(w + k + c), w2 = widen8(w + 2 * k + c), w3 = widen8(w + 3 * k + c);
        for (int j = 0; j < M; j++) {
            __m256 xv = _mm256_loadu_ps(x + j * k + c);
            acc[j][0] = _mm256_fmadd_ps(w0, xv, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(w1, xv, acc[j][1]);
            acc[j][2] = _mm256_fmadd_ps(w2, xv, acc[j][2]);
            acc[j][3] = _mm256_fmadd_ps(w3, xv, acc[j][3]);
        }
    }
    if (c < k) {  /* the tail, zero-padded to one more step of 8 */
        uint16_t wt[4][8] = {{0}};
        float xt[2][8] = {{0}};
        for (int64_t i = c; i < k; i++) {
            for (int r = 0; r < 4; r++) wt[r][i - c] = w[r * k + i];
            for (int j = 0; j < M; j++) xt[j][i - c] = x[j * k + i];
        }
        for (int j = 0; j < M; j++) {
            __m256 xv = _mm256_loadu_ps(xt[j]);
            for (int r = 0; r < 4; r++) acc[j][r] = _mm256_fmadd_ps(widen8(wt[r]), xv, acc[j][r]);
        }
    }
    for (int j = 0; j < M; j++) _mm_storeu_ps(out[j], sum8x4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
}

static void widen_block4(const uint16_t *w, const float *x, int64_t k, int64_t m, float *y, int64_t ldy,
                         const float *bias) {
    for (int64_t j = 0; j < m; j += 2) {
        float out[2][4];
        int rows = m - j >= 2 ? 2 : 1;
        if (rows == 2) widen_block(w, x + j * k, k, 2, out);
        else widen_block(w, x + j * k, k, 1, out);
        for (int i = 0; i < rows; i++)
            for (int r = 0; r < 4; r++) y[(j + i) * ldy + r] = out[i][r] + (bias ? bias[r] : 0.0f);
    }
}

static float widen_dot(const uint16_t *w, const float *x, int64_t k) {  /* a row left over: its own chain */
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) acc = _mm256_fmadd_ps(widen8(w + c), _mm256_loadu_ps(x + c), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float total = _mm_cvtss_f32(s);
    for (; c < k; c++) total += bf16_to_float(w[c]) * x[c];
    return total;
}

#else  /* the plain C spec: four independent sums, each vectorised by the compiler */

static void widen_block4(const uint16_t *w, const float *x, int64_t k, int64_t m, float *y, int64_t ldy,
                         const float *bias) {
    const uint16_t *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
    for (int64_t j = 0; j < m; j++) {
        const float *xj = x + j * k;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+:a0, a1, a2, a3)
        for (int64_t c = 0; c < k; c++) {
            float xv = xj[c];
            a0 += bf16_to_float(w[c]) * xv;
            a1 += bf16_to_float(w1[c]) * xv;
            a2 += bf16_to_float(w2[c]) * xv;
            a3 += bf16_to_float(w3[c]) * xv;
        }
        float out[4] = {a0, a1, a2, a3};
        for (int r = 0; r < 4; r++) y[j * ldy + r] = out[r] + (bias ? bias[r] : 0.0f);
    }
}

static float widen_dot(const uint16_t *w, const float *x, int64_t k) {
    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
    for (int64_t c = 0; c < k; c++) acc += bf16_to_float(w[c]) * x[c];
    return acc;
}
#endif

void gemv_columns_bf16_weights(const float *x, const uint16_t *w, const float *bias, float *y, int64_t ldy,
                               int64_t m, int64_t k, int64_t c0, int64_t c1) {
    int64_t row = c0;
    for (; row + 4 <= c1; row += 4) widen_block4(w + row * k, x, k, m, y + row, ldy, bias ? bias + row : 0);
    for (; row < c1; row++)
        for (int64_t j = 0; j < m; j++) y[j * ldy + row] = widen_dot(w + row * k, x + j * k, k) + (bias ? bias[row] : 0.0f);
}
