/* The GEMM kernel: many rows of x (prefill, large batches) against a quantized weight, on
 * AVX-512 VNNI with 512-bit registers (the other levels: gemm_ready() is 0).
 *
 * A panel of PANEL (32) output columns is unpacked once into the layout the integer dot
 * product wants: per 32-value block, for each group of four values, the panel's columns'
 * four bytes side by side (u8, a 32-bit lane per column: one 512-bit load serves 16
 * columns), then the block's scales and mins per column in float32. Every row of x then
 * meets the panel from cache: MR rows at a time, each row's four int8 values broadcast
 * against two column vectors, so one weight load serves MR rows and one broadcast serves
 * 32 columns (matmul.c's row kernel and wide.c's tiles re-unpack a weight block for every
 * tile of 8 rows, and use 256-bit registers).
 *
 * The arithmetic is the row kernel's, per block: x carried by two int8 passes summed in
 * int32 as (w.q << RESIDUAL_SHIFT) + w.r (activations.h; the r pass skipped where it is
 * zero: the K-quants' one pass), converted once, scaled by the
 * weight's and x's scales, and the format's min and offset joining as min * sum(x). A
 * format with two scales a block (Q6_K) folds each 16-value half apart: both halves' scale
 * terms, then both min terms, r8.c's order (panel_epilogue.h). So a row's result is the
 * file layout's row kernel's up to float32 summation order, and the repacked row tiles'
 * (r8.c, r8_pair.c) to the bit: a prompt's tail under R8_GEMM_MIN_ROWS rows after a
 * prefix-cache hit computes the cold prompt's bits.
 *
 * Q4_K, Q5_K and Q6_K repacked by 8 rows (r8.h) pack into the same panel (r8_pack: 4 groups of 8
 * columns, no transpose: a group holds each quad's 8 rows side by side already), with the
 * bytes and floats the file's blocks give, so a repacked weight's GEMM equals its file's
 * to the bit (tests/test_repacked_gemm.py). Q8_0 and Q5_0 repacked (r8_legacy.c) likewise
 * (r8_legacy_pack).
 *
 * The panel is also AMX-INT8's B-tile layout (drivers/amx_int8_tiles.h): where build.py
 * sets an AMX-INT8 engine, each packed panel of AMX_INT8_MIN_ROWS rows or more is handed
 * to it (amx_int8_panel) instead of the VNNI tiles below, with the same results.
 */
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "activations.h"
#include "prepared.h"
#include "r8.h"
#include "../drivers/amx_int8_tiles.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#include "unpack.h"
#include "panel_epilogue.h"

#define PANEL GEMM_PANEL               /* output columns a panel: two 512-bit vectors */
/* rows of x a tile: MR at most, tile_rows_now a call (inferpath_set_gemm_tile_rows). The
 * best count is the core's. Fewer rows per weight load is faster on AMD Zen 4: at 512 rows x
 * 1536, Q4_K, 1 thread, 3 rows gave 1.13-1.15x the 6 rows' GOP/s (2: 1.07x, 4: 1.10x; 7 and
 * 8 spill registers), Q6_K 1.03-1.05x (benchmarks/prefill_gemm.py, docs/kquant_kernels.md):
 * the epilogue's float multiplies share the VNNI pipes, and with 6 rows' 24 accumulators
 * live the compiler's schedule overlapped them worse. On an Intel Xeon with AMX (Sapphire
 * Rapids class) 6 rows gave 1.12-1.35x the 3 rows' (Q4_K 8960 x 1536 1.12x, 1536 x 8960
 * 1.17x; Q6_K 1.35x, 1.24x; 4 rows 1.11-1.34x; benchmarks/gemm_source_ab.py). So AMD
 * cores take 3 and the others 6. A row's result does not depend on the count (each row's
 * chain is its own), so the choice changes speed, never bits. */
#define MR 6
static int tile_rows_now;  /* 0: not chosen yet */

static int default_tile_rows(void) {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") ? 3 : 6;
}

/* the rows a tile takes now, chosen on first use (threads racing there store the same count) */
static int tile_height(void) {
    int rows = __atomic_load_n(&tile_rows_now, __ATOMIC_RELAXED);
    if (!rows) __atomic_store_n(&tile_rows_now, rows = default_tile_rows(), __ATOMIC_RELAXED);
    return rows;
}

/* The rows of x a GEMM tile takes from the next call on (1..MR; 0 for the core's default):
 * the previous count, or -1 out of range. */
