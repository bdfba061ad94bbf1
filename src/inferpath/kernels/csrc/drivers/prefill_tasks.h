/* The causal prefill attention's tasks and entry points, shared by each level's kernel
 * (avx512/prefill_attention.c, avx2/prefill_attention.c; the semantics are in their
 * heads). A task is one KV head's query heads at a span of positions: a tile of up to
 * TILE_ROWS rows (position, head). Threads take tasks in order, one KV head's together (its
 * keys stay in L2), the longest (last) queries first, each thread in its own scratch
 * memory; a row's output does not depend on which thread ran it.
 *
 * The including file defines TILE_ROWS, TILE_SLOTS (TILE_ROWS and the idle slots its last
 * group of rows may run past), KEYS (a key block) and SUM_LANES (the lanes of a row's
 * weight sums: a register's floats) and ROWS (rows attended together) before including this
 * header, and its load_key_block, attend and run_task (declared below) after. */
#ifndef INFERPATH_PREFILL_TASKS_H
#define INFERPATH_PREFILL_TASKS_H

#include <stdint.h>
#include <stdlib.h>

#define PREFILL_MAX_DIM 256

/* One thread's memory: the tile's rows (dp floats each: the head size rounded up to 16)
 * and one key block. */
typedef struct {
    int64_t position[TILE_SLOTS];  /* -1: an idle slot, which no key reaches */
    float top[TILE_SLOTS];         /* the running offset of the row's exponents */
    float *q, *acc, *total;        /* (slots, dp) scaled queries, (slots, dp) output sums, (slots, SUM_LANES) weight sums */
    float *kt, *vb;                /* (dp, KEYS) key columns, (KEYS, dp) values; zero past the block's keys */
} scratch;

/* Rows [first, last) of query positions for KV head kv (the level's kernel). Keys: with no
 * block table, key t is row t of k and v (token strides k_stride, v_stride); with one (the
 * chunk's cached context and its own keys, already written to the cache), key t is in slot
 * table[t / block_size] * block_size + t % block_size of the caches, a slot k_stride
 * (= v_stride) elements long. Query i is at position context + i. */
static void run_task(scratch *s, const void *q, const void *k, const void *v, void *out, int64_t h, int64_t kv,
                     int64_t group, int64_t d, int64_t first, int64_t last, int64_t q_stride, int64_t k_stride,
                     int64_t v_stride, const int64_t *table, int64_t block_size, int64_t context, float scale,
                     int is_bf16, int kv_bf16);

/* The level's key-block kernels, defined before run_task: load_key_block copies keys
 * k_rows[0..count) and values v_rows[0..count) into s->kt and s->vb (zero past count);
 * attend runs rows r .. r + ROWS - 1 of the tile against that block, keys t0 .. t0 + count - 1. */
static void load_key_block(scratch *s, const char *const *k_rows, const char *const *v_rows, int64_t count,
                           int64_t d, int64_t dp, int kv_bf16);
static void attend(scratch *s, int r, int64_t t0, int64_t count, int64_t d, int64_t dp);

/* Every key block the tile's rows (rows of them, positions in s->position, increasing) see:
 * keys 0 .. context + last - 1 of KV head kv (k_head, v_head: its first key and value), each
 * block loaded once and attended by the rows at or past its first key. */
static inline void attend_key_blocks(scratch *s, const char *k_head, const char *v_head, int rows, int64_t d,
                                     int64_t dp, int64_t last, int64_t k_stride, int64_t v_stride,
                                     const int64_t *table, int64_t block_size, int64_t context, int kv_bf16) {
    const int64_t kv_elem = kv_bf16 ? 2 : 4;
    int start = 0;  /* the first row at or after the key block */
    for (int64_t t0 = 0; t0 < context + last; t0 += KEYS) {
        const int64_t count = context + last - t0 < KEYS ? context + last - t0 : KEYS;
        const char *k_rows[KEYS], *v_rows[KEYS];
        for (int64_t j = 0; j < count; j++) {
            const int64_t t = t0 + j, slot = table ? table[t / block_size] * block_size + t % block_size : t;
            k_rows[j] = k_head + slot * k_stride * kv_elem, v_rows[j] = v_head + slot * v_stride * kv_elem;
        }
        load_key_block(s, k_rows, v_rows, count, d, dp, kv_bf16);
        while (start < rows && s->position[start] < t0) start++;
        for (int r = start; r < rows; r += ROWS) attend(s, r, t0, count, d, dp);
    }
}

