/* x's rows quantized to int8 for the dot products (matmul.c, wide.c): two int8 passes per
 * value, q and the residual r, and per-block scalars laid out tile by tile. */
#ifndef INFERPATH_QUANT_ACTIVATIONS_H
#define INFERPATH_QUANT_ACTIVATIONS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* A row tile: one weight row against up to TILE_ROWS rows of x. */
#define TILE_ROWS 8

/* Rows of x quantized. The per-block scalars are laid out tile by tile, block by block,
 * a lane per row of the tile ([m / TILE_ROWS][k / 32][TILE_ROWS], unused lanes zero), so
 * that a tile's eight values for one block are one vector; a single row (a decode step)
 * has one lane ([k / 32]: lanes_for), so that its scalars stay in L1 beside its values
 * (k = 8960: 4.5 KB, where eight lanes took 35 KB). */
typedef struct {
    const int8_t *q;   /* (m, k) */
    const int8_t *r;   /* (m, k): the residual x / d_x - q in steps of 1 / RESIDUAL_STEPS */
    const float *d;    /* d_x / RESIDUAL_STEPS per block */
    const float *s;    /* d_x * sum(q + r / RESIDUAL_STEPS) over the block */
    const float *h;    /* the same sum over each half block: [..][k / 32][2][lanes] */
    int64_t k, lanes;  /* lanes: lanes_for(m) */
    int one_pass;      /* r is all zero (K-quants in one pass): the row kernels may skip it */
    const int32_t *c;  /* per block, the sum of x in the dots' integer units: sum(q) in one pass, else
                        * 256 sum(q) + sum(r) (lanes as d; r8_pair.c's Q8_0 meets w + 128 and takes
                        * 128 c back off, exactly); NULL where no kernel needs it */
} q8_rows;

/* lanes a tile's per-block scalars have: one for a single row, else TILE_ROWS */
static inline int64_t lanes_for(int64_t m) { return m == 1 ? 1 : TILE_ROWS; }

/* where row j's value for block b lies in a tile-major array of ``lanes`` lanes, and its
 * half-block pair */
static inline int64_t lane_of(int64_t j, int64_t b, int64_t nb, int64_t lanes) {
    return (j / lanes * nb + b) * lanes + j % lanes;
}
static inline int64_t half_lane_of(int64_t j, int64_t b, int64_t nb, int half, int64_t lanes) {
    return ((j / lanes * nb + b) * 2 + half) * lanes + j % lanes;
}

/* x = d_x (q + r / RESIDUAL_STEPS) + e with |e| <= d_x / 512: the residual |x/d_x - q| <=
 * 1/2 is itself rounded to int8, so the activations carry ~15 bits through two int8 dot
 * products, summed in int32 as (w.q << RESIDUAL_SHIFT) + w.r. One pass alone (q8_0)
 * flipped 1.9% of SmolLM2's greedy tokens against its float32 self over 520 tokens of
 * text; two flip none of them. The 32-value formats keep two passes at every level: in one,
 * teacher-forced top-1 agreement with the dequantized file fell to 97.3% (SmolLM2) and
 * 97.9% (the packaged 0.5B), under the tests' 99% (docs/speculative.md, 2026-12-08). */
#define RESIDUAL_SHIFT 8
#define RESIDUAL_STEPS 256.0f

/* How many int8 passes of x the K-quants (Q4_K, Q5_K, Q6_K) meet, per level.
 *
 * One pass (the avx512 level): r is zero, so s and h are the sums of q alone and every
 * kernel's (w.q << RESIDUAL_SHIFT) + w.r is w.q scaled exactly by 256. llama.cpp's K-quant
 * path quantizes x to one int8 pass per 256 values (its Q8_K); one per 32 is as fine or
 * finer. The second pass doubles the VNNI row kernel's integer work per weight, and at one
 * thread that kernel is bound by its instructions (docs/kquant_kernels.md).
 *
 * Two passes (avx2 and the portable level), as the 32-value formats: one pass put the 1.5B
 * Q4_K_M file at 98.85% top-1 agreement with its dequantized self at avx2 (514 of 520
 * tokens; the test asks 99%: its logits ~0.18 from the reference at the median position),
 * two at 100% (logits within 0.005), for ~0.9x the row kernel's rate alone at one thread and
 * a decode step within that run's noise (a 2-core AMD EPYC with AVX2 only, 2026-12-03;
 * docs/kquant_kernels.md). The avx512 level measured 99.04% with one pass and keeps it.
 *
 * A group of weights (a fused Q/K/V) takes one pass only if all of its formats do. */