int inferpath_set_gemm_tile_rows(int rows) {
    if (rows < 0 || rows > MR) return -1;
    const int before = tile_height();
    __atomic_store_n(&tile_rows_now, rows ? rows : default_tile_rows(), __ATOMIC_RELAXED);
    return before;
}
#define PREFETCH_BLOCKS 8             /* a column's block this far ahead is fetched while packing */
#define QUAD_BYTES (PANEL * 4)        /* one group of four values for the panel's columns */
#define BLOCK_BYTES (8 * QUAD_BYTES + 4 * PANEL * 4)  /* quads, then scale[2][PANEL], min[2][PANEL] */

_Static_assert(BLOCK_BYTES == AMX_INT8_BLOCK_BYTES && QUAD_BYTES == AMX_INT8_QUAD_BYTES,
               "drivers/amx_int8_tiles.h describes this panel");

int gemm_ready(void) { return 1; }

/* The quads of 16 columns of one block, transposed: in[j] holds columns 2j and 2j + 1 (their
 * eight 4-byte groups each), out[g] group g of the 16 columns. Three rounds of two-register
 * permutes (each halves the columns a register holds and doubles its groups), 24 in all,
 * where scalar stores took 128. */
typedef struct { __m512i s1[2], s2[2], s3[2]; } transpose_indices;

static transpose_indices make_indices(void) {
    int32_t i1[2][16], i2[2][16], i3[2][16];
    for (int h = 0; h < 2; h++)
        for (int lane = 0; lane < 16; lane++) {
            int g = lane / 4 + 4 * h, c = lane % 4;  /* round 1: 4 groups x 4 columns */
            i1[h][lane] = (c < 2 ? 0 : 16) + (c % 2) * 8 + g;
            int gg = lane / 8 + 2 * h, c8 = lane % 8;  /* round 2: 2 groups x 8 columns */
            i2[h][lane] = (c8 < 4 ? 0 : 16) + gg * 4 + c8 % 4;
            i3[h][lane] = (lane < 8 ? 0 : 16) + 8 * h + lane % 8;  /* round 3: 1 group x 16 columns */
        }
    transpose_indices t;
    for (int h = 0; h < 2; h++) {
        t.s1[h] = _mm512_loadu_si512(i1[h]), t.s2[h] = _mm512_loadu_si512(i2[h]), t.s3[h] = _mm512_loadu_si512(i3[h]);
    }
    return t;
}

static inline void transpose16(const transpose_indices *t, const __m512i in[8], __m512i out[8]) {
    __m512i b[4][2], c[2][2][2];
    for (int p = 0; p < 4; p++)
        for (int h = 0; h < 2; h++) b[p][h] = _mm512_permutex2var_epi32(in[2 * p], t->s1[h], in[2 * p + 1]);
    for (int q = 0; q < 2; q++)
        for (int h = 0; h < 2; h++)
            for (int u = 0; u < 2; u++) c[q][h][u] = _mm512_permutex2var_epi32(b[2 * q][h], t->s2[u], b[2 * q + 1][h]);
    for (int h = 0; h < 2; h++)
        for (int u = 0; u < 2; u++)
            for (int e = 0; e < 2; e++)
                out[4 * h + 2 * u + e] = _mm512_permutex2var_epi32(c[0][h][u], t->s3[e], c[1][h][u]);
}

/* Columns [0, cols) of a panel from weight rows w (row_bytes apart), k = 32 nb values each;
 * missing columns are zero (their outputs are never stored). Block by block: 16 columns'
 * blocks unpacked, then transposed (transpose16). */
