/* Paged decode attention: one new query per sequence against its cached keys and values,
 * read in place through its row of the block table (no gather into a contiguous copy):
 *
 *   out[b, h] = softmax_t(q[b, h] . k[t] * scale) @ v[t],  t in [start_b, seq_lens[b])
 *
 * with start_b = max(0, seq_lens[b] - window) for a sliding window (window 0 = none).
 * Grouped-query: query head h reads KV head h / (H / KVH), and the H / KVH query heads of a
 * KV head share each key and value load. Scores, softmax and the weighted sum run in
 * float32 (as PyTorch's SDPA does for bf16); the output is rounded once. Shapes: q, out
 * (B, H, D); caches (num_blocks, block_size, KVH, D); block_tables (B, max_blocks) int64;
 * seq_lens (B,) int64; D <= 256, H / KVH <= 16.
 *
 * The work is split in parts of keys (attention_parts.h), so that one long sequence keeps
 * every thread busy: run here by OpenMP, or by the decode pool from decode.c. */
#include <math.h>
#include <stdlib.h>

#include "attention_parts.h"
#include "bf16.h"

/* Less work (positions x heads x head dim, summed over the batch) than this runs on the
 * calling thread alone: a short decode step's attention costs less than waking a thread. */
#define PARALLEL_MIN_WORK (1 << 18)

static int64_t first_position(const attention_job *job, int64_t b) {
    int64_t len = job->seq_lens[b];
    return job->window > 0 && len > job->window ? len - job->window : 0;
}

int64_t attention_work(const attention_job *job) {
    int64_t work = 0;
    for (int64_t b = 0; b < job->b_count; b++) work += (job->seq_lens[b] - first_position(job, b)) * job->h_count * job->d;
    return work;
}

int attention_plan(attention_job *job) {
    job->first = 0, job->partials = 0;
    if (job->b_count < 1 || job->kvh_count < 1 || job->h_count % job->kvh_count || job->d < 1
        || job->d > ATTENTION_MAX_HEAD_DIM)
        return -1;
    job->group = job->h_count / job->kvh_count;
    if (job->group > ATTENTION_MAX_GROUP) return -1;
    job->first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(job->b_count + 1));
    if (!job->first) return -3;
    job->first[0] = 0;
    for (int64_t b = 0; b < job->b_count; b++) {
        int64_t len = job->seq_lens[b];
        if (len < 1 || len > job->max_blocks * job->block_size) { free(job->first); job->first = 0; return -2; }
        int64_t parts = (len - first_position(job, b) + ATTENTION_PART - 1) / ATTENTION_PART;
        job->first[b + 1] = job->first[b] + parts * job->kvh_count;
    }
    job->tasks = job->first[job->b_count];
    job->partials = (float *)malloc(sizeof(float) * (size_t)(job->tasks * job->group * (2 + job->d)));
    if (!job->partials) { free(job->first); job->first = 0; return -3; }
    return 0;
}

void attention_task(void *ctx, int64_t task) {
    const attention_job *job = (const attention_job *)ctx;
    int64_t lo = 0, hi = job->b_count - 1;  /* the sequence: first[b] <= task < first[b + 1] */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (job->first[mid] <= task) lo = mid; else hi = mid - 1;
    }
    int64_t b = lo, local = task - job->first[b], part = local / job->kvh_count, kvh = local % job->kvh_count;
    int64_t t0 = first_position(job, b) + part * ATTENTION_PART;
    int64_t t1 = t0 + ATTENTION_PART < job->seq_lens[b] ? t0 + ATTENTION_PART : job->seq_lens[b];
    attention_part(job, b, kvh, t0, t1, job->partials + task * job->group * (2 + job->d));
}

