/* The quantized GEMM's panels through AMX-INT8 tiles (Intel Sapphire Rapids and later).
 *
 * gemm.c packs 32 output columns of a quantized weight into a panel whose groups of four
 * int8 values per column are AMX's B-tile layout (drivers/amx_int8_tiles.h); x, quantized
 * to int8 rows, is the A tile read in place. Per 16 rows of x, per block (per half block
 * for Q6_K), TDPBSUD (s8 x u8 -> int32) sums x's q pass and, unless x is one pass, its r
 * pass into C tiles, two 16-column tiles each; the int32 tiles are stored and scaled in
 * float32 exactly as gemm.c's VNNI tiles scale theirs (the same integers: each C element
 * is vpdpbusd's sum over the same bytes; the same float operations in the same order), so
 * the results equal the VNNI GEMM's, and drivers/amx_int8_reference.c's, to the bit.
 *
 * Tiles, x in two passes: 0, 1 C of x.q (columns 0-15, 16-31); 2, 3 C of x.r; 4 A of x.q, 5 A
 * of x.r; 6, 7 B. x in one pass (the K-quants, one_pass_panel): steps alternate between C 0, 1
 * with A 4 and C 2, 3 with A 5, each step's epilogue run after the next step's tile work is
 * issued (0.82x the VNNI tiles' 1.5B prefill before, 0.96x after: docs/amx.md).
 *
 * The tile permission is asked once (amx.c's inferpath_amx_init); build.py sets this
 * engine only where the CPU reports amx_tile and amx_int8 and the kernel granted it (and
 * INFERPATH_AMX_INT8=1: it measured slower than the VNNI tiles, docs/amx.md); the test
 * that compares it with the reference runs only there (it ran on an Intel Xeon VM).
 */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>
#include <string.h>

#include "../drivers/amx_int8_tiles.h"
#include "../quant/panel_epilogue.h"
#include "tile_config.h"

/* rows of x (A and C tiles), a_bytes of a block per A row (32, or 16 a half), a_bytes / 4 B rows */
static void configure_tiles(int rows, int a_bytes) {
    tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < 4; t++) cfg.rows[t] = (uint8_t)rows, cfg.colsb[t] = 64;
    for (int t = 4; t < 6; t++) cfg.rows[t] = (uint8_t)rows, cfg.colsb[t] = (uint16_t)a_bytes;
    for (int t = 6; t < 8; t++) cfg.rows[t] = (uint8_t)(a_bytes / 4), cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

/* C sums of one step (a block, or a half block) of 16 rows, the two 16-column tiles side by side */
typedef int32_t step_sums[2][AMX_INT8_TILE_ROWS][16];

/* acc[i] += step t's float epilogue from its stored sums c (the same operations, in the same
 * order, as gemm.c's VNNI tiles; x one int8 pass: r is zero, the shift in xd1) */
static inline __attribute__((always_inline)) void step_epilogue(__m512 acc[][2], step_sums c, const uint8_t *panel,
                                                                const quant_matmul *q, int64_t j0, int rows,
                                                                int64_t t, int halves, int64_t nb, int two_scales) {
    enum { P = AMX_INT8_PANEL };
    const int64_t b = t / halves;
    const int half = (int)(t % halves);
    const float *scale = (const float *)(panel + b * AMX_INT8_BLOCK_BYTES + 8 * AMX_INT8_QUAD_BYTES), *min = scale + 2 * P;
    const __m512 sc0 = _mm512_load_ps(scale + half * P), sc1 = _mm512_load_ps(scale + half * P + 16);
    /* x's scales and sums for this block (half) lie TILE_ROWS rows side by side
     * (activations.h's lane_of): rows j0 + i0.. from one pointer each. The terms' order is
     * panel_epilogue.h's: the min terms after the block's last scale term. */
    for (int i0 = 0; i0 < rows; i0 += TILE_ROWS) {
        const int64_t j = j0 + i0;
        const float *xd = q->xd1 + lane_of(j, b, nb, TILE_ROWS);  /* the sums unshifted (prepared.h) */
        const float *xs0 = two_scales ? q->xh + half_lane_of(j, b, nb, 0, TILE_ROWS) : q->xs + lane_of(j, b, nb, TILE_ROWS);
        const float *xs1 = two_scales ? q->xh + half_lane_of(j, b, nb, 1, TILE_ROWS) : xs0;
        const int end = rows - i0 < TILE_ROWS ? rows - i0 : TILE_ROWS;
        for (int i = 0; i < end; i++) {
            const __m512i s0 = _mm512_load_si512(c[0][i0 + i]), s1 = _mm512_load_si512(c[1][i0 + i]);
            panel_scale_row(acc[i0 + i], s0, s1, sc0, sc1, xd[i]);
            if (half == halves - 1) panel_block_mins(acc[i0 + i], min, two_scales, xs0[i], xs1[i]);
        }
    }
}

