/* Quantized matmul over GGUF blocks read in place: y = x @ dequant(w)^T (+ bias).
 *
 * x (m, k) float32 is first quantized per 32 values to int8 (llama.cpp's q8_0 scheme: a
 * scale d = max|x| / 127, q = round(x / d), and s = d * sum(q) kept for the formats
 * with a min). Each block's dot product is then an integer dot product of the weight's
 * q values with x's, scaled once per 16 values in float32 (blocks.h's view of every
 * format):
 *
 *     dot = d_x * sum_h scale_h * sum_{e in h} (q_e - OFFSET) * qx_e  +  min * s_x
 *
 * The integer part, per level (chosen by the flags this file is compiled with), for x's
 * two int8 passes (activations.h) summed in int32 as (q << 8) + r (a group of K-quants
 * alone: r is zero, one pass, activations.h's one_pass):
 *   AVX-512 VNNI: vpdpbusd on 256-bit registers (u8 x s8 summed by fours into int32;
 *         Q8_0's signed weights offset by 128 to unsigned, the offset joining the min);
 *   AVX2: vpmaddubsw (u8 x s8 pairs into int16: |sum| <= 2 * 63 * 127, no saturation
 *         since weights have at most 6 bits) then vpmaddwd into int32;
 *   Q8_0 on AVX2 (signed weights, |q| <= 127): |w| against x carrying w's sign (pairs <=
 *         2 * 127 * 127 < 32768);
 *   portable: the same sums in plain integer C.
 * Every format's OFFSET (w - OFFSET) joins its min as -OFFSET * scale * sum(x). The row
 * kernel here unpacks a weight block once for a tile of up to 8 rows of x (one row: the
 * decode step); on AVX2 wide.c's kernel takes whole tiles of 6+ rows a 32-bit lane per row,
 * with AVX-512 VNNI gemm.c's packed panels take GEMM_MIN_ROWS rows or more. Weight
 * rows are split over the decode pool's threads in chunks (below). Weights repacked by 8 rows
 * (r8.h) take r8.c's or r8_legacy.c's kernel, and gemm.c's panels packed from their groups.
 * ``inferpath_quant_dequantize`` turns rows into float32 (embedding lookups, and large
 * batches where a float GEMM over a dequantized tile is faster).
 */
#include <stdlib.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "blocks.h"
#include "mxfp4.h"

#include "activations.h"
#include "wide.h"
#include "prepared.h"
#include "r8.h"
#include "../drivers/pool.h"

#if defined(__AVX2__)
/* ---------------------------------------------------------------- AVX2 / AVX-512 VNNI */
#include "unpack.h"

/* One weight row against R rows of x (R a constant at each call site, so that the
 * accumulators live in registers). The weight offset (w - OFFSET) is not subtracted from
 * the weights: it joins the min, as -OFFSET * scale times the x block's sum. */