#define DEFINE_PACK(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES)                        \
static void NAME##_pack(const uint8_t *w, int64_t row_bytes, int cols, int64_t nb, uint8_t *panel) {  \
    const float offset = IS_SIGNED ? 0.0f : (float)(OFFSET);  /* Q8_0: 128 c off the int32 sums */     \
    const transpose_indices t = make_indices();                                                     \
    for (int c = 0; c < cols; c++)  /* the rows' first blocks: the loop below fetches ahead of them */  \
        for (int64_t at = 0; at < PREFETCH_BLOCKS * BYTES && at < row_bytes; at += 64)                \
            _mm_prefetch((const char *)w + c * row_bytes + at, _MM_HINT_T0);                         \
    if (cols < PANEL) memset(panel, 0, (size_t)(nb * BLOCK_BYTES));                                 \
    for (int64_t b = 0; b < nb; b++) {                                                              \
        uint8_t *pb = panel + b * BLOCK_BYTES;                                                      \
        float *scale = (float *)(pb + 8 * QUAD_BYTES), *min = scale + 2 * PANEL;                    \
        for (int half = 0; half < PANEL / 16 && 16 * half < cols; half++) {                         \
            __m256i v[16];                                                                          \
            for (int j = 0; j < 16; j++) {                                                          \
                const int c = 16 * half + j;                                                        \
                if (c >= cols) { v[j] = _mm256_setzero_si256(); continue; }                        \
                const uint8_t *row = w + c * row_bytes;                                             \
                _mm_prefetch((const char *)row + (b + PREFETCH_BLOCKS) * BYTES, _MM_HINT_T0);        \
                block_params p;                                                                     \
                NAME##_params(row, b, &p);                                                          \
                v[j] = NAME##_vec(row, b);                                                          \
                if (IS_SIGNED) v[j] = _mm256_xor_si256(v[j], _mm256_set1_epi8((char)0x80));         \
                scale[c] = p.scale[0], scale[PANEL + c] = p.scale[1];                               \
                min[c] = p.min - offset * p.scale[0], min[PANEL + c] = p.min - offset * p.scale[1]; \
            }                                                                                       \
            __m512i in[8], out[8];                                                                  \
            for (int j = 0; j < 8; j++) in[j] = _mm512_inserti64x4(_mm512_castsi256_si512(v[2 * j]), v[2 * j + 1], 1); \
            transpose16(&t, in, out);                                                               \
            for (int g = 0; g < 8; g++) _mm512_store_si512(pb + g * QUAD_BYTES + 64 * half, out[g]);   \
        }                                                                                           \
    }                                                                                               \
}
FOR_EACH_FORMAT(DEFINE_PACK)

/* The same panel from a repacked weight (r8.h): w is the group of the panel's first column
 * (a group boundary), groups group_bytes apart. A group's 32 bytes for one quad of one
 * sub-block are its eight rows' four values side by side already, so a panel's quad is
 * four such loads (nibbles selected; Q6_K: its two high bits joined), and the scales and
 * mins are eight rows' at once: the same floats as the file's blocks give above (d * scale,
 * -dmin * min; Q6_K: d * scale_h, 0 - 32 * it), so the GEMM's results are the as-laid-out
 * GEMM's to the bit. A group past ``cols`` is zero; the columns of a partial group past
 * it are computed and never stored. */
static void r8_pack(int qtype, const uint8_t *w, int64_t group_bytes, int cols, int64_t nb, uint8_t *panel) {
    const int groups = (cols + R8_ROWS - 1) / R8_ROWS;
    const int64_t sb_bytes = r8_block_bytes(qtype);
    const __m256i low = _mm256_set1_epi8(0xf), high = _mm256_set1_epi8(0x30);
    if (cols < PANEL) memset(panel, 0, (size_t)(nb * BLOCK_BYTES));
    for (int64_t t = 0; t < nb / 8; t++)
        for (int G = 0; G < groups; G++) {
            const uint8_t *o = w + G * group_bytes + t * sb_bytes;
            if (t + 1 < nb / 8)  /* the group's next super-block */
                for (int64_t at = 0; at < sb_bytes; at += 64) _mm_prefetch((const char *)o + sb_bytes + at, _MM_HINT_T0);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
            for (int s = 0; s < 8; s++) {
                uint8_t *pb = panel + (8 * t + s) * BLOCK_BYTES;
                float *scale = (float *)(pb + 8 * QUAD_BYTES) + 8 * G, *min = scale + 2 * PANEL;
                if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
                    const uint8_t *qs = o + k4_quants_at(qtype, s / 2);
                    for (int g = 0; g < 8; g++) {
                        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
                        v = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(v, 4) : v, low);
                        if (qtype == Q5_K_R8) {  /* the fifth bits joined, as the file's pack */
                            const __m256i hb = _mm256_loadu_si256((const __m256i *)(o + 160 + 32 * g));
                            const __m256i h = s < 4 ? _mm256_slli_epi16(hb, 4 - s) : _mm256_srli_epi16(hb, s - 4);
                            v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
                        }
                        _mm256_store_si256((__m256i *)(pb + g * QUAD_BYTES + 32 * G), v);
                    }
                    const __m256 neg_dmin = _mm256_xor_ps(_mm256_set1_ps(-0.0f), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))));  /* -dmin */
                    const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 32 + 8 * s)))));
                    const __m256 mn = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(o + 96 + 8 * s)))));
                    _mm256_store_ps(scale, sc), _mm256_store_ps(scale + PANEL, sc);
                    _mm256_store_ps(min, mn), _mm256_store_ps(min + PANEL, mn);  /* OFFSET 0: min - 0 * scale */
                } else {
                    const uint8_t *ql = o + q6_ql_at(s / 2), *qh = o + q6_qh_at(s / 4);
                    const int i = s % 4;
                    for (int g = 0; g < 8; g++) {
                        __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * g));
                        __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * g));
                        h = i == 0 ? _mm256_slli_epi16(h, 4) : i == 1 ? _mm256_slli_epi16(h, 2) : i == 2 ? h : _mm256_srli_epi16(h, 2);
                        __m256i v = _mm256_or_si256(_mm256_and_si256(s % 2 ? _mm256_srli_epi16(l, 4) : l, low), _mm256_and_si256(h, high));
                        _mm256_store_si256((__m256i *)(pb + g * QUAD_BYTES + 32 * G), v);
                    }
                    for (int half = 0; half < 2; half++) {
                        const __m256 sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(o + 16 + 8 * (2 * s + half))))));
                        _mm256_store_ps(scale + half * PANEL, sc);
                        _mm256_store_ps(min + half * PANEL, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(32.0f), sc)));
                    }
                }
            }
        }
}

