/* Paged decode attention, portable: the part kernel (drivers/attention_parts.h; the contract,
 * planning and combining are in drivers/decode_attention.c). One (sequence, KV head) over
 * keys [t0, t1): the group's query heads share each key and value load. */
#include "common.h"
#include "../drivers/attention_parts.h"

/* Keys and values are read a few rows ahead: a part's rows are 1 / KVH of each cache row,
 * scattered over the block table's blocks, which the hardware prefetchers do not follow
 * (a long context's cache is far out of cache: 512 positions of SmolLM2 are 24 MB). */
#define PREFETCH_AHEAD 8
static inline void prefetch_row(const void *p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch((const char *)p + c, 0, 3);
}

#define DEFINE_PART(NAME, TQ, Q_TO_F32, T, TO_F32)                                                                \
static void NAME(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) { \
    const int64_t d = job->d, group = job->group, n = t1 - t0;                                     \
    const T *k_cache = (const T *)job->k_cache, *v_cache = (const T *)job->v_cache;                 \
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART], qv[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM]; \
    float acc[ATTENTION_MAX_GROUP][ATTENTION_MAX_HEAD_DIM], maxes[ATTENTION_MAX_GROUP], sums[ATTENTION_MAX_GROUP]; \
    for (int64_t g = 0; g < group; g++) {                                                           \
        const TQ *qh = (const TQ *)job->q + (b * job->h_count + kvh * group + g) * d;               \
        for (int64_t c = 0; c < d; c++) { qv[g][c] = Q_TO_F32(qh[c]); acc[g][c] = 0.0f; }           \
        maxes[g] = -INFINITY; sums[g] = 0.0f;                                                       \
    }                                                                                               \
    int64_t slots[ATTENTION_PART];  /* the part's cache rows, in order */                          \
    part_slots(job, b, t0, t1, slots);                                                              \
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

DEFINE_PART(part_f32, float, f32_identity, float, f32_identity)
DEFINE_PART(part_bf16, uint16_t, bf16_to_float, uint16_t, bf16_to_float)
DEFINE_PART(part_f32_kv_bf16, float, f32_identity, uint16_t, bf16_to_float)

#if defined(__AVX2__) && defined(__FMA__)
/* ---------------------------------------------------------------- AVX2 (the avx2 level)
 * The same part, head sizes a multiple of 8: 8 keys' scores at a time, their 8 dot
 * products summed together by one tree of horizontal adds (10 instructions, where one
 * horizontal sum each costs ~6 and a dependent chain). */
#include <immintrin.h>

static inline __m256 load8(const void *p, int is_bf16) {
    if (!is_bf16) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* e^x for x <= 0 (a softmax's shifted scores), |rel err| < 2e-7 (avx512/common.h's exp512) */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));  /* n >= -126: 2^n is a normal float */
}

/* lane j: the sum of v[j]'s 8 lanes */
static inline __m256 sum8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    __m256 c = _mm256_hadd_ps(v[4], v[5]), e = _mm256_hadd_ps(v[6], v[7]);
    __m256 lo = _mm256_hadd_ps(a, b), hi = _mm256_hadd_ps(c, e);  /* 128-bit halves: v0-3 | v4-7 partials */
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* scores[g][0 .. n) <- exp(score - maxes[g]) (unnormalised probabilities); each head's
 * maximum and the probabilities' sum into its partial's first two slots */
static void softmax_rows(float (*scores)[ATTENTION_PART], const float *maxes, int64_t group, int64_t n,
                         float *partial, int64_t d) {
    for (int64_t g = 0; g < group; g++) {
        __m256 m = _mm256_set1_ps(maxes[g]), total = _mm256_setzero_ps();
        for (int64_t t = 0; t < n; t += 8) {  /* scores has room for whole vectors: ATTENTION_PART % 8 == 0 */
            __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)),
                                                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(scores[g] + t), m)), valid);
            _mm256_storeu_ps(scores[g] + t, e);
            total = _mm256_add_ps(total, e);
        }
        float lanes[8], sum = 0.0f;
        _mm256_storeu_ps(lanes, total);
        for (int i = 0; i < 8; i++) sum += lanes[i];
        partial[g * (2 + d)] = maxes[g], partial[g * (2 + d) + 1] = sum;
    }
}