#define DEFINE_ROWS(NAME, OFFSET, IS_SIGNED, TWO_SCALES)                                            \
static inline __attribute__((always_inline)) void NAME##_tile(const uint8_t *row, const q8_rows *x,   \
                                                                const int R, float *out) {            \
    const int64_t nb = x->k / 32, k = x->k;                                                         \
    const int is_signed = IS_SIGNED && !VNNI, offset = (IS_SIGNED && VNNI) ? 128 : OFFSET;          \
    __m256 acc[TILE_ROWS], mins = _mm256_setzero_ps();                                              \
    float scaled[2][TILE_ROWS], min_one = 0.0f;                                                     \
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();                                       \
    for (int64_t b = 0; b < nb; b++) {                                                              \
        block_params p;                                                                             \
        NAME##_params(row, b, &p);                                                                  \
        __m256i w = NAME##_vec(row, b);                                                             \
        if (IS_SIGNED && VNNI) w = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));              \
        if (R == 1) {  /* one row (decode): scalars, no tile vectors */                             \
            const float dx = x->d[b * x->lanes];                                                    \
            __m256i xq = _mm256_loadu_si256((const __m256i *)(x->q + 32 * b));                      \
            __m256i xr = _mm256_loadu_si256((const __m256i *)(x->r + 32 * b));                      \
            __m256 sums = _mm256_cvtepi32_ps(int_dot(w, xq, xr, is_signed));                        \
            if (TWO_SCALES) {                                                                       \
                const float *h = x->h + b * 2 * x->lanes;                                           \
                acc[0] = _mm256_fmadd_ps(sums, _mm256_set_m128(_mm_set1_ps(p.scale[1] * dx), _mm_set1_ps(p.scale[0] * dx)), acc[0]); \
                min_one += (offset ? p.min - (float)offset * p.scale[0] : p.min) * h[0] + (offset ? p.min - (float)offset * p.scale[1] : p.min) * h[x->lanes]; \
            } else {                                                                                \
                acc[0] = _mm256_fmadd_ps(sums, _mm256_set1_ps(p.scale[0] * dx), acc[0]);            \
                min_one += (offset ? p.min - (float)offset * p.scale[0] : p.min) * x->s[b * x->lanes];               \
            }                                                                                       \
            continue;                                                                               \
        }                                                                                           \
        /* the tile's eight rows at once: their scales, and the min (with the offset) */           \
        __m256 dx = _mm256_loadu_ps(x->d + b * TILE_ROWS);                                          \
        _mm256_storeu_ps(scaled[0], _mm256_mul_ps(dx, _mm256_set1_ps(p.scale[0])));                 \
        if (TWO_SCALES) {                                                                           \
            _mm256_storeu_ps(scaled[1], _mm256_mul_ps(dx, _mm256_set1_ps(p.scale[1])));             \
            const float *h = x->h + b * 2 * TILE_ROWS;                                              \
            mins = _mm256_fmadd_ps(_mm256_loadu_ps(h), _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[0] : p.min), mins); \
            mins = _mm256_fmadd_ps(_mm256_loadu_ps(h + TILE_ROWS),                                  \
                                   _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[1] : p.min), mins);       \
        } else if (offset || p.min != 0.0f) {                                                       \
            mins = _mm256_fmadd_ps(_mm256_loadu_ps(x->s + b * TILE_ROWS),                           \
                                   _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[0] : p.min), mins);       \
        }                                                                                           \
        for (int j = 0; j < R; j++) {                                                               \
            __m256i xq = _mm256_loadu_si256((const __m256i *)(x->q + j * k + 32 * b));              \
            __m256i xr = _mm256_loadu_si256((const __m256i *)(x->r + j * k + 32 * b));              \
            __m256 sums = _mm256_cvtepi32_ps(int_dot(w, xq, xr, is_signed));                        \
            __m256 f = TWO_SCALES ? _mm256_set_m128(_mm_broadcast_ss(&scaled[1][j]), _mm_broadcast_ss(&scaled[0][j])) \
                                  : _mm256_broadcast_ss(&scaled[0][j]);                             \
            acc[j] = _mm256_fmadd_ps(sums, f, acc[j]);                                              \
        }                                                                                           \
    }                                                                                               \
    float min_of[TILE_ROWS];                                                                        \
    _mm256_storeu_ps(min_of, mins);                                                                 \
    min_of[0] += min_one;                                                                           \
    for (int j = 0; j < R; j++) out[j] = hsum256(acc[j]) + min_of[j];                              \
}

