/* A 32-value block's q values unpacked into one 256-bit register (u8; Q8_0: s8), per
 * format (blocks.h has the layouts and the portable byte version). */
#ifndef INFERPATH_QUANT_UNPACK_H
#define INFERPATH_QUANT_UNPACK_H
#if defined(__AVX2__)
#include <immintrin.h>
#include <string.h>

#include "activations.h"

/* VNNI: vpdpbusd on 256-bit registers, from AVX-512 VNNI (EVEX, with VL) or AVX-VNNI (VEX:
 * the avxvnni level, Intel's client cores and AMD Zen 5); dpbusd256 names it either way.
 * VNNI512: AVX-512 VNNI, with its 32 vector registers and 512-bit forms (r8_pair.c, gemm.c). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define VNNI 1
#define VNNI512 1
#define dpbusd256 _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define VNNI 1
#define VNNI512 0
#define dpbusd256 _mm256_dpbusd_avx_epi32
#else
#define VNNI 0
#define VNNI512 0
#endif

static inline __m256i nibbles256(const uint8_t *q16) {
    __m128i b = _mm_loadu_si128((const __m128i *)q16);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0xf)), hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0xf));
    return _mm256_set_m128i(hi, lo);
}
/* 0x10 in byte j where bit j of the 32-bit word at qh4 is set (AVX-512: the word is a
 * byte mask) */
static inline __m256i fifth_bits256(const uint8_t *qh4) {
    uint32_t h;
    memcpy(&h, qh4, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));
#endif
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                    _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                       0x0303030303030303LL));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}
static inline __m256i k4_quants256(const uint8_t *qs, int s) {
    __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * (s / 2)));
    if (s % 2) b = _mm256_srli_epi16(b, 4);
    return _mm256_and_si256(b, _mm256_set1_epi8(0xf));
}
static inline __m256i q8_0_vec(const uint8_t *row, int64_t b) { return _mm256_loadu_si256((const __m256i *)(row + 34 * b + 2)); }
static inline __m256i q4_0_vec(const uint8_t *row, int64_t b) { return nibbles256(row + 18 * b + 2); }
static inline __m256i q4_1_vec(const uint8_t *row, int64_t b) { return nibbles256(row + 20 * b + 4); }
static inline __m256i q5_0_vec(const uint8_t *row, int64_t b) {
    return _mm256_or_si256(nibbles256(row + 22 * b + 6), fifth_bits256(row + 22 * b + 2));
}
static inline __m256i q5_1_vec(const uint8_t *row, int64_t b) {
    return _mm256_or_si256(nibbles256(row + 24 * b + 8), fifth_bits256(row + 24 * b + 4));
}
static inline __m256i q4_k_vec(const uint8_t *row, int64_t b) { return k4_quants256(row + 144 * (b / 8) + 16, (int)(b % 8)); }
static inline __m256i q5_k_vec(const uint8_t *row, int64_t b) {
    const uint8_t *sb = row + 176 * (b / 8);
    int s = (int)(b % 8);
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(sb + 16)), s), _mm256_set1_epi8(1));
    return _mm256_or_si256(k4_quants256(sb + 48, s), _mm256_slli_epi16(h, 4));
}
static inline __m256i q6_k_vec(const uint8_t *row, int64_t b) {
    const uint8_t *sb = row + 210 * (b / 8);
    int n = (int)(b % 8) / 4, i = (int)(b % 8) % 4;
    __m256i l = _mm256_loadu_si256((const __m256i *)(sb + 64 * n + 32 * (i % 2)));
    if (i >= 2) l = _mm256_srli_epi16(l, 4);
    l = _mm256_and_si256(l, _mm256_set1_epi8(0xf));
    __m256i h = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * n));
    h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * i), _mm256_set1_epi8(3));
    return _mm256_or_si256(l, _mm256_slli_epi16(h, 4));
}

/* Eight int32 sums of four w * x products each, x carried as (q << RESIDUAL_SHIFT) + r:
 * lanes 0-3 are values 0-15. w is unsigned (at most 6 bits; 8 with VNNI, whose products
 * are summed in int32), or signed (Q8_0 without VNNI: |w| against x carrying w's sign, so
 * that pairs stay <= 2 * 127 * 127 < 32768 in maddubs' int16). */
static inline __m256i int_dot(__m256i w, __m256i xq, __m256i xr, int is_signed) {
#if VNNI
    (void)is_signed;  /* VNNI's Q8_0 weights arrive offset to unsigned (xor 0x80 by the caller) */
    __m256i sum = _mm256_slli_epi32(dpbusd256(_mm256_setzero_si256(), w, xq), RESIDUAL_SHIFT);
    return dpbusd256(sum, w, xr);
#else
    __m256i pq, pr;
    if (is_signed) {
        __m256i a = _mm256_abs_epi8(w);
        pq = _mm256_maddubs_epi16(a, _mm256_sign_epi8(xq, w));
        pr = _mm256_maddubs_epi16(a, _mm256_sign_epi8(xr, w));
    } else {
        pq = _mm256_maddubs_epi16(w, xq);
        pr = _mm256_maddubs_epi16(w, xr);
    }
    return _mm256_add_epi32(_mm256_madd_epi16(pq, _mm256_set1_epi16(1 << RESIDUAL_SHIFT)),
                            _mm256_madd_epi16(pr, _mm256_set1_epi16(1)));
#endif
}

/* The same sums for x in one pass (activations.h's one_pass): w.q alone, unshifted. */
static inline __m256i int_dot_one(__m256i w, __m256i xq) {
#if VNNI
    return dpbusd256(_mm256_setzero_si256(), w, xq);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xq), _mm256_set1_epi16(1));
#endif
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
#endif
