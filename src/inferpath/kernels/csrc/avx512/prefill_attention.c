/* Causal prefill attention of a prompt chunk, over its own keys or, through the block
 * table, over its cached context and its own keys (a prefix-cache hit, a later chunk):
 *
 *   out[i, h] = softmax_{t <= i}(q[i, h] . k[t, h / G] * scale) @ v[t, h / G],  G = H / KVH
 *
 * q (n, H, D), k and v (n, KVH, D): token rows strided (q_stride, k_stride, v_stride
 * elements: the views of a fused Q/K/V projection), a token's heads contiguous; out
 * (n, H, D) contiguous; D <= 256, H / KVH <= TILE_ROWS.
 *
 * A task is one KV head's query heads at a span of positions: a tile of up to TILE_ROWS
 * rows (position, head), each with its running softmax state (top score, lane sums of the
 * weights, output sums). Keys come in blocks of KEYS: a block is transposed once into
 * float32 columns (kt[c]: the block's KEYS values of dimension c), its values copied
 * beside it, and every row at or after it meets it while it is in cache, ROWS rows at a
 * time. A row's KEYS scores are then D multiply-adds of a broadcast query element against
 * the columns (no horizontal sums; 16 terms summed at a time, then the partial sums, for a
 * short rounding chain), and its output sums take D / 16 multiply-adds a key, one value
 * load serving ROWS rows. Only keys at or before a query count (the diagonal block is
 * masked, later blocks are not read). Scores are in log2 units (the query is scaled by
 * scale * log2(e) as the tile is filled), so weights are 2^(score - top); a row's sums are
 * rescaled only when a score passes its top by more than EXCESS (a weight is then at most
 * 2^EXCESS; the final division cancels the offset). Float32 arithmetic throughout (bf16
 * inputs widened exactly); bf16 rounds the output once. Threads take (KV head, query
 * positions) tasks, one KV head's together (its keys stay in L2), the longest (last)
 * queries first, each thread in its own scratch memory. */
#include "common.h"

#define TILE_ROWS 144  /* 3x fewer copies of each key block than 48 rows (512 tokens, d 64: ~10% faster) */
#define KEYS 32        /* a key block: KEY_VECTORS lanes of 16 */
#define KEY_VECTORS (KEYS / 16)
#define ROWS 6         /* rows attended together: ROWS * KEY_VECTORS independent score sums */
#define MAX_PV_CHUNKS 2  /* output vectors a row keeps in registers while the values stream */
#define TILE_SLOTS (TILE_ROWS + ROWS - 1)  /* the last group of ROWS may run past the rows: idle slots */
#define EXCESS 8.0f   /* in log2 units: a weight is at most 2^EXCESS */
#define SUM_LANES 16  /* a row's weight sums: one register */

#include "../drivers/prefill_tasks.h"

/* 2^x, |rel err| < 3e-7 (a degree-5 fit of 2^f on [-1/2, 1/2]); 2^-127 below -127 */
static inline __m512 exp2_512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.3276465470e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6755418926e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5507134646e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022120237e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314694405e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192e+0f));
    return _mm512_scalef_ps(p, n);
}

