/* The K-quants' row kernel at the AVX2 and AVX-512 VNNI levels, eight 32-value blocks (a
 * super-block: Q4_K, Q5_K, Q6_K) at a time: one weight row against up to TILE_ROWS rows of x.
 *
 * matmul.c's row kernel takes one 32-value block at a time, so a K-quant's super-block
 * header (float16 d and dmin, twelve bytes of packed 6-bit scales and mins, or Q6_K's
 * sixteen int8 scales) was decoded eight times, and each block paid its own int -> float
 * conversion, scale broadcast and multiply-add (Q4_K, 1 thread, 8960 x 1536: ~6.5 GB/s of
 * weights against ~20 GB/s of read bandwidth). Here, per group of eight blocks:
 *
 *   - the scales are decoded once, into eight (Q6_K: sixteen) float scales (d * scale_s)
 *     and mins (-dmin * min_s; Q6_K: its offset, -32 * scale),
 *     vectors shared by the tile's rows;
 *   - each block's integer dot product (unpack.h's int_dot_one: x in one int8 pass,
 *     activations.h's one_pass; int_dot where a group shares x with a 32-value format:
 *     two passes, (w.q << RESIDUAL_SHIFT) + w.r in int32) stays an int32 vector of eight
 *     partial sums;
 *     the eight blocks' vectors are reduced together by horizontal adds into one vector of
 *     the eight blocks' (Q6_K: sixteen half blocks') exact sums, converted once and scaled
 *     by one multiply-add against scale * d_x per lane;
 *   - the mins meet x's block sums in one more.
 *
 * The integer sums are exact, so a row's result depends only on its own values and the
 * order of one float32 multiply-add chain over groups: the same whether the row is alone
 * or in a tile of eight (batch invariance holds), and equal to the one-block kernel up to
 * float32 rounding (tests/test_quantized.py bounds both against the gguf package's
 * dequantized weights). The portable level keeps matmul.c's kernel: the spec.
 */
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "activations.h"
#include "prepared.h"

#if defined(__AVX2__)
#include "unpack.h"

/* The eight int32 vectors of a super-block's blocks (each: eight partial sums, lanes 0-3
 * the block's values 0-15) -> lanes [b0lo b1lo b2lo b3lo | b0hi b1hi b2hi b3hi] (u0) and
 * the same for blocks 4-7 (u1), each a half block's exact sum. */
static inline __attribute__((always_inline)) void reduce_halves(const __m256i *s, __m256i *u0, __m256i *u1) {
    __m256i t0 = _mm256_hadd_epi32(s[0], s[1]), t1 = _mm256_hadd_epi32(s[2], s[3]);
    __m256i t2 = _mm256_hadd_epi32(s[4], s[5]), t3 = _mm256_hadd_epi32(s[6], s[7]);
    /* hadd pairs lanes within 128-bit halves: t0 = [b0 01, b0 23, b1 01, b1 23 | b0 45, ..] */
    *u0 = _mm256_hadd_epi32(t0, t1);  /* [b0 0-3, b1 0-3, b2 0-3, b3 0-3 | b0 4-7, .., b3 4-7] */
    *u1 = _mm256_hadd_epi32(t2, t3);
}

/* ... and the whole blocks' sums, in block order [b0 .. b7] */
static inline __attribute__((always_inline)) __m256i reduce_blocks(const __m256i *s) {
    __m256i u0, u1;
    reduce_halves(s, &u0, &u1);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* Q4_K and Q5_K's eight 6-bit scales and mins (blocks.h's k_scale_min, all at once) as
 * int32 lanes of sub-blocks 0..7 */
static inline void k_scales_mins(const uint8_t *packed, __m256i *scales, __m256i *mins) {
    uint32_t a, b, c;
    memcpy(&a, packed, 4), memcpy(&b, packed + 4, 4), memcpy(&c, packed + 8, 4);
    uint64_t sc = (uint64_t)(a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4)) << 32;
    uint64_t mn = (uint64_t)(b & 0x3f3f3f3fu) | (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4)) << 32;
    *scales = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
    *mins = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn));
}