/* The same from Q8_0, Q5_0 or Q4_1 repacked by 8 rows (r8.h, r8_legacy.c): a group's 32 bytes
 * for one quad are its rows' four values side by side, as the file's pack above makes them
 * (Q8_0: offset by 128 to unsigned; Q5_0: the fifth bit joined), and the same floats (d,
 * and min - OFFSET * d: Q4_1's m, else 0), so the GEMM's results are the as-laid-out GEMM's to the bit. */
static void r8_legacy_pack(int qtype, const uint8_t *w, int64_t group_bytes, int cols, int64_t nb, uint8_t *panel) {
    const int groups = (cols + R8_ROWS - 1) / R8_ROWS, is_q8 = qtype == Q8_0_R8, is_q41 = qtype == Q4_1_R8;
    const int64_t block_bytes = r8_legacy_block_bytes(qtype), at = r8_legacy_nibbles_at(qtype);
    const __m256i low = _mm256_set1_epi8(0xf), fifth = _mm256_set1_epi8(0x10), flip = _mm256_set1_epi8((char)0x80);
    const __m256 offset = _mm256_set1_ps(is_q8 || is_q41 ? 0.0f : 16.0f);  /* Q8_0: 128 c off the int32 sums */
    if (cols < PANEL) memset(panel, 0, (size_t)(nb * BLOCK_BYTES));
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *pb = panel + b * BLOCK_BYTES;
        for (int G = 0; G < groups; G++) {
            const uint8_t *o = w + G * group_bytes + b * block_bytes;
            if (b + PREFETCH_BLOCKS < nb)
                for (int64_t at = 0; at < block_bytes; at += 64)
                    _mm_prefetch((const char *)o + PREFETCH_BLOCKS * block_bytes + at, _MM_HINT_T0);
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(o + 16));
            for (int g = 0; g < 8; g++) {
                __m256i v;
                if (is_q8) {
                    v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(o + 16 + 32 * g)), flip);
                } else {
                    const __m256i nib = _mm256_loadu_si256((const __m256i *)(o + at + 32 * (g % 4)));
                    const __m256i h = g < 4 ? _mm256_slli_epi16(hb, 4 - g) : _mm256_srli_epi16(hb, g - 4);
                    v = _mm256_and_si256(g < 4 ? nib : _mm256_srli_epi16(nib, 4), low);
                    if (!is_q41) v = _mm256_or_si256(v, _mm256_and_si256(h, fifth));
                }
                _mm256_store_si256((__m256i *)(pb + g * QUAD_BYTES + 32 * G), v);
            }
            float *scale = (float *)(pb + 8 * QUAD_BYTES) + 8 * G, *min = scale + 2 * PANEL;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
            const __m256 base = is_q41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))) : _mm256_setzero_ps();
            const __m256 mn = _mm256_sub_ps(base, _mm256_mul_ps(offset, d));  /* min - OFFSET * d, as the file's pack */
            _mm256_store_ps(scale, d), _mm256_store_ps(scale + PANEL, d);
            _mm256_store_ps(min, mn), _mm256_store_ps(min + PANEL, mn);
        }
    }
}

