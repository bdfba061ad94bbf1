/* inferpath's CPU kernels for the rows of a decode step: GEMV and RMSNorm, bf16 and fp32.
 *
 * ---------------------------------------------------------------- GEMV
 * y = x @ w^T (+ bias) for a few rows of x, in bfloat16 (AVX512-BF16) or float32 (AVX512F).
 *
 * x: (m, k) bf16 row-major, w: (n, k) bf16 row-major (nn.Linear's layout), bias: (n,) bf16
 * or NULL, y: (m, n) bf16 row-major. 1 <= m <= 4. Products are accumulated in float32 by
 * vdpbf16ps (pairs of bf16 products per lane) and rounded to bf16 once, to nearest even.
 *
 * Why: a decode step multiplies one activation row by every weight matrix, so it is a
 * matrix-vector product bound by reading the weights. ATen's bf16 path converts every
 * weight to float32 first and runs at about half the memory bandwidth on a 2-core
 * AVX512 machine; here each 64-byte load of weights feeds one instruction per row of x.
 * Four weight rows are processed together so x's vector is loaded once per four rows.
 *
 * Threads: rows of w are split over OpenMP threads. The library links libgomp.so.1, which
 * PyTorch has already loaded, so it shares PyTorch's thread pool (no second set of
 * spinning threads).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>

static inline uint16_t round_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t u = v.u;
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40 : 0));
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

/* Software prefetch distance, in weight rows (two blocks of four) ahead of the rows being
 * read. Measured on the LM head (49152 x 576): one thread 6.7 -> 11 GB/s, two 25 -> 33
 * GB/s; the hardware prefetcher alone does not keep enough lines in flight. Prefetches
 * past the end of w are harmless (they never fault). */
#define PF 8

#define LOAD(ptr, mask) ((__m512bh)_mm512_maskz_loadu_epi16((mask), (const void *)(ptr)))

/* 4 weight rows starting at w, against M rows of x. */
#define DEFINE_BLOCK(M)                                                                      \
static void block4_m##M(const uint16_t *w, const uint16_t *x, int64_t k, float out[4][4]) { \
    __m512 acc[4][M];                                                                        \
    for (int r = 0; r < 4; r++)                                                              \
        for (int j = 0; j < M; j++) acc[r][j] = _mm512_setzero_ps();                         \
    for (int64_t c = 0; c < k; c += 32) {                                                    \
        __mmask32 mask = (k - c >= 32) ? (__mmask32)0xffffffffu                              \
                                       : (__mmask32)((1u << (k - c)) - 1u);                 \
        _mm_prefetch((const char *)(w + PF * k + c), _MM_HINT_T0);                           \
        _mm_prefetch((const char *)(w + (PF + 1) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 2) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 3) * k + c), _MM_HINT_T0);                     \
        __m512bh wv0 = LOAD(w + c, mask), wv1 = LOAD(w + k + c, mask);                       \
        __m512bh wv2 = LOAD(w + 2 * k + c, mask), wv3 = LOAD(w + 3 * k + c, mask);           \
        for (int j = 0; j < M; j++) {                                                        \
            __m512bh xv = LOAD(x + j * k + c, mask);                                         \
            acc[0][j] = _mm512_dpbf16_ps(acc[0][j], wv0, xv);                                \
            acc[1][j] = _mm512_dpbf16_ps(acc[1][j], wv1, xv);                                \
            acc[2][j] = _mm512_dpbf16_ps(acc[2][j], wv2, xv);                                \
            acc[3][j] = _mm512_dpbf16_ps(acc[3][j], wv3, xv);                                \
        }                                                                                    \
    }                                                                                        \
    for (int r = 0; r < 4; r++)                                                              \
        for (int j = 0; j < M; j++) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);             \
}
DEFINE_BLOCK(1)
DEFINE_BLOCK(2)
DEFINE_BLOCK(3)
DEFINE_BLOCK(4)

static float dot_row(const uint16_t *w, const uint16_t *x, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        __mmask32 mask = (k - c >= 32) ? (__mmask32)0xffffffffu : (__mmask32)((1u << (k - c)) - 1u);
        acc = _mm512_dpbf16_ps(acc, LOAD(w + c, mask), LOAD(x + c, mask));
    }
    return _mm512_reduce_add_ps(acc);
}

