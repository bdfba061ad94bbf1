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
#define PREFETCH_AHEAD 16
static inline void prefetch_row(const char *p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
}

/* scores[g][0 .. n) <- exp(score - the part's maximum) (unnormalised probabilities); the
 * maximum and the probabilities' sum into partial's first two slots of each head */
static void softmax_rows(float (*scores)[ATTENTION_PART], const __m512 *maxes, int64_t group, int64_t n,
                         float *partial, int64_t width) {
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
        partial[g * width] = top;
        partial[g * width + 1] = _mm512_reduce_add_ps(total);
    }
}

/* ---------------------------------------------------------------- head sizes 32, 64, 128, 256
 * The same part with the head size a compile-time constant (CH vectors of 16) and the group's
 * query heads taken HP at a time, so that their query vectors (scores) or accumulators
 * (weighted sum) stay in registers while each key or value vector, loaded once, meets all
 * of them. Every value is computed in the general part's order (a dot product's chunks in
 * order, then sum16 over 16 keys; the weighted sum over keys in order), so the bits are
 * the general part's: only the loops are interchanged. */
#define AI static inline __attribute__((always_inline))

AI __m512 load16(const char *src, const int bf16, const int64_t i) {
    return bf16 ? load_bf16_as_f32((const uint16_t *)src + 16 * i, (__mmask16)0xffffu)
                : _mm512_loadu_ps((const float *)src + 16 * i);
}

/* scores[h][t .. t + keys) and maxes[h] for the HPC query heads at q (q_stride bytes apart) */
AI void qk_block(const char *q, int64_t q_stride, const char *k_base, const int64_t *slots, int64_t row,
                 int64_t t, int64_t keys, float scale, float (*scores)[ATTENTION_PART], __m512 *maxes,
                 const int CH, const int HPC, const int BF) {
    __m512 qv[24], dots[8][16];
#pragma GCC unroll 8
    for (int h = 0; h < HPC; h++)
#pragma GCC unroll 16
        for (int i = 0; i < CH; i++) qv[h * CH + i] = load16(q + h * q_stride, BF == PART_BF16, i);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        if (j >= keys) {
#pragma GCC unroll 8
            for (int h = 0; h < HPC; h++) dots[h][j] = _mm512_setzero_ps();
            continue;
        }
        const char *kr = k_base + slots[t + j] * row;
        __m512 acc[8], kk = load16(kr, BF != PART_F32, 0);
#pragma GCC unroll 8
        for (int h = 0; h < HPC; h++) acc[h] = _mm512_mul_ps(qv[h * CH], kk);
#pragma GCC unroll 16
        for (int i = 1; i < CH; i++) {
            kk = load16(kr, BF != PART_F32, i);
#pragma GCC unroll 8
            for (int h = 0; h < HPC; h++) acc[h] = _mm512_fmadd_ps(qv[h * CH + i], kk, acc[h]);
        }
#pragma GCC unroll 8
        for (int h = 0; h < HPC; h++) dots[h][j] = acc[h];
    }
    __mmask16 mask = lanes16(keys);
#pragma GCC unroll 8
    for (int h = 0; h < HPC; h++) {
        __m512 sc = _mm512_mul_ps(sum16(dots[h]), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(scores[h] + t, mask, sc);
        maxes[h] = _mm512_mask_max_ps(maxes[h], mask, maxes[h], sc);
    }
}

/* acc (in partial's slots, HPC heads 2 + d apart) += sum over keys [ta, tb) of p_t v_t; from
 * zero where ``first`` */
