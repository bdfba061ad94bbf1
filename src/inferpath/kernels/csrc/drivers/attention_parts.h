/* Paged decode attention in parts (drivers/decode_attention.c): the work of one sequence's
 * query heads sharing a KV head is split over its keys in parts of ATTENTION_PART keys,
 * each part one task (flash-decoding). A task leaves, per query head, its running maximum,
 * the sum of exp(score - maximum) and the unnormalised weighted sum of values; the parts
 * are then combined in order. The split depends only on the sequence's own length, never
 * on the thread count or the batch, so a row's output is the same whoever runs it.
 * The part kernel itself is per level (avx512/attention.c, portable/attention.c). */
#ifndef INFERPATH_ATTENTION_PARTS_H
#define INFERPATH_ATTENTION_PARTS_H

#include <stdint.h>

#define ATTENTION_PART 128
#define ATTENTION_MAX_GROUP 16
#define ATTENTION_MAX_HEAD_DIM 256

/* The parts' dtype cases: q and caches float32, both bf16, or float32 q over bf16 caches */
enum { PART_F32 = 0, PART_BF16 = 1, PART_F32_KV_BF16 = 2 };
#define PART_CASE(job) ((job)->is_bf16 ? PART_BF16 : (job)->kv_bf16 ? PART_F32_KV_BF16 : PART_F32)

typedef struct {
    const void *q, *k_cache, *v_cache;  /* q float32 or bf16 (is_bf16); the caches bf16 where is_bf16 or kv_bf16 */
    void *out;
    const int64_t *block_tables, *seq_lens;
    int64_t b_count, h_count, kvh_count, d, block_size, max_blocks, window, group;
    float scale;
    int is_bf16;         /* q and out bf16 (and the caches) */
    int kv_bf16;         /* the caches bf16 beside float32 q and out (a bfloat16 KV cache) */
    int64_t tasks;       /* sum over sequences of parts x kvh_count */
    int64_t *first;      /* (b_count + 1): sequence b's tasks are [first[b], first[b + 1]) */
    float *partials;     /* per task, per query head of the group: max, sum, acc[d] */
} attention_job;

/* slots[0 .. t1 - t0): the cache rows of sequence b's positions t0 .. t1 - 1, through its
 * row of the block table (every level's part kernel) */
static inline void part_slots(const attention_job *job, int64_t b, int64_t t0, int64_t t1, int64_t *slots) {
    const int64_t *table = job->block_tables + b * job->max_blocks;
    for (int64_t pos = t0; pos < t1; pos++)
        slots[pos - t0] = table[pos / job->block_size] * job->block_size + pos % job->block_size;
}

/* The part kernel of this level: task's (sequence, KV head, part) into job->partials. */
__attribute__((visibility("hidden"))) void attention_part(const attention_job *job, int64_t b, int64_t kvh,
                                                          int64_t t0, int64_t t1, float *partial);

/* Checks the shapes and plans the tasks: 0, -1 bad shape, -2 a sequence longer than its
 * block table, -3 out of memory. Then run attention_task for every task (any order, any
 * thread), then attention_finish (combines, writes out, frees). */
__attribute__((visibility("hidden"))) int attention_plan(attention_job *job);
__attribute__((visibility("hidden"))) void attention_task(void *job, int64_t task);
__attribute__((visibility("hidden"))) void attention_finish(attention_job *job);
/* positions x heads x head dim over the batch: the work, for the threading thresholds */
__attribute__((visibility("hidden"))) int64_t attention_work(const attention_job *job);

#endif
