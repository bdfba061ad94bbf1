/* Q8_0, Q5_0 and Q4_1 repacked into groups of eight rows (layout: r8.h): the repacking,
 * the kernel at every level, and the dequantizer.
 *
 * Per 32-value block b, for each x row j:
 *
 *     isum = the eight rows' integer dots with x (lanes: rows), exact in int32:
 *            (w.q << RESIDUAL_SHIFT) + w.r, or w.q alone where x is in one pass
 *     acc_j = fma(float(isum), (d * unit) * dx_b, acc_j)
 *     acc_j = fma(d * -16, sx_b, acc_j)                    (Q5_0: its offset 16)
 *     acc_j = fma(m, sx_b, acc_j)                          (Q4_1: its min m)
 *
 * unit as r8.c's (RESIDUAL_STEPS where x is in one int8 pass, else 1). The integer dot is
 * exact at every level: Q8_0's signed weights meet x as |w| against x carrying w's sign
 * (vpsignb), so VNNI and AVX2 sum the same integers (no +128 offset folded into a float
 * min); Q5_0's values are 0..31 unsigned, Q4_1's 0..15. The chain of a row j never depends on the other
 * rows of the call, and the portable form runs the same float operations in the same order
 * (fmaf): every level gives the same bits. Per group and block, the weights are unpacked
 * once for all rows of x. At avx512 two adjacent groups run at once in r8_pair.c (the same
 * chain in 512-bit lanes); this file's kernel serves a group alone there.
 */
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "activations.h"
#include "r8.h"

#if defined(__AVX2__)
#include <immintrin.h>
#include "unpack.h"
#endif

/* ---------------------------------------------------------------- repacking (plain C) */
static void repack_group(int qtype, const uint8_t *src, int64_t row_bytes, int64_t nb, uint8_t *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < R8_ROWS; r++) {
            if (qtype == Q8_0_R8) {
                const uint8_t *blk = src + r * row_bytes + 34 * b;
                uint8_t *o = dst + b * Q8_0_R8_BYTES;
                memcpy(o + 2 * r, blk, 2);
                for (int g = 0; g < 8; g++) memcpy(o + 16 + 32 * g + 4 * r, blk + 2 + 4 * g, 4);
            } else if (qtype == Q4_1_R8) {
                const uint8_t *blk = src + r * row_bytes + 20 * b;
                uint8_t *o = dst + b * Q4_1_R8_BYTES;
                memcpy(o + 2 * r, blk, 2);
                memcpy(o + 16 + 2 * r, blk + 2, 2);
                for (int g = 0; g < 4; g++) memcpy(o + 32 + 32 * g + 4 * r, blk + 4 + 4 * g, 4);
            } else {
                const uint8_t *blk = src + r * row_bytes + 22 * b;
                uint8_t *o = dst + b * Q5_0_R8_BYTES;
                uint32_t qh;
                memcpy(o + 2 * r, blk, 2);
                memcpy(&qh, blk + 2, 4);
                for (int e = 0; e < 4; e++) {
                    int bits = 0;
                    for (int g = 0; g < 8; g++) bits |= (int)((qh >> (4 * g + e)) & 1u) << g;
                    o[16 + 4 * r + e] = (uint8_t)bits;
                }
                for (int g = 0; g < 4; g++) memcpy(o + 48 + 32 * g + 4 * r, blk + 6 + 4 * g, 4);
            }
        }
}

/* w: n rows (a multiple of 8) of the file's row_bytes in GGUF format qtype (Q8_0, Q5_0, Q4_1),
 * k values each -> dst (n / 8 groups of k / 32 blocks, r8.h): 0, or -1 for a format or
 * shape it does not take. */
int inferpath_quant_repack_legacy(int qtype, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, uint8_t *dst,
                                  int num_threads) {
    const int r8 = qtype + R8_BASE;
    const int64_t file_bytes = qtype == Q8_0 ? 34 : qtype == Q5_0 ? 22 : qtype == Q4_1 ? 20 : 0;
    if (!r8_legacy_format(r8) || n < R8_ROWS || n % R8_ROWS || k < 32 || k % 32 || row_bytes != k / 32 * file_bytes)
        return -1;
    const int64_t nb = k / 32, group = R8_ROWS * r8_legacy_row_bytes(r8) * nb;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t g = 0; g < n / R8_ROWS; g++) repack_group(r8, w + g * R8_ROWS * row_bytes, row_bytes, nb, dst + g * group);
    return 0;
}