#if defined(__AVX512F__)
#define K_QUANT_X_PASSES 1
#else
#define K_QUANT_X_PASSES 2
#endif
/* That is each library's default for a decode step's rows; inferpath_set_k_quant_x_passes
 * (matmul.c) changes it for the library (INFERPATH_KQUANT_X_PASSES, and the tests that hold
 * two levels to the same bits).
 *
 * A prompt-sized call (PROMPT_MIN_ROWS rows of x or more, no prepared.h flag) meets x in
 * K_QUANT_PROMPT_X_PASSES at every level: one. There the kernels are bound by their
 * integer work, not by the weight stream, and the second pass doubles it: at the avx2 level
 * (an AMD EPYC Zen 4, one thread, 512 rows, repacked) Q4_K 8960 x 1536 ran 1.56x and Q6_K
 * 1536 x 8960 2.2x as fast in one pass. The LM head keeps the decode count
 * (QUANT_DECODE_PASSES: its rows are the sampled ones, few, except for prompt logprobs):
 * so the 1.5B file's 520 rows together, repacked, at avx2 agree 515 / 520 with its
 * dequantized self (the head in one pass too: 514; llama.cpp on the same tokens: 513;
 * docs/kquant_kernels.md). QUANT_ROWS_ALONE (--deterministic) keeps the decode count
 * whatever the rows, so a row's bits never depend on the call's size.
 * inferpath_set_k_quant_x_passes sets both counts (INFERPATH_KQUANT_X_PASSES both,
 * INFERPATH_KQUANT_PROMPT_X_PASSES the prompts'). */
#define K_QUANT_PROMPT_X_PASSES 1
#define PROMPT_MIN_ROWS 32
static inline int k_quant_format(int qtype) {
    return qtype == Q4_K || qtype == Q5_K || qtype == Q6_K || qtype == Q4_K_R8 || qtype == Q5_K_R8 || qtype == Q6_K_R8;
}

/* Where value e (a multiple of 4) of row i's block b lies in the interleaved copy the
 * wide kernel reads (wide.c): per tile of TILE_ROWS rows, per block and per group of four
 * values, the tile's rows' four bytes side by side (32 bytes: a 32-bit lane per row). */
static inline int64_t interleaved_at(int64_t i, int64_t b, int e, int64_t nb) {
    return ((i / TILE_ROWS * nb + b) * 8 + e / 4) * 4 * TILE_ROWS + 4 * (i % TILE_ROWS);
}

/* One block of 32 values: q and r (32 each), and the sums of q and of r per half. */
#if defined(__AVX2__)
#include <immintrin.h>
static inline float block_amax(const float *xb) {
    __m256 sign = _mm256_set1_ps(-0.0f), m = _mm256_setzero_ps();
    for (int c = 0; c < 4; c++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * c)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
/* 32 int32 (four registers, values in order) -> 32 int8 in order */
static inline __m256i pack_bytes(const __m256i *v) {
    __m256i words = _mm256_packs_epi32(v[0], v[1]), words2 = _mm256_packs_epi32(v[2], v[3]);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words2), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
static inline void quantize_block(const float *xb, float inv, int8_t *q, int8_t *r, int *sums, int *residual_sums,
                                  int one_pass) {
    __m256i whole_i[4], rest_i[4];
    for (int c = 0; c < 4; c++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * c), _mm256_set1_ps(inv));
        __m256 whole = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 rest = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v, whole), _mm256_set1_ps(RESIDUAL_STEPS)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        rest = _mm256_min_ps(_mm256_max_ps(rest, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        if (one_pass) rest = _mm256_setzero_ps();
        whole_i[c] = _mm256_cvtps_epi32(whole);
        rest_i[c] = _mm256_cvtps_epi32(rest);
    }
    _mm256_storeu_si256((__m256i *)q, pack_bytes(whole_i));
    _mm256_storeu_si256((__m256i *)r, pack_bytes(rest_i));
    sums[0] = hsum_epi32(_mm256_add_epi32(whole_i[0], whole_i[1]));
    sums[1] = hsum_epi32(_mm256_add_epi32(whole_i[2], whole_i[3]));
    residual_sums[0] = hsum_epi32(_mm256_add_epi32(rest_i[0], rest_i[1]));
    residual_sums[1] = hsum_epi32(_mm256_add_epi32(rest_i[2], rest_i[3]));
}
#else
static inline float block_amax(const float *xb) {
    float amax = 0.0f;
    for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(xb[e]));
    return amax;
}
static inline void quantize_block(const float *xb, float inv, int8_t *q, int8_t *r, int *sums, int *residual_sums,
                                  int one_pass) {
    sums[0] = sums[1] = residual_sums[0] = residual_sums[1] = 0;
    for (int e = 0; e < 32; e++) {
        float v = xb[e] * inv;
        float whole = nearbyintf(v);
        float rest = nearbyintf((v - whole) * RESIDUAL_STEPS);
        rest = one_pass ? 0.0f : fminf(fmaxf(rest, -127.0f), 127.0f);
        q[e] = (int8_t)whole;
        r[e] = (int8_t)rest;
        sums[e / 16] += (int)whole;
        residual_sums[e / 16] += (int)rest;
    }
}
#endif