/* block b's fifth bits from a Q5_K's qh[32] (bit b of byte l) as 0x10 */
static inline __m256i k5_high(__m256i qh, int b) {
    __m256i at4 = b <= 4 ? _mm256_slli_epi16(qh, 4 - b) : _mm256_srli_epi16(qh, b - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
}

/* The eight blocks of a super-block unpacked to u8 (Q6_K: its 6 bits, offset not removed) */
static inline __attribute__((always_inline)) void unpack_super(const uint8_t *sb, int qtype, __m256i *w) {
    const __m256i low = _mm256_set1_epi8(0xf);
    if (qtype == Q6_K) {
        const __m256i two = _mm256_set1_epi8(0x30);
        for (int n = 0; n < 2; n++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(sb + 64 * n));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(sb + 64 * n + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * n));
            w[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), two));
            w[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(h, 2), two));
            w[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(h, two));
            w[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                           _mm256_and_si256(_mm256_srli_epi16(h, 2), two));
        }
        return;
    }
    const uint8_t *qs = sb + (qtype == Q5_K ? 48 : 16);
    for (int p = 0; p < 4; p++) {
        __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        w[2 * p] = _mm256_and_si256(bytes, low);
        w[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
    }
    if (qtype == Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + 16));
        for (int b = 0; b < 8; b++) w[b] = _mm256_or_si256(w[b], k5_high(qh, b));
    }
}

/* A super-block's weights and scales, as the rows meet them: w[b] block b's u8 values;
 * scale and min vectors in the lane order of the reduction (reduce_blocks; Q6_K:
 * reduce_halves, a and b for its two halves). */
typedef struct {
    __m256i w[8];
    __m256 scale_a, scale_b, min_a, min_b;
} group8;

/* unit: 1, or RESIDUAL_STEPS where x is in one pass (its sums unshifted; exact in float) */
static inline __attribute__((always_inline)) void k_group(const uint8_t *sb, const int qtype, const float unit,
                                                           group8 *g) {
    unpack_super(sb, qtype, g->w);
    if (qtype == Q6_K) {
        const __m256i halves_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        __m256 d = _mm256_set1_ps(half_to_float(sb + 208));
        __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 192)));
        __m256i sc2 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 200)));
        g->scale_a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(sc, halves_order)));
        g->scale_b = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(sc2, halves_order)));
        g->min_a = _mm256_mul_ps(_mm256_set1_ps(-32.0f), g->scale_a);  /* the offset: -32 * scale */
        g->min_b = _mm256_mul_ps(_mm256_set1_ps(-32.0f), g->scale_b);
        g->scale_a = _mm256_mul_ps(g->scale_a, _mm256_set1_ps(unit));
        g->scale_b = _mm256_mul_ps(g->scale_b, _mm256_set1_ps(unit));
        return;
    }
    float d, dmin;
    half_pair(sb, &d, &dmin);
    __m256i sc, mn;
    k_scales_mins(sb + 4, &sc, &mn);
    g->scale_a = _mm256_mul_ps(_mm256_set1_ps(d * unit), _mm256_cvtepi32_ps(sc));
    g->min_a = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(mn));
}

/* A group's contribution to rows 0..R-1 of x: blocks [first, first + 8). */
static inline __attribute__((always_inline)) void meet_rows(const group8 *g, const q8_rows *x, const int R,
                                                             int64_t first, const int qtype, const int one_pass,
                                                             __m256 *acc, __m256 *mins) {
    const int64_t k = x->k, lanes = x->lanes;
    const __m256i by8 = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
    const __m256i halves_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int j = 0; j < R; j++) {
        const int8_t *xq = x->q + j * k + 32 * first, *xr = x->r + j * k + 32 * first;
        __m256i s[8];
        for (int b = 0; b < 8; b++)
            s[b] = one_pass ? int_dot_one(g->w[b], _mm256_loadu_si256((const __m256i *)(xq + 32 * b)))
                            : int_dot(g->w[b], _mm256_loadu_si256((const __m256i *)(xq + 32 * b)),
                                      _mm256_loadu_si256((const __m256i *)(xr + 32 * b)), 0);
        /* x's scalars of these blocks (activations.h): one lane (a single row: plain
         * loads), or row j's lane of eight (gathers) */
        const int one = lanes == 1;
        const float *d = x->d + first * lanes + j, *sx = x->s + first * lanes + j, *h = x->h + 2 * first * lanes + j;
        if (qtype == Q6_K) {
            __m256i u0, u1;
            reduce_halves(s, &u0, &u1);
            __m256 dx, dx2, h0, h1;  /* in reduce_halves' order */
            if (one) {
                __m256 blocks = _mm256_loadu_ps(d);
                dx = _mm256_permutevar8x32_ps(blocks, _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
                dx2 = _mm256_permutevar8x32_ps(blocks, _mm256_setr_epi32(4, 5, 6, 7, 4, 5, 6, 7));
                h0 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(h), halves_order);
                h1 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(h + 8), halves_order);
            } else {  /* block b at d[8 b]; half i of block b at h[(2 b + i) * 8] */
                const __m256i dx_of_half = _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24);
                const __m256i at = _mm256_slli_epi32(halves_order, 3);
                dx = _mm256_i32gather_ps(d, dx_of_half, 4), dx2 = _mm256_i32gather_ps(d + 32, dx_of_half, 4);
                h0 = _mm256_i32gather_ps(h, at, 4), h1 = _mm256_i32gather_ps(h + 64, at, 4);
            }
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u0), _mm256_mul_ps(g->scale_a, dx), acc[j]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u1), _mm256_mul_ps(g->scale_b, dx2), acc[j]);
            mins[j] = _mm256_fmadd_ps(g->min_a, h0, mins[j]);
            mins[j] = _mm256_fmadd_ps(g->min_b, h1, mins[j]);
            continue;
        }
        __m256 dx = one ? _mm256_loadu_ps(d) : _mm256_i32gather_ps(d, by8, 4);
        __m256 sums = one ? _mm256_loadu_ps(sx) : _mm256_i32gather_ps(sx, by8, 4);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_blocks(s)), _mm256_mul_ps(g->scale_a, dx), acc[j]);
        mins[j] = _mm256_fmadd_ps(g->min_a, sums, mins[j]);
    }
}

