/* GEMV, portable: columns of y = x @ w^T (+ bias) for any number of rows of x, float32 or bf16.
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