static void part_avx2(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
    const int64_t d = job->d, group = job->group, chunks = d / 8, n = t1 - t0;
    const int is_bf16 = job->is_bf16, kv_bf16 = is_bf16 || job->kv_bf16;
    const int64_t elem = kv_bf16 ? 2 : 4, q_elem = is_bf16 ? 2 : 4, row = job->kvh_count * d * elem;
    const char *k_base = (const char *)job->k_cache + kvh * d * elem, *v_base = (const char *)job->v_cache + kvh * d * elem;
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART], maxes[ATTENTION_MAX_GROUP];
    int64_t slots[ATTENTION_PART];
    part_slots(job, b, t0, t1, slots);
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(k_base + slots[t] * row, d * elem);
    for (int64_t g = 0; g < group; g++) maxes[g] = -INFINITY;
    const char *q_base = (const char *)job->q + (b * job->h_count + kvh * group) * d * q_elem;
    for (int64_t t = 0; t < n; t += 8) {
        int64_t keys = n - t < 8 ? n - t : 8;
        for (int64_t j = 0; j < keys && t + j + 8 < n; j++) prefetch_row(k_base + slots[t + j + 8] * row, d * elem);
        for (int64_t g = 0; g < group; g++) {
            const char *qh = q_base + g * d * q_elem;
            __m256 dots[8];
            for (int64_t j = 0; j < 8; j++) {
                if (j >= keys) { dots[j] = _mm256_setzero_ps(); continue; }
                const char *kr = k_base + slots[t + j] * row;
                __m256 acc = _mm256_mul_ps(load8(qh, is_bf16), load8(kr, kv_bf16));
                for (int64_t i = 1; i < chunks; i++)
                    acc = _mm256_fmadd_ps(load8(qh + 8 * i * q_elem, is_bf16), load8(kr + 8 * i * elem, kv_bf16), acc);
                dots[j] = acc;
            }
            float s[8];
            _mm256_storeu_ps(s, _mm256_mul_ps(sum8(dots), _mm256_set1_ps(job->scale)));
            for (int64_t j = 0; j < keys; j++) {
                scores[g][t + j] = s[j];
                if (s[j] > maxes[g]) maxes[g] = s[j];
            }
        }
    }
    softmax_rows(scores, maxes, group, n, partial, d);
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(v_base + slots[t] * row, d * elem);
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < d; c++) partial[g * (2 + d) + 2 + c] = 0.0f;
    for (int64_t c0 = 0; c0 < chunks; c0 += 4) {  /* 4 vectors of the head at a time, in registers */
        int64_t width = chunks - c0 < 4 ? chunks - c0 : 4;
        __m256 acc[ATTENTION_MAX_GROUP][4];
        for (int64_t g = 0; g < group; g++)
            for (int64_t i = 0; i < 4; i++) acc[g][i] = _mm256_setzero_ps();
        for (int64_t t = 0; t < n; t++) {
            if (c0 == 0 && t + PREFETCH_AHEAD < n) prefetch_row(v_base + slots[t + PREFETCH_AHEAD] * row, d * elem);
            const char *vr = v_base + slots[t] * row + 8 * c0 * elem;
            __m256 vv[4];
            for (int64_t i = 0; i < width; i++) vv[i] = load8(vr + 8 * i * elem, kv_bf16);
            for (int64_t g = 0; g < group; g++) {
                __m256 p = _mm256_set1_ps(scores[g][t]);
                for (int64_t i = 0; i < width; i++) acc[g][i] = _mm256_fmadd_ps(p, vv[i], acc[g][i]);
            }
        }
        for (int64_t g = 0; g < group; g++)
            for (int64_t i = 0; i < width; i++) _mm256_storeu_ps(partial + g * (2 + d) + 2 + 8 * (c0 + i), acc[g][i]);
    }
}

/* ---------------------------------------------------------------- head sizes 32, 64, 128, 256
 * The same part with the head size a compile-time constant (CH vectors of 8) and the group's
 * query heads taken up to 6 at a time: two keys' dot products with 6 heads are 12
 * independent chains in registers, each key vector loaded once for all the heads (the
 * general part above loads a key vector once per head and runs one chain at a time). The
 * weighted sum keeps 6 heads x 2 vectors of accumulators in registers over 32 keys at a
 * time, whose values stay in L1 between its passes. Every value is computed in the general
 * part's order (a dot product's chunks in order, then sum8 over 8 keys; the weighted sum
 * over keys in order), so the bits are its bits: only the loops are interchanged. */
#define AI static inline __attribute__((always_inline))
#define FIXED_HEADS 6
#define PV_BLOCK 32

AI __m256 load8_at(const char *p, const int bf, const int64_t i) { return load8(p + 8 * i * (bf ? 2 : 4), bf); }

