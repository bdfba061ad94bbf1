/* The AMX-INT8 engine of the quantized GEMM: which engine serves gemm.c's packed panels
 * (none, this file's plain-C reference, or avx512/amx_int8.c's AMX tiles), and the
 * reference itself: the panel read as B tiles, x as A tiles (drivers/amx_int8_tiles.h),
 * TDPBSUD as the Intel SDM defines it, and the block scales applied as gemm.c applies
 * them, so that its results are the VNNI GEMM's to the bit (every level compiles it; the
 * quantized GEMM reaches it at the avx512 level only, where gemm.c runs).
 *
 * TDPBSUD (SDM): for each row m of C (rows of A) and each 32-bit element n of C (colsb / 4),
 * for each k of A's colsb / 4: C[m][n] += sum_{i<4} SignExtend(A[m][4k + i]) *
 * ZeroExtend(B[k][4n + i]), in int32 with wraparound (no saturation).
 *
 * Per block (per half for Q6_K) and row j of x, with s = (x.q . w << RESIDUAL_SHIFT) +
 * x.r . w (the r pass zero where x is one pass), exactly gemm.c's tile():
 *     acc = fma(float(s), scale * dx, acc);  acc = fma(sx, min, acc);   y = acc + bias (0 if none)
 * (Q6_K: both halves' scale terms, then both halves' min terms: quant/panel_epilogue.h's
 * order) with fmaf, whose single rounding is vfmadd's, at every level.
 */
#include <math.h>
#include <string.h>

#include "amx_int8_tiles.h"
#include "../quant/blocks.h"
#include "../quant/r8.h"

static int engine = AMX_INT8_NONE;
static int panels_served;  /* panels the engine took since it was last set (tests: the path ran) */

/* The formats whose packing gemm.c has and whose reference results are tested to the bit
 * against its VNNI tiles (tests/test_amx_int8_layout.py): the allow-list. */
static int amx_int8_format(int qtype) {
    switch (qtype) {
        case Q8_0: case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q4_K: case Q5_K: case Q6_K:
        case Q4_K_R8: case Q6_K_R8: return 1;
        default: return 0;
    }
}

/* Set the engine (AMX_INT8_NONE, _REFERENCE or _TILES; build.py sets it from the CPU
 * flags, the tile permission and simulated_cpu_flags): 0, or -1 for a mode that is not
 * one, or AMX tiles where this level was not compiled with them. */
int inferpath_amx_int8_use(int mode) {
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    const int most = AMX_INT8_TILES;
#else
    const int most = AMX_INT8_REFERENCE;
#endif
    if (mode < AMX_INT8_NONE || mode > most) return -1;
    engine = mode;
    __atomic_store_n(&panels_served, 0, __ATOMIC_RELAXED);
    return 0;
}

/* Whether the engine set now takes m rows against a weight of qtype (1 or 0): the
 * decision amx_int8_panel makes, for ops.py's mirror of it. */
int inferpath_amx_int8_takes(int qtype, int64_t m) {
    return engine != AMX_INT8_NONE && m >= AMX_INT8_MIN_ROWS && amx_int8_format(qtype);
}

int inferpath_amx_int8_panels(void) { return __atomic_load_n(&panels_served, __ATOMIC_RELAXED); }

/* c (rows x 16 int32, 16 apart) += a . b as TDPBSUD: a rows x k_bytes int8, a_stride bytes
 * apart; b k_bytes / 4 rows of 16 x 4 uint8, b_stride bytes apart. */
static void tile_dpbsud(int32_t *c, const int8_t *a, int64_t a_stride, const uint8_t *b, int64_t b_stride,
                        int rows, int k_bytes) {
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < 16; n++) {
            uint32_t acc = (uint32_t)c[m * 16 + n];
            for (int kk = 0; kk < k_bytes / 4; kk++)
                for (int i = 0; i < 4; i++)
                    acc += (uint32_t)((int32_t)a[m * a_stride + 4 * kk + i] * (int32_t)b[kk * b_stride + 4 * n + i]);
            c[m * 16 + n] = (int32_t)acc;
        }
}

/* The tile multiply alone, for the layout's test: c (rows <= 16, 16) int32; k_bytes a
 * multiple of 4 up to 64. */
