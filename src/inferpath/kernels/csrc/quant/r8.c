/* Q4_K, Q5_K and Q6_K repacked into groups of eight rows (layout: r8.h): the repacking,
 * the kernel at every level, and the dequantizer. Q5_K runs Q4_K's chain on its 0..31
 * values (each quad's fifth bits joined: one shift and two logic ops more).
 *
 * Per super-block and sub-block s (x's 32-value block b = 8t + s), for each x row j:
 *
 *     isum = the eight rows' integer dots with x's int8 q (lanes: rows), exact in int32
 *     acc_j = fma(float(isum), dsc_s * dx_b, acc_j)        dsc_s = d * unit * scale_s
 *     acc_j = fma(dmn_s, sx_b, acc_j)                       dmn_s = -dmin * min_s
 *
 * (Q6_K: per 16-value half, dsc the half's scale, dmn = -32 * d * scale: its offset, and
 * sx the half's sum.) unit: RESIDUAL_STEPS where x is in one int8 pass (activations.h),
 * else 1 and isum = (w.q << RESIDUAL_SHIFT) + w.r. The chain of a row j never depends on
 * the other rows of the call, and the portable form runs the same float operations in the
 * same order (fmaf), so every level gives the same bits. Per group of eight weight rows and
 * sub-block, the weights are unpacked once for all rows of x; the scale vectors (one
 * cvtepu8 of eight bytes) too. With AVX-512 VNNI, matmul.c hands two adjacent groups at
 * once to r8_pair.c (the same chain in 512-bit lanes); this file serves a group alone,
 * except Q6_K at 2..8 rows on AVX2 without VNNI: r8_multi.c (every row in one pass).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "activations.h"
#include "r8.h"

#if defined(__AVX2__)
#include <immintrin.h>
#include "unpack.h"
#endif

/* ---------------------------------------------------------------- repacking (plain C) */
static void repack_group(int qtype, const uint8_t *src, int64_t row_bytes, int64_t nsb, uint8_t *dst) {
    for (int64_t t = 0; t < nsb; t++) {
        for (int r = 0; r < R8_ROWS; r++) {
            const uint8_t *row = src + r * row_bytes;
            uint8_t q[8][32];
            if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
                const int is_q5 = qtype == Q5_K_R8;
                uint8_t *o = dst + t * r8_block_bytes(qtype);
                const uint8_t *sb = row + (is_q5 ? 176 : 144) * t;
                memcpy(o + 2 * r, sb, 2), memcpy(o + 16 + 2 * r, sb + 2, 2);
                for (int s = 0; s < 8; s++) {
                    int scale, min;
                    k_scale_min(sb + 4, s, &scale, &min);
                    o[32 + 8 * s + r] = (uint8_t)scale, o[96 + 8 * s + r] = (uint8_t)min;
                    if (is_q5) q5_k_quants(row, 8 * t + s, q[s]);
                    else q4_k_quants(row, 8 * t + s, q[s]);
                }
                for (int p = 0; p < 4; p++)
                    for (int g = 0; g < 8; g++)
                        for (int e = 0; e < 4; e++)
                            o[k4_quants_at(qtype, p) + g * 32 + 4 * r + e] =
                                (uint8_t)((q[2 * p][4 * g + e] & 0xf) | ((q[2 * p + 1][4 * g + e] & 0xf) << 4));
                if (is_q5)
                    for (int g = 0; g < 8; g++)
                        for (int e = 0; e < 4; e++) {
                            int bits = 0;
                            for (int s = 0; s < 8; s++) bits |= (q[s][4 * g + e] >> 4) << s;
                            o[160 + g * 32 + 4 * r + e] = (uint8_t)bits;
                        }
            } else {
                uint8_t *o = dst + t * Q6_K_R8_BYTES;
                const uint8_t *sb = row + 210 * t;
                memcpy(o + 2 * r, sb + 208, 2);
                if (r == 0) memset(o + 144, 0, 16);  /* padding: the quants 32-byte aligned */
                for (int h = 0; h < 16; h++) o[16 + 8 * h + r] = sb[192 + h];
                for (int s = 0; s < 8; s++) q6_k_quants(row, 8 * t + s, q[s]);
                for (int p = 0; p < 4; p++)
                    for (int g = 0; g < 8; g++)
                        for (int e = 0; e < 4; e++)
                            o[q6_ql_at(p) + g * 32 + 4 * r + e] =
                                (uint8_t)((q[2 * p][4 * g + e] & 0xf) | ((q[2 * p + 1][4 * g + e] & 0xf) << 4));
                for (int h = 0; h < 2; h++)
                    for (int g = 0; g < 8; g++)
                        for (int e = 0; e < 4; e++) {
                            int bits = 0;
                            for (int i = 0; i < 4; i++) bits |= (q[4 * h + i][4 * g + e] >> 4) << (2 * i);
                            o[q6_qh_at(h) + g * 32 + 4 * r + e] = (uint8_t)bits;
                        }
            }
        }
    }
}