/* step t's tile work: B (tiles 6, 7) and A (tile A) loaded, C0/C1 = A x B, stored into c */
#define ONE_PASS_STEP(t, A, C0, C1, c)                                                                         \
    do {                                                                                                       \
        const int64_t b_ = (t) / halves;                                                                       \
        const int g0_ = (int)((t) % halves) * quads;                                                           \
        const uint8_t *bt_ = panel + b_ * AMX_INT8_BLOCK_BYTES + g0_ * AMX_INT8_QUAD_BYTES;                    \
        _tile_loadd(6, bt_, AMX_INT8_QUAD_BYTES);                                                              \
        _tile_loadd(7, bt_ + 64, AMX_INT8_QUAD_BYTES);                                                         \
        _tile_loadd(A, xq + 32 * b_ + 4 * g0_, k);                                                             \
        _tile_zero(C0);                                                                                        \
        _tile_zero(C1);                                                                                        \
        _tile_dpbsud(C0, A, 6);                                                                                \
        _tile_dpbsud(C1, A, 7);                                                                                \
        _tile_stored(C0, (c)[0], 64);                                                                          \
        _tile_stored(C1, (c)[1], 64);                                                                          \
    } while (0)

/* x in one int8 pass (the K-quants): the steps (blocks, or Q6_K's half blocks) two at a time
 * in two sets of tiles (C 0, 1 and A 4; C 2, 3 and A 5), each step's epilogue run after the
 * next step's tile work is issued, so that the vector unit scales one step's sums while the
 * tile unit computes the next, and no load waits on the tile store just before it. */
_Static_assert(AMX_INT8_TILE_ROWS % TILE_ROWS == 0, "a C tile's rows are whole lane groups of x's scales");

static void one_pass_panel(const uint8_t *panel, const quant_matmul *q, int two_scales, float *y, int64_t n,
                           int cols, const float *bias) {
    enum { R = AMX_INT8_TILE_ROWS };
    const int64_t k = q->k, nb = k / 32, m = q->m;
    const int halves = two_scales ? 2 : 1, quads = 8 / halves;
    const int64_t steps = nb * halves;
    step_sums c[2] __attribute__((aligned(64)));
    __m512 acc[R][2];
    int configured = 0;
    for (int64_t j0 = 0; j0 < m; j0 += R) {
        const int rows = m - j0 < R ? (int)(m - j0) : R;
        if (rows != configured) configure_tiles(rows, 4 * quads), configured = rows;
        const int8_t *xq = q->xq + j0 * k;
        for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        int64_t t = 0;
        for (; t + 1 < steps; t += 2) {
            ONE_PASS_STEP(t, 4, 0, 1, c[0]);
            if (t > 0) step_epilogue(acc, c[1], panel, q, j0, rows, t - 1, halves, nb, two_scales);
            ONE_PASS_STEP(t + 1, 5, 2, 3, c[1]);
            step_epilogue(acc, c[0], panel, q, j0, rows, t, halves, nb, two_scales);
        }
        if (t < steps) {  /* an odd number of steps: the last one alone */
            ONE_PASS_STEP(t, 4, 0, 1, c[0]);
            if (t > 0) step_epilogue(acc, c[1], panel, q, j0, rows, t - 1, halves, nb, two_scales);
            step_epilogue(acc, c[0], panel, q, j0, rows, t, halves, nb, two_scales);
        } else if (steps > 0) {
            step_epilogue(acc, c[1], panel, q, j0, rows, t - 1, halves, nb, two_scales);
        }
        panel_store(acc, rows, y + j0 * n, n, cols, bias);
    }
    _tile_release();
}
#undef ONE_PASS_STEP

