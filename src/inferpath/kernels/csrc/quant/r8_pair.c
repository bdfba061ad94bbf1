/* Two groups of a repacked tensor (r8.h) at once in 512-bit registers (AVX-512 VNNI): the
 * lower 256 bits of every vector are group A's eight rows, the upper group B's (B at A +
 * step: matmul.c pairs a range's two halves, r8.h's r8_prefetch_pair).
 * Q4_K_R8, Q5_K_R8 and Q6_K_R8 (r8.c's chain), Q8_0_R8, Q5_0_R8 and Q4_1_R8 (r8_legacy.c's: a verification's
 * 5 rows of the 0.5B file's Q5_0 4864 x 896, 1 thread, streamed, 284 -> 179 us).
 *
 * Why: a 512-bit vpdpbusd issues at the rate of a 256-bit one here (AMD Zen 4, 16
 * independent chains: 0.225 ns either), so pairing the groups halves the instructions per
 * weight row: the vpdpbusd, the x broadcasts (one broadcast serves both groups), the
 * int -> float converts and the float multiply-adds. Each lane runs exactly r8.c's chain
 * (the same float operations on the same values, in the same order), so a pair gives the
 * bits of two r8_rows calls, and of the portable spec. Where rows are few (one or two x
 * rows: a decode step) a sub-block's eight quads are summed in two integer chains and then
 * added (exact), so that the vpdpbusd latency (~5 cycles) does not serialize a sub-block. */
#include <stdint.h>
#include <string.h>

#include "r8.h"

#if defined(__AVX2__)
#include <immintrin.h>
#include "unpack.h"
#endif

#if defined(__AVX2__) && VNNI && defined(__AVX512BW__)
/* acc + w . x's four bytes at x in every lane, x read by the instruction's own broadcast
 * ({1to16}): GCC issues a separate vpbroadcastd, which here costs a vector slot as the
 * vpdpbusd does (a pair's sub-block and row took 5 ns, as 20 such slots, not 2.7 as 12) */
static inline __attribute__((always_inline)) __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}

/* sum over quads [g0, g0 + count) of both groups' dots with x's four bytes 4g.. */
static inline __attribute__((always_inline)) __m512i quads512(const __m512i *w, const int8_t *x, const int g0,
                                                               const int count, const int chains) {
    __m512i sum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int g = g0; g < g0 + count; g++)
        sum[(g - g0) % chains] = dpbusd_broadcast(sum[(g - g0) % chains], w[g], x + 4 * g);
    return chains == 2 ? _mm512_add_epi32(sum[0], sum[1]) : sum[0];
}

static inline __attribute__((always_inline)) __m512i block_dot512(const __m512i *w, const int8_t *xq,
                                                                   const int8_t *xr, const int g0, const int count,
                                                                   const int chains, const int one_pass) {
    __m512i s = quads512(w, xq, g0, count, chains);
    if (one_pass) return s;
    return _mm512_add_epi32(_mm512_slli_epi32(s, RESIDUAL_SHIFT), quads512(w, xr, g0, count, chains));
}

/* 32 bytes of group A at a, of group B at b -> one vector (A low, B high) */
static inline __m512i load_pair(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
/* eight bytes of each group -> 16 floats */
static inline __m512 cvt16(const uint8_t *a, const uint8_t *b, int is_signed) {
    __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
}
/* eight float16 of each group -> 16 floats */
static inline __m512 halves16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}