/* scores[h][t .. t + keys) (keys <= 8) and maxes[h] for the HPC query heads at q */
AI void qk_block8(const char *q, int64_t q_stride, const char *k_base, const int64_t *slots, int64_t row, int64_t t,
                  int64_t keys, float scale, float (*scores)[ATTENTION_PART], float *maxes, const int CH,
                  const int HPC, const int BF) {
    __m256 dots[FIXED_HEADS][8];
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
        if (j >= keys) {
#pragma GCC unroll 6
            for (int h = 0; h < HPC; h++) dots[h][j] = dots[h][j + 1] = _mm256_setzero_ps();
            continue;
        }
        const int two = j + 1 < keys;
        const char *k0 = k_base + slots[t + j] * row, *k1 = two ? k_base + slots[t + j + 1] * row : k0;
        __m256 a0[FIXED_HEADS], a1[FIXED_HEADS], x0 = load8_at(k0, BF != PART_F32, 0), x1 = load8_at(k1, BF != PART_F32, 0);
#pragma GCC unroll 6
        for (int h = 0; h < HPC; h++) {
            __m256 qq = load8_at(q + h * q_stride, BF == PART_BF16, 0);
            a0[h] = _mm256_mul_ps(qq, x0), a1[h] = _mm256_mul_ps(qq, x1);
        }
#pragma GCC unroll 4
        for (int i = 1; i < CH; i++) {
            x0 = load8_at(k0, BF != PART_F32, i), x1 = load8_at(k1, BF != PART_F32, i);
#pragma GCC unroll 6
            for (int h = 0; h < HPC; h++) {
                __m256 qq = load8_at(q + h * q_stride, BF == PART_BF16, i);
                a0[h] = _mm256_fmadd_ps(qq, x0, a0[h]), a1[h] = _mm256_fmadd_ps(qq, x1, a1[h]);
            }
        }
#pragma GCC unroll 6
        for (int h = 0; h < HPC; h++) dots[h][j] = a0[h], dots[h][j + 1] = two ? a1[h] : _mm256_setzero_ps();
    }
#pragma GCC unroll 6
    for (int h = 0; h < HPC; h++) {
        float s[8];
        _mm256_storeu_ps(s, _mm256_mul_ps(sum8(dots[h]), _mm256_set1_ps(scale)));
        for (int64_t j = 0; j < keys; j++) {
            scores[h][t + j] = s[j];
            if (s[j] > maxes[h]) maxes[h] = s[j];
        }
    }
}

/* acc (partial's slots of HPC heads, width apart) += sum over keys [ta, tb) of p_t v_t; from
 * zero where ``first`` */
AI void pv_block8(const char *v_base, const int64_t *slots, int64_t row, int64_t ta, int64_t tb, int64_t n,
                  const float (*scores)[ATTENTION_PART], float *partial, int64_t width, int first, int prefetch,
                  const int CH, const int HPC, const int BF) {
    for (int c0 = 0; c0 < CH; c0 += 2) {
        __m256 acc[FIXED_HEADS][2];
#pragma GCC unroll 6
        for (int h = 0; h < HPC; h++)
            for (int i = 0; i < 2; i++)
                acc[h][i] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + h * width + 2 + 8 * (c0 + i));
        for (int64_t t = ta; t < tb; t++) {
            if (prefetch && c0 == 0 && t + PREFETCH_AHEAD < n)
                prefetch_row(v_base + slots[t + PREFETCH_AHEAD] * row, 8 * CH * (BF ? 2 : 4));
            const char *vr = v_base + slots[t] * row;
            __m256 v0 = load8_at(vr, BF != PART_F32, c0), v1 = load8_at(vr, BF != PART_F32, c0 + 1);
#pragma GCC unroll 6
            for (int h = 0; h < HPC; h++) {
                __m256 p = _mm256_broadcast_ss(&scores[h][t]);
                acc[h][0] = _mm256_fmadd_ps(p, v0, acc[h][0]), acc[h][1] = _mm256_fmadd_ps(p, v1, acc[h][1]);
            }
        }
#pragma GCC unroll 6
        for (int h = 0; h < HPC; h++)
            for (int i = 0; i < 2; i++) _mm256_storeu_ps(partial + h * width + 2 + 8 * (c0 + i), acc[h][i]);
    }
}

#define QK_CASE(CH, HPC, BF) case HPC: qk_block8(qg, d * q_elem, k_base, slots, row, t, keys, job->scale, scores + g, \
                                                 maxes + g, CH, HPC, BF); break;
#define PV_CASE(CH, HPC, BF) case HPC: pv_block8(v_base, slots, row, ta, tb, n, sg, pg, width, ta == 0, g == 0, \
                                                 CH, HPC, BF); break;
