/* A quantized matmul split in three (matmul.c): x quantized once, output columns computed
 * in ranges by whoever runs them (an OpenMP region, or decode.c's pool), then released. */
#ifndef INFERPATH_QUANT_PREPARED_H
#define INFERPATH_QUANT_PREPARED_H

#include <stdint.h>

#include "activations.h"
#include "wide.h"

#define MAX_GROUP 8

typedef void (*rows_fn)(const uint8_t *, const q8_rows *, int64_t, float *);

typedef struct {
    int count, use_wide, use_gemm, one_pass;  /* one_pass: x in one int8 pass (activations.h) */
    int qtypes[MAX_GROUP];
    const uint8_t *const *ws;
    const int64_t *row_bytes;
    const float *const *biases;
    int64_t starts[MAX_GROUP + 1];  /* weight i's first output column */
    rows_fn fns[MAX_GROUP];
    wide_fn wides[MAX_GROUP];
    int64_t m, k, n, tiles;
    int8_t *xq, *xr, *wq, *wr;      /* x quantized (m, k) twice, and interleaved (wide) */
    float *xd, *xs, *xh;            /* per-block scalars, tile-major */
} quant_matmul;

#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN int quant_prepare(quant_matmul *q, int count, const int *qtypes, const uint8_t *const *ws,
                         const int64_t *row_bytes, const int64_t *ns, const float *const *biases, const float *x,
                         int64_t m, int64_t k, int num_threads, int rows_alone);
HIDDEN void quant_columns(const quant_matmul *q, float *y, int64_t c0, int64_t c1);
HIDDEN void quant_release(quant_matmul *q);

/* eight_blocks.c: the row kernel of a format eight blocks at a time at this level (AVX2 and
 * up), or NULL (the portable level: matmul.c's kernel serves it). */
HIDDEN rows_fn eight_block_rows(int qtype);

/* gemm.c: whether its kernel runs at this level (AVX-512 VNNI), and output columns
 * [c0, c1) through it (0, or -2 out of memory). */
HIDDEN int gemm_ready(void);
HIDDEN int gemm_columns(const quant_matmul *q, float *y, int64_t c0, int64_t c1);

/* Tiles of x with at least this many rows take gemm.c's kernel where it runs; it packs
 * panels of GEMM_PANEL output columns. SmolLM2's batched decode step, weights from memory,
 * 1 thread, ms GEMM vs the row/wide kernels: 2 rows 13.8 vs 11.1, 3: 15.0 vs 14.1, 4: 15.8
 * vs 17.0, 6: 17.6 vs 19.6, 8: 19.6 vs 20.6, 12: 26.7 vs 38.7, 32: 48.1 vs 75.6. */
#define GEMM_MIN_ROWS 4
/* The same for repacked weights (r8.h), whose own kernel (r8.c) serves fewer rows (a
 * 5-row verification tile among them). 1 thread, AMD EPYC Zen 4, ms r8.c vs the GEMM:
 * Q4_K 8960 x 1536 4 rows 0.42 vs 0.49, 5: 0.51 vs 0.54, 6: 0.60 vs 0.58, 8: 0.83 vs 0.68;
 * Q6_K 1536 x 8960 5: 0.84-1.21 vs 0.76, 6: 0.96-1.36 vs 0.86, 8: 1.67-2.24 vs 1.21-1.47. */
#define R8_GEMM_MIN_ROWS 6
#define GEMM_PANEL 32

#endif