typedef void (*pack_fn)(const uint8_t *, int64_t, int, int64_t, uint8_t *);

static pack_fn pack_of(int qtype, int *two_scales) {
    switch (qtype) {
#define PACK_CASE(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES) \
        case TYPE: *two_scales = TWO_SCALES; return NAME##_pack;
        FOR_EACH_FORMAT(PACK_CASE)
        default: return 0;
    }
}

/* s[i][*] += the integer dot products of the groups [g0, g0 + quads) of a packed block with
 * rows i of one int8 pass of x (x: the block's first value of row 0; rows k apart). */
static inline __attribute__((always_inline)) void one_pass(__m512i s[][2], const uint8_t *pb, const int8_t *x,
                                                           int64_t k, int g0, int quads, const int R) {
    for (int g = g0; g < g0 + quads; g++) {
        __m512i w0 = _mm512_load_si512(pb + g * QUAD_BYTES), w1 = _mm512_load_si512(pb + g * QUAD_BYTES + 64);
        for (int i = 0; i < R; i++) {
            int32_t four;
            memcpy(&four, x + i * k + 4 * g, 4);
            __m512i xv = _mm512_set1_epi32(four);
            s[i][0] = _mm512_dpbusd_epi32(s[i][0], w0, xv);
            s[i][1] = _mm512_dpbusd_epi32(s[i][1], w1, xv);
        }
    }
}

/* R rows (a constant at each call site) from row j0 against a packed panel: y's rows j0..,
 * n apart, from y's first column of the panel (cols of them), + bias (cols) or NULL. */
static inline __attribute__((always_inline)) void tile(const uint8_t *panel, const quant_matmul *q, int64_t j0,
                                                       const int R, const int two_scales, const int signed8,
                                                       float *y, int64_t n, int cols, const float *bias) {
    const int64_t k = q->k, nb = k / 32;
    const int8_t *xq = q->xq + j0 * k, *xr = q->xr + j0 * k;
    const float *xd = q->one_pass ? q->xd1 : q->xd;
    const int halves = two_scales ? 2 : 1, quads = 8 / halves;
    __m512 acc[MR][2];
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * BLOCK_BYTES;
        const float *scale = (const float *)(pb + 8 * QUAD_BYTES), *min = scale + 2 * PANEL;
        for (int half = 0; half < halves; half++) {
            const int g0 = half * quads;
            __m512i s[MR][2];
            for (int i = 0; i < R; i++) s[i][0] = s[i][1] = _mm512_setzero_si512();
            one_pass(s, pb, xq + 32 * b, k, g0, quads, R);
            if (!q->one_pass) {  /* (w.q << RESIDUAL_SHIFT) + w.r; one pass: the shift is in xd1 (prepared.h) */
                for (int i = 0; i < R; i++) {
                    s[i][0] = _mm512_slli_epi32(s[i][0], RESIDUAL_SHIFT);
                    s[i][1] = _mm512_slli_epi32(s[i][1], RESIDUAL_SHIFT);
                }
                one_pass(s, pb, xr + 32 * b, k, g0, quads, R);
            }
            if (signed8)
                for (int i = 0; i < R; i++) panel_signed8_sums(s[i], q, j0 + i, b, nb);
            const __m512 sc0 = _mm512_load_ps(scale + half * PANEL), sc1 = _mm512_load_ps(scale + half * PANEL + 16);
            for (int i = 0; i < R; i++)
                panel_accumulate(acc[i], s[i][0], s[i][1], sc0, sc1, min, q, xd, j0 + i, b, nb, half, two_scales);
        }
    }
    panel_store(acc, R, y + j0 * n, n, cols, bias);
}

static void tile_rows(const uint8_t *panel, const quant_matmul *q, int64_t j0, int rows, int two_scales,
                      int signed8, float *y, int64_t n, int cols, const float *bias) {
#define TILE_OF(R) do { if (two_scales) tile(panel, q, j0, R, 1, 0, y, n, cols, bias);           \
                        else if (signed8) tile(panel, q, j0, R, 0, 1, y, n, cols, bias);         \
                        else tile(panel, q, j0, R, 0, 0, y, n, cols, bias); } while (0)
    switch (rows) {
        case 1: TILE_OF(1); break;
        case 2: TILE_OF(2); break;
        case 3: TILE_OF(3); break;
        case 4: TILE_OF(4); break;
        case 5: TILE_OF(5); break;
        default: TILE_OF(MR); break;
    }
#undef TILE_OF
}

