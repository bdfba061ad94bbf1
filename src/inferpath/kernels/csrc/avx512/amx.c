/* Small-batch GEMM on AMX: y = x @ w^T (+ bias) for 1 to 64 rows of x at a time, bf16.
 *
 * A batched decode step multiplies a few dozen activation rows by every weight matrix:
 * too many rows for the GEMV (compute-bound past 8) and too few for a general GEMM to
 * stream the weights at memory speed (oneDNN reaches ~180 GFLOP/s here on weights that
 * are not in cache). This kernel computes the transposed product, y^T = w . x^T, so that
 * the weights are AMX's A operand, loaded straight from nn.Linear's row-major layout (16
 * rows x 32 values per tile, with software prefetch ahead), and only x, a few KB, is
 * repacked into the pairwise (VNNI) layout AMX wants for B. Each 16-row block of w meets
 * up to two 16-column tiles of x^T; products accumulate in float32 tiles and are rounded
 * to bf16 once. Requires k % 32 == 0; rows of w past the last full 16 use the GEMV.
 *
 * The packing and the tile layout are drivers/amx_tiles.h's; drivers/amx_reference.c runs
 * the same layout through a plain-C tile multiply on every CPU.
 *
 * Up to 64 rows of x are packed at a time: up to 32 meet two weight blocks per pass, 33
 * to 64 one block against four tiles of x^T.
 *
 * x: (m, k) bf16, w: (n, k) bf16, bias: (n,) bf16 or NULL, y: (m, n) bf16; row-major.
 */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "../drivers/amx_tiles.h"
#include "tile_config.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_PREFETCH_STEPS 4  /* k-steps (64 bytes of each weight row) ahead */


int inferpath_gemv_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                        int64_t m, int64_t n, int64_t k, int num_threads);

