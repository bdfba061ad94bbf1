/* MXFP4 (GGUF type 39, gpt-oss's expert weights): its row kernel and dequantizer
 * (mxfp4.c), for matmul.c's dispatch.
 *
 * A block of 32 values is 17 bytes: e, an E8M0 exponent, then q[16] (value j: low nibble
 * of q[j], value j + 16: high nibble). A nibble is an E2M1 float: sign bit 3, then one of
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6. Doubled, those are the integers KVALUE[nibble] (0..12 and
 * their negatives), so that
 *
 *     value[e] = d * KVALUE[nibble_e],   d = 2^(e - 128)  (e < 2: float32 subnormals)
 *
 * which is Q8_0's form (a signed integer times one scale per block, no min): the kernel is
 * Q8_0's dot product with the weight's integers looked up instead of loaded.
 */
#ifndef INFERPATH_QUANT_MXFP4_H
#define INFERPATH_QUANT_MXFP4_H

#include <stdint.h>

#include "prepared.h"

#define MXFP4 39
#define MXFP4_BYTES 17

/* the rows_fn of prepared.h: one weight row against ``rows`` (1..TILE_ROWS) rows of x */
__attribute__((visibility("hidden"))) void mxfp4_rows(const uint8_t *row, const q8_rows *x, int64_t rows, float *out);
/* one row of k values (k / 32 blocks) -> float32, exactly the gguf package's values */
__attribute__((visibility("hidden"))) void mxfp4_dequantize_row(const uint8_t *row, int64_t k, float *dst);
/* whether any of the count formats is MXFP4 (gemm.c's panels do not pack it) */
static inline int mxfp4_in(const int *qtypes, int count) {
    for (int i = 0; i < count; i++)
        if (qtypes[i] == MXFP4) return 1;
    return 0;
}

#endif