/* One weight row against R rows of x: out[j] = row . x_j, then hsum(acc) + hsum(mins). */
static inline __attribute__((always_inline)) void k_tile_pass(const uint8_t *row, const q8_rows *x, const int R,
                                                               float *out, const int qtype, const int bytes,
                                                               const int one_pass) {
    __m256 acc[TILE_ROWS], mins[TILE_ROWS];
    const float unit = one_pass ? RESIDUAL_STEPS : 1.0f;
    for (int j = 0; j < R; j++) acc[j] = mins[j] = _mm256_setzero_ps();
    for (int64_t t = 0; t < x->k / 256; t++) {
        group8 g;
        k_group(row + (int64_t)bytes * t, qtype, unit, &g);
        meet_rows(&g, x, R, 8 * t, qtype, one_pass, acc, mins);
    }
    for (int j = 0; j < R; j++) out[j] = hsum256(acc[j]) + hsum256(mins[j]);
}

/* x in one int8 pass (activations.h: a group of K-quants alone) or two (one shared with
 * a 32-value format) */
static inline __attribute__((always_inline)) void k_tile(const uint8_t *row, const q8_rows *x, const int R,
                                                          float *out, const int qtype, const int bytes) {
    if (x->one_pass) k_tile_pass(row, x, R, out, qtype, bytes, 1);
    else k_tile_pass(row, x, R, out, qtype, bytes, 0);
}

/* Rows 1..TILE_ROWS of a tile, by fours (each count compiled apart: accumulators in registers) */
#define DEFINE_EIGHT_ROWS(NAME, TILE)                                                           \
static void NAME##_eight_rows(const uint8_t *row, const q8_rows *x, int64_t rows, float *out) { \
    for (int64_t j = 0; j < rows; j += 4) {                                                     \
        q8_rows part = *x;  /* rows j.. of the tile: their lanes of the scalars */              \
        part.q += j * x->k, part.r += j * x->k, part.d += j, part.s += j, part.h += j;          \
        if (part.c) part.c += j;                                                                \
        switch (rows - j) {                                                                     \
            case 1: TILE(row, &part, 1, out + j); break;                                        \
            case 2: TILE(row, &part, 2, out + j); break;                                        \
            case 3: TILE(row, &part, 3, out + j); break;                                        \
            default: TILE(row, &part, 4, out + j); break;                                       \
        }                                                                                       \
    }                                                                                           \
}
#define Q4_K_TILE(row, x, R, out) k_tile(row, x, R, out, Q4_K, 144)
#define Q5_K_TILE(row, x, R, out) k_tile(row, x, R, out, Q5_K, 176)
#define Q6_K_TILE(row, x, R, out) k_tile(row, x, R, out, Q6_K, 210)
DEFINE_EIGHT_ROWS(q4_k, Q4_K_TILE)
DEFINE_EIGHT_ROWS(q5_k, Q5_K_TILE)
DEFINE_EIGHT_ROWS(q6_k, Q6_K_TILE)

/* NOTE: the 32-value formats stay with matmul.c's one-block kernel: grouped eight at a time
 * (their scales gathered from eight block headers, scalar) they measured slower, 512 x 1536
 * from L2, 1 thread: Q8_0 42 -> 66 us, Q5_0 51 -> 64, Q4_1 45 -> 64. */
rows_fn eight_block_rows(int qtype) {
    switch (qtype) {
        case Q4_K: return q4_k_eight_rows;
        case Q5_K: return q5_k_eight_rows;
        case Q6_K: return q6_k_eight_rows;
        default: return 0;
    }
}

#else
rows_fn eight_block_rows(int qtype) { (void)qtype; return 0; }
#endif