/* A per-thread panel buffer, grown as needed (kept for the thread's life). */
static uint8_t *panel_buffer(int64_t bytes) {
    static __thread uint8_t *buffer;
    static __thread int64_t capacity;
    if (bytes > capacity) {
        free(buffer);
        buffer = (uint8_t *)aligned_alloc(64, (size_t)bytes);
        capacity = buffer ? bytes : 0;
    }
    return buffer;
}

int gemm_columns(const quant_matmul *q, float *y, int64_t c0, int64_t c1) {
    const int64_t nb = q->k / 32, m = q->m, n = q->n;
    uint8_t *panel = panel_buffer(nb * BLOCK_BYTES);
    if (!panel) return -2;
    const int mr = tile_height();
    int i = 0;
    for (int64_t c = c0; c < c1;) {
        while (c >= q->starts[i + 1]) i++;
        int64_t end = c + PANEL;
        if (end > c1) end = c1;
        if (end > q->starts[i + 1]) end = q->starts[i + 1];
        const int cols = (int)(end - c);
        const int64_t local = c - q->starts[i];
        int two_scales;
        if (r8_legacy_format(q->qtypes[i])) {  /* the same, for r8_legacy.c's groups */
            if (local % R8_ROWS) return -1;
            two_scales = 0;
            r8_legacy_pack(q->qtypes[i], q->ws[i] + local * q->row_bytes[i], R8_ROWS * q->row_bytes[i], cols, nb, panel);
        } else if (r8_format(q->qtypes[i])) {  /* from a group boundary only (else r8.c's kernel serves) */
            if (local % R8_ROWS) return -1;
            two_scales = q->qtypes[i] == Q6_K_R8;
            r8_pack(q->qtypes[i], q->ws[i] + local * q->row_bytes[i], R8_ROWS * q->row_bytes[i], cols, nb, panel);
        } else {
            pack_fn pack = pack_of(q->qtypes[i], &two_scales);
            pack(q->ws[i] + local * q->row_bytes[i], q->row_bytes[i], cols, nb, panel);
        }
        const float *bias = q->biases[i] ? q->biases[i] + local : 0;
        if (!amx_int8_panel(panel, q, q->qtypes[i], two_scales, y + c, n, cols, bias)) {  /* else VNNI tiles */
            const int64_t tiles = (m + mr - 1) / mr, base = m / tiles, longer = m % tiles;  /* balanced: 32 rows 3 x 10 and 2 */
            for (int64_t t = 0, j0 = 0; t < tiles; t++) {
                const int rows = (int)(base + (t < longer));
                tile_rows(panel, q, j0, rows, two_scales, signed8_format(q->qtypes[i]), y + c, n, cols, bias);
                j0 += rows;
            }
        }
        c = end;
    }
    return 0;
}

/* One panel of a weight laid out as in the file (cols <= GEMM_PANEL rows of row_bytes, k
 * values each) packed as gemm_columns packs it, into panel (k / 32 * AMX_INT8_BLOCK_BYTES
 * bytes): the AMX-INT8 layout's test. 0, -1 for a format or shape, -2 out of memory. */
int inferpath_amx_int8_pack_panel(int qtype, const uint8_t *w, int64_t row_bytes, int cols, int64_t k,
                                  uint8_t *panel) {
    int two_scales;
    pack_fn pack = pack_of(qtype, &two_scales);
    if (!pack || cols < 1 || cols > PANEL || k < 32 || k % 32 || row_bytes < 1) return -1;
    uint8_t *aligned = panel_buffer(k / 32 * BLOCK_BYTES);
    if (!aligned) return -2;
    pack(w, row_bytes, cols, k / 32, aligned);
    memcpy(panel, aligned, (size_t)(k / 32 * BLOCK_BYTES));
    return 0;
}

#else
int gemm_ready(void) { return 0; }
int inferpath_set_gemm_tile_rows(int rows) { (void)rows; return -1; }  /* no GEMM at this level */
int gemm_columns(const quant_matmul *q, float *y, int64_t c0, int64_t c1) { (void)q, (void)y, (void)c0, (void)c1; return -1; }
int inferpath_amx_int8_pack_panel(int qtype, const uint8_t *w, int64_t row_bytes, int cols, int64_t k,
                                  uint8_t *panel) {
    (void)qtype, (void)w, (void)row_bytes, (void)cols, (void)k, (void)panel;
    return -1;  /* gemm.c's panels are packed at the avx512 level only */
}
#endif
