/* GGUF (ggml) block formats, read in place, as 32-value blocks.
 *
 * A tensor row of k values is k / 32 blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or k / 256
 * super-blocks of eight 32-value sub-blocks (Q4_K, Q5_K, Q6_K). Whatever the format, the
 * kernels see one 32-value block at a time as
 *
 *     value[e] = scale[e / 16] * (q[e] - OFFSET) + min          (e in 0..31)
 *
 * with q unsigned and at most 6 bits (Q8_0: signed 8-bit, OFFSET 0), two scales (one per
 * 16 values: Q6_K's sub-blocks are 16 wide; equal for the others) and a min (0 where the
 * format has none). ``TYPE_params`` decodes the scales and min (scalar, the same at every
 * level); ``TYPE_quants`` gathers the 32 q values: here into bytes (the portable level);
 * matmul.c has the AVX2 version into one 256-bit register.
 *
 * Layouts (bytes, little-endian; d, m, dmin are float16):
 *   Q8_0  34: d, int8 q[32]
 *   Q4_0  18: d, q[16] (value j: low nibble of q[j], value j+16: high nibble), OFFSET 8
 *   Q4_1  20: d, m, q[16] as Q4_0, min m
 *   Q5_0  22: d, qh[4] (bit j: 5th bit of value j), q[16] as Q4_0, OFFSET 16
 *   Q5_1  24: d, m, qh[4], q[16], min m
 *   Q4_K 144: d, dmin, scales[12] (eight 6-bit scales and mins), q[128]: sub-blocks 2i
 *             and 2i+1 are the low and high nibbles of q[32i..32i+31];
 *             value = d * scale_s * q - dmin * min_s
 *   Q5_K 176: d, dmin, scales[12], qh[32] (bit s of qh[l]: 5th bit of value l of
 *             sub-block s), q[128] as Q4_K
 *   Q6_K 210: ql[128], qh[64], int8 scales[16], d: 128-value halves n; in each, value l
 *             of quarter i takes the low (i < 2) or high nibble of ql[64n + 32(i % 2) + l]
 *             and bits 2i, 2i+1 of qh[32n + l]; scale of 16 values: scales[8n + 2i + l/16];
 *             OFFSET 32
 */
#ifndef INFERPATH_QUANT_BLOCKS_H
#define INFERPATH_QUANT_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
/* Q4_K, Q5_K and Q6_K repacked at load into groups of eight rows (r8.h): ids of ours, not GGUF's */
enum { R8_BASE = 1000, Q4_K_R8 = R8_BASE + Q4_K, Q5_K_R8 = R8_BASE + Q5_K, Q6_K_R8 = R8_BASE + Q6_K };

/* Every format, for the kernels to instantiate theirs from one list: X(name, GGUF type,
 * values per block, bytes per block, OFFSET, signed q (Q8_0), two scales per block (Q6_K)) */
#define FOR_EACH_FORMAT(X)               \
    X(q8_0, Q8_0, 32, 34, 0, 1, 0)       \
    X(q4_0, Q4_0, 32, 18, 8, 0, 0)       \
    X(q4_1, Q4_1, 32, 20, 0, 0, 0)       \
    X(q5_0, Q5_0, 32, 22, 16, 0, 0)      \
    X(q5_1, Q5_1, 32, 24, 0, 0, 0)       \
    X(q4_k, Q4_K, 256, 144, 0, 0, 0)     \
    X(q5_k, Q5_K, 256, 176, 0, 0, 0)     \
    X(q6_k, Q6_K, 256, 210, 32, 0, 1)

