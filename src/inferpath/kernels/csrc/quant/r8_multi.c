/* Two to eight rows of x against one repacked Q6_K group (r8.h) at the AVX2 level (no
 * VNNI): every row in one pass over the group, quads outer.
 *
 * Why: r8.c's tile holds a sub-block's eight unpacked quads in registers while each x row
 * meets them, so with AVX2's 16 registers it takes four x rows per pass: a 5-row
 * verification step ran as 4 + 1 (the group read and unpacked twice, the 1-row pass the
 * costliest per row), 8 rows as 4 + 4, and Q6_K's unpacking (two loads, a shift or two,
 * three logic ops per quad) is most of a sub-block's work at few rows. Here a sub-block is
 * walked two quads at a time: the two unpacked quads meet every row's broadcasts, and each
 * row keeps one int32 running sum per half, so eight rows fit in the registers with the
 * weights unpacked once per step; the float accumulators (touched four times per row and
 * sub-block) live in memory. Measured against r8.c's tiles (1 thread, in L2, shared
 * machine: docs/kquant_kernels.md): 0.67-0.86x the time at 2-8 rows. Q4_K gains nothing
 * from this walk, nor from one over two sub-blocks per load (its unpacking is one and per
 * quad; its eight vpmaddubsw and their int16 adds per row and sub-block bound every form
 * tried: 0.96-1.36x r8.c's), so Q4_K stays with r8.c's tiles.
 *
 * The integer sums are r8.c's (two vpmaddubsw pairs per vpmaddwd: |sum| <= 2 * 2 * 63 *
 * 127 < 32768), and each row's float chain is r8.c's, operation for operation and in order
 * (the half 0 term, the half 1 term, the two offsets), so the results equal r8_rows' own
 * tiles (and the portable spec) to the bit. x in one int8 pass or two (activations.h's
 * K_QUANT_X_PASSES, or a Q6_K weight fused with a Q8_0 one): with two, each quad pair meets
 * q and r alike and the row's sum is (q-sum << RESIDUAL_SHIFT) + r-sum, r8.c's int32. */
#include <stdint.h>
#include <string.h>

#include "r8.h"

#if defined(__AVX2__)
#include <immintrin.h>
#include "unpack.h"
#endif

#if defined(__AVX2__) && !VNNI
/* x's four bytes at p in every 32-bit lane */
static inline __m256i four_bytes(const int8_t *p) {
    int32_t four;
    memcpy(&four, p, 4);
    return _mm256_set1_epi32(four);
}

static inline __m256 signed8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* two unpacked quads against x's eight bytes at p (four a quad): int32 lanes */
static inline __m256i quad_pair(const __m256i *w, const int8_t *p) {
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], four_bytes(p)),
                                           _mm256_maddubs_epi16(w[1], four_bytes(p + 4)));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* half hf (quads 4hf .. 4hf + 3) of sub-block s of super-block o (x's block b), x rows
 * 0 .. R - 1: isum[j] = the eight weight rows' dots with x row j, as int32 lanes */
static inline __attribute__((always_inline)) void half_sums(const uint8_t *o, const int s, const int hf,
                                                             const q8_rows *x, const int64_t b, const int R,
                                                             const int one_pass, __m256i *isum) {
    const int64_t k = x->k;
    const __m256i low = _mm256_set1_epi8(0xf), high = _mm256_set1_epi8(0x30);
    const uint8_t *ql = o + q6_ql_at(s / 2), *qh = o + q6_qh_at(s / 4);
    const int i = s % 4;
#pragma GCC unroll 2
    for (int g = 4 * hf; g < 4 * hf + 4; g += 2) {
        __m256i w[2];
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (g + e)));
            __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * (g + e)));
            h = i == 0 ? _mm256_slli_epi16(h, 4) : i == 1 ? _mm256_slli_epi16(h, 2) : i == 2 ? h : _mm256_srli_epi16(h, 2);
            w[e] = _mm256_or_si256(_mm256_and_si256(s % 2 ? _mm256_srli_epi16(l, 4) : l, low), _mm256_and_si256(h, high));
        }
