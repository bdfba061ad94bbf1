/* Causal prefill attention of a prompt chunk, over its own keys or, through the block
 * table, over its cached context and its own keys (a prefix-cache hit, a later chunk):
 *
 *   out[i, h] = softmax_{t <= i}(q[i, h] . k[t, h / G] * scale) @ v[t, h / G],  G = H / KVH
 *
 * q (n, H, D), k and v (n, KVH, D): token rows strided (q_stride, k_stride, v_stride
 * elements: the views of a fused Q/K/V projection), a token's heads contiguous; out
 * (n, H, D) contiguous; D <= 256, H / KVH <= 48. Each (query, head) runs an online softmax
 * over its keys in blocks of 16: the 16 scores are summed together (sum16), and only the
 * keys at or before the query are read (no masked half as in a dense causal GEMM). A
 * task's rows keep their running state in a tile that every key block meets while it is
 * in L1. Float32 arithmetic (bf16 q . k by vdpbf16ps: exact products, float32 sums); bf16
 * rounds the output once. Threads take (KV head, query positions) tasks, the longest
 * (last) queries first. */
#include <string.h>

#include "common.h"

#define MAX_CHUNKS 16  /* D <= 256 */

static inline __mmask32 lanes32(int64_t left) {
    return left >= 32 ? (__mmask32)0xffffffffu : left <= 0 ? (__mmask32)0 : (__mmask32)((1u << left) - 1u);
}

static inline __m512 load_row(const void *p, int is_bf16, int64_t c, __mmask16 mask) {
    return is_bf16 ? load_bf16_as_f32((const uint16_t *)p + c, mask) : LOADF((const float *)p + c, mask);
}

/* The query rows of one task, (position, head) pairs of one KV head's query heads, with
 * their running softmax state; key blocks are read once for all of them (they stay in L1
 * while every row meets them: re-reading each query's keys from L2 cost more than the
 * arithmetic). */
#define TILE_ROWS 48

typedef struct {
    int64_t position[TILE_ROWS];
    float top[TILE_ROWS], total[TILE_ROWS];
    float q[TILE_ROWS][16 * MAX_CHUNKS], acc[TILE_ROWS][16 * MAX_CHUNKS];
    uint16_t q_bf16[TILE_ROWS][16 * MAX_CHUNKS];  /* bf16 inputs: the query as it came, for vdpbf16ps */
} query_tile;

/* row r of the tile against keys [t0, t0 + count) (count <= 16, all at or before it).
 * Compiled for constant head sizes (CHUNKS vectors) and input types, so that the 16 dot
 * products stay in registers. */
