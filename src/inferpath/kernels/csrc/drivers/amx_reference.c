/* The AMX bf16 GEMM (avx512/amx.c) in plain C: the same packing of x^T (amx_pack_x_pairs),
 * the same tiles of w read in place, and TDPBF16PS as the Intel SDM describes it, so that
 * every CPU (every level compiles drivers/) runs the layout and the arithmetic the AMX
 * kernel runs, and a CPU with AMX can test its kernel against this one.
 *
 * TDPBF16PS (SDM): for each row m of C and each k-step of a tile, the even and the odd
 * bf16 of each pair accumulate in two float32 lanes of their own (FMA, round to nearest
 * even, inputs and outputs that are denormal taken as zero), and their sum is added to
 * C[m][n]. bf16 x bf16 is exact in float32, so only the additions round.
 *
 * Same signature and contract as inferpath_amx_gemm_bf16: x (m, k), w (n, k), bias (n,)
 * or NULL, y (m, n), bf16, row-major; k % 32 == 0; w rows past the last full 16 take a
 * plain dot product. num_threads is accepted and unused (one thread: a reference).
 */
#include <math.h>
#include <stdlib.h>

#include "amx_tiles.h"
#include "bf16.h"

static inline float flush_denormal(float f) {  /* a denormal to zero of its sign */
    return fabsf(f) < 1.17549435e-38f ? copysignf(0.0f, f) : f;
}

static inline float tile_value(uint16_t h) {  /* a bf16 input, denormals as zero */
    return flush_denormal(bf16_value(h));
}

/* c (16 x 16 float32) += a . b: a is 16 rows x AMX_TILE_K bf16 values, a_stride values
 * apart; b is 16 pair rows of 16 columns x 2 bf16 values, b_stride values apart.
 * NOTE: a product of two bf16 values is exact in float32, so `lane + a * b` rounds once,
 * as the instruction's FMA does (and compiles to one where the level has FMA). */
static void tile_dpbf16ps(float c[AMX_TILE_ROWS][AMX_TILE_ROWS], const uint16_t *a, int64_t a_stride,
                          const uint16_t *b, int64_t b_stride) {
    enum { R = AMX_TILE_ROWS, P = AMX_TILE_K / 2 };
    float b_even[P][R], b_odd[P][R];  /* the B tile widened once, its pairs' halves apart */
    for (int p = 0; p < P; p++)
        for (int n = 0; n < R; n++) {
            b_even[p][n] = tile_value(b[p * b_stride + 2 * n]);
            b_odd[p][n] = tile_value(b[p * b_stride + 2 * n + 1]);
        }
    for (int m = 0; m < R; m++) {
        float even[R] = {0}, odd[R] = {0};
        for (int p = 0; p < P; p++) {
            float a0 = tile_value(a[m * a_stride + 2 * p]), a1 = tile_value(a[m * a_stride + 2 * p + 1]);
            for (int n = 0; n < R; n++) {
                even[n] = flush_denormal(even[n] + a0 * b_even[p][n]);
                odd[n] = flush_denormal(odd[n] + a1 * b_odd[p][n]);
            }
        }
        for (int n = 0; n < R; n++) c[m][n] = flush_denormal(c[m][n] + flush_denormal(even[n] + odd[n]));
    }
}

/* Pack x as amx.c does (exported for the layout's test): xp holds (k / 2) pair rows of
 * AMX_XP_ROW values for rows <= AMX_XP_COLS rows of x. */
int inferpath_amx_pack_x(const uint16_t *x, int64_t k, int64_t rows, uint16_t *xp) {
    if (rows < 1 || rows > AMX_XP_COLS || k < 2 || k % 2) return -1;
    amx_pack_x_pairs(x, k, rows, xp);
    return 0;
}

int inferpath_amx_reference_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                                      int64_t m, int64_t n, int64_t k, int num_threads) {
    (void)num_threads;
    if (m < 1 || n < 1 || k < AMX_TILE_K || k % AMX_TILE_K) return -1;
    int64_t n16 = n / AMX_TILE_ROWS * AMX_TILE_ROWS, steps = k / AMX_TILE_K;
    uint16_t *xp = (uint16_t *)malloc((size_t)(k / 2) * AMX_XP_ROW * sizeof(uint16_t));
    if (!xp) return -3;
    float c[AMX_TILE_ROWS][AMX_TILE_ROWS];
    for (int64_t j0 = 0; j0 < m; j0 += AMX_XP_COLS) {
        int64_t rows = m - j0 < AMX_XP_COLS ? m - j0 : AMX_XP_COLS;
        amx_pack_x_pairs(x + j0 * k, k, rows, xp);
        for (int64_t row0 = 0; row0 < n16; row0 += AMX_TILE_ROWS)
            for (int64_t h = 0; h < (rows + 15) / 16; h++) {  /* C tile: w rows row0.., x rows j0 + 16h.. */
                for (int r = 0; r < AMX_TILE_ROWS; r++)
                    for (int jj = 0; jj < AMX_TILE_ROWS; jj++) c[r][jj] = 0.0f;
                for (int64_t s = 0; s < steps; s++)
                    tile_dpbf16ps(c, w + row0 * k + s * AMX_TILE_K, k, xp + s * 16 * AMX_XP_ROW + 32 * h, AMX_XP_ROW);
                for (int64_t jj = 0; jj < AMX_TILE_ROWS && 16 * h + jj < rows; jj++)
                    for (int r = 0; r < AMX_TILE_ROWS; r++) {
                        float add = bias ? bf16_value(bias[row0 + r]) : 0.0f;
                        y[(j0 + 16 * h + jj) * n + row0 + r] = bf16_round(c[r][jj] + add);
                    }
            }
        for (int64_t row = n16; row < n; row++)  /* as amx.c: a plain dot product, in order */
            for (int64_t j = 0; j < rows; j++) {
                float acc = bias ? bf16_value(bias[row]) : 0.0f;
                for (int64_t i = 0; i < k; i++) acc += bf16_value(w[row * k + i]) * bf16_value(x[(j0 + j) * k + i]);
                y[(j0 + j) * n + row] = bf16_round(acc);
            }
    }
    free(xp);
    return 0;
}