#pragma GCC unroll 8
        for (int j = 0; j < R; j++) {
            const int64_t at = j * k + 32 * b + 4 * g;
            __m256i m = quad_pair(w, x->q + at);
            if (!one_pass) m = _mm256_add_epi32(_mm256_slli_epi32(m, RESIDUAL_SHIFT), quad_pair(w, x->r + at));
            isum[j] = g % 4 ? _mm256_add_epi32(isum[j], m) : m;
        }
    }
}

/* rows 0 .. R - 1 of x against a group; out[j * 8 + r] as r8_rows */
static inline __attribute__((always_inline)) void multi_tile(const uint8_t *group, const q8_rows *x, const int R,
                                                              const int one_pass, float *out) {
    const int64_t k = x->k, lanes = x->lanes, nsb = k / 256;
    float acc[TILE_ROWS * R8_ROWS];
    memset(acc, 0, sizeof acc);
    for (int64_t t = 0; t < nsb; t++) {
        const uint8_t *o = group + t * Q6_K_R8_BYTES;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const int64_t b = 8 * t + s;
            r8_prefetch(o + s * (Q6_K_R8_BYTES / 8), Q6_K_R8_BYTES / 8);
            const __m256 sc0 = _mm256_mul_ps(d, signed8(o + 16 + 8 * (2 * s)));
            const __m256 sc1 = _mm256_mul_ps(d, signed8(o + 16 + 8 * (2 * s + 1)));
            /* r8.c's scales (unit: RESIDUAL_STEPS with x in one pass, 1 with two) */
            const __m256 unit = _mm256_set1_ps(one_pass ? RESIDUAL_STEPS : 1.0f);
            const __m256 dsc0 = _mm256_mul_ps(sc0, unit), dsc1 = _mm256_mul_ps(sc1, unit);
            const __m256 dmn0 = _mm256_mul_ps(sc0, _mm256_set1_ps(-32.0f)), dmn1 = _mm256_mul_ps(sc1, _mm256_set1_ps(-32.0f));
            __m256i isum[TILE_ROWS];
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {  /* r8.c's order: the half 0 term, then half 1's */
                half_sums(o, s, hf, x, b, R, one_pass, isum);
#pragma GCC unroll 8
                for (int j = 0; j < R; j++) {
                    const __m256 dx = _mm256_set1_ps(x->d[b * lanes + j]);
                    const __m256 a = _mm256_loadu_ps(acc + 8 * j);
                    _mm256_storeu_ps(acc + 8 * j,
                                     _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(hf ? dsc1 : dsc0, dx), a));
                }
            }
#pragma GCC unroll 8
            for (int j = 0; j < R; j++) {
                const __m256 h0 = _mm256_set1_ps(x->h[(2 * b) * lanes + j]);
                const __m256 h1 = _mm256_set1_ps(x->h[(2 * b + 1) * lanes + j]);
                __m256 a = _mm256_loadu_ps(acc + 8 * j);
                a = _mm256_fmadd_ps(dmn0, h0, a);
                _mm256_storeu_ps(acc + 8 * j, _mm256_fmadd_ps(dmn1, h1, a));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * 8 * R);
}

int r8_multi_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out) {
    if (qtype != Q6_K_R8) return 0;
    switch (rows) {
#define MULTI_CASE(R) \
    case R: x->one_pass ? multi_tile(group, x, R, 1, out) : multi_tile(group, x, R, 0, out); return 1;
        MULTI_CASE(2) MULTI_CASE(3) MULTI_CASE(4) MULTI_CASE(5) MULTI_CASE(6) MULTI_CASE(7) MULTI_CASE(8)
#undef MULTI_CASE
        default: return 0;  /* one row: r8.c's tile (its chains split for the vpmaddubsw latency) */
    }
}
#else
int r8_multi_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out) {
    (void)qtype, (void)group, (void)x, (void)rows, (void)out;
    return 0;  /* portable, or VNNI (r8.c's tile takes eight rows per pass): r8_rows serves */
}
#endif