/* w: n rows (a multiple of 8) of the file's row_bytes in GGUF format qtype (Q4_K, Q5_K, Q6_K),
 * k values each -> dst (n / 8 groups of k / 256 super-blocks, r8.h): 0, or -1 for a format
 * or shape it does not take. */
int inferpath_quant_repack(int qtype, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k, uint8_t *dst,
                           int num_threads) {
    const int r8 = qtype + R8_BASE;
    const int64_t file_bytes = qtype == Q4_K ? 144 : qtype == Q5_K ? 176 : qtype == Q6_K ? 210 : 0;
    if (!r8_format(r8) || n < R8_ROWS || n % R8_ROWS || k < 256 || k % 256 || row_bytes != k / 256 * file_bytes)
        return -1;
    const int64_t nsb = k / 256, group = R8_ROWS * r8_row_bytes(r8) * nsb;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t g = 0; g < n / R8_ROWS; g++) repack_group(r8, w + g * R8_ROWS * row_bytes, row_bytes, nsb, dst + g * group);
    return 0;
}

/* ---------------------------------------------------------------- dequantizing */
/* as blocks.h's params and matmul.c's dequantizer: scale * (q - OFFSET) + min, unfused */
static void __attribute__((optimize("fp-contract=off")))
dequantize_group(int qtype, const uint8_t *group, int64_t nsb, int64_t k, float *out) {
    for (int64_t t = 0; t < nsb; t++)
        for (int r = 0; r < R8_ROWS; r++)
            for (int s = 0; s < 8; s++) {
                float *dst = out + r * k + 256 * t + 32 * s;
                if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
                    const uint8_t *o = group + t * r8_block_bytes(qtype);
                    float scale = half_to_float(o + 2 * r) * (float)o[32 + 8 * s + r];
                    float min = -half_to_float(o + 16 + 2 * r) * (float)o[96 + 8 * s + r];
                    const uint8_t *qs = o + k4_quants_at(qtype, s / 2);
                    for (int e = 0; e < 32; e++) {
                        const int at = (e / 4) * 32 + 4 * r + e % 4, byte = qs[at];
                        const int fifth = qtype == Q5_K_R8 ? ((o[160 + at] >> s) & 1) << 4 : 0;
                        dst[e] = scale * (float)(((s % 2) ? byte >> 4 : byte & 0xf) | fifth) + min;
                    }
                } else {
                    const uint8_t *o = group + t * Q6_K_R8_BYTES;
                    const float d = half_to_float(o + 2 * r);
                    const uint8_t *ql = o + q6_ql_at(s / 2), *qh = o + q6_qh_at(s / 4);
                    for (int e = 0; e < 32; e++) {
                        const int at = (e / 4) * 32 + 4 * r + e % 4;
                        int q = ((s % 2) ? ql[at] >> 4 : ql[at] & 0xf) | (((qh[at] >> (2 * (s % 4))) & 3) << 4);
                        float scale = d * (float)(int8_t)o[16 + 8 * (2 * s + e / 16) + r];
                        dst[e] = scale * (float)(q - 32) + 0.0f;
                    }
                }
            }
}

void r8_dequantize(int qtype, const uint8_t *w, int64_t rows, int64_t k, float *out, int num_threads) {
    const int64_t nsb = k / 256, group = R8_ROWS * r8_row_bytes(qtype) * nsb;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * k >= 65536)
    for (int64_t g = 0; g < rows / R8_ROWS; g++) dequantize_group(qtype, w + g * group, nsb, k, out + g * R8_ROWS * k);
}

/* ---------------------------------------------------------------- the kernel */
#if defined(__AVX2__)
/* sum over quads [g0, g0 + count) of the eight rows' dots with x's four bytes 4g.. (x:
 * the block's first value): int32 lanes, a row each. Without VNNI, maddubs pairs are
 * summed in int16 (Q4_K: four, |sum| <= 4 * 2 * 15 * 127; Q5_K: four, <= 4 * 2 * 31 * 128;
 * Q6_K: two, <= 2 * 2 * 63 * 127: all < 32768) before one vpmaddwd. */
