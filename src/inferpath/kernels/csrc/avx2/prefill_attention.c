/* Causal prefill attention of a prompt chunk on 256-bit AVX2 + FMA (+ F16C) registers (the
 * avx2 and avxvnni levels): csrc/avx512/prefill_attention.c's kernel for 16 ymm registers,
 * with the same exported functions and semantics. A chunk over its own keys or, through
 * the block table, over its cached context and its own keys:
 *
 *   out[i, h] = softmax_{t <= i}(q[i, h] . k[t, h / G] * scale) @ v[t, h / G],  G = H / KVH
 *
 * q (n, H, D), k and v (n, KVH, D): token rows strided (q_stride, k_stride, v_stride
 * elements), a token's heads contiguous; out (n, H, D) contiguous; D <= 256,
 * H / KVH <= TILE_ROWS.
 *
 * A task is one KV head's query heads at a span of positions: a tile of up to TILE_ROWS
 * rows (position, head), each with its running softmax state (top score, lane sums of the
 * weights, output sums). Keys come in blocks of KEYS = 16 (two vectors of 8): a block is
 * transposed once (8 x 8 transposes) into float32 columns (kt[c]: the block's 16 values of
 * dimension c), its values copied beside it, and every row at or after it meets it while
 * it is in cache, ROWS = 4 rows at a time. A row's 16 scores are D multiply-adds of a
 * broadcast query element against two columns: 8 accumulators for 4 rows (partial sums of
 * 16 terms, then added to the scores kept in memory: a short rounding chain, and room for
 * the two columns and the broadcast in 16 registers). Its output sums take D / 8
 * multiply-adds a key, two value vectors at a time, each value load serving 4 rows. Only
 * keys at or before a query count (the diagonal block masked by compare and and, later
 * blocks not read). Scores are in log2 units (the query is scaled by scale * log2(e) as the
 * tile is filled), so weights are 2^(score - top), 2^x a polynomial times 2^n built by an
 * integer shift into the exponent field (AVX2 has no scalef); a row's sums are rescaled only
 * when a score passes its top by more than EXCESS. Float32 arithmetic throughout (bf16
 * inputs widened exactly); bf16 rounds the output once, to nearest even. Threads take
 * (KV head, query positions) tasks, one KV head's together, the longest (last) queries
 * first, each thread in its own scratch memory. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE_ROWS 144  /* as the avx512 kernel: each key block copied once for up to 144 rows */
#define KEYS 16        /* a key block: KEY_VECTORS lanes of 8 */
#define KEY_VECTORS (KEYS / 8)
#define ROWS 4         /* rows attended together: ROWS * KEY_VECTORS partial score sums in registers */
#define PV_CHUNKS 2    /* output vectors of 8 a row keeps in registers while the values stream */
#define TILE_SLOTS (TILE_ROWS + ROWS - 1)  /* the last group of ROWS may run past the rows: idle slots */
#define EXCESS 8.0f    /* in log2 units: a weight is at most 2^EXCESS */
#define SUM_LANES 8  /* a row's weight sums: one register */

#include "../drivers/prefill_tasks.h"

/* 2^x, |rel err| < 3e-7 (a degree-5 fit of 2^f on [-1/2, 1/2]); 2^-126 below -126 */
static inline __m256 exp2_256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.3276465470e-3f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6755418926e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5507134646e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022120237e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314694405e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001192e+0f));
    /* 2^n: n + 127 in the exponent field (n in [-126, EXCESS]: a normal number) */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* all ones in the first min(max(left, 0), 8) lanes */
