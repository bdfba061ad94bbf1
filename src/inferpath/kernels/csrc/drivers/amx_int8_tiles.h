/* The AMX-INT8 view of gemm.c's packed panels, shared by the AMX kernel
 * (avx512/amx_int8.c), its portable reference (drivers/amx_int8_reference.c) and gemm.c,
 * which hands each packed panel to them.
 *
 * gemm.c packs GEMM_PANEL (32) output columns a panel, per 32-value block b:
 *
 *     panel[b * AMX_INT8_BLOCK_BYTES + g * AMX_INT8_QUAD_BYTES + 4 * c + e] = w_c[32 b + 4 g + e]
 *
 * (u8: the formats' unsigned q; Q8_0's signed q xor 0x80), g the block's 8 groups of four
 * values, then scale[2][32] and min[2][32] in float32 (min with the format's offset
 * folded in, but for Q8_0's 128, which comes off the int32 sums: prepared.h's
 * SIGNED8_OFFSET). That is AMX's B-tile layout for int8: a B tile row is one group of four k
 * values of 16 columns (64 bytes, a 32-bit element a column), rows AMX_INT8_QUAD_BYTES
 * apart; 16 columns h at +64 h. The block's scale floats sit after its 8 groups, so one
 * B tile holds one block (8 rows, K = 32) or, for a format with a scale per 16 values
 * (Q6_K), one half (4 rows, K = 16): the int32 sums must be scaled per block anyway.
 *
 * x, quantized to int8 by quant_prepare (q and the residual r, (m, k) each, row-major), is
 * the A tile read in place: 16 rows of x, row stride k bytes, 32 (or 16) bytes of a block.
 * The signs: x is signed, the weights unsigned, so the instruction is TDPBSUD (s8 x u8 ->
 * int32), and each C tile element is exactly vpdpbusd's sum over the same bytes.
 */
#ifndef INFERPATH_AMX_INT8_TILES_H
#define INFERPATH_AMX_INT8_TILES_H

#include <stdint.h>

#include "../quant/prepared.h"

#define AMX_INT8_PANEL GEMM_PANEL                       /* columns a panel: two 16-column B tiles */
#define AMX_INT8_QUAD_BYTES (AMX_INT8_PANEL * 4)          /* B tile row stride */
#define AMX_INT8_BLOCK_BYTES (8 * AMX_INT8_QUAD_BYTES + 4 * AMX_INT8_PANEL * 4)  /* quads, scale[2], min[2] */
#define AMX_INT8_TILE_ROWS 16                             /* rows of x an A tile, rows of a C tile */
/* Rows of x from which a matmul takes the AMX-INT8 engine (where one is set): one full A
 * tile, not tuned (the engine is opt-in: slower than the VNNI tiles, docs/amx.md); below
 * it gemm.c's VNNI tiles. */
#define AMX_INT8_MIN_ROWS 16

/* The engine set by inferpath_amx_int8_use (drivers/amx_int8_reference.c). */
enum { AMX_INT8_NONE = 0, AMX_INT8_REFERENCE = 1, AMX_INT8_TILES = 2 };

/* One packed panel (cols <= 32 of its columns stored) against all q->m rows of x: y's
 * rows n apart from the panel's first column, + bias (cols) or NULL; two_scales: Q6_K's
 * halves. Returns 1 where the engine served it, 0 where the caller's VNNI tiles must
 * (no engine set, fewer than AMX_INT8_MIN_ROWS rows, a format off the allow-list). */
__attribute__((visibility("hidden"))) int amx_int8_panel(const uint8_t *panel, const quant_matmul *q, int qtype,
                                                         int two_scales, float *y, int64_t n, int cols,
                                                         const float *bias);

/* The same panel through AMX tiles (avx512/amx_int8.c; compiled where -mamx-int8 is). */
__attribute__((visibility("hidden"))) void amx_int8_tiles_panel(const uint8_t *panel, const quant_matmul *q,
                                                                int two_scales, int signed8, float *y, int64_t n,
                                                                int cols, const float *bias);

#endif