int inferpath_gemv_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                        int64_t m, int64_t n, int64_t k, int num_threads) {
    if (m < 1 || m > 4 || n < 1 || k < 1) return -1;
    int64_t blocks = n / 4;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        float out[4][4];
        const uint16_t *wb = w + b * 4 * k;
        switch (m) {
            case 1: block4_m1(wb, x, k, out); break;
            case 2: block4_m2(wb, x, k, out); break;
            case 3: block4_m3(wb, x, k, out); break;
            default: block4_m4(wb, x, k, out); break;
        }
        for (int r = 0; r < 4; r++) {
            int64_t row = b * 4 + r;
            float add = bias ? bf16_to_float(bias[row]) : 0.0f;
            for (int64_t j = 0; j < m; j++) y[j * n + row] = round_bf16(out[r][j] + add);
        }
    }
    for (int64_t row = blocks * 4; row < n; row++) {  /* the n % 4 rows left over */
        float add = bias ? bf16_to_float(bias[row]) : 0.0f;
        for (int64_t j = 0; j < m; j++) y[j * n + row] = round_bf16(dot_row(w + row * k, x + j * k, k) + add);
    }
    return 0;
}

/* ---------------------------------------------------------------- float32
 * The same product for float32 x, w, bias, y: one FMA per 16 floats and row of x. */
#define LOADF(ptr, mask) _mm512_maskz_loadu_ps((mask), (const void *)(ptr))

#define DEFINE_BLOCK_F32(M)                                                                   \
static void block4_f32_m##M(const float *w, const float *x, int64_t k, float out[4][4]) {    \
    __m512 acc[4][M];                                                                        \
    for (int r = 0; r < 4; r++)                                                              \
        for (int j = 0; j < M; j++) acc[r][j] = _mm512_setzero_ps();                         \
    for (int64_t c = 0; c < k; c += 16) {                                                    \
        __mmask16 mask = (k - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (k - c)) - 1u); \
        _mm_prefetch((const char *)(w + PF * k + c), _MM_HINT_T0);                           \
        _mm_prefetch((const char *)(w + (PF + 1) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 2) * k + c), _MM_HINT_T0);                     \
        _mm_prefetch((const char *)(w + (PF + 3) * k + c), _MM_HINT_T0);                     \
        __m512 wv0 = LOADF(w + c, mask), wv1 = LOADF(w + k + c, mask);                       \
        __m512 wv2 = LOADF(w + 2 * k + c, mask), wv3 = LOADF(w + 3 * k + c, mask);           \
        for (int j = 0; j < M; j++) {                                                        \
            __m512 xv = LOADF(x + j * k + c, mask);                                          \
            acc[0][j] = _mm512_fmadd_ps(wv0, xv, acc[0][j]);                                 \
            acc[1][j] = _mm512_fmadd_ps(wv1, xv, acc[1][j]);                                 \
            acc[2][j] = _mm512_fmadd_ps(wv2, xv, acc[2][j]);                                 \
            acc[3][j] = _mm512_fmadd_ps(wv3, xv, acc[3][j]);                                 \
        }                                                                                    \
    }                                                                                        \
    for (int r = 0; r < 4; r++)                                                              \
        for (int j = 0; j < M; j++) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);             \
}
DEFINE_BLOCK_F32(1)
DEFINE_BLOCK_F32(2)
DEFINE_BLOCK_F32(3)
DEFINE_BLOCK_F32(4)

static float dot_row_f32(const float *w, const float *x, int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        __mmask16 mask = (k - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (k - c)) - 1u);
        acc = _mm512_fmadd_ps(LOADF(w + c, mask), LOADF(x + c, mask), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

int inferpath_gemv_f32(const float *x, const float *w, const float *bias, float *y,
                       int64_t m, int64_t n, int64_t k, int num_threads) {
    if (m < 1 || m > 4 || n < 1 || k < 1) return -1;
    int64_t blocks = n / 4;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        float out[4][4];
        const float *wb = w + b * 4 * k;
        switch (m) {
            case 1: block4_f32_m1(wb, x, k, out); break;
            case 2: block4_f32_m2(wb, x, k, out); break;
            case 3: block4_f32_m3(wb, x, k, out); break;
            default: block4_f32_m4(wb, x, k, out); break;
        }
        for (int r = 0; r < 4; r++) {
            int64_t row = b * 4 + r;
            float add = bias ? bias[row] : 0.0f;
            for (int64_t j = 0; j < m; j++) y[j * n + row] = out[r][j] + add;
        }
    }
    for (int64_t row = blocks * 4; row < n; row++) {
        float add = bias ? bias[row] : 0.0f;
        for (int64_t j = 0; j < m; j++) y[j * n + row] = dot_row_f32(w + row * k, x + j * k, k) + add;
    }
    return 0;
}