#else
/* ---------------------------------------------------------------- portable */
#define DEFINE_ROWS(NAME, OFFSET, IS_SIGNED, TWO_SCALES)                                            \
static inline void NAME##_tile(const uint8_t *row, const q8_rows *x, const int R, float *out) {     \
    const int64_t nb = x->k / 32, k = x->k;                                                         \
    float acc[TILE_ROWS] = {0.0f};                                                                  \
    for (int64_t b = 0; b < nb; b++) {                                                              \
        block_params p;                                                                             \
        uint8_t q[32];                                                                              \
        int8_t w[32];                                                                               \
        NAME##_params(row, b, &p);                                                                  \
        NAME##_quants(row, b, q);                                                                   \
        for (int e = 0; e < 32; e++) w[e] = IS_SIGNED ? (int8_t)q[e] : (int8_t)(q[e] - OFFSET);     \
        for (int j = 0; j < R; j++) {                                                               \
            const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;                  \
            int32_t lo = 0, hi = 0, rlo = 0, rhi = 0;                                               \
            for (int e = 0; e < 16; e++) { lo += w[e] * xq[e]; hi += w[e + 16] * xq[e + 16]; }      \
            for (int e = 0; e < 16; e++) { rlo += w[e] * xr[e]; rhi += w[e + 16] * xr[e + 16]; }    \
            float flo = (float)((lo << RESIDUAL_SHIFT) + rlo), fhi = (float)((hi << RESIDUAL_SHIFT) + rhi); \
            acc[j] += x->d[b * x->lanes + j] * (p.scale[0] * flo + p.scale[1] * fhi)                \
                      + p.min * x->s[b * x->lanes + j];                                             \
        }                                                                                           \
    }                                                                                               \
    for (int j = 0; j < R; j++) out[j] = acc[j];                                                    \
}
#endif

/* The tile at a constant row count (1..TILE_ROWS), so each is compiled for its count. */
#define DEFINE_TILES(NAME)                                                                          \
static void NAME##_rows(const uint8_t *row, const q8_rows *x, int64_t rows, float *out) {           \
    switch (rows) {                                                                                 \
        case 1: NAME##_tile(row, x, 1, out); break;                                                 \
        case 2: NAME##_tile(row, x, 2, out); break;                                                 \
        case 3: NAME##_tile(row, x, 3, out); break;                                                 \
        case 4: NAME##_tile(row, x, 4, out); break;                                                 \
        case 5: NAME##_tile(row, x, 5, out); break;                                                 \
        case 6: NAME##_tile(row, x, 6, out); break;                                                 \
        case 7: NAME##_tile(row, x, 7, out); break;                                                 \
        default: NAME##_tile(row, x, 8, out); break;                                                \
    }                                                                                               \
}

#define ROWS_OF(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES) \
    DEFINE_ROWS(NAME, OFFSET, IS_SIGNED, TWO_SCALES) DEFINE_TILES(NAME)
FOR_EACH_FORMAT(ROWS_OF)


/* the passes of x the K-quants meet here (activations.h; inferpath_set_k_quant_x_passes):
 * a decode step's few rows, and a prompt-sized call's */
static int k_quant_x_passes = K_QUANT_X_PASSES, k_quant_prompt_x_passes = K_QUANT_PROMPT_X_PASSES;

/* the passes a call of m rows of x meets (flags: prepared.h's; either keeps the decode count) */
static int passes_for(int64_t m, int flags) {
    return m >= PROMPT_MIN_ROWS && !flags ? k_quant_prompt_x_passes : k_quant_x_passes;
}

/* (values per block, bytes per block) of a format; 0 if not one of ours */
static int format_of(int qtype, int64_t *block, int64_t *bytes, rows_fn *fn) {
    switch (qtype) {
#define FORMAT_CASE(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES) \
        case TYPE: *block = BLOCK; *bytes = BYTES; *fn = eight_block_rows(TYPE) ? eight_block_rows(TYPE) : NAME##_rows; return 1;
        FOR_EACH_FORMAT(FORMAT_CASE)
        case MXFP4: *block = 32; *bytes = MXFP4_BYTES; *fn = mxfp4_rows; return 1;  /* mxfp4.c */
        case Q4_K_R8: case Q5_K_R8: case Q6_K_R8: *block = 256; *bytes = r8_row_bytes(qtype); *fn = 0; return 1;  /* r8.c */
        case Q8_0_R8: case Q5_0_R8: case Q4_1_R8: *block = 32; *bytes = r8_legacy_row_bytes(qtype); *fn = 0; return 1;  /* r8_legacy.c */
        default: return 0;
    }
}

