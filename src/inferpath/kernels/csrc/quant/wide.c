/* The wide kernel: one weight row against a whole tile of TILE_ROWS rows of x, a 32-bit
 * lane per row (x interleaved by activations.h). Each 4-value group of the weight block is
 * broadcast and meets all eight rows in one integer dot product, so the float work (one
 * conversion, one multiply-add per block) and the result (one register: eight outputs)
 * serve eight rows at once, where the row kernel (matmul.c) spends them per row. Used for
 * tiles of WIDE_MIN_ROWS rows and more (batched decode, prefill) at the AVX2 level only:
 * the portable level keeps the row kernel, and with AVX-512 VNNI gemm.c's panels take every
 * tile of GEMM_MIN_ROWS rows or more.
 */
#include "blocks.h"
#include "activations.h"
#include "unpack.h"
#include "wide.h"

#if defined(__AVX2__) && !VNNI512  /* unpack.h: VNNI512 (gemm.c's panels there) */

/* acc + the int32 sums of groups g and g + 1: in each 32-bit lane (row j) the eight
 * products of the groups' broadcast weights with row j's values: vpmaddubsw pairs into
 * int16, the two groups' pairs added in int16 (unsigned weights have at most 6 bits:
 * 2 * 2 * 63 * 127 = 32004 < 32768), one vpmaddwd; Q8_0's signed weights (|w| against x
 * carrying w's sign, pairs up to 2 * 127 * 127) widen each group apart. */
static inline __m256i dot_pair(__m256i acc, __m256i w0, __m256i x0, __m256i w1, __m256i x1, int is_signed) {
#if VNNI  /* AVX-VNNI: each group's products summed by fours straight into int32 */
    if (is_signed) {
        acc = dpbusd256(acc, _mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0));
        return dpbusd256(acc, _mm256_abs_epi8(w1), _mm256_sign_epi8(x1, w1));
    }
    return dpbusd256(dpbusd256(acc, w0, x0), w1, x1);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (is_signed) {
        __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0));
        __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x1, w1));
        return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
    }
    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
#endif
}

/* (q << RESIDUAL_SHIFT) + r over the groups [g0, g0 + 4) of one block, for the 8 rows */
static inline __m256i half_block(__m256i w, const int8_t *xq, const int8_t *xr, int g0, int is_signed, int one_pass) {
    __m256i sq = _mm256_setzero_si256(), sr = _mm256_setzero_si256();
    for (int g = g0; g < g0 + 4; g += 2) {
        __m256i w0 = _mm256_permutevar8x32_epi32(w, _mm256_set1_epi32(g));
        __m256i w1 = _mm256_permutevar8x32_epi32(w, _mm256_set1_epi32(g + 1));
        sq = dot_pair(sq, w0, _mm256_loadu_si256((const __m256i *)(xq + 32 * g)),
                      w1, _mm256_loadu_si256((const __m256i *)(xq + 32 * (g + 1))), is_signed);
        if (!one_pass)
            sr = dot_pair(sr, w0, _mm256_loadu_si256((const __m256i *)(xr + 32 * g)),
                          w1, _mm256_loadu_si256((const __m256i *)(xr + 32 * (g + 1))), is_signed);
    }
    return _mm256_add_epi32(_mm256_slli_epi32(sq, RESIDUAL_SHIFT), sr);
}

#define DEFINE_WIDE(NAME, OFFSET, IS_SIGNED, TWO_SCALES)                                            \
static void NAME##_wide(const uint8_t *row, const wide_rows *x, float *out) {                       \
    const int64_t nb = x->k / 32;                                                                   \
    const int is_signed = IS_SIGNED, offset = OFFSET;                                               \
    __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();                                   \
    for (int64_t b = 0; b < nb; b++) {                                                              \
        block_params p;                                                                             \
        NAME##_params(row, b, &p);                                                                  \
        __m256i w = NAME##_vec(row, b);                                                             \
        const int8_t *xq = x->q + b * 8 * 4 * TILE_ROWS, *xr = x->r + b * 8 * 4 * TILE_ROWS;       \
        __m256 dx = _mm256_loadu_ps(x->d + b * TILE_ROWS);                                          \
        if (TWO_SCALES) {                                                                           \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half_block(w, xq, xr, 0, is_signed, x->one_pass)),          \
                                  _mm256_mul_ps(dx, _mm256_set1_ps(p.scale[0])), acc);              \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half_block(w, xq, xr, 4, is_signed, x->one_pass)),          \
                                  _mm256_mul_ps(dx, _mm256_set1_ps(p.scale[1])), acc);              \
            const float *h = x->h + b * 2 * TILE_ROWS;                                              \
            mins = _mm256_fmadd_ps(_mm256_loadu_ps(h), _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[0] : p.min), mins); \
            mins = _mm256_fmadd_ps(_mm256_loadu_ps(h + TILE_ROWS),                                  \
                                   _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[1] : p.min), mins);       \
        } else {                                                                                    \
            __m256i sums = _mm256_add_epi32(half_block(w, xq, xr, 0, is_signed, x->one_pass),                    \
                                            half_block(w, xq, xr, 4, is_signed, x->one_pass));                   \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dx, _mm256_set1_ps(p.scale[0])), acc); \
            if (offset || p.min != 0.0f)                                                            \
                mins = _mm256_fmadd_ps(_mm256_loadu_ps(x->s + b * TILE_ROWS),                       \
                                       _mm256_set1_ps(offset ? p.min - (float)offset * p.scale[0] : p.min), mins);   \
        }                                                                                           \
    }                                                                                               \
    _mm256_storeu_ps(out, _mm256_add_ps(acc, mins));                                                \
}

#define WIDE_OF(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES) DEFINE_WIDE(NAME, OFFSET, IS_SIGNED, TWO_SCALES)
FOR_EACH_FORMAT(WIDE_OF)

wide_fn wide_kernel(int qtype) {
    switch (qtype) {
#define WIDE_CASE(NAME, TYPE, BLOCK, BYTES, OFFSET, IS_SIGNED, TWO_SCALES) case TYPE: return NAME##_wide;
        FOR_EACH_FORMAT(WIDE_CASE)
        default: return 0;
    }
}

#else
wide_fn wide_kernel(int qtype) { (void)qtype; return 0; }
#endif