#define HEAD_CASES(CASE, CH, BF) CASE(CH, 1, BF) CASE(CH, 2, BF) CASE(CH, 3, BF) CASE(CH, 4, BF) CASE(CH, 5, BF) \
                                 CASE(CH, 6, BF)

#define FIXED_PART(CH, BF)                                                                          \
static void part_##CH##_##BF(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, \
                             float *partial) {                                                     \
    const int64_t d = 8 * CH, group = job->group, n = t1 - t0, width = 2 + d;                     \
    const int64_t elem = BF != PART_F32 ? 2 : 4, row = job->kvh_count * d * elem;               \
    const int64_t q_elem = BF == PART_BF16 ? 2 : 4;                                               \
    const char *k_base = (const char *)job->k_cache + kvh * d * elem;                             \
    const char *v_base = (const char *)job->v_cache + kvh * d * elem;                             \
    const char *q = (const char *)job->q + (b * job->h_count + kvh * group) * d * q_elem;         \
    float scores[ATTENTION_MAX_GROUP][ATTENTION_PART], maxes[ATTENTION_MAX_GROUP];                \
    int64_t slots[ATTENTION_PART];                                                                \
    part_slots(job, b, t0, t1, slots);                                                              \
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(k_base + slots[t] * row, d * elem); \
    for (int64_t g = 0; g < group; g++) maxes[g] = -INFINITY;                                     \
    for (int64_t t = 0; t < n; t += 8) {                                                          \
        int64_t keys = n - t < 8 ? n - t : 8;                                                     \
        for (int64_t j = 0; j < keys && t + j + 8 < n; j++) prefetch_row(k_base + slots[t + j + 8] * row, d * elem); \
        for (int64_t g = 0; g < group; g += FIXED_HEADS) {                                        \
            const char *qg = q + g * d * q_elem;                                                  \
            switch (group - g < FIXED_HEADS ? group - g : FIXED_HEADS) { HEAD_CASES(QK_CASE, CH, BF) } \
        }                                                                                         \
    }                                                                                             \
    softmax_rows(scores, maxes, group, n, partial, d);                                            \
    for (int64_t t = 0; t < PREFETCH_AHEAD && t < n; t++) prefetch_row(v_base + slots[t] * row, d * elem); \
    for (int64_t ta = 0; ta < n; ta += PV_BLOCK) {                                                \
        int64_t tb = ta + PV_BLOCK < n ? ta + PV_BLOCK : n;                                       \
        for (int64_t g = 0; g < group; g += FIXED_HEADS) {                                        \
            float *pg = partial + g * width;                                                      \
            const float (*sg)[ATTENTION_PART] = (const float (*)[ATTENTION_PART])scores[g];      \
            switch (group - g < FIXED_HEADS ? group - g : FIXED_HEADS) { HEAD_CASES(PV_CASE, CH, BF) } \
        }                                                                                         \
    }                                                                                             \
}

FIXED_PART(4, 0) FIXED_PART(4, 1) FIXED_PART(4, 2)
FIXED_PART(8, 0) FIXED_PART(8, 1) FIXED_PART(8, 2)
FIXED_PART(16, 0) FIXED_PART(16, 1) FIXED_PART(16, 2)
FIXED_PART(32, 0) FIXED_PART(32, 1) FIXED_PART(32, 2)
#endif

void attention_part(const attention_job *job, int64_t b, int64_t kvh, int64_t t0, int64_t t1, float *partial) {
#if defined(__AVX2__) && defined(__FMA__)
    typedef void (*part_fn)(const attention_job *, int64_t, int64_t, int64_t, int64_t, float *);
    static const part_fn fixed[4][3] = {{part_4_0, part_4_1, part_4_2}, {part_8_0, part_8_1, part_8_2},
                                        {part_16_0, part_16_1, part_16_2}, {part_32_0, part_32_1, part_32_2}};
    const int size = job->d == 32 ? 0 : job->d == 64 ? 1 : job->d == 128 ? 2 : job->d == 256 ? 3 : -1;
    if (size >= 0) {
        fixed[size][PART_CASE(job)](job, b, kvh, t0, t1, partial);
        return;
    }
    if (job->d % 8 == 0) {
        part_avx2(job, b, kvh, t0, t1, partial);
        return;
    }
#endif
    (job->is_bf16 ? part_bf16 : job->kv_bf16 ? part_f32_kv_bf16 : part_f32)(job, b, kvh, t0, t1, partial);
}