/* value e of row r in block o: Q8_0 signed, Q5_0 0..31 (its offset not subtracted), Q4_1 0..15 */
static inline int value_at(int qtype, const uint8_t *o, int r, int e) {
    if (qtype == Q8_0_R8) return (int8_t)o[16 + 32 * (e / 4) + 4 * r + e % 4];
    const int g = e / 4, nib = o[r8_legacy_nibbles_at(qtype) + 32 * (g % 4) + 4 * r + e % 4];
    if (qtype == Q4_1_R8) return (g < 4 ? nib : nib >> 4) & 0xf;
    return ((g < 4 ? nib : nib >> 4) & 0xf) | (((o[16 + 4 * r + e % 4] >> g) & 1) << 4);
}
/* the float the block's sum of x meets in row r's chain: Q5_0 d * -16, Q4_1 its min m */
static inline float min_term(int qtype, const uint8_t *o, int r) {
    return qtype == Q4_1_R8 ? half_to_float(o + 16 + 2 * r) : half_to_float(o + 2 * r) * -16.0f;
}

/* ---------------------------------------------------------------- dequantizing */
/* as matmul.c's dequantizer of the file's blocks: d * (q - OFFSET) + min (Q4_1's m, else 0), unfused */
static void __attribute__((optimize("fp-contract=off")))
dequantize_group(int qtype, const uint8_t *group, int64_t nb, int64_t k, float *out) {
    const int64_t bytes = R8_ROWS * r8_legacy_row_bytes(qtype), offset = qtype == Q5_0_R8 ? 16 : 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = group + b * bytes;
        for (int r = 0; r < R8_ROWS; r++) {
            const float d = half_to_float(o + 2 * r), min = qtype == Q4_1_R8 ? half_to_float(o + 16 + 2 * r) : 0.0f;
            for (int e = 0; e < 32; e++) out[r * k + 32 * b + e] = d * (float)(value_at(qtype, o, r, e) - offset) + min;
        }
    }
}

void r8_legacy_dequantize(int qtype, const uint8_t *w, int64_t rows, int64_t k, float *out, int num_threads) {
    const int64_t nb = k / 32, group = R8_ROWS * r8_legacy_row_bytes(qtype) * nb;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * k >= 65536)
    for (int64_t g = 0; g < rows / R8_ROWS; g++) dequantize_group(qtype, w + g * group, nb, k, out + g * R8_ROWS * k);
}

/* ---------------------------------------------------------------- the kernel */
#if defined(__AVX2__)
/* the eight rows' dots with x's 32 bytes (int32 lanes, a row each). Q8_0: w holds |w|
 * and sgn the signed weights (x takes their sign); without VNNI the maddubs pairs (Q8_0:
 * <= 2 * 127 * 127; Q5_0: four quads, <= 8 * 31 * 127 < 32768) become int32 by vpmaddwd. */
static inline __attribute__((always_inline)) __m256i quads(const __m256i *w, const __m256i *sgn, const int8_t *x,
                                                            const int is_q8) {
    int32_t four;
    __m256i sum = _mm256_setzero_si256();
#if VNNI
    for (int g = 0; g < 8; g++) {
        memcpy(&four, x + 4 * g, 4);
        __m256i xb = _mm256_set1_epi32(four);
        sum = dpbusd256(sum, w[g], is_q8 ? _mm256_sign_epi8(xb, sgn[g]) : xb);
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (is_q8) {
        for (int g = 0; g < 8; g++) {
            memcpy(&four, x + 4 * g, 4);
            __m256i p = _mm256_maddubs_epi16(w[g], _mm256_sign_epi8(_mm256_set1_epi32(four), sgn[g]));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
        }
    } else {
        for (int g0 = 0; g0 < 8; g0 += 4) {
            __m256i pairs = _mm256_setzero_si256();
            for (int g = g0; g < g0 + 4; g++) {
                memcpy(&four, x + 4 * g, 4);
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(four)));
            }
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
    }
#endif
    return sum;
}

