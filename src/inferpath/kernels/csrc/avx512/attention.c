/* Paged decode attention. One new query per sequence against its cached keys and values, read in place through
 * its row of the block table (no gather into a contiguous copy):
 *
 *   out[b, h] = softmax_t(q[b, h] . k[t] * scale) @ v[t],  t in [start_b, seq_lens[b])
 *
 * with start_b = max(0, seq_lens[b] - window) for a sliding window (window 0 = none).
 * Grouped-query: query head h reads KV head h / (H / KVH); the H / KVH query heads of a KV
 * head share each key and value load. Scores, softmax and the weighted sum run in float32
 * (as PyTorch's SDPA does for bf16); the output is rounded once. Shapes: q, out (B, H, D);
 * caches (num_blocks, block_size, KVH, D); block_tables (B, max_blocks) int64; seq_lens
 * (B,) int64; D <= 256. Work is split over (sequence, KV head) pairs. */
#include "common.h"

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
/* Less work (positions x heads x head dim, summed over the batch) than this runs on the
 * calling thread alone: a short decode step's attention costs less than waking a thread. */
#define PARALLEL_MIN_WORK (1 << 18)

/* Load one head vector (d <= 256) as float32 vectors. */
static inline void load_head(const void *src, int is_bf16, int64_t d, __m512 *dst) {
    for (int64_t c = 0, i = 0; c < d; c += 16, i++) {
        __mmask16 mask = lanes16(d - c);
        dst[i] = is_bf16 ? load_bf16_as_f32((const uint16_t *)src + c, mask)
                         : LOADF((const float *)src + c, mask);
    }
}

static int paged_decode_attention(const void *q, const void *k_cache, const void *v_cache,
                                  const int64_t *block_tables, const int64_t *seq_lens, void *out,
                                  int64_t b_count, int64_t h_count, int64_t kvh_count, int64_t d,
                                  int64_t block_size, int64_t max_blocks, float scale, int64_t window,
                                  int num_threads, int is_bf16) {
    if (b_count < 1 || kvh_count < 1 || h_count % kvh_count || d < 1 || d > MAX_HEAD_DIM) return -1;
    int64_t group = h_count / kvh_count;
    if (group > MAX_GROUP) return -1;
    int64_t elem = is_bf16 ? 2 : 4;
    int64_t chunks = (d + 15) / 16;
    int status = 0;
    int64_t work = 0;
    for (int64_t b = 0; b < b_count; b++) work += (window > 0 && seq_lens[b] > window ? window : seq_lens[b]) * h_count * d;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (work >= PARALLEL_MIN_WORK)
    for (int64_t task = 0; task < b_count * kvh_count; task++) {
        int64_t b = task / kvh_count, kvh = task % kvh_count;
        int64_t len = seq_lens[b];
        int64_t start = (window > 0 && len > window) ? len - window : 0;
        if (len < 1 || len > max_blocks * block_size) { status = -2; continue; }
        int64_t n = len - start;
        float *scores = (float *)malloc(sizeof(float) * (size_t)(group * ((n + 15) & ~15LL)));
        if (!scores) { status = -3; continue; }
        int64_t stride = (n + 15) & ~15LL;
        __m512 qv[MAX_GROUP][MAX_HEAD_DIM / 16];
        for (int64_t g = 0; g < group; g++)
            load_head((const char *)q + ((b * h_count + kvh * group + g) * d) * elem, is_bf16, d, qv[g]);
        const int64_t *table = block_tables + b * max_blocks;
        /* scores = q . k * scale, and each query head's running maximum */
        float maxes[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) maxes[g] = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            int64_t pos = start + t;
            int64_t slot = table[pos / block_size] * block_size + pos % block_size;
            __m512 kv[MAX_HEAD_DIM / 16];
            load_head((const char *)k_cache + ((slot * kvh_count + kvh) * d) * elem, is_bf16, d, kv);
            for (int64_t g = 0; g < group; g++) {
                __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
                for (int64_t i = 1; i < chunks; i++) acc = _mm512_fmadd_ps(qv[g][i], kv[i], acc);
                float s = _mm512_reduce_add_ps(acc) * scale;
                scores[g * stride + t] = s;
                if (s > maxes[g]) maxes[g] = s;
            }
        }
        /* probabilities (unnormalised), then sum_t p_t v_t / sum_t p_t */
        float sums[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) {
            __m512 m = _mm512_set1_ps(maxes[g]), total = _mm512_setzero_ps();
            float *sg = scores + g * stride;
            for (int64_t t = 0; t < n; t += 16) {
                __mmask16 mask = lanes16(n - t);
                __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sg + t), m));
                e = _mm512_maskz_mov_ps(mask, e);
                _mm512_mask_storeu_ps(sg + t, mask, e);
                total = _mm512_add_ps(total, e);
            }
            sums[g] = _mm512_reduce_add_ps(total);
        }
        __m512 acc[MAX_GROUP][MAX_HEAD_DIM / 16];
        for (int64_t g = 0; g < group; g++)
            for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t++) {
            int64_t pos = start + t;
            int64_t slot = table[pos / block_size] * block_size + pos % block_size;
            __m512 vv[MAX_HEAD_DIM / 16];
            load_head((const char *)v_cache + ((slot * kvh_count + kvh) * d) * elem, is_bf16, d, vv);
            for (int64_t g = 0; g < group; g++) {
                __m512 p = _mm512_set1_ps(scores[g * stride + t]);
                for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]);
            }
        }
        for (int64_t g = 0; g < group; g++) {
            __m512 inv = _mm512_set1_ps(1.0f / sums[g]);
            char *dst = (char *)out + ((b * h_count + kvh * group + g) * d) * elem;
            for (int64_t c = 0, i = 0; c < d; c += 16, i++) {
                __mmask16 mask = lanes16(d - c);
                __m512 o = _mm512_mul_ps(acc[g][i], inv);
                if (is_bf16) _mm256_mask_storeu_epi16((void *)((uint16_t *)dst + c), mask, round_to_bf16(o));
                else _mm512_mask_storeu_ps((float *)dst + c, mask, o);
            }
        }
        free(scores);
    }
    return status;
}

int inferpath_paged_decode_attention_bf16(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                          const int64_t *block_tables, const int64_t *seq_lens, uint16_t *out,
                                          int64_t b, int64_t h, int64_t kvh, int64_t d, int64_t block_size,
                                          int64_t max_blocks, float scale, int64_t window, int num_threads) {
    return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, out, b, h, kvh, d,
                                  block_size, max_blocks, scale, window, num_threads, 1);
}

int inferpath_paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                                         const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                         int64_t b, int64_t h, int64_t kvh, int64_t d, int64_t block_size,
                                         int64_t max_blocks, float scale, int64_t window, int num_threads) {
    return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, out, b, h, kvh, d,
                                  block_size, max_blocks, scale, window, num_threads, 0);
}