/* Ask the kernel for the AMX tile state (Linux >= 5.16); 0 when granted. */
int inferpath_amx_init(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {  /* 0-3: C (2 blocks of w x 2 halves of x); 4, 5: A; 6, 7: B */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

static inline void prefetch_rows(const uint16_t *rows, int64_t k, int64_t count) {
    for (int64_t r = 0; r < count; r++) _mm_prefetch((const char *)(rows + r * k), _MM_HINT_T0);
}

/* At k-step s of `steps`, prefetch the `rows` weight rows from w0 AMX_PREFETCH_STEPS steps
 * on, or, near the end, the first steps of the rows that follow them. */
static inline void prefetch_ahead(const uint16_t *w0, int64_t rows, int64_t k, int64_t s, int64_t steps) {
    int64_t ahead = s + AMX_PREFETCH_STEPS;
    if (ahead < steps) prefetch_rows(w0 + ahead * 32, k, rows);
    else prefetch_rows(w0 + rows * k + (ahead - steps) * 32, k, rows);
}

static inline void zero_accumulators(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* Round the float32 tiles of one 16-row block of w into y: out[h][r][jj] = y[16h + jj][row0 + r].
 * Each row j of y takes one 16-value column of a tile (a gather from L1) as 32 bytes. */
static void store_block(float out[4][16][16], const uint16_t *bias, uint16_t *y, int64_t row0, int64_t m,
                        int64_t n) {
    __m512 add = bias ? load_bf16_as_f32(bias + row0, 0xffff) : _mm512_setzero_ps();
    __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(16));
    for (int64_t j = 0; j < m; j++) {
        __m512 v = _mm512_i32gather_ps(column, &out[j / 16][0][j % 16], 4);
        _mm256_storeu_si256((__m256i *)(y + j * n + row0), round_to_bf16(_mm512_add_ps(v, add)));
    }
}

/* x^T as packed by amx_pack_x_pairs (drivers/amx_tiles.h): XP_COLS columns (rows of x) per pair of k. */
#define XP_COLS AMX_XP_COLS
#define XP_ROW AMX_XP_ROW

/* y rows [0, m) with m <= 32 against w rows [0, n16) (a multiple of 16). Two 16-row blocks
 * of w per iteration: four independent accumulator tiles keep AMX busy while the weight
 * tiles stream in. */
static void amx_chunk(const uint16_t *xp, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                      int64_t m, int64_t n16, int64_t n, int64_t k, int num_threads) {
    int64_t halves = (m + 15) / 16;
    int64_t pairs = (n16 / 16 + 1) / 2;  /* the last "pair" may be a single block */
    int64_t steps = k / 32;
#pragma omp parallel num_threads(num_threads)
    {
        configure_tiles();
        float out[4][16][16];
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            int64_t row0 = p * 32;
            int two = row0 + 32 <= n16;
            const uint16_t *w0 = w + row0 * k, *w1 = w0 + 16 * k;
            zero_accumulators();
            for (int64_t s = 0; s < steps; s++) {
                prefetch_ahead(w0, two ? 32 : 16, k, s, steps);
                _tile_loadd(6, xp + s * 16 * XP_ROW, XP_ROW * 2);
                if (halves > 1) _tile_loadd(7, xp + s * 16 * XP_ROW + 32, XP_ROW * 2);
                _tile_loadd(4, w0 + s * 32, k * 2);
                _tile_dpbf16ps(0, 4, 6);
                if (halves > 1) _tile_dpbf16ps(1, 4, 7);
                if (two) {
                    _tile_loadd(5, w1 + s * 32, k * 2);
                    _tile_dpbf16ps(2, 5, 6);
                    if (halves > 1) _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, out[0], 64);
            if (halves > 1) _tile_stored(1, out[1], 64);
            store_block(out, bias, y, row0, m, n);
            if (two) {
                _tile_stored(2, out[0], 64);
                if (halves > 1) _tile_stored(3, out[1], 64);
                store_block(out, bias, y, row0 + 16, m, n);
            }
        }
        _tile_release();
    }
}

/* y rows [0, m) with 32 < m <= 64: one 16-row block of w per iteration against four
 * 16-column halves of x^T (four accumulator tiles), so the weights are read once for 64
 * rows instead of once per 32. */
static void amx_chunk4(const uint16_t *xp, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                       int64_t m, int64_t n16, int64_t n, int64_t k, int num_threads) {
    int64_t halves = (m + 15) / 16;
    int64_t steps = k / 32;
#pragma omp parallel num_threads(num_threads)
    {
        configure_tiles();
        float out[4][16][16];
#pragma omp for schedule(static)
        for (int64_t b = 0; b < n16 / 16; b++) {
            const uint16_t *wb = w + b * 16 * k;
            zero_accumulators();
            for (int64_t s = 0; s < steps; s++) {
                prefetch_ahead(wb, 16, k, s, steps);
                const uint16_t *xs = xp + s * 16 * XP_ROW;
                _tile_loadd(4, wb + s * 32, k * 2);
                _tile_loadd(6, xs, XP_ROW * 2);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, xs + 32, XP_ROW * 2);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(6, xs + 64, XP_ROW * 2);
                _tile_dpbf16ps(2, 4, 6);
                if (halves > 3) {
                    _tile_loadd(7, xs + 96, XP_ROW * 2);
                    _tile_dpbf16ps(3, 4, 7);
                }
            }
            _tile_stored(0, out[0], 64);
            _tile_stored(1, out[1], 64);
            _tile_stored(2, out[2], 64);
            if (halves > 3) _tile_stored(3, out[3], 64);
            store_block(out, bias, y, b * 16, m, n);
        }
        _tile_release();
    }
}

int inferpath_amx_gemm_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                            int64_t m, int64_t n, int64_t k, int num_threads) {
    if (m < 1 || n < 1 || k < 32 || k % 32) return -1;
    int64_t n16 = n / 16 * 16;
    /* x^T in pairs: xp[p][j][t] = x[j][2p + t] for XP_COLS columns j (zeros past m, up to
     * the last 16-column tile read) */
    uint16_t *xp = (uint16_t *)aligned_alloc(64, (size_t)(k / 2) * XP_ROW * sizeof(uint16_t));
    if (!xp) return -3;
    for (int64_t j0 = 0; j0 < m; j0 += XP_COLS) {
        int64_t rows = m - j0 < XP_COLS ? m - j0 : XP_COLS;
        amx_pack_x_pairs(x + j0 * k, k, rows, xp);
        if (n16 > 0 && rows > 32) amx_chunk4(xp, w, bias, y + j0 * n, rows, n16, n, k, num_threads);
        else if (n16 > 0) amx_chunk(xp, w, bias, y + j0 * n, rows, n16, n, k, num_threads);
        if (n16 < n) {  /* the n % 16 rows left: one GEMV call on those rows of w */
            for (int64_t row = n16; row < n; row++)
                for (int64_t j = 0; j < rows; j++) {
                    float acc = bias ? bf16_to_float(bias[row]) : 0.0f;
                    for (int64_t c = 0; c < k; c++)
                        acc += bf16_to_float(w[row * k + c]) * bf16_to_float(x[(j0 + j) * k + c]);
                    y[(j0 + j) * n + row] = round_bf16(acc);
                }
        }
    }
    free(xp);
    return 0;
}
