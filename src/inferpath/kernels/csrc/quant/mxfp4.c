/* MXFP4 blocks read in place (layout and value rule: mxfp4.h).
 *
 * The dot product of a weight block with x's block (activations.h: two int8 passes q, r
 * and d_x per block) is
 *
 *     d_w * d_x * sum_e KVALUE[nibble_e] * ((q_e << RESIDUAL_SHIFT) + r_e)
 *
 * |KVALUE| <= 12, so every partial sum is far inside int16 / int32. Levels:
 *   portable: the nibbles looked up in a 16-entry table, plain integer C (the reference);
 *   AVX2 (and the AVX-512 level, which compiles the same code with its flags): the
 *         nibbles looked up by one vpshufb into 32 int8, then Q8_0's signed trick:
 *         vpmaddubsw of |w| with x carrying w's sign (pairs <= 2 * 12 * 127), vpmaddwd
 *         into int32.
 */
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "mxfp4.h"

static const int8_t KVALUE[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* d = 2^(e - 128) as float32 bits: exponent field e - 1, or a subnormal below that */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    return d;
}

/* the block's 32 integers in value order: KVALUE of the low nibbles, then of the high */
static inline void mxfp4_ints(const uint8_t *block, int8_t *w) {
    const uint8_t *q = block + 1;
    for (int j = 0; j < 16; j++) {
        w[j] = KVALUE[q[j] & 0xf];
        w[j + 16] = KVALUE[q[j] >> 4];
    }
}

void mxfp4_dequantize_row(const uint8_t *row, int64_t k, float *dst) {
    for (int64_t b = 0; b < k / 32; b++) {
        const uint8_t *block = row + MXFP4_BYTES * b;
        const float d = e8m0_half(block[0]);
        int8_t w[32];
        mxfp4_ints(block, w);
        for (int e = 0; e < 32; e++) dst[32 * b + e] = d * (float)w[e];
    }
}

#if defined(__AVX2__)
static inline __m256i mxfp4_vec(const uint8_t *block) {
    const __m128i table = _mm_loadu_si128((const __m128i *)KVALUE);
    __m128i b = _mm_loadu_si128((const __m128i *)(block + 1));  /* 16 bytes: reads q[0..15] */
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0xf)), hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0xf));
    return _mm256_set_m128i(_mm_shuffle_epi8(table, hi), _mm_shuffle_epi8(table, lo));
}

/* sum of w * ((xq << RESIDUAL_SHIFT) + xr) over the 32 values, w signed and small */
static inline int32_t signed_dot(__m256i w, const int8_t *xq, const int8_t *xr) {
    const __m256i ones = _mm256_set1_epi16(1), aw = _mm256_sign_epi8(w, w);
    __m256i q = _mm256_loadu_si256((const __m256i *)xq), r = _mm256_loadu_si256((const __m256i *)xr);
    __m256i pq = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, w)), ones);
    __m256i pr = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(r, w)), ones);
    __m256i v = _mm256_add_epi32(_mm256_slli_epi32(pq, RESIDUAL_SHIFT), pr);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

void mxfp4_rows(const uint8_t *row, const q8_rows *x, int64_t rows, float *out) {
    const int64_t nb = x->k / 32, k = x->k;
    float acc[TILE_ROWS] = {0.0f};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = row + MXFP4_BYTES * b;
        const float d = e8m0_half(block[0]);
        const __m256i w = mxfp4_vec(block);
        for (int64_t j = 0; j < rows; j++)
            acc[j] += x->d[b * x->lanes + j] * d * (float)signed_dot(w, x->q + j * k + 32 * b, x->r + j * k + 32 * b);
    }
    for (int64_t j = 0; j < rows; j++) out[j] = acc[j];
}

#else
void mxfp4_rows(const uint8_t *row, const q8_rows *x, int64_t rows, float *out) {
    const int64_t nb = x->k / 32, k = x->k;
    float acc[TILE_ROWS] = {0.0f};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = row + MXFP4_BYTES * b;
        const float d = e8m0_half(block[0]);
        int8_t w[32];
        mxfp4_ints(block, w);
        for (int64_t j = 0; j < rows; j++) {
            const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;
            int32_t sq = 0, sr = 0;
            for (int e = 0; e < 32; e++) { sq += w[e] * xq[e]; sr += w[e] * xr[e]; }
            acc[j] += x->d[b * x->lanes + j] * d * (float)(sq * (1 << RESIDUAL_SHIFT) + sr);
        }
    }
    for (int64_t j = 0; j < rows; j++) out[j] = acc[j];
}
#endif