/* A block's scale (amax / 127) and its inverse from its largest |value|: a block whose
 * largest value is below 127 / FLT_MAX (subnormal: its inverse overflows, and an infinite
 * or NaN product has no int8 value, which C leaves undefined) takes q = 0, as a block of
 * zeros: every level the same bits */
static inline void block_scales(float amax, float *scale, float *inv) {
    *scale = amax / 127.0f;
    *inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    if (isinf(*inv)) *inv = 0.0f;
}

/* Block b of row j of x (m, k), of scale and inv (block_scales): its q, r and the
 * tile-major scalars (quantize_rows) */
static inline void quantize_one(const float *x, int64_t j, int64_t b, int64_t nb, int64_t lanes, int8_t *q, int8_t *r,
                                float *d, float *s, float *h, int32_t *c, int8_t *wq, int8_t *wr, int one_pass,
                                float scale, float inv) {
    const int64_t i = j * nb + b;
    const float *xb = x + i * 32;
    int sums[2], residual_sums[2];
    quantize_block(xb, inv, q + i * 32, r + i * 32, sums, residual_sums, one_pass);
    if (wq)
        for (int e = 0; e < 32; e += 4) {
            memcpy(wq + interleaved_at(j, b, e, nb), q + i * 32 + e, 4);
            memcpy(wr + interleaved_at(j, b, e, nb), r + i * 32 + e, 4);
        }
    float lo = scale * ((float)sums[0] + (float)residual_sums[0] / RESIDUAL_STEPS);
    float hi = scale * ((float)sums[1] + (float)residual_sums[1] / RESIDUAL_STEPS);
    const int64_t lane = lane_of(j, b, nb, lanes);
    d[lane] = scale / RESIDUAL_STEPS;
    s[lane] = lo + hi;
    h[half_lane_of(j, b, nb, 0, lanes)] = lo;
    h[half_lane_of(j, b, nb, 1, lanes)] = hi;
    const int32_t sq = sums[0] + sums[1], sr = residual_sums[0] + residual_sums[1];
    c[lane] = one_pass ? sq : sq * 256 + sr;  /* |c| < 2^21 */
}

/* Run t of x's runs of QUANTIZE_RUN blocks (``runs`` a row): its blocks' maxima and scales
 * first, then their values, three short loops of independent iterations, where one loop
 * whose block ran a long chain (max, divide, round, sum) ran the blocks one after another
 * (5 rows of 576 and 1536 values, AMD Zen 5: 21-23 -> 9-11 ns a block with the OpenMP
 * region below no longer entered for a few rows) */
#define QUANTIZE_RUN 64
static inline void quantize_run(const float *x, int64_t t, int64_t runs, int64_t nb, int64_t lanes, int8_t *q,
                                int8_t *r, float *d, float *s, float *h, int32_t *c, int8_t *wq, int8_t *wr,
                                int one_pass) {
    const int64_t j = t / runs, b0 = t % runs * QUANTIZE_RUN, n = nb - b0 < QUANTIZE_RUN ? nb - b0 : QUANTIZE_RUN;
    float scale[QUANTIZE_RUN], inv[QUANTIZE_RUN];
    for (int64_t b = 0; b < n; b++) scale[b] = block_amax(x + (j * nb + b0 + b) * 32);
    for (int64_t b = 0; b < n; b++) block_scales(scale[b], &scale[b], &inv[b]);
    for (int64_t b = 0; b < n; b++)
        quantize_one(x, j, b0 + b, nb, lanes, q, r, d, s, h, c, wq, wr, one_pass, scale[b], inv[b]);
}

/* x (m, k) -> q, r (m, k) and the tile-major scalars d, s, h, c (q8_rows'); with wq, wr (not NULL:
 * padded to whole tiles, zeroed by the caller) also the interleaved copies. one_pass: r
 * zero (x in one pass: matmul.c's quant_prepare). Runs of blocks over num_threads OpenMP
 * threads where x has 65536 values or more; a decode step's few rows on the calling thread
 * alone (an OpenMP region cost ~0.3 us a call, four calls a layer). */
static inline void quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, int8_t *r, float *d, float *s,
                                 float *h, int32_t *c, int8_t *wq, int8_t *wr, int one_pass, int num_threads) {
    const int64_t nb = k / 32, lanes = lanes_for(m), runs = (nb + QUANTIZE_RUN - 1) / QUANTIZE_RUN;
    if (m * k < 65536 || num_threads < 2) {
        for (int64_t t = 0; t < m * runs; t++) quantize_run(x, t, runs, nb, lanes, q, r, d, s, h, c, wq, wr, one_pass);
        return;
    }
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t t = 0; t < m * runs; t++) quantize_run(x, t, runs, nb, lanes, q, r, d, s, h, c, wq, wr, one_pass);
}

#endif
