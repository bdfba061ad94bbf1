/* Paged decode attention, portable: the contract of avx512/attention.c (one query per
 * sequence against its cached keys and values, read in place through its block table;
 * grouped-query heads share each K/V load; float32 scores, softmax and sum; sliding
 * window; D <= 256, query group <= 16). Work is split over (sequence, KV head) pairs. */
#include "common.h"

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
/* Less work (positions x heads x head dim, summed over the batch) than this runs on the
 * calling thread alone: a short decode step's attention costs less than waking a thread. */
#define PARALLEL_MIN_WORK (1 << 18)

#define DEFINE_ATTENTION(NAME, T, TO_F32, FROM_F32)                                                \
int NAME(const T *q, const T *k_cache, const T *v_cache, const int64_t *block_tables,               \
         const int64_t *seq_lens, T *out, int64_t b_count, int64_t h_count, int64_t kvh_count,      \
         int64_t d, int64_t block_size, int64_t max_blocks, float scale, int64_t window,            \
         int num_threads) {                                                                         \
    if (b_count < 1 || kvh_count < 1 || h_count % kvh_count || d < 1 || d > MAX_HEAD_DIM) return -1; \
    int64_t group = h_count / kvh_count;                                                            \
    if (group > MAX_GROUP) return -1;                                                               \
    int status = 0;                                                                                 \
    int64_t work = 0;                                                                               \
    for (int64_t b = 0; b < b_count; b++)                                                           \
        work += (window > 0 && seq_lens[b] > window ? window : seq_lens[b]) * h_count * d;          \
    _Pragma("omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (work >= PARALLEL_MIN_WORK)") \
    for (int64_t task = 0; task < b_count * kvh_count; task++) {                                    \
        int64_t b = task / kvh_count, kvh = task % kvh_count;                                       \
        int64_t len = seq_lens[b];                                                                  \
        int64_t start = (window > 0 && len > window) ? len - window : 0;                            \
        if (len < 1 || len > max_blocks * block_size) { status = -2; continue; }                    \
        int64_t count = len - start;                                                                \
        float *scores = (float *)malloc(sizeof(float) * (size_t)(group * count));                   \
        if (!scores) { status = -3; continue; }                                                     \
        float qv[MAX_GROUP][MAX_HEAD_DIM], acc[MAX_GROUP][MAX_HEAD_DIM], maxes[MAX_GROUP], sums[MAX_GROUP]; \
        for (int64_t g = 0; g < group; g++) {                                                       \
            const T *qh = q + (b * h_count + kvh * group + g) * d;                                  \
            for (int64_t c = 0; c < d; c++) { qv[g][c] = TO_F32(qh[c]); acc[g][c] = 0.0f; }         \
            maxes[g] = -INFINITY; sums[g] = 0.0f;                                                   \
        }                                                                                           \
        const int64_t *table = block_tables + b * max_blocks;                                       \
        for (int64_t t = 0; t < count; t++) {                                                       \
            int64_t pos = start + t, slot = table[pos / block_size] * block_size + pos % block_size; \
            const T *kr = k_cache + (slot * kvh_count + kvh) * d;                                   \
            for (int64_t g = 0; g < group; g++) {                                                   \
                float s = 0.0f;                                                                     \
                _Pragma("omp simd reduction(+:s)")                                                  \
                for (int64_t c = 0; c < d; c++) s += qv[g][c] * TO_F32(kr[c]);                      \
                s *= scale;                                                                         \
                scores[g * count + t] = s;                                                          \
                if (s > maxes[g]) maxes[g] = s;                                                     \
            }                                                                                       \
        }                                                                                           \
        for (int64_t g = 0; g < group; g++)                                                         \
            for (int64_t t = 0; t < count; t++) {                                                   \
                float e = expf(scores[g * count + t] - maxes[g]);                                   \
                scores[g * count + t] = e;                                                          \
                sums[g] += e;                                                                       \
            }                                                                                       \
        for (int64_t t = 0; t < count; t++) {                                                       \
            int64_t pos = start + t, slot = table[pos / block_size] * block_size + pos % block_size; \
            const T *vr = v_cache + (slot * kvh_count + kvh) * d;                                   \
            for (int64_t g = 0; g < group; g++) {                                                   \
                float p = scores[g * count + t];                                                    \
                _Pragma("omp simd")                                                                 \
                for (int64_t c = 0; c < d; c++) acc[g][c] += p * TO_F32(vr[c]);                     \
            }                                                                                       \
        }                                                                                           \
        for (int64_t g = 0; g < group; g++) {                                                       \
            T *dst = out + (b * h_count + kvh * group + g) * d;                                     \
            float inv = 1.0f / sums[g];                                                             \
            for (int64_t c = 0; c < d; c++) dst[c] = FROM_F32(acc[g][c] * inv);                     \
        }                                                                                           \
        free(scores);                                                                               \
    }                                                                                               \
    return status;                                                                                  \
}

DEFINE_ATTENTION(inferpath_paged_decode_attention_f32, float, f32_identity, f32_identity)
DEFINE_ATTENTION(inferpath_paged_decode_attention_bf16, uint16_t, bf16_to_float, round_bf16)
