/* Paged decode attention, AVX-512: the part kernel (drivers/attention_parts.h; the contract,
 * planning and combining are in drivers/decode_attention.c). One (sequence, KV head) over
 * keys [t0, t1): the group's query heads share each key and value load. */
#include "common.h"
#include "../drivers/attention_parts.h"

/* Load one head vector (d <= 256) as float32 vectors. */
static inline void load_head(const void *src, int is_bf16, int64_t d, __m512 *dst) {
    for (int64_t c = 0, i = 0; c < d; c += 16, i++) {
        __mmask16 mask = lanes16(d - c);
        dst[i] = is_bf16 ? load_bf16_as_f32((const uint16_t *)src + c, mask)
                         : LOADF((const float *)src + c, mask);
    }
}

/* Keys and values are read a few rows ahead: a part's rows are 1 / KVH of each cache row,
 * scattered over the block table's blocks, which the hardware prefetchers do not follow
 * (a long context's cache is far out of cache: 512 positions of SmolLM2 are 24 MB). */
#define PREFETCH_AHEAD 8
static inline void prefetch_row(const char *p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
}

void attention_part(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
    const int64_t d = job->d, group = job->group, chunks = (d + 15) / 16, n = t1 - t0;
    const int64_t elem = job->is_bf16 ? 2 : 4, row = job->kvh_count * d * elem;
    const int64_t *table = job->block_tables + b * job->max_blocks;
    const char *k_base = (const char *)job->k_cache + kvh * d * elem, *v_base = (const char *)job->v_cache + kvh * d * elem;
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART];
    __m512 qv[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM / 16];
    for (int64_t g = 0; g < group; g++)
        load_head((const char *)job->q + ((b * job->h_count + kvh * group + g) * d) * elem, job->is_bf16, d, qv[g]);
    /* scores = q . k * scale, 16 keys at a time (their 16 dot products reduced together),
     * and each query head's maximum over the part */
    int64_t slots[ATTENTION_PART];  /* the part's cache rows, in order */
    for (int64_t t = 0, pos = t0; t < n; t++, pos++)
        slots[t] = table[pos / job->block_size] * job->block_size + pos % job->block_size;
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(k_base + slots[t] * row, d * elem);
    __m512 maxes[ATTENTION_MAX_GROUP];
    for (int64_t g = 0; g < group; g++) maxes[g] = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t += 16) {
        int64_t keys = n - t < 16 ? n - t : 16;
        for (int64_t j = 0; j < keys && t + j + 16 < n; j++) prefetch_row(k_base + slots[t + j + 16] * row, d * elem);
        __m512 kv[16][ATTENTION_MAX_HEAD_DIM / 16];
        for (int64_t j = 0; j < keys; j++) load_head(k_base + slots[t + j] * row, job->is_bf16, d, kv[j]);
        for (int64_t g = 0; g < group; g++) {
            __m512 dots[16];
            for (int64_t j = 0; j < 16; j++) {
                if (j >= keys) { dots[j] = _mm512_setzero_ps(); continue; }
                __m512 acc = _mm512_mul_ps(qv[g][0], kv[j][0]);
                for (int64_t i = 1; i < chunks; i++) acc = _mm512_fmadd_ps(qv[g][i], kv[j][i], acc);
                dots[j] = acc;
            }
            __mmask16 mask = lanes16(keys);
            __m512 sc = _mm512_mul_ps(sum16(dots), _mm512_set1_ps(job->scale));
            _mm512_mask_storeu_ps(scores[g] + t, mask, sc);
            maxes[g] = _mm512_mask_max_ps(maxes[g], mask, maxes[g], sc);
        }
    }
    /* probabilities (unnormalised) and their sums */
    for (int64_t g = 0; g < group; g++) {
        float top = _mm512_reduce_max_ps(maxes[g]);
        __m512 m = _mm512_set1_ps(top), total = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t += 16) {
            __mmask16 mask = lanes16(n - t);
            __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores[g] + t), m));
            e = _mm512_maskz_mov_ps(mask, e);
            _mm512_mask_storeu_ps(scores[g] + t, mask, e);
            total = _mm512_add_ps(total, e);
        }
        partial[g * (2 + d)] = top;
        partial[g * (2 + d) + 1] = _mm512_reduce_add_ps(total);
    }
    /* sum_t p_t v_t */
    __m512 acc[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM / 16];
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(v_base + slots[t] * row, d * elem);
    for (int64_t t = 0; t < n; t++) {
        if (t + PREFETCH_AHEAD < n) prefetch_row(v_base + slots[t + PREFETCH_AHEAD] * row, d * elem);
        __m512 vv[ATTENTION_MAX_HEAD_DIM / 16];
        load_head(v_base + slots[t] * row, job->is_bf16, d, vv);
        for (int64_t g = 0; g < group; g++) {
            __m512 p = _mm512_set1_ps(scores[g][t]);
            for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]);
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0, i = 0; c < d; c += 16, i++)
            _mm512_mask_storeu_ps(partial + g * (2 + d) + 2 + c, lanes16(d - c), acc[g][i]);
}