/* the first min(max(left, 0), 16) lanes */
static inline __mmask16 lanes_upto(int64_t left) {
    return left >= 16 ? (__mmask16)0xffffu : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

static inline __m512 load_row(const void *p, int is_bf16, int64_t c, __mmask16 mask) {
    return is_bf16 ? load_bf16_as_f32((const uint16_t *)p + c, mask) : LOADF((const float *)p + c, mask);
}

/* r[e] <- lane e of each of r[0..15] (a 16 x 16 transpose in registers) */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {  /* per 128-bit block: rows 2i, 2i+1 interleaved */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  /* r[4i + m], block L: rows 4i..4i+3 at column 4L + m */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int m = 0; m < 4; m++) {
        const __m512 a = _mm512_shuffle_f32x4(r[m], r[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 b = _mm512_shuffle_f32x4(r[m], r[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 c = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 e = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
        t[m] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + m] = _mm512_shuffle_f32x4(b, e, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + m] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));
        t[12 + m] = _mm512_shuffle_f32x4(b, e, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* keys [t0, t0 + count) (count <= KEYS) into s->kt (transposed) and s->vb, as float32 */
static void load_key_block(scratch *s, const char *const *k_rows, const char *const *v_rows, int64_t count,
                           int64_t d, int64_t dp, int is_bf16) {
    for (int64_t j = 0; j < KEYS; j++)
        for (int64_t c = 0; c < dp; c += 16)
            _mm512_storeu_ps(s->vb + j * dp + c, j < count ? load_row(v_rows[j], is_bf16, c, lanes_upto(d - c))
                                                           : _mm512_setzero_ps());
    for (int64_t g = 0; g < KEY_VECTORS; g++)
        for (int64_t c = 0; c < dp; c += 16) {
            __m512 r[16];
            for (int64_t j = 0; j < 16; j++)
                r[j] = 16 * g + j < count ? load_row(k_rows[16 * g + j], is_bf16, c, lanes_upto(d - c))
                                          : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t e = 0; e < 16; e++) _mm512_storeu_ps(s->kt + (c + e) * KEYS + 16 * g, r[e]);
        }
}

/* rows r..r+ROWS-1 of the tile (at positions >= t0 or idle) against the block of keys
 * [t0, t0 + count), the output sums pv_chunks vectors at a time. Compiled for constant
 * head sizes, so that the loops unroll. */
static inline __attribute__((always_inline)) void attend_rows(scratch *s, int r, int64_t t0, int64_t count,
                                                              const int64_t d, const int64_t dp,
                                                              const int64_t pv_chunks) {
    __m512 score[ROWS][KEY_VECTORS];
    for (int i = 0; i < ROWS; i++)
        for (int v = 0; v < KEY_VECTORS; v++) score[i][v] = _mm512_setzero_ps();
    const float *q = s->q + r * dp;
    for (int64_t c0 = 0; c0 < d; c0 += 16) {  /* sums of 16 terms, then summed: a shorter rounding chain */
        __m512 part[ROWS][KEY_VECTORS];
        for (int i = 0; i < ROWS; i++)
            for (int v = 0; v < KEY_VECTORS; v++) part[i][v] = _mm512_setzero_ps();
        for (int64_t c = c0; c < c0 + 16 && c < d; c++) {
            __m512 column[KEY_VECTORS];
            for (int v = 0; v < KEY_VECTORS; v++) column[v] = _mm512_loadu_ps(s->kt + c * KEYS + 16 * v);
            for (int i = 0; i < ROWS; i++) {
                const __m512 qc = _mm512_set1_ps(q[i * dp + c]);
                for (int v = 0; v < KEY_VECTORS; v++) part[i][v] = _mm512_fmadd_ps(qc, column[v], part[i][v]);
            }
        }
        for (int i = 0; i < ROWS; i++)
            for (int v = 0; v < KEY_VECTORS; v++) score[i][v] = _mm512_add_ps(score[i][v], part[i][v]);
    }
    float weight[ROWS][KEYS];
    int64_t keys = 0;  /* keys any of the rows reaches */
    for (int i = 0; i < ROWS; i++) {
        const int64_t position = s->position[r + i];
        if (position + 1 - t0 > keys) keys = position + 1 - t0;
        __mmask16 valid[KEY_VECTORS], over = 0;
        for (int v = 0; v < KEY_VECTORS; v++) {
            valid[v] = lanes_upto(position + 1 - t0 - 16 * v);
            over |= _mm512_mask_cmp_ps_mask(valid[v], score[i][v], _mm512_set1_ps(s->top[r + i] + EXCESS), _CMP_GT_OQ);
        }
        float *acc = s->acc + (r + i) * dp, *total = s->total + (r + i) * 16;
        if (over) {  /* a new top: rescale the row's sums (the first block always) */
            __m512 top = _mm512_set1_ps(s->top[r + i]);
            for (int v = 0; v < KEY_VECTORS; v++) top = _mm512_mask_max_ps(top, valid[v], top, score[i][v]);
            const float new_top = _mm512_reduce_max_ps(top);
            const __m512 shrink = exp2_512(_mm512_set1_ps(s->top[r + i] - new_top));  /* ~0 from -inf: the sums are 0 */
            for (int64_t c = 0; c < dp; c += 16) _mm512_storeu_ps(acc + c, _mm512_mul_ps(_mm512_loadu_ps(acc + c), shrink));
            _mm512_storeu_ps(total, _mm512_mul_ps(_mm512_loadu_ps(total), shrink));
            s->top[r + i] = new_top;
        }
        const __m512 top = _mm512_set1_ps(s->top[r + i]);
        __m512 sum = _mm512_loadu_ps(total);
        for (int v = 0; v < KEY_VECTORS; v++) {
            const __m512 p = _mm512_maskz_mov_ps(valid[v], exp2_512(_mm512_sub_ps(score[i][v], top)));
            sum = _mm512_add_ps(sum, p);
            _mm512_storeu_ps(weight[i] + 16 * v, p);
        }
        _mm512_storeu_ps(total, sum);
    }
    if (keys > count) keys = count;
    for (int64_t c0 = 0; c0 < dp; c0 += 16 * pv_chunks) {  /* dp is a multiple of 16 * pv_chunks */
        __m512 acc[ROWS][MAX_PV_CHUNKS];
        for (int i = 0; i < ROWS; i++)
            for (int64_t k = 0; k < pv_chunks; k++) acc[i][k] = _mm512_loadu_ps(s->acc + (r + i) * dp + c0 + 16 * k);
        for (int64_t j = 0; j < keys; j++) {
            const float *value = s->vb + j * dp + c0;
            for (int64_t k = 0; k < pv_chunks; k++) {
                const __m512 vk = _mm512_loadu_ps(value + 16 * k);
                for (int i = 0; i < ROWS; i++) acc[i][k] = _mm512_fmadd_ps(_mm512_set1_ps(weight[i][j]), vk, acc[i][k]);
            }
        }
        for (int i = 0; i < ROWS; i++)
            for (int64_t k = 0; k < pv_chunks; k++) _mm512_storeu_ps(s->acc + (r + i) * dp + c0 + 16 * k, acc[i][k]);
    }
}

/* Each head size its own function (inlined together, they spilled: d 64 20% slower). Two
 * output vectors at a time for 64 and 128 dims: each key then costs a row two value loads
 * and six weight broadcasts for twelve multiply-adds, where one vector a pass left the loop
 * bound by its loads (7 for 6). On AMD Zen 5, 1 thread, the two builds in one process
 * (tests: the same bits): d 128 1.12-1.18x faster at 512 and 2048 tokens (12/2 and 32/8
 * heads), four vectors no faster; in the code of 2026-12-01 one vector had measured 13%
 * faster (d 128, 512 tokens), before the tile of 144 rows and the per-size functions. */
#define NOINLINE __attribute__((noinline))
static NOINLINE void attend_64(scratch *s, int r, int64_t t0, int64_t count) { attend_rows(s, r, t0, count, 64, 64, 2); }
static NOINLINE void attend_128(scratch *s, int r, int64_t t0, int64_t count) {
    attend_rows(s, r, t0, count, 128, 128, 2);
}
static NOINLINE void attend_any(scratch *s, int r, int64_t t0, int64_t count, int64_t d, int64_t dp) {
    attend_rows(s, r, t0, count, d, dp, 1);
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
    for (int r = 0; r < TILE_SLOTS; r++) {
        const int64_t i = first + r / group, g = r % group;
        s->position[r] = r < rows ? context + i : -1, s->top[r] = -INFINITY;
        _mm512_storeu_ps(s->total + r * 16, _mm512_setzero_ps());
        const char *src = (const char *)q + (i * q_stride + (kv * group + g) * d) * elem;
        if (r + 4 * group < rows)  /* 4 positions ahead, here and for the output (512 tokens: 6-8% faster) */
            for (int64_t c = 0; c < d * elem; c += 64) _mm_prefetch(src + 4 * q_stride * elem + c, _MM_HINT_T0);
        for (int64_t c = 0; c < dp; c += 16) {
            _mm512_storeu_ps(s->q + r * dp + c, r < rows ? _mm512_mul_ps(load_row(src, is_bf16, c, lanes_upto(d - c)),
                                                                         _mm512_set1_ps(scale * 1.44269504088896341f))
                                                         : _mm512_setzero_ps());
            _mm512_storeu_ps(s->acc + r * dp + c, _mm512_setzero_ps());
        }
    }
    attend_key_blocks(s, k_head, v_head, rows, d, dp, last, k_stride, v_stride, table, block_size, context, kv_bf16);
    for (int r = 0; r < rows; r++) {
        const int64_t i = s->position[r] - context, head = kv * group + r % group;
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_loadu_ps(s->total + r * 16)));
        char *dst = (char *)out + ((i * h + head) * d) * elem;
        if (r + 4 * group < rows)
            for (int64_t c = 0; c < d * elem; c += 64) _mm_prefetch(dst + 4 * h * d * elem + c, _MM_HINT_ET0);
        for (int64_t c = 0; c < dp; c += 16) {
            const __mmask16 mask = lanes_upto(d - c);
            const __m512 o = _mm512_mul_ps(_mm512_loadu_ps(s->acc + r * dp + c), inv);
            if (is_bf16) _mm256_mask_storeu_epi16((uint16_t *)dst + c, mask, round_to_bf16(o));
            else _mm512_mask_storeu_ps((float *)dst + c, mask, o);
        }
    }
}