/* rows 0 .. R - 1 of x against groups A (a) and B (a + step); out[j * 16 + lane] */
static inline __attribute__((always_inline)) void pair_tile(const int qtype, const uint8_t *a, const int64_t step,
                                                             const q8_rows *x, const int R, const int one_pass,
                                                             float *out) {
    const int64_t k = x->k, lanes = x->lanes, nsb = k / 256;
    const int chains = R <= 2 ? 2 : 1;
    const float unit = one_pass ? RESIDUAL_STEPS : 1.0f;
    const __m512i low = _mm512_set1_epi8(0xf);
    __m512 acc[TILE_ROWS];
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t t = 0; t < nsb; t++) {
        __m512i w[8];
        if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
            const int64_t sb_bytes = r8_block_bytes(qtype);
            const uint8_t *o = a + t * sb_bytes, *p = o + step;
            const __m512 d = _mm512_mul_ps(halves16(o, p), _mm512_set1_ps(unit));
            const __m512 dmin = _mm512_sub_ps(_mm512_setzero_ps(), halves16(o + 16, p + 16));
            __m512i v[8];  /* pair s / 2's bytes: sub-block s even in the low nibbles, odd in the high */
            for (int s = 0; s < 8; s++) {
                const int64_t b = 8 * t + s;
                const int at = k4_quants_at(qtype, s / 2);
                r8_prefetch_pair(a, step, nsb * sb_bytes, t * sb_bytes + s * (sb_bytes / 8), sb_bytes / 8);  /* r8.h */
                for (int g = 0; g < 8; g++) {
                    if (s % 2 == 0) v[g] = load_pair(o + at + 32 * g, p + at + 32 * g);
                    w[g] = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v[g], 4) : v[g], low);
                    if (qtype == Q5_K_R8) {  /* the fifth bits: r8.c's */
                        const __m512i hb = load_pair(o + 160 + 32 * g, p + 160 + 32 * g);
                        const __m512i h = s < 4 ? _mm512_slli_epi16(hb, 4 - s) : _mm512_srli_epi16(hb, s - 4);
                        w[g] = _mm512_or_si512(w[g], _mm512_and_si512(h, _mm512_set1_epi8(0x10)));
                    }
                }
                const __m512 dsc = _mm512_mul_ps(d, cvt16(o + 32 + 8 * s, p + 32 + 8 * s, 0));
                const __m512 dmn = _mm512_mul_ps(dmin, cvt16(o + 96 + 8 * s, p + 96 + 8 * s, 0));
                for (int j = 0; j < R; j++) {
                    __m512i isum = block_dot512(w, x->q + j * k + 32 * b, x->r + j * k + 32 * b, 0, 8, chains, one_pass);
                    const __m512 dx = _mm512_set1_ps(x->d[b * lanes + j]), sx = _mm512_set1_ps(x->s[b * lanes + j]);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dsc, dx), acc[j]);
                    acc[j] = _mm512_fmadd_ps(dmn, sx, acc[j]);
                }
            }
        } else {
            const uint8_t *o = a + t * Q6_K_R8_BYTES, *p = o + step;
            const __m512 d = halves16(o, p);
            const __m512i high = _mm512_set1_epi8(0x30);
            __m512i lv[8];  /* pair s / 2's low bits: sub-block s even in the low nibbles, odd in the high */
            for (int s = 0; s < 8; s++) {
                const int64_t b = 8 * t + s;
                const int l_at = q6_ql_at(s / 2), h_at = q6_qh_at(s / 4), i = s % 4;
                r8_prefetch_pair(a, step, nsb * Q6_K_R8_BYTES, t * Q6_K_R8_BYTES + s * (Q6_K_R8_BYTES / 8),
                                 Q6_K_R8_BYTES / 8);
                for (int g = 0; g < 8; g++) {
                    if (s % 2 == 0) lv[g] = load_pair(o + l_at + 32 * g, p + l_at + 32 * g);
                    const __m512i l = lv[g];
                    __m512i h = load_pair(o + h_at + 32 * g, p + h_at + 32 * g);
                    h = i == 0 ? _mm512_slli_epi16(h, 4) : i == 1 ? _mm512_slli_epi16(h, 2) : i == 2 ? h : _mm512_srli_epi16(h, 2);
                    w[g] = _mm512_or_si512(_mm512_and_si512(s % 2 ? _mm512_srli_epi16(l, 4) : l, low), _mm512_and_si512(h, high));
                }
                const __m512 sc0 = _mm512_mul_ps(d, cvt16(o + 16 + 8 * (2 * s), p + 16 + 8 * (2 * s), 1));
                const __m512 sc1 = _mm512_mul_ps(d, cvt16(o + 16 + 8 * (2 * s + 1), p + 16 + 8 * (2 * s + 1), 1));
                const __m512 dsc0 = _mm512_mul_ps(sc0, _mm512_set1_ps(unit)), dsc1 = _mm512_mul_ps(sc1, _mm512_set1_ps(unit));
                const __m512 dmn0 = _mm512_mul_ps(sc0, _mm512_set1_ps(-32.0f)), dmn1 = _mm512_mul_ps(sc1, _mm512_set1_ps(-32.0f));
                for (int j = 0; j < R; j++) {
                    const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;
                    __m512i i0 = block_dot512(w, xq, xr, 0, 4, chains, one_pass);
                    __m512i i1 = block_dot512(w, xq, xr, 4, 4, chains, one_pass);
                    const __m512 dx = _mm512_set1_ps(x->d[b * lanes + j]);
                    const __m512 h0 = _mm512_set1_ps(x->h[(2 * b) * lanes + j]);
                    const __m512 h1 = _mm512_set1_ps(x->h[(2 * b + 1) * lanes + j]);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(dsc0, dx), acc[j]);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(dsc1, dx), acc[j]);
                    acc[j] = _mm512_fmadd_ps(dmn0, h0, acc[j]);
                    acc[j] = _mm512_fmadd_ps(dmn1, h1, acc[j]);
                }
            }
        }
    }
    for (int j = 0; j < R; j++) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

