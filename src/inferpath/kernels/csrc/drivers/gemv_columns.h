/* The float GEMV split by output columns: each level's gemv.c (avx512/ or portable/)
 * computes a range of columns; gemv_group.c and decode.c hand the ranges out (OpenMP
 * threads, or the decode pool). An output value does not depend on how the columns were
 * split: each is one accumulation chain over k at every level, so every split gives the
 * same bits. */
#ifndef INFERPATH_GEMV_COLUMNS_H
#define INFERPATH_GEMV_COLUMNS_H

#include <stdint.h>

#define HIDDEN_FN __attribute__((visibility("hidden")))

/* Columns [c0, c1) of y = x w^T (+ bias): x (m, k), w (n, k) row-major (nn.Linear's
 * layout), bias (n,) or NULL, y's rows ldy values apart (a group's outputs side by side). */
HIDDEN_FN void gemv_columns_f32(const float *x, const float *w, const float *bias, float *y, int64_t ldy,
                                int64_t m, int64_t k, int64_t c0, int64_t c1);
HIDDEN_FN void gemv_columns_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                                 int64_t ldy, int64_t m, int64_t k, int64_t c0, int64_t c1);
/* The same with bf16 weights and float32 x, bias and y: each weight widened exactly to
 * float32 in the kernel (a 16-bit shift), products and sums in float32. */
HIDDEN_FN void gemv_columns_bf16_weights(const float *x, const uint16_t *w, const float *bias, float *y,
                                         int64_t ldy, int64_t m, int64_t k, int64_t c0, int64_t c1);

/* The element types of a float GEMV: x, w, bias and y all float32, all bf16, or bf16
 * weights with float32 x, bias and y. */
enum gemv_kind { GEMV_F32, GEMV_BF16, GEMV_BF16_WEIGHTS };

/* Several float matrices of one type sharing an input x (Q/K/V, gate/up), read where they
 * lie; their outputs side by side in y (m, n), n the sum of their rows. */
typedef struct {
    int count, kind;  /* kind: a gemv_kind */
    const void *const *weights;  /* (rows[i], k) each */
    const int64_t *rows;
    const void *const *biases;   /* (rows[i],) each, or NULL */
    int64_t n;
} float_group;

/* Columns [c0, c1) of the group's output, across its matrices. */
HIDDEN_FN void gemv_group_columns(const float_group *g, const void *x, void *y, int64_t m, int64_t k, int64_t c0,
                                  int64_t c1);

#endif
