/* The tile layout of the AMX bf16 GEMM (avx512/amx.c), shared with its portable reference
 * (drivers/amx_reference.c), so that a CPU without AMX exercises the same packing.
 *
 * amx.c computes y^T = w . x^T: a 16-row block of w is AMX's A operand, read in place
 * (16 rows x AMX_TILE_K bf16 values per tile, row stride k), and x^T is B, packed by
 * amx_pack_x_pairs into pair rows: xp[p][j][t] = x[j][2p + t] for AMX_XP_COLS columns j
 * (rows of x, zeros past the last one up to a multiple of 16), p over k / 2. A B tile is
 * 16 pair rows x 16 columns (64 bytes a row) at xp + s * 16 * AMX_XP_ROW + 32 * h for k-step
 * s and 16-column half h. A float32 C tile holds out[r][jj] = y[16h + jj][row0 + r].
 */
#ifndef INFERPATH_AMX_TILES_H
#define INFERPATH_AMX_TILES_H

#include <stdint.h>

#define AMX_TILE_ROWS 16  /* rows of every tile; columns of a C tile */
#define AMX_TILE_K 32     /* bf16 values of k per tile step (64 bytes of each weight row) */
#define AMX_XP_COLS 64    /* rows of x packed at a time */
#define AMX_XP_ROW (AMX_XP_COLS * 2)  /* uint16 values per pair row of xp */

/* Pack `rows` (<= AMX_XP_COLS) rows of x (row stride k, k even) into xp ((k / 2) pair
 * rows of AMX_XP_ROW values), zero-padding the columns past `rows` up to a multiple of 16. */
static inline void amx_pack_x_pairs(const uint16_t *x, int64_t k, int64_t rows, uint16_t *xp) {
    int64_t padded = (rows + 15) / 16 * 16;
    for (int64_t p = 0; p < k / 2; p++) {
        uint32_t *dst = (uint32_t *)xp + p * AMX_XP_COLS;  /* pairs as 32-bit words */
        for (int64_t j = 0; j < rows; j++) dst[j] = ((const uint32_t *)(x + j * k))[p];
        for (int64_t j = rows; j < padded; j++) dst[j] = 0;
    }
}

#endif