void amx_int8_tiles_panel(const uint8_t *panel, const quant_matmul *q, int two_scales, int signed8, float *y,
                          int64_t n, int cols, const float *bias) {
    if (q->one_pass) {  /* the K-quants only: never signed8 */
        one_pass_panel(panel, q, two_scales, y, n, cols, bias);
        return;
    }
    enum { R = AMX_INT8_TILE_ROWS, P = AMX_INT8_PANEL };
    const int64_t k = q->k, nb = k / 32, m = q->m;
    const int halves = two_scales ? 2 : 1, quads = 8 / halves;
    int32_t cq[2][R][16] __attribute__((aligned(64))), cr[2][R][16] __attribute__((aligned(64)));
    __m512 acc[R][2];
    int configured = 0;
    for (int64_t j0 = 0; j0 < m; j0 += R) {
        const int rows = m - j0 < R ? (int)(m - j0) : R;
        if (rows != configured) configure_tiles(rows, 4 * quads), configured = rows;
        for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pb = panel + b * AMX_INT8_BLOCK_BYTES;
            const float *scale = (const float *)(pb + 8 * AMX_INT8_QUAD_BYTES), *min = scale + 2 * P;
            for (int half = 0; half < halves; half++) {
                const int g0 = half * quads;
                const uint8_t *bt = pb + g0 * AMX_INT8_QUAD_BYTES;
                _tile_loadd(6, bt, AMX_INT8_QUAD_BYTES);
                _tile_loadd(7, bt + 64, AMX_INT8_QUAD_BYTES);
                _tile_zero(0);
                _tile_zero(1);
                _tile_loadd(4, q->xq + j0 * k + 32 * b + 4 * g0, k);
                _tile_dpbsud(0, 4, 6);
                _tile_dpbsud(1, 4, 7);
                _tile_stored(0, cq[0], 64);
                _tile_stored(1, cq[1], 64);
                if (!q->one_pass) {
                    _tile_zero(2);
                    _tile_zero(3);
                    _tile_loadd(5, q->xr + j0 * k + 32 * b + 4 * g0, k);
                    _tile_dpbsud(2, 5, 6);
                    _tile_dpbsud(3, 5, 7);
                    _tile_stored(2, cr[0], 64);
                    _tile_stored(3, cr[1], 64);
                }
                const __m512 sc0 = _mm512_load_ps(scale + half * P), sc1 = _mm512_load_ps(scale + half * P + 16);
                for (int i = 0; i < rows; i++) {
                    __m512i s[2] = {_mm512_slli_epi32(_mm512_load_si512(cq[0][i]), RESIDUAL_SHIFT),
                                    _mm512_slli_epi32(_mm512_load_si512(cq[1][i]), RESIDUAL_SHIFT)};
                    if (!q->one_pass) {
                        s[0] = _mm512_add_epi32(s[0], _mm512_load_si512(cr[0][i]));
                        s[1] = _mm512_add_epi32(s[1], _mm512_load_si512(cr[1][i]));
                    }
                    if (signed8) panel_signed8_sums(s, q, j0 + i, b, nb);  /* gemm.c's tile */
                    panel_accumulate(acc[i], s[0], s[1], sc0, sc1, min, q, q->xd, j0 + i, b, nb, half, two_scales);
                }
            }
        }
        panel_store(acc, rows, y + j0 * n, n, cols, bias);
    }
    _tile_release();
}
#endif