void attention_finish(attention_job *job) {
    const int64_t d = job->d, group = job->group, kvh_count = job->kvh_count, width = 2 + d;
    for (int64_t b = 0; b < job->b_count; b++) {
        int64_t parts = (job->first[b + 1] - job->first[b]) / kvh_count;
        for (int64_t kvh = 0; kvh < kvh_count; kvh++)
            for (int64_t g = 0; g < group; g++) {
                /* part p of (b, kvh): task first[b] + p * kvh_count + kvh */
                const float *part0 = job->partials + ((job->first[b] + kvh) * group + g) * width;
                const int64_t step = kvh_count * group * width;
                float top = part0[0];
                for (int64_t p = 1; p < parts; p++) top = fmaxf(top, part0[p * step]);
                float acc[ATTENTION_MAX_HEAD_DIM], total = 0.0f;
                for (int64_t c = 0; c < d; c++) acc[c] = 0.0f;
                for (int64_t p = 0; p < parts; p++) {
                    const float *part = part0 + p * step;
                    float w = parts == 1 ? 1.0f : expf(part[0] - top);
                    total += part[1] * w;
                    for (int64_t c = 0; c < d; c++) acc[c] += part[2 + c] * w;
                }
                float inv = 1.0f / total;
                int64_t at = (b * job->h_count + kvh * group + g) * d;
                if (job->is_bf16)
                    for (int64_t c = 0; c < d; c++) ((uint16_t *)job->out)[at + c] = bf16_round(acc[c] * inv);
                else
                    for (int64_t c = 0; c < d; c++) ((float *)job->out)[at + c] = acc[c] * inv;
            }
    }
    free(job->first), free(job->partials);
    job->first = 0, job->partials = 0;
}

static int decode_attention(const void *q, const void *k_cache, const void *v_cache, const int64_t *block_tables,
                            const int64_t *seq_lens, void *out, int64_t b, int64_t h, int64_t kvh, int64_t d,
                            int64_t block_size, int64_t max_blocks, float scale, int64_t window, int num_threads,
                            int is_bf16, int kv_bf16) {
    attention_job job = {.q = q, .k_cache = k_cache, .v_cache = v_cache, .out = out, .block_tables = block_tables,
                         .seq_lens = seq_lens, .b_count = b, .h_count = h, .kvh_count = kvh, .d = d,
                         .block_size = block_size, .max_blocks = max_blocks, .window = window, .scale = scale,
                         .is_bf16 = is_bf16, .kv_bf16 = kv_bf16};
    int status = attention_plan(&job);
    if (status) return status;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (attention_work(&job) >= PARALLEL_MIN_WORK)
    for (int64_t task = 0; task < job.tasks; task++) attention_task(&job, task);
    attention_finish(&job);
    return 0;
}

int inferpath_paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                                         const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                         int64_t b, int64_t h, int64_t kvh, int64_t d, int64_t block_size,
                                         int64_t max_blocks, float scale, int64_t window, int num_threads) {
    return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, out, b, h, kvh, d, block_size, max_blocks,
                            scale, window, num_threads, 0, 0);
}

int inferpath_paged_decode_attention_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                          const int64_t *block_tables, const int64_t *seq_lens, uint16_t *out,
                                          int64_t b, int64_t h, int64_t kvh, int64_t d, int64_t block_size,
                                          int64_t max_blocks, float scale, int64_t window, int num_threads) {
    return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, out, b, h, kvh, d, block_size, max_blocks,
                            scale, window, num_threads, 1, 1);
}

/* float32 queries and output over a bfloat16 cache (EngineConfig.kv_cache_dtype): each key
 * and value widened exactly, then the float32 kernel's arithmetic */
int inferpath_paged_decode_attention_f32_kv_bf16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                                 const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                                 int64_t b, int64_t h, int64_t kvh, int64_t d, int64_t block_size,
                                                 int64_t max_blocks, float scale, int64_t window, int num_threads) {
    return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, out, b, h, kvh, d, block_size, max_blocks,
                            scale, window, num_threads, 0, 1);
}