/* The same for Q8_0_R8, Q5_0_R8 and Q4_1_R8 (r8_legacy.c's chain per lane): per 32-value block, the
 * eight quads of both groups unpacked once for all rows of x. Q8_0's signed weights meet x
 * as the unsigned w + 128 (one xor a quad, once for all rows), each quad one vpdpbusd with
 * x's four bytes broadcast by the instruction itself as the other formats', and the block's
 * 128 * sum(x) (q8_rows' c, in the dots' units) comes off the int32 sum: the integer dot
 * is r8_legacy.c's exactly (|w + 128| * |x| <= 255 * 127: no int32 bound is near), where
 * |w| against a negated x cost a broadcast and a masked subtract more per quad and row (a
 * 5-row verification of the 0.5B's 151936 x 896 LM head, 1 thread, streamed:
 * benchmarks/r8rows_kernel.py --cases legacy). */
/* Rows of x whose chains pair_legacy_tile interleaves (from 3: below, two chains a pass per
 * row serve): x in two passes, 2R int32 sums beside the eight weight vectors and R float
 * accumulators stay in the 32 registers up to 6 rows; at 7-8 they spilled (1.06-1.12x slower). */
#define INTERLEAVED_MAX_ROWS 6

static inline __attribute__((always_inline)) void pair_legacy_tile(const int qtype, const uint8_t *a,
                                                                    const int64_t step, const q8_rows *x, const int R,
                                                                    const int one_pass, float *out) {
    const int64_t k = x->k, lanes = x->lanes, nb = k / 32;
    const int is_q8 = qtype == Q8_0_R8, is_q41 = qtype == Q4_1_R8, chains = R <= 2 ? 2 : 1;
    const int interleaved = R >= 3 && R <= INTERLEAVED_MAX_ROWS;
    const int64_t bytes = r8_legacy_block_bytes(qtype), at = r8_legacy_nibbles_at(qtype);
    const __m512 unit = _mm512_set1_ps(one_pass ? RESIDUAL_STEPS : 1.0f), offset = _mm512_set1_ps(-16.0f);
    const __m512i low = _mm512_set1_epi8(0xf), fifth = _mm512_set1_epi8(0x10), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[TILE_ROWS];
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = a + b * bytes, *p = o + step;
        r8_prefetch_pair(a, step, nb * bytes, b * bytes, bytes);  /* r8.h */
        __m512i w[8];
        if (is_q8) {
            for (int g = 0; g < 8; g++) w[g] = _mm512_xor_si512(load_pair(o + 16 + 32 * g, p + 16 + 32 * g), flip);
        } else {
            const __m512i hb = load_pair(o + 16, p + 16);
            for (int g = 0; g < 8; g++) {
                const __m512i nib = load_pair(o + at + 32 * (g % 4), p + at + 32 * (g % 4));
                const __m512i l = _mm512_and_si512(g < 4 ? nib : _mm512_srli_epi16(nib, 4), low);
                const __m512i h = g < 4 ? _mm512_slli_epi16(hb, 4 - g) : _mm512_srli_epi16(hb, g - 4);
                w[g] = is_q41 ? l : _mm512_or_si512(l, _mm512_and_si512(h, fifth));
            }
        }
        const __m512 d = halves16(o, p);
        const __m512 dsc = _mm512_mul_ps(d, unit), dmn = is_q41 ? halves16(o + 16, p + 16) : _mm512_mul_ps(d, offset);
        __m512i sums[TILE_ROWS], rests[TILE_ROWS];
        if (interleaved) {  /* every row's chains, quad by quad: 2R independent chains in flight */
            for (int j = 0; j < R; j++) sums[j] = rests[j] = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++)
                for (int j = 0; j < R; j++) {
                    sums[j] = dpbusd_broadcast(sums[j], w[g], x->q + j * k + 32 * b + 4 * g);
                    if (!one_pass) rests[j] = dpbusd_broadcast(rests[j], w[g], x->r + j * k + 32 * b + 4 * g);
                }
        }
        for (int j = 0; j < R; j++) {
            const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;
            __m512i isum = !interleaved ? block_dot512(w, xq, xr, 0, 8, chains, one_pass)
                           : one_pass   ? sums[j]
                                        : _mm512_add_epi32(_mm512_slli_epi32(sums[j], RESIDUAL_SHIFT), rests[j]);
            if (is_q8) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(x->c[b * lanes + j] * 128));
            const __m512 dx = _mm512_set1_ps(x->d[b * lanes + j]);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dsc, dx), acc[j]);
            if (!is_q8) acc[j] = _mm512_fmadd_ps(dmn, _mm512_set1_ps(x->s[b * lanes + j]), acc[j]);
        }
    }
    for (int j = 0; j < R; j++) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