/* Several weights against one x, as one matmul: weight i is ns[i] rows of row_bytes[i]
 * (k values each, format qtypes[i]), bias i (ns[i],) or NULL; x (m, k); y (m, sum ns) with
 * the weights' outputs side by side (a fused Q/K/V or gate/up projection, read in place
 * from three or two tensors of the file). x is quantized once (quant_prepare), then the
 * output columns are computed in ranges (quant_columns), split over the decode pool
 * (here as in decode.c). flags (prepared.h): QUANT_ROWS_ALONE, every row through the row
 * kernel, whatever m (a row's result then never depends on the rows beside it: batch
 * invariance); QUANT_DECODE_PASSES, x in the decode step's passes whatever m; else tiles
 * of WIDE_MIN_ROWS rows or more take the wide kernel (AVX2), or m >= GEMM_MIN_ROWS takes
 * gemm.c's panels (AVX-512 VNNI). Returns 0, -1 for a bad format or
 * shape, -2 out of memory. */
/* Less work than this runs on the calling thread alone: waking the other threads (a futex
 * each once they sleep, tens of microseconds) costs more than it saves; a
 * decode step's small projections (SmolLM2's Q/K/V and O: 0.3-0.6 M multiply-adds, ~30 us
 * on one core) stay on one thread, the MLP and the LM head split. */
#define PARALLEL_MIN_MACS (1 << 20)

/* whether gemm.c's panels take a weight of ``qtype`` in q's call (repacked ones from
 * R8_GEMM_MIN_ROWS rows: under it r8.c's pairs are faster) */
static int gemm_serves(const quant_matmul *q, int qtype) {
    return q->use_gemm && (!r8_grouped(qtype) || q->m >= R8_GEMM_MIN_ROWS);
}

int quant_prepare(quant_matmul *q, int count, const int *qtypes, const uint8_t *const *ws, const int64_t *row_bytes,
                  const int64_t *ns, const float *const *biases, const float *x, int64_t m, int64_t k,
                  int num_threads, int flags) {
    const int rows_alone = flags & QUANT_ROWS_ALONE;
    if (count < 1 || count > MAX_GROUP || m < 1 || k < 32) return -1;
    q->count = count, q->ws = ws, q->row_bytes = row_bytes, q->biases = biases, q->m = m, q->k = k, q->xd1 = 0;
    q->starts[0] = 0;
    for (int i = 0; i < count; i++) {
        int64_t block, bytes;
        if (!format_of(qtypes[i], &block, &bytes, &q->fns[i]) || ns[i] < 1 || k < block || k % block
            || row_bytes[i] != k / block * bytes)
            return -1;
        if (r8_grouped(qtypes[i]) && ns[i] % R8_ROWS) return -1;  /* whole groups of eight rows */
        q->starts[i + 1] = q->starts[i] + ns[i];
        q->qtypes[i] = qtypes[i];
    }
    q->one_pass = passes_for(m, flags) == 1;
    for (int i = 0; i < count; i++) q->one_pass = q->one_pass && k_quant_format(qtypes[i]);
    int64_t nb = k / 32;
    q->n = q->starts[count], q->tiles = (m + TILE_ROWS - 1) / TILE_ROWS;
    q->use_gemm = m >= GEMM_MIN_ROWS && !rows_alone && gemm_ready() && !mxfp4_in(qtypes, count);
    q->use_wide = m >= WIDE_MIN_ROWS && !rows_alone && !q->use_gemm;
    q->gemm_panels = 0;
    for (int i = 0; i < count; i++) q->gemm_panels |= gemm_serves(q, qtypes[i]);
    for (int i = 0; i < count; i++)  /* repacked weights (r8.c) take their own kernel: not counted */
        q->use_wide = q->use_wide && (r8_grouped(qtypes[i]) || (q->wides[i] = wide_kernel(qtypes[i])) != 0);
    int64_t padded = q->tiles * TILE_ROWS;
    q->xq = (int8_t *)malloc((size_t)((q->use_wide ? 4 : 2) * padded * k)), q->xr = q->xq + m * k;
    int64_t lanes = padded * nb;  /* per-block scalars, tile-major */
    const int unshifted = q->use_gemm && q->one_pass;
    /* xd, xs, xh (two lanes a block), xc (int32, a float's size), then xd1 where it is kept */
    q->xd = (float *)calloc((size_t)((unshifted ? 6 : 5) * lanes), sizeof(float)), q->xs = q->xd + lanes, q->xh = q->xs + lanes;
    q->xc = q->xd ? (int32_t *)(q->xh + 2 * lanes) : 0;
    q->xd1 = unshifted && q->xd ? q->xh + 3 * lanes : 0;
    if (!q->xq || !q->xd) { quant_release(q); return -2; }
    q->wq = q->use_wide ? q->xq + 2 * padded * k : 0, q->wr = q->use_wide ? q->wq + padded * k : 0;  /* interleaved */
    if (q->use_wide && padded > m) {  /* the last tile's missing rows: zero lanes */
        memset(q->wq + (padded - TILE_ROWS) * k, 0, (size_t)(TILE_ROWS * k));
        memset(q->wr + (padded - TILE_ROWS) * k, 0, (size_t)(TILE_ROWS * k));
    }
    quantize_rows(x, m, k, q->xq, q->xr, q->xd, q->xs, q->xh, q->xc, q->wq, q->wr, q->one_pass, num_threads);
    /* The GEMM's panels meet one-pass x with their sums unshifted: s << RESIDUAL_SHIFT is s * 256
     * exactly (|s| < 2^21), and so are xd * 256 and scale * (xd * 256) = (scale * xd) * 256
     * (normal floats), so each fma's product, and so its result, are the shifted form's bits. */
    if (q->xd1)
        for (int64_t i = 0; i < lanes; i++) q->xd1[i] = q->xd[i] * RESIDUAL_STEPS;
    return 0;
}

