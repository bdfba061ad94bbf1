/* Paged decode attention, portable: the part kernel (quant/attention_parts.h; the contract,
 * planning and combining are in quant/decode_attention.c). One (sequence, KV head) over
 * keys [t0, t1): the group's query heads share each key and value load. */
#include "common.h"
#include "../quant/attention_parts.h"

/* Keys and values are read a few rows ahead: a part's rows are 1 / KVH of each cache row,
 * scattered over the block table's blocks, which the hardware prefetchers do not follow
 * (a long context's cache is far out of cache: 512 positions of SmolLM2 are 24 MB). */
#define PREFETCH_AHEAD 8
static inline void prefetch_row(const void *p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch((const char *)p + c, 0, 3);
}

#define DEFINE_PART(NAME, T, TO_F32)                                                                \
static void NAME(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) { \
    const int64_t d = job->d, group = job->group, n = t1 - t0;                                     \
    const int64_t *table = job->block_tables + b * job->max_blocks;                                 \
    const T *k_cache = (const T *)job->k_cache, *v_cache = (const T *)job->v_cache;                 \
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART], qv[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM]; \
    float acc[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM], maxes[ATTENTION_MAX_GROUP], sums[ATTENTION_MAX_GROUP]; \
    for (int64_t g = 0; g < group; g++) {                                                           \
        const T *qh = (const T *)job->q + (b * job->h_count + kvh * group + g) * d;                 \
        for (int64_t c = 0; c < d; c++) { qv[g][c] = TO_F32(qh[c]); acc[g][c] = 0.0f; }             \
        maxes[g] = -INFINITY; sums[g] = 0.0f;                                                       \
    }                                                                                               \
    int64_t slots[ATTENTION_PART];  /* the part's cache rows, in order */                          \
    for (int64_t t = 0, pos = t0; t < n; t++, pos++)                                                \
        slots[t] = table[pos / job->block_size] * job->block_size + pos % job->block_size;          \
    for (int64_t t = 0; t < n; t++) {                                                               \
        if (t + PREFETCH_AHEAD < n) prefetch_row(k_cache + (slots[t + PREFETCH_AHEAD] * job->kvh_count + kvh) * d, d * sizeof(T)); \
        const T *kr = k_cache + (slots[t] * job->kvh_count + kvh) * d;                              \
        for (int64_t g = 0; g < group; g++) {                                                       \
            float s = 0.0f;                                                                         \
            _Pragma("omp simd reduction(+:s)")                                                      \
            for (int64_t c = 0; c < d; c++) s += qv[g][c] * TO_F32(kr[c]);                          \
            s *= job->scale;                                                                        \
            scores[g][t] = s;                                                                       \
            if (s > maxes[g]) maxes[g] = s;                                                         \
        }                                                                                           \
    }                                                                                               \
    for (int64_t g = 0; g < group; g++)                                                             \
        for (int64_t t = 0; t < n; t++) {                                                           \
            float e = expf(scores[g][t] - maxes[g]);                                                \
            scores[g][t] = e;                                                                       \
            sums[g] += e;                                                                           \
        }                                                                                           \
    for (int64_t t = 0; t < n; t++) {                                                               \
        if (t + PREFETCH_AHEAD < n) prefetch_row(v_cache + (slots[t + PREFETCH_AHEAD] * job->kvh_count + kvh) * d, d * sizeof(T)); \
        const T *vr = v_cache + (slots[t] * job->kvh_count + kvh) * d;                              \
        for (int64_t g = 0; g < group; g++) {                                                       \
            float p = scores[g][t];                                                                 \
            _Pragma("omp simd")                                                                     \
            for (int64_t c = 0; c < d; c++) acc[g][c] += p * TO_F32(vr[c]);                         \
        }                                                                                           \
    }                                                                                               \
    for (int64_t g = 0; g < group; g++) {                                                           \
        float *out = partial + g * (2 + d);                                                         \
        out[0] = maxes[g], out[1] = sums[g];                                                        \
        for (int64_t c = 0; c < d; c++) out[2 + c] = acc[g][c];                                     \
    }                                                                                               \
}

DEFINE_PART(part_f32, float, f32_identity)
DEFINE_PART(part_bf16, uint16_t, bf16_to_float)

void attention_part(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
    (job->is_bf16 ? part_bf16 : part_f32)(job, b, kvh, t0, t1, partial);
}