static inline __attribute__((always_inline)) void attend_block(query_tile *tile, int r, const char *const *k_rows,
        const char *const *v_rows, int64_t count, int64_t d, float scale, const int is_bf16, const int64_t chunks) {
    __m512 qv[MAX_CHUNKS], acc[MAX_CHUNKS];
    for (int64_t i = 0; i < chunks; i++) qv[i] = _mm512_loadu_ps(tile->q[r] + 16 * i);
    __m512 dots[16];
    if (is_bf16) {  /* bf16 q . k: pairs of exact products per instruction (vdpbf16ps), summed in float32 */
        __m512bh qh[MAX_CHUNKS / 2];
        for (int64_t i = 0; i < (chunks + 1) / 2; i++) qh[i] = LOAD(tile->q_bf16[r] + 32 * i, lanes32(d - 32 * i));
        for (int64_t j = 0; j < 16; j++) {
            if (j >= count) { dots[j] = _mm512_setzero_ps(); continue; }
            const uint16_t *kr = (const uint16_t *)k_rows[j];
            __m512 a = _mm512_setzero_ps();
            for (int64_t i = 0; i < (chunks + 1) / 2; i++) a = _mm512_dpbf16_ps(a, qh[i], LOAD(kr + 32 * i, lanes32(d - 32 * i)));
            dots[j] = a;
        }
    } else {
        for (int64_t j = 0; j < 16; j++) {
            if (j >= count) { dots[j] = _mm512_setzero_ps(); continue; }
            const char *kr = k_rows[j];
            __m512 a = _mm512_mul_ps(qv[0], load_row(kr, is_bf16, 0, lanes16(d)));
            for (int64_t i = 1; i < chunks; i++) a = _mm512_fmadd_ps(qv[i], load_row(kr, is_bf16, 16 * i, lanes16(d - 16 * i)), a);
            dots[j] = a;
        }
    }
    const __mmask16 valid = lanes16(count);
    __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(sum16(dots), _mm512_set1_ps(scale)));
    const float top = tile->top[r], block_top = _mm512_reduce_max_ps(s), new_top = block_top > top ? block_top : top;
    /* e^(top - new_top) as a vector (no libm call on the row's critical path); 0 for the first block */
    const __m512 c = top == -INFINITY ? _mm512_setzero_ps() : exp512(_mm512_set1_ps(top - new_top));
    __m512 e = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, _mm512_set1_ps(new_top))));
    tile->total[r] = tile->total[r] * _mm512_cvtss_f32(c) + _mm512_reduce_add_ps(e);
    tile->top[r] = new_top;
    float p[16];
    _mm512_storeu_ps(p, e);
    __m512 odd[MAX_CHUNKS];  /* even and odd keys in two sums: half the dependent chain */
    for (int64_t i = 0; i < chunks; i++) {
        acc[i] = _mm512_mul_ps(_mm512_loadu_ps(tile->acc[r] + 16 * i), c);
        odd[i] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 1 < count; j += 2) {
        const char *vr = v_rows[j], *vr2 = v_rows[j + 1];
        const __m512 w = _mm512_set1_ps(p[j]), w2 = _mm512_set1_ps(p[j + 1]);
        for (int64_t i = 0; i < chunks; i++) {
            acc[i] = _mm512_fmadd_ps(w, load_row(vr, is_bf16, 16 * i, lanes16(d - 16 * i)), acc[i]);
            odd[i] = _mm512_fmadd_ps(w2, load_row(vr2, is_bf16, 16 * i, lanes16(d - 16 * i)), odd[i]);
        }
    }
    if (j < count) {
        const char *vr = v_rows[j];
        const __m512 w = _mm512_set1_ps(p[j]);
        for (int64_t i = 0; i < chunks; i++)
            acc[i] = _mm512_fmadd_ps(w, load_row(vr, is_bf16, 16 * i, lanes16(d - 16 * i)), acc[i]);
    }
    for (int64_t i = 0; i < chunks; i++) _mm512_storeu_ps(tile->acc[r] + 16 * i, _mm512_add_ps(acc[i], odd[i]));
}

#define ATTEND(BF16, CHUNKS) attend_block(tile, r, k_rows, v_rows, count, d, scale, BF16, CHUNKS)
static void attend(query_tile *tile, int r, const char *const *k_rows, const char *const *v_rows, int64_t count,
                   int64_t d, float scale, int is_bf16) {
    if (d == 64) { if (is_bf16) ATTEND(1, 4); else ATTEND(0, 4); }
    else if (d == 128) { if (is_bf16) ATTEND(1, 8); else ATTEND(0, 8); }
    else if (is_bf16) ATTEND(1, (d + 15) / 16);
    else ATTEND(0, (d + 15) / 16);
}

/* Keys: with no block table, key t is row t of k and v (token strides k_stride, v_stride);
 * with one (the chunk's cached context and its own keys, already written to the cache),
 * key t is in slot table[t / block_size] * block_size + t % block_size of the caches, a
 * slot k_stride (= v_stride) elements long. Query i is at position context + i. */