void quant_release(quant_matmul *q) {
    free(q->xq); free(q->xd);
    q->xq = 0, q->xd = 0, q->xd1 = 0, q->xc = 0;
}

/* Output columns [c0, c1) of y (m, n), all of weight i (not repacked): for each tile of x,
 * each column's weight row (a tile of x and a range of weight rows stay in cache while
 * they meet). */
static void row_columns(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1) {
    const int64_t k = q->k, nb = k / 32, m = q->m, n = q->n;
    for (int64_t t = 0; t < q->tiles; t++) {
        int64_t j0 = t * TILE_ROWS, rows = m - j0 < TILE_ROWS ? m - j0 : TILE_ROWS;
        const float *d = q->xd + j0 * nb, *sx = q->xs + j0 * nb, *h = q->xh + 2 * j0 * nb;
        q8_rows xj = {q->xq + j0 * k, q->xr + j0 * k, d, sx, h, k, lanes_for(m), q->one_pass, q->xc + j0 * nb};
        wide_rows xw = {q->wq + j0 * k, q->wr + j0 * k, d, sx, h, k, q->one_pass};
        for (int64_t r = c0; r < c1; r++) {
            int64_t local = r - q->starts[i];
            const uint8_t *row = q->ws[i] + local * q->row_bytes[i];
            r8_prefetch(row, q->row_bytes[i]);  /* the rows ahead (r8.h): rows lie end to end */
            float add = q->biases[i] ? q->biases[i][local] : 0.0f, out[TILE_ROWS];
            if (q->use_wide && rows >= WIDE_MIN_ROWS) q->wides[i](row, &xw, out);
            else q->fns[i](row, &xj, rows, out);
            for (int64_t j = 0; j < rows; j++) y[(j0 + j) * n + r] = out[j] + add;
        }
    }
}

/* The same for a repacked weight (r8.c, r8_legacy.c): groups of eight columns, each against a tile of
 * x at once. A range that starts or ends inside a group computes the whole group and keeps
 * its columns (decode.c's and the pool's chunks are multiples of 16: whole groups where
 * the group's weights start at multiples of 8). */
static void r8_span(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1);