/* ---------------------------------------------------------------- RMSNorm
 * y = weight * (x / sqrt(mean(x^2) + eps)) for m rows of n, in one pass over memory per
 * row and no temporaries. For bf16 the order is Hugging Face's: normalise in float32,
 * round to bf16, then multiply by the bf16 weight and round again. PyTorch spends four to
 * six ops (and their dispatch, and float32 temporaries) on what is one pass here; rows are
 * split over threads once there are enough of them. */
static inline __m512 load_bf16_as_f32(const uint16_t *p, __mmask16 mask) {
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m256i round_to_bf16(__m512 v) {  /* round to nearest even (finite values) */
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

int inferpath_rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *y, int64_t m, int64_t n,
                            float eps, int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t row = 0; row < m; row++) {
        const uint16_t *xr = x + row * n;
        uint16_t *yr = y + row * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = (n - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (n - c)) - 1u);
            __m512 v = load_bf16_as_f32(xr + c, mask);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float scale = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
        __m512 s = _mm512_set1_ps(scale);
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = (n - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (n - c)) - 1u);
            __m256i normed = round_to_bf16(_mm512_mul_ps(load_bf16_as_f32(xr + c, mask), s));
            __m512 nf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(normed), 16));
            __m256i out = round_to_bf16(_mm512_mul_ps(nf, load_bf16_as_f32(w + c, mask)));
            _mm256_mask_storeu_epi16((void *)(yr + c), mask, out);
        }
    }
    return 0;
}

int inferpath_rms_norm_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps,
                           int num_threads) {
    if (m < 1 || n < 1) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * n >= 65536)
    for (int64_t row = 0; row < m; row++) {
        const float *xr = x + row * n;
        float *yr = y + row * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = (n - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (n - c)) - 1u);
            __m512 v = LOADF(xr + c, mask);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        __m512 s = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 mask = (n - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (n - c)) - 1u);
            _mm512_mask_storeu_ps(yr + c, mask, _mm512_mul_ps(_mm512_mul_ps(LOADF(xr + c, mask), s),
                                                               LOADF(w + c, mask)));
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- paged decode attention
 * One new query per sequence against its cached keys and values, read in place through
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
#define MAX_GROUP 16
#define MAX_HEAD_DIM 256

static inline __m512 exp512(__m512 x) {  /* e^x, |rel err| < 2e-7 over the softmax range */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* Load one head vector (d <= 256) as float32 vectors. */
static inline void load_head(const void *src, int is_bf16, int64_t d, __m512 *dst) {
    for (int64_t c = 0, i = 0; c < d; c += 16, i++) {
        __mmask16 mask = (d - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (d - c)) - 1u);
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
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
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
                __mmask16 mask = (n - t >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (n - t)) - 1u);
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
                __mmask16 mask = (d - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (d - c)) - 1u);
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

/* ---------------------------------------------------------------- SwiGLU gate
 * gate = silu(gate) * up, in place in gate (count contiguous elements each), in float32
 * per element; for bf16 in PyTorch's order: silu rounded to bf16, then the product. One
 * pass instead of two ops, each a pass over memory with its own dispatch. */
static inline __m512 silu512(__m512 g) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

int inferpath_silu_mul_bf16(uint16_t *gate, const uint16_t *up, int64_t count, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (count >= 65536)
    for (int64_t c = 0; c < count; c += 16) {
        __mmask16 mask = (count - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (count - c)) - 1u);
        __m256i s = round_to_bf16(silu512(load_bf16_as_f32(gate + c, mask)));
        __m512 sf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s), 16));
        __m256i out = round_to_bf16(_mm512_mul_ps(sf, load_bf16_as_f32(up + c, mask)));
        _mm256_mask_storeu_epi16((void *)(gate + c), mask, out);
    }
    return 0;
}

int inferpath_silu_mul_f32(float *gate, const float *up, int64_t count, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (count >= 65536)
    for (int64_t c = 0; c < count; c += 16) {
        __mmask16 mask = (count - c >= 16) ? (__mmask16)0xffffu : (__mmask16)((1u << (count - c)) - 1u);
        __m512 out = _mm512_mul_ps(silu512(LOADF(gate + c, mask)), LOADF(up + c, mask));
        _mm512_mask_storeu_ps(gate + c, mask, out);
    }
    return 0;
}