AI void pv_block(const char *v_base, const int64_t *slots, int64_t row, int64_t ta, int64_t tb, int64_t n,
                 const float (*scores)[ATTENTION_PART], float *partial, int64_t width, int first, int prefetch,
                 const int CH, const int HPC, const int BF) {
    __m512 acc[24];
#pragma GCC unroll 8
    for (int h = 0; h < HPC; h++)
#pragma GCC unroll 16
        for (int i = 0; i < CH; i++)
            acc[h * CH + i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(partial + h * width + 2 + 16 * i);
    for (int64_t t = ta; t < tb; t++) {
        if (prefetch && t + PREFETCH_AHEAD < n) prefetch_row(v_base + slots[t + PREFETCH_AHEAD] * row, 16 * CH * (BF ? 2 : 4));
        const char *vr = v_base + slots[t] * row;
        __m512 p[8];
#pragma GCC unroll 8
        for (int h = 0; h < HPC; h++) p[h] = _mm512_set1_ps(scores[h][t]);
#pragma GCC unroll 16
        for (int i = 0; i < CH; i++) {
            __m512 vv = load16(vr, BF != PART_F32, i);
#pragma GCC unroll 8
            for (int h = 0; h < HPC; h++) acc[h * CH + i] = _mm512_fmadd_ps(p[h], vv, acc[h * CH + i]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < HPC; h++)
#pragma GCC unroll 16
        for (int i = 0; i < CH; i++) _mm512_storeu_ps(partial + h * width + 2 + 16 * i, acc[h * CH + i]);
}

/* keys per block of the weighted sum when the group takes several passes: their values stay
 * in L1 between passes (32 rows of 128 float32: 16 KB) */
#define PV_BLOCK 32

#define FIXED_PART(CH, HP, BF)                                                                     \
static void part_##CH##_##BF(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, \
                             float *partial) {                                                    \
    const int64_t d = 16 * CH, group = job->group, n = t1 - t0, width = 2 + d;                  \
    const int64_t elem = BF != PART_F32 ? 2 : 4, row = job->kvh_count * d * elem;                \
    const int64_t q_elem = BF == PART_BF16 ? 2 : 4;                                              \
    const char *k_base = (const char *)job->k_cache + kvh * d * elem;                            \
    const char *v_base = (const char *)job->v_cache + kvh * d * elem;                            \
    const char *q = (const char *)job->q + ((b * job->h_count + kvh * group) * d) * q_elem;      \
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART];                                           \
    int64_t slots[ATTENTION_PART];                                                               \
    part_slots(job, b, t0, t1, slots);                                                              \
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(k_base + slots[t] * row, d * elem); \
    __m512 maxes[ATTENTION_MAX_GROUP];                                                           \
    for (int64_t g = 0; g < group; g++) maxes[g] = _mm512_set1_ps(-INFINITY);                   \
    for (int64_t t = 0; t < n; t += 16) {                                                        \
        int64_t keys = n - t < 16 ? n - t : 16;                                                  \
        for (int64_t j = 0; j < keys && t + j + 16 < n; j++) prefetch_row(k_base + slots[t + j + 16] * row, d * elem); \
        for (int64_t g = 0; g < group; g += HP) {                                                \
            const char *qg = q + g * d * q_elem;                                                 \
            switch (group - g < HP ? group - g : HP) {                                           \
            FIXED_QK_CASES_##HP(CH, BF)                                                          \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    softmax_rows(scores, maxes, group, n, partial, width);                                       \
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(v_base + slots[t] * row, d * elem); \
    const int64_t span = group <= HP ? n : PV_BLOCK;                                              \
    for (int64_t ta = 0; ta < n; ta += span) {                                                   \
        int64_t tb = ta + span < n ? ta + span : n;                                              \
        for (int64_t g = 0; g < group; g += HP) {                                                \
            float *pg = partial + g * width;                                                     \
            const float (*sg)[ATTENTION_PART] = (const float (*)[ATTENTION_PART])scores[g];     \
            switch (group - g < HP ? group - g : HP) {                                           \
            FIXED_PV_CASES_##HP(CH, BF)                                                          \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
}

#define QK_CASE(CH, HPC, BF) case HPC: qk_block(qg, d * q_elem, k_base, slots, row, t, keys, job->scale, scores + g, \
                                                maxes + g, CH, HPC, BF); break;
#define PV_CASE(CH, HPC, BF) case HPC: pv_block(v_base, slots, row, ta, tb, n, sg, pg, width, ta == 0, g == 0, \
                                                CH, HPC, BF); break;
#define FIXED_QK_CASES_1(CH, BF) QK_CASE(CH, 1, BF)
#define FIXED_QK_CASES_3(CH, BF) QK_CASE(CH, 1, BF) QK_CASE(CH, 2, BF) QK_CASE(CH, 3, BF)
#define FIXED_QK_CASES_6(CH, BF) FIXED_QK_CASES_3(CH, BF) QK_CASE(CH, 4, BF) QK_CASE(CH, 5, BF) QK_CASE(CH, 6, BF)
#define FIXED_QK_CASES_8(CH, BF) FIXED_QK_CASES_6(CH, BF) QK_CASE(CH, 7, BF) QK_CASE(CH, 8, BF)
#define FIXED_PV_CASES_1(CH, BF) PV_CASE(CH, 1, BF)
#define FIXED_PV_CASES_3(CH, BF) PV_CASE(CH, 1, BF) PV_CASE(CH, 2, BF) PV_CASE(CH, 3, BF)
#define FIXED_PV_CASES_6(CH, BF) FIXED_PV_CASES_3(CH, BF) PV_CASE(CH, 4, BF) PV_CASE(CH, 5, BF) PV_CASE(CH, 6, BF)
#define FIXED_PV_CASES_8(CH, BF) FIXED_PV_CASES_6(CH, BF) PV_CASE(CH, 7, BF) PV_CASE(CH, 8, BF)

FIXED_PART(2, 8, 0) FIXED_PART(2, 8, 1) FIXED_PART(2, 8, 2)
FIXED_PART(4, 6, 0) FIXED_PART(4, 6, 1) FIXED_PART(4, 6, 2)
FIXED_PART(8, 3, 0) FIXED_PART(8, 3, 1) FIXED_PART(8, 3, 2)
FIXED_PART(16, 1, 0) FIXED_PART(16, 1, 1) FIXED_PART(16, 1, 2)

/* any head size up to 256: query and key vectors through memory */
static void part_any(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
    const int64_t d = job->d, group = job->group, chunks = (d + 15) / 16, n = t1 - t0;
    const int kv_bf16 = job->is_bf16 || job->kv_bf16;
    const int64_t elem = kv_bf16 ? 2 : 4, q_elem = job->is_bf16 ? 2 : 4, row = job->kvh_count * d * elem;
    const char *k_base = (const char *)job->k_cache + kvh * d * elem, *v_base = (const char *)job->v_cache + kvh * d * elem;
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART];
    __m512 qv[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM / 16];
    for (int64_t g = 0; g < group; g++)
        load_head((const char *)job->q + ((b * job->h_count + kvh * group + g) * d) * q_elem, job->is_bf16, d, qv[g]);
    /* scores = q . k * scale, 16 keys at a time (their 16 dot products reduced together),
     * and each query head's maximum over the part */
    int64_t slots[ATTENTION_PART];  /* the part's cache rows, in order */
    part_slots(job, b, t0, t1, slots);
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(k_base + slots[t] * row, d * elem);
    __m512 maxes[ATTENTION_MAX_GROUP];
    for (int64_t g = 0; g < group; g++) maxes[g] = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t += 16) {
        int64_t keys = n - t < 16 ? n - t : 16;
        for (int64_t j = 0; j < keys && t + j + 16 < n; j++) prefetch_row(k_base + slots[t + j + 16] * row, d * elem);
        __m512 kv[16][ATTENTION_MAX_HEAD_DIM / 16];
        for (int64_t j = 0; j < keys; j++) load_head(k_base + slots[t + j] * row, kv_bf16, d, kv[j]);
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
    softmax_rows(scores, maxes, group, n, partial, 2 + d);
    /* sum_t p_t v_t */
    __m512 acc[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM / 16];
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(v_base + slots[t] * row, d * elem);
    for (int64_t t = 0; t < n; t++) {
        if (t + PREFETCH_AHEAD < n) prefetch_row(v_base + slots[t + PREFETCH_AHEAD] * row, d * elem);
        __m512 vv[ATTENTION_MAX_HEAD_DIM / 16];
        load_head(v_base + slots[t] * row, kv_bf16, d, vv);
        for (int64_t g = 0; g < group; g++) {
            __m512 p = _mm512_set1_ps(scores[g][t]);
            for (int64_t i = 0; i < chunks; i++) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]);
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0, i = 0; c < d; c += 16, i++)
            _mm512_mask_storeu_ps(partial + g * (2 + d) + 2 + c, lanes16(d - c), acc[g][i]);
}

void attention_part(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
    typedef void (*part_fn)(const attention_job *, int64_t, int64_t, int64_t, int64_t, float *);
    static const part_fn fixed[4][3] = {{part_2_0, part_2_1, part_2_2}, {part_4_0, part_4_1, part_4_2},
                                        {part_8_0, part_8_1, part_8_2}, {part_16_0, part_16_1, part_16_2}};
    const int size = job->d == 32 ? 0 : job->d == 64 ? 1 : job->d == 128 ? 2 : job->d == 256 ? 3 : -1;
    if (size >= 0) fixed[size][PART_CASE(job)](job, b, kvh, t0, t1, partial);
    else part_any(job, b, kvh, t0, t1, partial);
}