/* Where x has several tiles, the columns go by spans of about R8_SPAN_BYTES of weights, each
 * meeting every tile before the next: a span stays in L2 while the tiles pass, where the
 * whole range (a chunk of a prompt's gate/up: ~1 MB at 2 threads) came from memory again
 * for each tile of 8 rows. The same operations per output: the same bits. */
#define R8_SPAN_BYTES (192 << 10)

static void r8_columns(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1) {
    if (q->tiles == 1) { r8_span(q, i, y, c0, c1); return; }
    int64_t span = R8_SPAN_BYTES / q->row_bytes[i] / (2 * R8_ROWS) * (2 * R8_ROWS);  /* whole pairs of groups */
    if (span < 2 * R8_ROWS) span = 2 * R8_ROWS;
    const int64_t start = q->starts[i];
    for (int64_t lo = c0; lo < c1;) {  /* span ends on group boundaries of the weight */
        int64_t hi = start + ((lo - start) / R8_ROWS * R8_ROWS) + span;
        if (hi > c1) hi = c1;
        r8_span(q, i, y, lo, hi);
        lo = hi;
    }
}

/* group g's outputs (its lanes in out, rows of width floats from lane 0) into y's columns
 * [c0, c1), bias added */
static void r8_store(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1, int64_t g, const float *out,
                     int64_t width, int64_t j0, int64_t rows) {
    const int64_t start = q->starts[i], n = q->n;
    int64_t lo = start + g * R8_ROWS, hi = lo + R8_ROWS;
    lo = lo < c0 ? c0 : lo, hi = hi > c1 ? c1 : hi;
    for (int64_t r = lo; r < hi; r++) {
        const int64_t local = r - start, lane = local - g * R8_ROWS;
        const float add = q->biases[i] ? q->biases[i][local] : 0.0f;
        for (int64_t j = 0; j < rows; j++) y[(j0 + j) * n + r] = out[j * width + lane] + add;
    }
}

/* group g alone (r8.c's or r8_legacy.c's kernel), its outputs stored */
static void r8_single(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1, int64_t g, const q8_rows *x,
                      int64_t j0, int64_t rows, float *out) {
    const uint8_t *group = q->ws[i] + g * R8_ROWS * q->row_bytes[i];
    if (r8_legacy_format(q->qtypes[i])) r8_legacy_rows(q->qtypes[i], group, x, rows, out);
    else r8_rows(q->qtypes[i], group, x, rows, out);
    r8_store(q, i, y, c0, c1, g, out, R8_ROWS, j0, rows);
}

/* The groups [g0, g1) touching columns [c0, c1) go as pairs of the range's halves, group
 * g0 + p with g0 + half + p (r8_pair.c: two straight streams, r8.h's r8_prefetch_pair),
 * an odd one alone; a 32-value format's tiles of 3 rows or more as adjacent pairs (r8.h);
 * where r8_pair.c does not run, group by group. Each group's outputs are its own chain's
 * whichever group it is paired with: the same bits either way. */
static void r8_span(const quant_matmul *q, int i, float *y, int64_t c0, int64_t c1) {
    const int64_t k = q->k, nb = k / 32, m = q->m, start = q->starts[i];
    const int64_t group_bytes = R8_ROWS * q->row_bytes[i];
    const int64_t g0 = (c0 - start) / R8_ROWS, g1 = (c1 - start + R8_ROWS - 1) / R8_ROWS, half = (g1 - g0) / 2;
    const int qtype = q->qtypes[i];
    for (int64_t t = 0; t < q->tiles; t++) {
        int64_t j0 = t * TILE_ROWS, rows = m - j0 < TILE_ROWS ? m - j0 : TILE_ROWS;
        q8_rows xj = {q->xq + j0 * k, q->xr + j0 * k, q->xd + j0 * nb, q->xs + j0 * nb, q->xh + 2 * j0 * nb, k,
                      lanes_for(m), q->one_pass, q->xc + j0 * nb};
        const int adjacent = rows > 2 && r8_legacy_format(qtype);
        float out[TILE_ROWS * 2 * R8_ROWS];
        if (!r8_pairs_ready()) {  /* group by group, in order: one straight stream (the halves 1.02-1.13x slower at avx2) */
            for (int64_t g = g0; g < g1; g++) r8_single(q, i, y, c0, c1, g, &xj, j0, rows, out);
            continue;
        }
        for (int64_t p = 0; p < half; p++) {
            const int64_t a = adjacent ? g0 + 2 * p : g0 + p, b = adjacent ? a + 1 : g0 + half + p;
            if (r8_pair_rows(qtype, q->ws[i] + a * group_bytes, (b - a) * group_bytes, &xj, rows, out)) {
                r8_store(q, i, y, c0, c1, a, out, 2 * R8_ROWS, j0, rows);
                r8_store(q, i, y, c0, c1, b, out + R8_ROWS, 2 * R8_ROWS, j0, rows);
                continue;
            }
            r8_single(q, i, y, c0, c1, a, &xj, j0, rows, out);  /* not taken where pairs are ready */
            r8_single(q, i, y, c0, c1, b, &xj, j0, rows, out);
        }
        if ((g1 - g0) % 2) r8_single(q, i, y, c0, c1, g1 - 1, &xj, j0, rows, out);  /* the last group alone */
    }
}