/* rows j0 .. j0 + R - 1 of x against a group; acc[j] (8 lanes: the weight rows) */
static inline __attribute__((always_inline)) void legacy_tile(const int qtype, const uint8_t *group, const q8_rows *x,
                                                               const int64_t j0, const int R, const int one_pass,
                                                               float *out) {
    const int64_t k = x->k, lanes = x->lanes, nb = k / 32;
    const int is_q8 = qtype == Q8_0_R8, is_q41 = qtype == Q4_1_R8;
    const int64_t bytes = r8_legacy_block_bytes(qtype), at = r8_legacy_nibbles_at(qtype);
    const __m256 unit = _mm256_set1_ps(one_pass ? RESIDUAL_STEPS : 1.0f), offset = _mm256_set1_ps(-16.0f);
    const __m256i low = _mm256_set1_epi8(0xf), fifth = _mm256_set1_epi8(0x10);
    __m256 acc[TILE_ROWS];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = group + b * bytes;
        r8_prefetch(o, bytes);
        __m256i w[8], sgn[8];
        if (is_q8) {
            for (int g = 0; g < 8; g++) {
                sgn[g] = _mm256_loadu_si256((const __m256i *)(o + 16 + 32 * g));
                w[g] = _mm256_abs_epi8(sgn[g]);
            }
        } else {
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(o + 16));
            for (int g = 0; g < 8; g++) {
                const __m256i nib = _mm256_loadu_si256((const __m256i *)(o + at + 32 * (g % 4)));
                const __m256i l = _mm256_and_si256(g < 4 ? nib : _mm256_srli_epi16(nib, 4), low);
                const __m256i h = g < 4 ? _mm256_slli_epi16(hb, 4 - g) : _mm256_srli_epi16(hb, g - 4);
                w[g] = is_q41 ? l : _mm256_or_si256(l, _mm256_and_si256(h, fifth));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
        const __m256 dsc = _mm256_mul_ps(d, unit);
        const __m256 dmn = is_q41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))) : _mm256_mul_ps(d, offset);
        for (int j = 0; j < R; j++) {
            const int64_t row = j0 + j;
            __m256i isum = quads(w, sgn, x->q + row * k + 32 * b, is_q8);
            if (!one_pass)
                isum = _mm256_add_epi32(_mm256_slli_epi32(isum, RESIDUAL_SHIFT), quads(w, sgn, x->r + row * k + 32 * b, is_q8));
            const __m256 dx = _mm256_set1_ps(x->d[b * lanes + row]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dsc, dx), acc[j]);
            if (!is_q8) acc[j] = _mm256_fmadd_ps(dmn, _mm256_set1_ps(x->s[b * lanes + row]), acc[j]);
        }
    }
    for (int j = 0; j < R; j++) _mm256_storeu_ps(out + 8 * (j0 + j), acc[j]);
}

/* x rows per pass over a group: all eight with AVX-512's 32 registers, else four (16) */
#define LEGACY_PASS (VNNI512 ? 8 : 4)

static inline __attribute__((always_inline)) void legacy_tiles(const int qtype, const uint8_t *group, const q8_rows *x,
                                                                int64_t rows, const int one_pass, float *out) {
    for (int64_t j0 = 0; j0 < rows; j0 += LEGACY_PASS) {
        switch (rows - j0) {
#define PASS_CASE(R) case R: legacy_tile(qtype, group, x, j0, R, one_pass, out); break;
            PASS_CASE(1) PASS_CASE(2) PASS_CASE(3)
#if VNNI512
            PASS_CASE(4) PASS_CASE(5) PASS_CASE(6) PASS_CASE(7)
#endif
            default: legacy_tile(qtype, group, x, j0, LEGACY_PASS, one_pass, out); break;
#undef PASS_CASE
        }
    }
}

void r8_legacy_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out) {
    if (qtype == Q8_0_R8) {
        if (x->one_pass) legacy_tiles(Q8_0_R8, group, x, rows, 1, out);
        else legacy_tiles(Q8_0_R8, group, x, rows, 0, out);
    } else if (qtype == Q4_1_R8) {
        if (x->one_pass) legacy_tiles(Q4_1_R8, group, x, rows, 1, out);
        else legacy_tiles(Q4_1_R8, group, x, rows, 0, out);
    } else {
        if (x->one_pass) legacy_tiles(Q5_0_R8, group, x, rows, 1, out);
        else legacy_tiles(Q5_0_R8, group, x, rows, 0, out);
    }
}

#else
/* ---------------------------------------------------------------- portable: the spec */
static int32_t row_dot(int qtype, const uint8_t *o, int r, const int8_t *x) {
    int32_t sum = 0;
    for (int e = 0; e < 32; e++) sum += (int32_t)value_at(qtype, o, r, e) * (int32_t)x[e];
    return sum;
}

void __attribute__((optimize("fp-contract=off"))) r8_legacy_rows(int qtype, const uint8_t *group, const q8_rows *x,
                                                                 int64_t rows, float *out) {
    const int64_t k = x->k, lanes = x->lanes, nb = k / 32, bytes = R8_ROWS * r8_legacy_row_bytes(qtype);
    const float unit = x->one_pass ? RESIDUAL_STEPS : 1.0f;
    for (int64_t j = 0; j < rows; j++)
        for (int r = 0; r < R8_ROWS; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = group + b * bytes;
                const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;
                int32_t isum = row_dot(qtype, o, r, xq);
                if (!x->one_pass) isum = (int32_t)((uint32_t)isum << RESIDUAL_SHIFT) + row_dot(qtype, o, r, xr);
                const float d = half_to_float(o + 2 * r), dx = x->d[b * lanes + j];
                acc = fmaf((float)isum, (d * unit) * dx, acc);
                if (qtype != Q8_0_R8) acc = fmaf(min_term(qtype, o, r), x->s[b * lanes + j], acc);
            }
            out[8 * j + r] = acc;
        }
}
#endif