int inferpath_amx_int8_tile_dpbsud(int32_t *c, const int8_t *a, int64_t a_stride, const uint8_t *b,
                                   int64_t b_stride, int rows, int k_bytes) {
    if (rows < 1 || rows > 16 || k_bytes < 4 || k_bytes > 64 || k_bytes % 4) return -1;
    tile_dpbsud(c, a, a_stride, b, b_stride, rows, k_bytes);
    return 0;
}

static void reference_panel(const uint8_t *panel, const quant_matmul *q, int two_scales, int signed8, float *y,
                            int64_t n, int cols, const float *bias) {
    enum { R = AMX_INT8_TILE_ROWS, P = AMX_INT8_PANEL };
    const int64_t k = q->k, nb = k / 32, m = q->m;
    const int halves = two_scales ? 2 : 1, quads = 8 / halves;
    for (int64_t j0 = 0; j0 < m; j0 += R) {
        const int rows = m - j0 < R ? (int)(m - j0) : R;
        float acc[R][P];
        memset(acc, 0, sizeof(acc));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pb = panel + b * AMX_INT8_BLOCK_BYTES;
            const float *scale = (const float *)(pb + 8 * AMX_INT8_QUAD_BYTES), *min = scale + 2 * P;
            for (int half = 0; half < halves; half++) {
                const int g0 = half * quads;
                int32_t cq[2][R * 16], cr[2][R * 16];  /* C tiles: x's q and r passes, 16 columns each */
                memset(cq, 0, sizeof(cq)), memset(cr, 0, sizeof(cr));
                for (int h = 0; h < 2; h++) {
                    const uint8_t *bt = pb + g0 * AMX_INT8_QUAD_BYTES + 64 * h;
                    tile_dpbsud(cq[h], q->xq + j0 * k + 32 * b + 4 * g0, k, bt, AMX_INT8_QUAD_BYTES, rows, 4 * quads);
                    if (!q->one_pass)
                        tile_dpbsud(cr[h], q->xr + j0 * k + 32 * b + 4 * g0, k, bt, AMX_INT8_QUAD_BYTES, rows, 4 * quads);
                }
                for (int i = 0; i < rows; i++) {
                    const int64_t j = j0 + i;
                    const float dx = q->xd[lane_of(j, b, nb, TILE_ROWS)];
                    for (int c = 0; c < P; c++) {
                        const uint32_t s = ((uint32_t)cq[c / 16][i * 16 + c % 16] << RESIDUAL_SHIFT)
                                           + (uint32_t)cr[c / 16][i * 16 + c % 16]
                                           - (signed8 ? (uint32_t)(SIGNED8_OFFSET * q->xc[lane_of(j, b, nb, TILE_ROWS)]) : 0u);
                        const float scaled = scale[half * P + c] * dx;
                        acc[i][c] = fmaf((float)(int32_t)s, scaled, acc[i][c]);
                    }
                    /* the min terms after the block's last scale term (Q6_K: both halves', half
                     * 0's first): quant/panel_epilogue.h's order, r8.c's */
                    for (int h = 0; half == halves - 1 && h < halves; h++) {
                        const float sx = two_scales ? q->xh[half_lane_of(j, b, nb, h, TILE_ROWS)]
                                                    : q->xs[lane_of(j, b, nb, TILE_ROWS)];
                        for (int c = 0; c < P; c++) acc[i][c] = fmaf(sx, min[h * P + c], acc[i][c]);
                    }
                }
            }
        }
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < cols; c++) y[(j0 + i) * n + c] = acc[i][c] + (bias ? bias[c] : 0.0f);
    }
}

int amx_int8_panel(const uint8_t *panel, const quant_matmul *q, int qtype, int two_scales, float *y, int64_t n,
                   int cols, const float *bias) {
    if (!inferpath_amx_int8_takes(qtype, q->m)) return 0;
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
    if (engine == AMX_INT8_TILES) amx_int8_tiles_panel(panel, q, two_scales, signed8_format(qtype), y, n, cols, bias);
    else
#endif
        reference_panel(panel, q, two_scales, signed8_format(qtype), y, n, cols, bias);
    __atomic_fetch_add(&panels_served, 1, __ATOMIC_RELAXED);
    return 1;
}