static inline __attribute__((always_inline)) void pair_rows(const int qtype, const uint8_t *a, const int64_t step,
                                                             const q8_rows *x, const int64_t rows, const int one_pass,
                                                             float *out) {
    if (r8_legacy_format(qtype)) {
        switch (rows) {
#define PAIR_CASE(R) case R: pair_legacy_tile(qtype, a, step, x, R, one_pass, out); break;
            PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) PAIR_CASE(5) PAIR_CASE(6) PAIR_CASE(7) PAIR_CASE(8)
#undef PAIR_CASE
        }
        return;
    }
    switch (rows) {
#define PAIR_CASE(R) case R: pair_tile(qtype, a, step, x, R, one_pass, out); break;
        PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) PAIR_CASE(5) PAIR_CASE(6) PAIR_CASE(7) PAIR_CASE(8)
#undef PAIR_CASE
    }
}

/* each format's pairs in a function of its own (as r8.c's tiles: one function holding every
 * format's code compiled worse), x in one int8 pass or two */
#define PAIR_ROWS_OF(NAME, QTYPE)                                                                      \
    static __attribute__((noinline)) void NAME(const uint8_t *group, int64_t step, const q8_rows *x,       \
                                               int64_t rows, float *out) {                              \
        if (x->one_pass) pair_rows(QTYPE, group, step, x, rows, 1, out);                                \
        else pair_rows(QTYPE, group, step, x, rows, 0, out);                                            \
    }
PAIR_ROWS_OF(pair_q4_k, Q4_K_R8)
PAIR_ROWS_OF(pair_q5_k, Q5_K_R8)
PAIR_ROWS_OF(pair_q6_k, Q6_K_R8)
PAIR_ROWS_OF(pair_q8_0, Q8_0_R8)
PAIR_ROWS_OF(pair_q5_0, Q5_0_R8)
PAIR_ROWS_OF(pair_q4_1, Q4_1_R8)
#undef PAIR_ROWS_OF

int r8_pairs_ready(void) { return 1; }

int r8_pair_rows(int qtype, const uint8_t *group, int64_t step, const q8_rows *x, int64_t rows, float *out) {
    if (rows < 1 || rows > TILE_ROWS || !r8_grouped(qtype)) return 0;
    switch (qtype) {
        case Q4_K_R8: pair_q4_k(group, step, x, rows, out); break;
        case Q5_K_R8: pair_q5_k(group, step, x, rows, out); break;
        case Q8_0_R8: pair_q8_0(group, step, x, rows, out); break;
        case Q5_0_R8: pair_q5_0(group, step, x, rows, out); break;
        case Q4_1_R8: pair_q4_1(group, step, x, rows, out); break;
        default: pair_q6_k(group, step, x, rows, out); break;
    }
    return 1;
}
#else
int r8_pairs_ready(void) { return 0; }

int r8_pair_rows(int qtype, const uint8_t *group, int64_t step, const q8_rows *x, int64_t rows, float *out) {
    (void)qtype, (void)group, (void)step, (void)x, (void)rows, (void)out;
    return 0;  /* no 512-bit VNNI at this level: the caller runs r8_rows per group */
}
#endif