static inline __m256i lanes_upto(int64_t left) {
    const int32_t l = left >= 8 ? 8 : left <= 0 ? 0 : (int32_t)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(l), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* elements [c, c + 8) of a row, float32 (bf16 widened exactly: its bits in the top half);
 * zero from d on */
static inline __m256 load_row(const void *p, int is_bf16, int64_t c, int64_t d) {
    if (is_bf16) {
        const uint16_t *h = (const uint16_t *)p + c;
        __m128i bits;
        if (d - c >= 8) {
            bits = _mm_loadu_si128((const __m128i *)h);
        } else {
            uint16_t tail[8] = {0};
            for (int64_t j = 0; j < d - c; j++) tail[j] = h[j];
            bits = _mm_loadu_si128((const __m128i *)tail);
        }
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    }
    const float *f = (const float *)p + c;
    return d - c >= 8 ? _mm256_loadu_ps(f) : _mm256_maskload_ps(f, lanes_upto(d - c));
}

/* bf16 bits of 8 floats, rounded to nearest even (finite values) */
static inline __m128i round_to_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));  /* 0..65535: exact */
}

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* r[e] <- lane e of each of r[0..7] (an 8 x 8 transpose in registers) */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {  /* rows 2i, 2i+1 interleaved, per 128-bit half */
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {  /* u[4i + m], half L: rows 4i..4i+3 at column 4L + m */
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int m = 0; m < 4; m++) {  /* rows 0..3 and 4..7 of column m (low halves), of 4 + m (high) */
        r[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
        r[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
    }
}

/* keys [t0, t0 + count) (count <= KEYS) into s->kt (transposed) and s->vb, as float32 */
static void load_key_block(scratch *s, const char *const *k_rows, const char *const *v_rows, int64_t count,
                           int64_t d, int64_t dp, int is_bf16) {
    for (int64_t j = 0; j < KEYS; j++)
        for (int64_t c = 0; c < dp; c += 8)
            _mm256_storeu_ps(s->vb + j * dp + c, j < count && c < d ? load_row(v_rows[j], is_bf16, c, d)
                                                                    : _mm256_setzero_ps());
    for (int64_t g = 0; g < KEY_VECTORS; g++)
        for (int64_t c = 0; c < dp; c += 8) {
            __m256 r[8];
            for (int64_t j = 0; j < 8; j++)
                r[j] = 8 * g + j < count && c < d ? load_row(k_rows[8 * g + j], is_bf16, c, d) : _mm256_setzero_ps();
            transpose8(r);
            for (int64_t e = 0; e < 8; e++) _mm256_storeu_ps(s->kt + (c + e) * KEYS + 8 * g, r[e]);
        }
}

/* rows r..r+ROWS-1 of the tile (at positions >= t0 or idle) against the block of keys
 * [t0, t0 + count). Compiled for constant head sizes, so that the loops unroll. */
static inline __attribute__((always_inline)) void attend_rows(scratch *s, int r, int64_t t0, int64_t count,
                                                              const int64_t d, const int64_t dp) {
    __m256 score[ROWS][KEY_VECTORS];  /* 8 registers: the compiler keeps them in memory between chunks */
    for (int i = 0; i < ROWS; i++)
        for (int v = 0; v < KEY_VECTORS; v++) score[i][v] = _mm256_setzero_ps();
    const float *q = s->q + r * dp;
    for (int64_t c0 = 0; c0 < d; c0 += 16) {  /* sums of 16 terms, then summed: a shorter rounding chain */
        __m256 part[ROWS][KEY_VECTORS];
        for (int i = 0; i < ROWS; i++)
            for (int v = 0; v < KEY_VECTORS; v++) part[i][v] = _mm256_setzero_ps();
        for (int64_t c = c0; c < c0 + 16 && c < d; c++) {
            __m256 column[KEY_VECTORS];
            for (int v = 0; v < KEY_VECTORS; v++) column[v] = _mm256_loadu_ps(s->kt + c * KEYS + 8 * v);
            for (int i = 0; i < ROWS; i++) {
                const __m256 qc = _mm256_broadcast_ss(q + i * dp + c);
                for (int v = 0; v < KEY_VECTORS; v++) part[i][v] = _mm256_fmadd_ps(qc, column[v], part[i][v]);
            }
        }
        for (int i = 0; i < ROWS; i++)
            for (int v = 0; v < KEY_VECTORS; v++) score[i][v] = _mm256_add_ps(score[i][v], part[i][v]);
    }
    float weight[ROWS][KEYS];
    int64_t keys = 0;  /* keys any of the rows reaches */
    for (int i = 0; i < ROWS; i++) {
        const int64_t position = s->position[r + i];
        if (position + 1 - t0 > keys) keys = position + 1 - t0;
        __m256 valid[KEY_VECTORS];  /* all ones at the keys at or before the row's position */
        int over = 0;
        const __m256 limit = _mm256_set1_ps(s->top[r + i] + EXCESS);
        for (int v = 0; v < KEY_VECTORS; v++) {
            valid[v] = _mm256_castsi256_ps(lanes_upto(position + 1 - t0 - 8 * v));
            over |= _mm256_movemask_ps(_mm256_and_ps(valid[v], _mm256_cmp_ps(score[i][v], limit, _CMP_GT_OQ)));
        }
        float *acc = s->acc + (r + i) * dp, *total = s->total + (r + i) * 8;
        if (over) {  /* a new top: rescale the row's sums (the first block always) */
            __m256 top = _mm256_set1_ps(s->top[r + i]);
            for (int v = 0; v < KEY_VECTORS; v++) top = _mm256_blendv_ps(top, _mm256_max_ps(top, score[i][v]), valid[v]);
            const float new_top = hmax(top);
            const __m256 shrink = exp2_256(_mm256_set1_ps(s->top[r + i] - new_top));  /* ~0 from -inf: the sums are 0 */
            for (int64_t c = 0; c < dp; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), shrink));
            _mm256_storeu_ps(total, _mm256_mul_ps(_mm256_loadu_ps(total), shrink));
            s->top[r + i] = new_top;
        }
        const __m256 top = _mm256_set1_ps(s->top[r + i]);
        __m256 sum = _mm256_loadu_ps(total);
        for (int v = 0; v < KEY_VECTORS; v++) {
            const __m256 p = _mm256_and_ps(valid[v], exp2_256(_mm256_sub_ps(score[i][v], top)));
            sum = _mm256_add_ps(sum, p);
            _mm256_storeu_ps(weight[i] + 8 * v, p);
        }
        _mm256_storeu_ps(total, sum);
    }
    if (keys > count) keys = count;
    for (int64_t c0 = 0; c0 < dp; c0 += 8 * PV_CHUNKS) {  /* dp is a multiple of 16 */
        __m256 acc[ROWS][PV_CHUNKS];
        for (int i = 0; i < ROWS; i++)
            for (int k = 0; k < PV_CHUNKS; k++) acc[i][k] = _mm256_loadu_ps(s->acc + (r + i) * dp + c0 + 8 * k);
        for (int64_t j = 0; j < keys; j++) {
            const float *value = s->vb + j * dp + c0;
            const __m256 v0 = _mm256_loadu_ps(value), v1 = _mm256_loadu_ps(value + 8);
            for (int i = 0; i < ROWS; i++) {
                const __m256 w = _mm256_broadcast_ss(&weight[i][j]);
                acc[i][0] = _mm256_fmadd_ps(w, v0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(w, v1, acc[i][1]);
            }
        }
        for (int i = 0; i < ROWS; i++)
            for (int k = 0; k < PV_CHUNKS; k++) _mm256_storeu_ps(s->acc + (r + i) * dp + c0 + 8 * k, acc[i][k]);
    }
}

/* Each common head size its own function, so that its loops unroll without spilling into
 * the others'. */
#define NOINLINE __attribute__((noinline))
static NOINLINE void attend_64(scratch *s, int r, int64_t t0, int64_t count) { attend_rows(s, r, t0, count, 64, 64); }
static NOINLINE void attend_128(scratch *s, int r, int64_t t0, int64_t count) {
    attend_rows(s, r, t0, count, 128, 128);
}
static NOINLINE void attend_any(scratch *s, int r, int64_t t0, int64_t count, int64_t d, int64_t dp) {
    attend_rows(s, r, t0, count, d, dp);
}

static void attend(scratch *s, int r, int64_t t0, int64_t count, int64_t d, int64_t dp) {
    if (d == 64) attend_64(s, r, t0, count);
    else if (d == 128) attend_128(s, r, t0, count);
    else attend_any(s, r, t0, count, d, dp);
}

/* one task (drivers/prefill_tasks.h) */
static void run_task(scratch *s, const void *q, const void *k, const void *v, void *out, int64_t h, int64_t kv,
                     int64_t group, int64_t d, int64_t first, int64_t last, int64_t q_stride, int64_t k_stride,
                     int64_t v_stride, const int64_t *table, int64_t block_size, int64_t context, float scale,
                     int is_bf16, int kv_bf16) {
    const int64_t elem = is_bf16 ? 2 : 4, kv_elem = kv_bf16 ? 2 : 4, dp = (d + 15) / 16 * 16;
    const char *k_head = (const char *)k + kv * d * kv_elem, *v_head = (const char *)v + kv * d * kv_elem;
    const int rows = (int)((last - first) * group);
    const __m256 q_scale = _mm256_set1_ps(scale * 1.44269504088896341f);  /* scores in log2 units */
    for (int r = 0; r < TILE_SLOTS; r++) {
        const int64_t i = first + r / group, g = r % group;
        s->position[r] = r < rows ? context + i : -1, s->top[r] = -INFINITY;
        _mm256_storeu_ps(s->total + r * 8, _mm256_setzero_ps());
        const char *src = (const char *)q + (i * q_stride + (kv * group + g) * d) * elem;
        if (r + 4 * group < rows)  /* 4 positions ahead, here and for the output */
            for (int64_t c = 0; c < d * elem; c += 64) _mm_prefetch(src + 4 * q_stride * elem + c, _MM_HINT_T0);
        for (int64_t c = 0; c < dp; c += 8) {
            _mm256_storeu_ps(s->q + r * dp + c, r < rows && c < d ? _mm256_mul_ps(load_row(src, is_bf16, c, d), q_scale)
                                                                  : _mm256_setzero_ps());
            _mm256_storeu_ps(s->acc + r * dp + c, _mm256_setzero_ps());
        }
    }
    attend_key_blocks(s, k_head, v_head, rows, d, dp, last, k_stride, v_stride, table, block_size, context, kv_bf16);
    for (int r = 0; r < rows; r++) {
        const int64_t i = s->position[r] - context, head = kv * group + r % group;
        const __m256 inv = _mm256_set1_ps(1.0f / hsum(_mm256_loadu_ps(s->total + r * 8)));
        char *dst = (char *)out + ((i * h + head) * d) * elem;
        if (r + 4 * group < rows)
            for (int64_t c = 0; c < d * elem; c += 64) _mm_prefetch(dst + 4 * h * d * elem + c, _MM_HINT_T0);
        for (int64_t c = 0; c < d; c += 8) {
            const __m256 o = _mm256_mul_ps(_mm256_loadu_ps(s->acc + r * dp + c), inv);
            if (is_bf16) {
                const __m128i bits = round_to_bf16(o);
                if (d - c >= 8) {
                    _mm_storeu_si128((__m128i *)((uint16_t *)dst + c), bits);
                } else {
                    uint16_t tail[8];
                    _mm_storeu_si128((__m128i *)tail, bits);
                    memcpy((uint16_t *)dst + c, tail, (size_t)(d - c) * 2);
                }
            } else if (d - c >= 8) {
                _mm256_storeu_ps((float *)dst + c, o);
            } else {
                _mm256_maskstore_ps((float *)dst + c, lanes_upto(d - c), o);
            }
        }
    }
}