static int prefill_attention(const void *q, const void *k, const void *v, void *out, int64_t n, int64_t h,
                             int64_t kvh, int64_t d, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                             const int64_t *table, int64_t block_size, int64_t context, float scale, int num_threads,
                             int is_bf16) {
    if (n < 1 || kvh < 1 || h % kvh || d < 1 || d > 16 * MAX_CHUNKS || h / kvh > TILE_ROWS || context < 0
        || (table && block_size < 1) || (!table && context))
        return -1;
    const int64_t group = h / kvh, elem = is_bf16 ? 2 : 4, span = TILE_ROWS / group;  /* positions a tile */
    const int64_t blocks = (n + span - 1) / span, chunks = (d + 15) / 16;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if ((context + n) * n * h * d >= (1 << 20))
    for (int64_t task = 0; task < blocks * kvh; task++) {
        const int64_t block = blocks - 1 - task / kvh, kv = task % kvh;  /* the longest queries first */
        const int64_t first = block * span, last = (block + 1) * span < n ? (block + 1) * span : n;
        const char *k_head = (const char *)k + kv * d * elem, *v_head = (const char *)v + kv * d * elem;
        query_tile tile;
        int rows = 0;
        for (int64_t i = first; i < last; i++)
            for (int64_t g = 0; g < group; g++, rows++) {
                const char *src = (const char *)q + (i * q_stride + (kv * group + g) * d) * elem;
                tile.position[rows] = context + i, tile.top[rows] = -INFINITY, tile.total[rows] = 0.0f;
                if (is_bf16) memcpy(tile.q_bf16[rows], src, (size_t)(d * 2));
                for (int64_t c = 0; c < chunks; c++) {
                    _mm512_storeu_ps(tile.q[rows] + 16 * c, load_row(src, is_bf16, 16 * c, lanes16(d - 16 * c)));
                    _mm512_storeu_ps(tile.acc[rows] + 16 * c, _mm512_setzero_ps());
                }
            }
        for (int64_t t0 = 0; t0 < context + last; t0 += 16) {  /* a key block, met by every row at or after it */
            const char *k_rows[16], *v_rows[16];
            for (int64_t j = 0; j < 16 && t0 + j < context + last; j++) {
                const int64_t t = t0 + j, slot = table ? table[t / block_size] * block_size + t % block_size : t;
                k_rows[j] = k_head + slot * k_stride * elem, v_rows[j] = v_head + slot * v_stride * elem;
            }
            for (int r = 0; r < rows; r++) {
                const int64_t keys = tile.position[r] + 1 - t0;
                if (keys > 0) attend(&tile, r, k_rows, v_rows, keys < 16 ? keys : 16, d, scale, is_bf16);
            }
        }
        for (int r = 0; r < rows; r++) {
            const int64_t i = tile.position[r] - context, head = kv * group + r % group;
            const __m512 inv = _mm512_set1_ps(1.0f / tile.total[r]);
            char *dst = (char *)out + ((i * h + head) * d) * elem;
            for (int64_t c = 0; c < chunks; c++) {
                const __mmask16 mask = lanes16(d - 16 * c);
                const __m512 o = _mm512_mul_ps(_mm512_loadu_ps(tile.acc[r] + 16 * c), inv);
                if (is_bf16) _mm256_mask_storeu_epi16((uint16_t *)dst + 16 * c, mask, round_to_bf16(o));
                else _mm512_mask_storeu_ps((float *)dst + 16 * c, mask, o);
            }
        }
    }
    return 0;
}

int inferpath_prefill_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t n, int64_t h,
                                    int64_t kvh, int64_t d, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                                    const int64_t *table, int64_t block_size, int64_t context, float scale,
                                    int num_threads) {
    return prefill_attention(q, k, v, out, n, h, kvh, d, q_stride, k_stride, v_stride, table, block_size, context,
                             scale, num_threads, 0);
}

int inferpath_prefill_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out,
                                     int64_t n, int64_t h, int64_t kvh, int64_t d, int64_t q_stride,
                                     int64_t k_stride, int64_t v_stride, const int64_t *table, int64_t block_size,
                                     int64_t context, float scale, int num_threads) {
    return prefill_attention(q, k, v, out, n, h, kvh, d, q_stride, k_stride, v_stride, table, block_size, context,
                             scale, num_threads, 1);
}
