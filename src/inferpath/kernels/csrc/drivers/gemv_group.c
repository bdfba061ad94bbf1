/* The float GEMV's entry points, the same at every level: y = x W^T (+ b) for one matrix
 * or for a group of matrices sharing x (Q/K/V, gate/up: one call and one parallel region
 * for all, each matrix read where it lies, no concatenated copy), the output columns split
 * over OpenMP threads and computed by the level's gemv_columns_* (avx512/ or portable/
 * gemv.c): float32, bfloat16, and bf16 weights against float32 x (``_bf16_weights``).
 * The library links libgomp.so.1, which PyTorch has already loaded: these regions
 * run on PyTorch's own thread pool.
 */
#include <omp.h>

#include "gemv_columns.h"

void gemv_group_columns(const float_group *g, const void *x, void *y, int64_t m, int64_t k, int64_t c0,
                        int64_t c1) {
    int64_t start = 0;  /* the current matrix's first column in y */
    for (int i = 0; i < g->count && start < c1; start += g->rows[i], i++) {
        int64_t lo = c0 > start ? c0 - start : 0, hi = c1 - start < g->rows[i] ? c1 - start : g->rows[i];
        if (lo >= hi) continue;
        if (g->kind == GEMV_BF16)
            gemv_columns_bf16((const uint16_t *)x, (const uint16_t *)g->weights[i], (const uint16_t *)g->biases[i],
                              (uint16_t *)y + start, g->n, m, k, lo, hi);
        else if (g->kind == GEMV_BF16_WEIGHTS)
            gemv_columns_bf16_weights((const float *)x, (const uint16_t *)g->weights[i], (const float *)g->biases[i],
                                      (float *)y + start, g->n, m, k, lo, hi);
        else
            gemv_columns_f32((const float *)x, (const float *)g->weights[i], (const float *)g->biases[i],
                             (float *)y + start, g->n, m, k, lo, hi);
    }
}

/* Each thread takes one contiguous range of columns (a multiple of 4: the avx512 kernel's
 * weight-row block) and streams through it. */
static int run_group(const float_group *g, const void *x, void *y, int64_t m, int64_t k, int num_threads) {
    if (m < 1 || k < 1 || g->count < 1 || g->n < 1) return -1;
    const int64_t blocks = (g->n + 3) / 4;
#pragma omp parallel num_threads(num_threads)
    {
        int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t c0 = blocks * t / threads * 4, c1 = blocks * (t + 1) / threads * 4;
        if (c1 > g->n) c1 = g->n;
        if (c0 < c1) gemv_group_columns(g, x, y, m, k, c0, c1);
    }
    return 0;
}

static int64_t total_rows(int count, const int64_t *rows) {
    int64_t n = 0;
    for (int i = 0; i < count; i++) n += rows[i];
    return n;
}

/* TX: x's, the bias's and y's type; TW: the weights' */
#define DEFINE_ENTRY_POINTS(SUFFIX, TX, TW, KIND)                                                      \
int inferpath_gemv_group_##SUFFIX(int count, const TW *const *ws, const int64_t *rows, const TX *const *biases, \
                                  const TX *x, TX *y, int64_t m, int64_t k, int num_threads) {          \
    float_group g = {count, KIND, (const void *const *)ws, rows, (const void *const *)biases,          \
                     total_rows(count, rows)};                                                         \
    return run_group(&g, x, y, m, k, num_threads);                                                     \
}                                                                                                      \
int inferpath_gemv_##SUFFIX(const TX *x, const TW *w, const TX *bias, TX *y, int64_t m, int64_t n, int64_t k, \
                            int num_threads) {                                                         \
    return inferpath_gemv_group_##SUFFIX(1, &w, &n, &bias, x, y, m, k, num_threads);                   \
}

DEFINE_ENTRY_POINTS(f32, float, float, GEMV_F32)
DEFINE_ENTRY_POINTS(bf16, uint16_t, uint16_t, GEMV_BF16)
DEFINE_ENTRY_POINTS(bf16_weights, float, uint16_t, GEMV_BF16_WEIGHTS)