static inline __attribute__((always_inline)) __m256i quads(const __m256i *w, const int8_t *x, const int g0,
                                                            const int count, const int per_madd) {
    int32_t four;
    __m256i sum = _mm256_setzero_si256();
#if VNNI
    (void)per_madd;
    for (int g = g0; g < g0 + count; g++) {
        memcpy(&four, x + 4 * g, 4);
        sum = dpbusd256(sum, w[g], _mm256_set1_epi32(four));
    }
#else
    for (int g = g0; g < g0 + count; g += per_madd) {
        __m256i pairs = _mm256_setzero_si256();
        for (int i = g; i < g + per_madd; i++) {
            memcpy(&four, x + 4 * i, 4);
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[i], _mm256_set1_epi32(four)));
        }
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
#endif
    return sum;
}

/* the integer dot of x row j's block (one pass, or (q << RESIDUAL_SHIFT) + r) */
static inline __attribute__((always_inline)) __m256i block_dot(const __m256i *w, const int8_t *xq, const int8_t *xr,
                                                                const int g0, const int count, const int per_madd,
                                                                const int one_pass) {
    __m256i s = quads(w, xq, g0, count, per_madd);
    if (one_pass) return s;
    return _mm256_add_epi32(_mm256_slli_epi32(s, RESIDUAL_SHIFT), quads(w, xr, g0, count, per_madd));
}

static inline __m256 cvt8(const uint8_t *p, int is_signed) {
    __m128i bytes = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
}

/* rows j0 .. j0 + R - 1 of x against a group; acc[j] (8 lanes: the weight rows) */
static inline __attribute__((always_inline)) void r8_tile(const int qtype, const uint8_t *group, const q8_rows *x,
                                                           const int64_t j0, const int R, const int one_pass,
                                                           float *out) {
    const int64_t k = x->k, lanes = x->lanes, nsb = k / 256;
    const float unit = one_pass ? RESIDUAL_STEPS : 1.0f;
    const __m256i low = _mm256_set1_epi8(0xf);
    __m256 acc[TILE_ROWS];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t t = 0; t < nsb; t++) {
        __m256i w[8];
        if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
            const int64_t sb_bytes = r8_block_bytes(qtype);
            const uint8_t *o = group + t * sb_bytes;
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o)), _mm256_set1_ps(unit));
            const __m256 dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16))));
            for (int s = 0; s < 8; s++) {
                const int64_t b = 8 * t + s;
                const uint8_t *qs = o + k4_quants_at(qtype, s / 2);
                r8_prefetch(o + s * (sb_bytes / 8), sb_bytes / 8);
                for (int g = 0; g < 8; g++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
                    w[g] = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(v, 4) : v, low);
                    if (qtype == Q5_K_R8) {
                        const __m256i hb = _mm256_loadu_si256((const __m256i *)(o + 160 + 32 * g));
                        const __m256i h = s < 4 ? _mm256_slli_epi16(hb, 4 - s) : _mm256_srli_epi16(hb, s - 4);
                        w[g] = _mm256_or_si256(w[g], _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
                    }
                }
                const __m256 dsc = _mm256_mul_ps(d, cvt8(o + 32 + 8 * s, 0));
                const __m256 dmn = _mm256_mul_ps(dmin, cvt8(o + 96 + 8 * s, 0));
                for (int j = 0; j < R; j++) {
                    const int64_t row = j0 + j;
                    __m256i isum = block_dot(w, x->q + row * k + 32 * b, x->r + row * k + 32 * b, 0, 8, 4, one_pass);
                    const __m256 dx = _mm256_set1_ps(x->d[b * lanes + row]), sx = _mm256_set1_ps(x->s[b * lanes + row]);
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dsc, dx), acc[j]);
                    acc[j] = _mm256_fmadd_ps(dmn, sx, acc[j]);
                }
            }
        } else {
            const uint8_t *o = group + t * Q6_K_R8_BYTES;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
            const __m256i high = _mm256_set1_epi8(0x30);
            for (int s = 0; s < 8; s++) {
                const int64_t b = 8 * t + s;
                const uint8_t *ql = o + q6_ql_at(s / 2), *qh = o + q6_qh_at(s / 4);
                const int i = s % 4;
                r8_prefetch(o + s * (Q6_K_R8_BYTES / 8), Q6_K_R8_BYTES / 8);
                for (int g = 0; g < 8; g++) {
                    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * g));
                    __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * g));
                    h = i == 0 ? _mm256_slli_epi16(h, 4) : i == 1 ? _mm256_slli_epi16(h, 2) : i == 2 ? h : _mm256_srli_epi16(h, 2);
                    w[g] = _mm256_or_si256(_mm256_and_si256(s % 2 ? _mm256_srli_epi16(l, 4) : l, low), _mm256_and_si256(h, high));
                }
                const __m256 sc0 = _mm256_mul_ps(d, cvt8(o + 16 + 8 * (2 * s), 1));
                const __m256 sc1 = _mm256_mul_ps(d, cvt8(o + 16 + 8 * (2 * s + 1), 1));
                const __m256 dsc0 = _mm256_mul_ps(sc0, _mm256_set1_ps(unit)), dsc1 = _mm256_mul_ps(sc1, _mm256_set1_ps(unit));
                const __m256 dmn0 = _mm256_mul_ps(sc0, _mm256_set1_ps(-32.0f)), dmn1 = _mm256_mul_ps(sc1, _mm256_set1_ps(-32.0f));
                for (int j = 0; j < R; j++) {
                    const int64_t row = j0 + j;
                    const int8_t *xq = x->q + row * k + 32 * b, *xr = x->r + row * k + 32 * b;
                    __m256i i0 = block_dot(w, xq, xr, 0, 4, 2, one_pass), i1 = block_dot(w, xq, xr, 4, 4, 2, one_pass);
                    const __m256 dx = _mm256_set1_ps(x->d[b * lanes + row]);
                    const __m256 h0 = _mm256_set1_ps(x->h[(2 * b) * lanes + row]);
                    const __m256 h1 = _mm256_set1_ps(x->h[(2 * b + 1) * lanes + row]);
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dsc0, dx), acc[j]);
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dsc1, dx), acc[j]);
                    acc[j] = _mm256_fmadd_ps(dmn0, h0, acc[j]);
                    acc[j] = _mm256_fmadd_ps(dmn1, h1, acc[j]);
                }
            }
        }
    }
    for (int j = 0; j < R; j++) _mm256_storeu_ps(out + 8 * (j0 + j), acc[j]);
}