/* 0, -1 for a shape the kernel does not take, -2 where a thread's memory was refused */
static int prefill_attention(const void *q, const void *k, const void *v, void *out, int64_t n, int64_t h,
                             int64_t kvh, int64_t d, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                             const int64_t *table, int64_t block_size, int64_t context, float scale, int num_threads,
                             int is_bf16, int kv_bf16) {
    if (n < 1 || kvh < 1 || h % kvh || d < 1 || d > PREFILL_MAX_DIM || h / kvh > TILE_ROWS || context < 0
        || (table && block_size < 1) || (!table && context))
        return -1;
    const int64_t group = h / kvh, span = TILE_ROWS / group;  /* positions a tile */
    const int64_t blocks = (n + span - 1) / span, dp = (d + 15) / 16 * 16;
    const size_t floats = (size_t)(2 * TILE_SLOTS * dp + TILE_SLOTS * SUM_LANES + 2 * KEYS * dp);
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if ((context + n) * n * h * d >= (1 << 20))
    {
        scratch s;
        float *memory = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (memory) {
            s.q = memory, s.acc = s.q + TILE_SLOTS * dp, s.total = s.acc + TILE_SLOTS * dp;
            s.kt = s.total + TILE_SLOTS * SUM_LANES, s.vb = s.kt + KEYS * dp;
        } else {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < blocks * kvh; task++) {
            const int64_t block = blocks - 1 - task % blocks, kv = task / blocks;
            const int64_t first = block * span, last = (block + 1) * span < n ? (block + 1) * span : n;
            if (memory)
                run_task(&s, q, k, v, out, h, kv, group, d, first, last, q_stride, k_stride, v_stride, table,
                         block_size, context, scale, is_bf16, kv_bf16);
        }
        free(memory);
    }
    return failed ? -2 : 0;
}

int inferpath_prefill_attention_f32(const float *q, const float *k, const float *v, float *out, int64_t n, int64_t h,
                                    int64_t kvh, int64_t d, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                                    const int64_t *table, int64_t block_size, int64_t context, float scale,
                                    int num_threads) {
    return prefill_attention(q, k, v, out, n, h, kvh, d, q_stride, k_stride, v_stride, table, block_size, context,
                             scale, num_threads, 0, 0);
}

int inferpath_prefill_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out,
                                     int64_t n, int64_t h, int64_t kvh, int64_t d, int64_t q_stride,
                                     int64_t k_stride, int64_t v_stride, const int64_t *table, int64_t block_size,
                                     int64_t context, float scale, int num_threads) {
    return prefill_attention(q, k, v, out, n, h, kvh, d, q_stride, k_stride, v_stride, table, block_size, context,
                             scale, num_threads, 1, 1);
}

/* float32 queries and output over bfloat16 keys and values (a bfloat16 KV cache beside
 * float32 activations, EngineConfig.kv_cache_dtype): keys widened exactly as they load */
int inferpath_prefill_attention_f32_kv_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                                            int64_t n, int64_t h, int64_t kvh, int64_t d, int64_t q_stride,
                                            int64_t k_stride, int64_t v_stride, const int64_t *table,
                                            int64_t block_size, int64_t context, float scale, int num_threads) {
    return prefill_attention(q, k, v, out, n, h, kvh, d, q_stride, k_stride, v_stride, table, block_size, context,
                             scale, num_threads, 0, 1);
}

#endif