/* Output columns [c0, c1) of y (m, n), weight by weight: repacked ones through r8.c, the
 * others through gemm.c's panels (use_gemm) or the row and wide kernels; repacked ones
 * of R8_GEMM_MIN_ROWS rows or more through gemm.c's panels too, packed from the groups. */
void quant_columns(const quant_matmul *q, float *y, int64_t c0, int64_t c1) {
    for (int i = 0; i < q->count; i++) {
        const int64_t lo = c0 > q->starts[i] ? c0 : q->starts[i], hi = c1 < q->starts[i + 1] ? c1 : q->starts[i + 1];
        if (lo >= hi) continue;
        if (gemm_serves(q, q->qtypes[i]) && gemm_columns(q, y, lo, hi) == 0) continue;
        if (r8_grouped(q->qtypes[i])) r8_columns(q, i, y, lo, hi);
        else row_columns(q, i, y, lo, hi);
    }
}

/* Output columns split over decode.c's pool (drivers/pool.c): chunks claimed one at a time
 * from either end, so a thread whose core is taken leaves its share to the other (OpenMP's
 * static split waited for it: an LM head of 191 MB is 10-20 ms at 2 threads), and a
 * decode step's head runs on the same warm workers as its layers. */
typedef struct {
    const quant_matmul *q;
    float *y;
    int64_t n, columns;
} columns_job;

static void columns_task(void *ctx, int64_t chunk) {
    const columns_job *job = (const columns_job *)ctx;
    int64_t c0 = chunk * job->columns, c1 = c0 + job->columns < job->n ? c0 + job->columns : job->n;
    quant_columns(job->q, job->y, c0, c1);
}

int inferpath_quant_matmul_group(int count, const int *qtypes, const uint8_t *const *ws, const int64_t *row_bytes,
                                 const int64_t *ns, const float *const *biases, const float *x, float *y,
                                 int64_t m, int64_t k, int num_threads, int flags) {
    quant_matmul q;
    int status = quant_prepare(&q, count, qtypes, ws, row_bytes, ns, biases, x, m, k, num_threads, flags);
    if (status) return status;
    const int64_t n = q.n;
    const int threads = m * n * k >= PARALLEL_MIN_MACS ? num_threads : 1;
    /* GEMM panels: a chunk of one panel; else about 8 chunks a thread, of 16 columns or more */
    int64_t columns = q.gemm_panels ? GEMM_PANEL : (n / (8 * (int64_t)threads) + 15) / 16 * 16;
    columns_job job = {&q, y, n, columns < 16 ? 16 : columns};
    pool_run(threads, columns_task, &job, (n + job.columns - 1) / job.columns);
    quant_release(&q);
    return 0;
}

/* the int8 passes of x the K-quants meet in this library (activations.h), 1 or 2, in a
 * call of m rows (flags as quant_prepare's); set before a call, never during one: passes
 * for the calls under PROMPT_MIN_ROWS rows (and those with flags), prompt_passes for the
 * others */