/* x rows per pass over a group: all eight with AVX-512's 32 registers, else four (16) */
#define R8_PASS (VNNI512 ? 8 : 4)

static inline __attribute__((always_inline)) void r8_tiles(const int qtype, const uint8_t *group, const q8_rows *x,
                                                            int64_t rows, const int one_pass, float *out) {
    for (int64_t j0 = 0; j0 < rows; j0 += R8_PASS) {
        switch (rows - j0) {
#define PASS_CASE(R) case R: r8_tile(qtype, group, x, j0, R, one_pass, out); break;
            PASS_CASE(1) PASS_CASE(2) PASS_CASE(3)
#if VNNI512
            PASS_CASE(4) PASS_CASE(5) PASS_CASE(6) PASS_CASE(7)
#endif
            default: r8_tile(qtype, group, x, j0, R8_PASS, one_pass, out); break;
#undef PASS_CASE
        }
    }
}

/* each format's tiles in a function of its own: compiled together in one, GCC's code for
 * Q4_K and Q6_K got slower at the avx2 level once Q5_K's joined them (1 thread, streamed:
 * Q6_K_R8 1536 x 8960 one row 555 -> 836 us, Q4_K_R8 8960 x 1536 five rows 1083 -> 1553) */
#define R8_ROWS_OF(NAME, QTYPE)                                                                       \
    static __attribute__((noinline)) void NAME(const uint8_t *group, const q8_rows *x, int64_t rows, float *out) { \
        if (x->one_pass) r8_tiles(QTYPE, group, x, rows, 1, out);                                      \
        else r8_tiles(QTYPE, group, x, rows, 0, out);                                                  \
    }
R8_ROWS_OF(r8_rows_q4_k, Q4_K_R8)
R8_ROWS_OF(r8_rows_q5_k, Q5_K_R8)
R8_ROWS_OF(r8_rows_q6_k, Q6_K_R8)
#undef R8_ROWS_OF

