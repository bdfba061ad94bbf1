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
    int gemm_panels;  /* use_gemm and some weight takes the panels (repacked ones from R8_GEMM_MIN_ROWS
                       * rows): the callers' column chunks are then whole panels, else the row
                       * kernels' longer runs */
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
    float *xd1;                     /* set where use_gemm and one_pass: xd * RESIDUAL_STEPS (exact), so the
                                     * panels skip the sums' shift (the same bits: quant_prepare, matmul.c) */
    int32_t *xc;                    /* x's integer sums per block, tile-major (q8_rows' c) */
} quant_matmul;

/* quant_prepare's flags (model/batch_invariant.py's): every row through the row kernel,
 * whatever m (batch invariance; its x in the decode step's passes too); x in the decode
 * step's int8 passes whatever m (activations.h: the LM head) */
#define QUANT_ROWS_ALONE 1
#define QUANT_DECODE_PASSES 2

#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN int quant_prepare(quant_matmul *q, int count, const int *qtypes, const uint8_t *const *ws,
                         const int64_t *row_bytes, const int64_t *ns, const float *const *biases, const float *x,
                         int64_t m, int64_t k, int num_threads, int flags);
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
/* The same for repacked weights (r8.h): their own kernel (r8.c, two groups at once in
 * r8_pair.c) serves a whole tile of x (a verification step of 2-8 rows, batch 8), gemm.c's
 * panels more rows (prefill). 1 thread, AMD EPYC Zen 4, us r8 vs the GEMM, medians of two
 * interleaved rounds (benchmarks/r8rows_kernel.py, results/r8rows_kernel.json): Q4_K 512 x
 * 1536 from L2 6 rows 89 vs 121, 8: 115 vs 146; Q6_K 6: 113 vs 178, 8: 154 vs 212; from
 * memory Q4_K 8960 x 1536 6: 2098 vs 2817, 8: 2534 vs 3701; Q6_K 1536 x 8960 6: 2788 vs
 * 3457, 8: 3627 vs 3763. (Before r8_pair.c: 6 rows 0.60 vs 0.58 ms, the GEMM from 6.)
 * From the third tile since 2026-12-06: on the Intel Xeon AMX VM (docs/benchmarks.md's machine
 * B), 2 threads, streamed, the 1.5B file's five shapes, us r8 vs the GEMM, medians of 3
 * rounds (benchmarks/r8rows_kernel.py --cases model --threads 2): 9 rows 758-1707 vs
 * 1199-1854 (r8 1.09-1.59x faster), 12 rows 1.22-1.54x, 16 rows 1.23-1.27x on four shapes
 * (Q6_K 1536 x 1536 0.93x), 24 rows 0.99-1.08x, 32 rows 0.74-1.12x, 128 and 512 rows the GEMM
 * (r8 0.59-0.94x but for Q4_K 1536 x 8960). */
#define R8_GEMM_MIN_ROWS (2 * TILE_ROWS + 1)
#define GEMM_PANEL 32

/* Q8_0's signed weights meet x as the unsigned w + 128 in the GEMM's panels (as in
 * r8_pair.c's pairs), and SIGNED8_OFFSET times x's block sum in the dots' units (q8_rows'
 * c, quant_matmul's xc) comes off the int32 sums exactly, where it came off as a float min
 * term: a row's float chain is then r8.c's, so a prompt tail that r8's tiles compute after a
 * prefix-cache hit gets the cold prompt's bits (as laid out in the file, or repacked). */
#define SIGNED8_OFFSET 128
static inline int signed8_format(int qtype) { return qtype == Q8_0 || qtype == R8_BASE + Q8_0; }

#endif