int inferpath_k_quant_x_passes(int64_t m, int flags) { return passes_for(m, flags); }
int inferpath_k_quant_prompt_min_rows(void) { return PROMPT_MIN_ROWS; }
int inferpath_set_k_quant_x_passes(int passes, int prompt_passes) {
    if (passes < 1 || passes > 2 || prompt_passes < 1 || prompt_passes > 2) return -1;
    k_quant_x_passes = passes, k_quant_prompt_x_passes = prompt_passes;
    return 0;
}

/* w: n rows of row_bytes (k values each in format qtype); x (m, k), bias (n,) or NULL,
 * y (m, n), all float32: a group of one. */
int inferpath_quant_matmul(int qtype, const uint8_t *w, int64_t row_bytes, const float *x, const float *bias,
                           float *y, int64_t m, int64_t n, int64_t k, int num_threads, int flags) {
    return inferpath_quant_matmul_group(1, &qtype, &w, &row_bytes, &n, &bias, x, y, m, k, num_threads, flags);
}

#if defined(__AVX2__)
/* 32 values of a block: scale[e / 16] * (q - OFFSET) + min, rounded as the scalar form
 * (a multiply, then an add: never fused, so that the values equal the gguf package's) */
static inline void __attribute__((optimize("fp-contract=off")))
dequant_block(__m256i q, const block_params *p, int offset, int is_signed, float *dst) {
    __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int c = 0; c < 4; c++) {
        __m128i bytes = c % 2 ? _mm_srli_si128(halves[c / 2], 8) : halves[c / 2];
        __m256i ints = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
        __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(ints, _mm256_set1_epi32(offset)));
        v = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(p->scale[c / 2]), v), _mm256_set1_ps(p->min));
        _mm256_storeu_ps(dst + 8 * c, v);
    }
}
#define DEQUANT_CASE(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES)                      \
    case TYPE:                                                                                      \
        for (int64_t b = 0; b < k / 32; b++) {                                                      \
            block_params p;                                                                         \
            NAME##_params(row, b, &p);                                                              \
            dequant_block(NAME##_vec(row, b), &p, OFFSET, IS_SIGNED, dst + 32 * b);                 \
        }                                                                                           \
        break;
#else
#define DEQUANT_CASE(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES)                      \
    case TYPE:                                                                                      \
        for (int64_t b = 0; b < k / 32; b++) {                                                      \
            block_params p;                                                                         \
            uint8_t q[32];                                                                          \
            NAME##_params(row, b, &p);                                                              \
            NAME##_quants(row, b, q);                                                               \
            for (int e = 0; e < 32; e++)                                                            \
                dst[32 * b + e] = p.scale[e / 16] * (float)(IS_SIGNED ? (int)(int8_t)q[e] : (int)q[e] - OFFSET) + p.min; \
        }                                                                                           \
        break;
#endif

/* rows of w (row_bytes each, k values) -> out (rows, k) float32. Same return codes. */
int inferpath_quant_dequantize(int qtype, const uint8_t *w, int64_t row_bytes, float *out, int64_t rows, int64_t k,
                               int num_threads) {
    int64_t block, bytes;
    rows_fn fn;
    if (!format_of(qtype, &block, &bytes, &fn) || rows < 1 || k < block || k % block || row_bytes != k / block * bytes)
        return -1;
    if (r8_grouped(qtype)) {  /* whole groups of eight rows (r8.c, r8_legacy.c) */
        if (rows % R8_ROWS) return -1;
        if (r8_legacy_format(qtype)) r8_legacy_dequantize(qtype, w, rows, k, out, num_threads);
        else r8_dequantize(qtype, w, rows, k, out, num_threads);
        return 0;
    }
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * k >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * row_bytes;
        float *dst = out + r * k;
        switch (qtype) {
            FOR_EACH_FORMAT(DEQUANT_CASE)
            case MXFP4: mxfp4_dequantize_row(row, k, dst); break;
        }
    }
    return 0;
}