void r8_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out) {
    if (r8_multi_rows(qtype, group, x, rows, out)) return;  /* AVX2, Q6_K, 2..8 rows: r8_multi.c */
    if (qtype == Q4_K_R8) r8_rows_q4_k(group, x, rows, out);
    else if (qtype == Q5_K_R8) r8_rows_q5_k(group, x, rows, out);
    else r8_rows_q6_k(group, x, rows, out);
}

#else
/* ---------------------------------------------------------------- portable: the spec */
/* row r's integer dot over quads [g0, g0 + count) of a sub-block's 32 bytes per quad */
static int32_t row_dot(const uint8_t w[8][32], int r, const int8_t *x, int g0, int count) {
    int32_t sum = 0;
    for (int g = g0; g < g0 + count; g++)
        for (int e = 0; e < 4; e++) sum += (int32_t)w[g][4 * r + e] * (int32_t)x[4 * g + e];
    return sum;
}
static int32_t dot_of(const uint8_t w[8][32], int r, const int8_t *xq, const int8_t *xr, int g0, int count,
                      int one_pass) {
    int32_t s = row_dot(w, r, xq, g0, count);
    return one_pass ? s : (int32_t)((uint32_t)s << RESIDUAL_SHIFT) + row_dot(w, r, xr, g0, count);
}

void __attribute__((optimize("fp-contract=off"))) r8_rows(int qtype, const uint8_t *group, const q8_rows *x,
                                                          int64_t rows, float *out) {
    const int64_t k = x->k, lanes = x->lanes, nsb = k / 256;
    const float unit = x->one_pass ? RESIDUAL_STEPS : 1.0f;
    for (int64_t j = 0; j < rows; j++)
        for (int r = 0; r < R8_ROWS; r++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < nsb; t++)
                for (int s = 0; s < 8; s++) {
                    const int64_t b = 8 * t + s;
                    const int8_t *xq = x->q + j * k + 32 * b, *xr = x->r + j * k + 32 * b;
                    uint8_t w[8][32];
                    const float dx = x->d[b * lanes + j];
                    if (qtype == Q4_K_R8 || qtype == Q5_K_R8) {
                        const uint8_t *o = group + t * r8_block_bytes(qtype), *qs = o + k4_quants_at(qtype, s / 2);
                        for (int g = 0; g < 8; g++)
                            for (int e = 0; e < 32; e++) {
                                w[g][e] = (s % 2) ? qs[32 * g + e] >> 4 : qs[32 * g + e] & 0xf;
                                if (qtype == Q5_K_R8) w[g][e] |= ((o[160 + 32 * g + e] >> s) & 1) << 4;
                            }
                        const float d = half_to_float(o + 2 * r) * unit, dmin = 0.0f - half_to_float(o + 16 + 2 * r);
                        const float dsc = d * (float)o[32 + 8 * s + r], dmn = dmin * (float)o[96 + 8 * s + r];
                        acc = fmaf((float)dot_of(w, r, xq, xr, 0, 8, x->one_pass), dsc * dx, acc);
                        acc = fmaf(dmn, x->s[b * lanes + j], acc);
                    } else {
                        const uint8_t *o = group + t * Q6_K_R8_BYTES;
                        const uint8_t *ql = o + q6_ql_at(s / 2), *qh = o + q6_qh_at(s / 4);
                        for (int g = 0; g < 8; g++)
                            for (int e = 0; e < 32; e++) {
                                int l = (s % 2) ? ql[32 * g + e] >> 4 : ql[32 * g + e] & 0xf;
                                w[g][e] = (uint8_t)(l | (((qh[32 * g + e] >> (2 * (s % 4))) & 3) << 4));
                            }
                        const float d = half_to_float(o + 2 * r);
                        const float sc0 = d * (float)(int8_t)o[16 + 8 * (2 * s) + r];
                        const float sc1 = d * (float)(int8_t)o[16 + 8 * (2 * s + 1) + r];
                        const float h0 = x->h[(2 * b) * lanes + j], h1 = x->h[(2 * b + 1) * lanes + j];
                        acc = fmaf((float)dot_of(w, r, xq, xr, 0, 4, x->one_pass), (sc0 * unit) * dx, acc);
                        acc = fmaf((float)dot_of(w, r, xq, xr, 4, 4, x->one_pass), (sc1 * unit) * dx, acc);
                        acc = fmaf(sc0 * -32.0f, h0, acc);
                        acc = fmaf(sc1 * -32.0f, h1, acc);
                    }
                }
            out[8 * j + r] = acc;
        }
}
#endif