typedef struct {
    float scale[2];  /* values 0-15 and 16-31 */
    float min;
} block_params;

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);  /* one instruction (avx2 and avx512 levels) */
#endif
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else {  /* subnormal: normalise */
        int shift = 0;
        while (!(mant & 0x400u)) { mant <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Two adjacent float16 values (a block's d and m, or d and dmin): one conversion with F16C. */
static inline void half_pair(const uint8_t *p, float *first, float *second) {
#if defined(__F16C__)
    int32_t bits;
    memcpy(&bits, p, 4);
    __m128 pair = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    *first = _mm_cvtss_f32(pair);
    *second = _mm_cvtss_f32(_mm_movehdup_ps(pair));
#else
    *first = half_to_float(p);
    *second = half_to_float(p + 2);
#endif
}

static inline void both(block_params *p, float scale, float min) {
    p->scale[0] = p->scale[1] = scale;
    p->min = min;
}

/* ---------------------------------------------------------------- scales and mins */
static inline void q8_0_params(const uint8_t *row, int64_t b, block_params *p) { both(p, half_to_float(row + 34 * b), 0.0f); }
static inline void q4_0_params(const uint8_t *row, int64_t b, block_params *p) { both(p, half_to_float(row + 18 * b), 0.0f); }
static inline void q5_0_params(const uint8_t *row, int64_t b, block_params *p) { both(p, half_to_float(row + 22 * b), 0.0f); }
static inline void q4_1_params(const uint8_t *row, int64_t b, block_params *p) {
    float d, m;
    half_pair(row + 20 * b, &d, &m);
    both(p, d, m);
}
static inline void q5_1_params(const uint8_t *row, int64_t b, block_params *p) {
    float d, m;
    half_pair(row + 24 * b, &d, &m);
    both(p, d, m);
}

/* The 6-bit scale and min of sub-block s (0..7) from a K super-block's 12 scale bytes. */
static inline void k_scale_min(const uint8_t *q, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = q[s] & 63;
        *min = q[s + 4] & 63;
    } else {
        *scale = (q[s + 4] & 0xf) | ((q[s - 4] >> 6) << 4);
        *min = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

#define DEFINE_K_PARAMS(NAME, SIZE)                                                         \
static inline void NAME##_params(const uint8_t *row, int64_t b, block_params *p) {          \
    const uint8_t *sb = row + SIZE * (b / 8);                                               \
    int scale, min;                                                                         \
    k_scale_min(sb + 4, (int)(b % 8), &scale, &min);                                        \
    float d, dmin;                                                                          \
    half_pair(sb, &d, &dmin);                                                               \
    both(p, d * (float)scale, -dmin * (float)min);                                          \
}
DEFINE_K_PARAMS(q4_k, 144)
DEFINE_K_PARAMS(q5_k, 176)

static inline void q6_k_params(const uint8_t *row, int64_t b, block_params *p) {
    const uint8_t *sb = row + 210 * (b / 8);
    int n = (int)(b % 8) / 4, i = (int)(b % 8) % 4;
    const int8_t *scales = (const int8_t *)(sb + 192);
    float d = half_to_float(sb + 208);
    p->scale[0] = d * (float)scales[8 * n + 2 * i];
    p->scale[1] = d * (float)scales[8 * n + 2 * i + 1];
    p->min = 0.0f;
}

/* ---------------------------------------------------------------- quants, portable */
static inline void nibbles(const uint8_t *q16, uint8_t *q) {
    for (int j = 0; j < 16; j++) { q[j] = q16[j] & 0xf; q[j + 16] = q16[j] >> 4; }
}
static inline void fifth_bits(const uint8_t *qh4, uint8_t *q) {
    uint32_t h;
    memcpy(&h, qh4, 4);
    for (int j = 0; j < 32; j++) q[j] |= ((h >> j) & 1u) << 4;
}
static inline void q8_0_quants(const uint8_t *row, int64_t b, uint8_t *q) { memcpy(q, row + 34 * b + 2, 32); }
static inline void q4_0_quants(const uint8_t *row, int64_t b, uint8_t *q) { nibbles(row + 18 * b + 2, q); }
static inline void q4_1_quants(const uint8_t *row, int64_t b, uint8_t *q) { nibbles(row + 20 * b + 4, q); }
static inline void q5_0_quants(const uint8_t *row, int64_t b, uint8_t *q) {
    nibbles(row + 22 * b + 6, q);
    fifth_bits(row + 22 * b + 2, q);
}
static inline void q5_1_quants(const uint8_t *row, int64_t b, uint8_t *q) {
    nibbles(row + 24 * b + 8, q);
    fifth_bits(row + 24 * b + 4, q);
}
static inline void k4_quants(const uint8_t *qs, int s, uint8_t *q) {  /* sub-block s of 128 nibble bytes */
    const uint8_t *src = qs + 32 * (s / 2);
    for (int l = 0; l < 32; l++) q[l] = (s % 2) ? src[l] >> 4 : src[l] & 0xf;
}
static inline void q4_k_quants(const uint8_t *row, int64_t b, uint8_t *q) {
    k4_quants(row + 144 * (b / 8) + 16, (int)(b % 8), q);
}
static inline void q5_k_quants(const uint8_t *row, int64_t b, uint8_t *q) {
    const uint8_t *sb = row + 176 * (b / 8);
    int s = (int)(b % 8);
    k4_quants(sb + 48, s, q);
    for (int l = 0; l < 32; l++) q[l] |= ((sb[16 + l] >> s) & 1) << 4;
}
static inline void q6_k_quants(const uint8_t *row, int64_t b, uint8_t *q) {
    const uint8_t *sb = row + 210 * (b / 8);
    int n = (int)(b % 8) / 4, i = (int)(b % 8) % 4;
    const uint8_t *ql = sb + 64 * n + 32 * (i % 2), *qh = sb + 128 + 32 * n;
    for (int l = 0; l < 32; l++)
        q[l] = (uint8_t)(((i < 2) ? ql[l] & 0xf : ql[l] >> 4) | (((qh[l] >> (2 * i)) & 3) << 4));
}

#endif
