/* A decode step's layers in one call: for each layer, the same kernels in the same order
 * as the PyTorch modules call them one by one (kernels/fused.py, modules.py, quantized.py),
 * so the result is the same to the bit, without a Python round trip per kernel (a decode
 * step of a small model is otherwise mostly those round trips: SmolLM2 makes ~360 of them).
 *
 * Per layer, x (m, hidden) the residual stream, every row one sequence's next token:
 *   h = rms_norm(x) ; qkv = [Wq; Wk; Wv] h (+ b) ; q, k = rope(q, k) ; cache[slot] = k, v ;
 *   a = paged_attention(q) ; x += Wo a (+ b) ; h = rms_norm(x) ;
 *   g, u = [Wg; Wu] h ; x += Wd (silu(g) * u)
 * Two kinds of model: weights in GGUF blocks (quant/matmul.c) with float32 activations,
 * or float weights (float32 or bfloat16, the level's GEMV) with activations, norms, RoPE
 * tables and KV cache in the weights' type (each kernel rounds where its module does: a
 * bf16 residual add is one rounding of the float32 sum, as PyTorch's), or bf16 weights
 * with everything else float32 (a CPU without bf16 arithmetic). Either way the
 * matmuls' output columns are split over the decode pool (pool.c). Llama-family layers
 * only (the Python side checks the model: no QK-norm, no sandwich norms, no soft-capping,
 * SwiGLU).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_parts.h"
#include "bf16.h"
#include "gemv_columns.h"
#include "pool.h"
#include "../quant/prepared.h"

/* the kernels this calls, from the same library (portable/ or avx512/) */
#define DECLARE_KERNELS(SUFFIX, T)                                                                         \
int inferpath_rms_norm_##SUFFIX(const T *x, const T *w, T *y, int64_t m, int64_t n, float eps, int num_threads); \
int inferpath_rope_##SUFFIX(const T *q, int64_t q_stride, int64_t heads, const T *k, int64_t k_stride,        \
                            int64_t kv_heads, const T *cos, const T *sin, T *q_out, T *k_out, int64_t tokens, \
                            int64_t d, int num_threads);                                                      \
int inferpath_silu_mul_##SUFFIX(const T *gate, int64_t gate_stride, const T *up, int64_t up_stride, T *out,  \
                                int64_t out_stride, int64_t m, int64_t n, int num_threads);
DECLARE_KERNELS(f32, float)
DECLARE_KERNELS(bf16, uint16_t)

enum { TYPE_F32 = 0, TYPE_BF16 = 30 };  /* GGUF's type ids of float matrices (blocks.h: the quantized ones) */

/* Several weights sharing an input (ops.QuantGroup's or ops.FloatGroup's arrays; a group of
 * one for a single projection): all in GGUF block types, or all TYPE_F32 / TYPE_BF16. */
typedef struct {
    int count;
    const int *qtypes;
    const uint8_t *const *weights;
    const int64_t *row_bytes;
    const int64_t *rows;
    const void *const *biases;  /* float32 for block types, else the activations' type */
} weight_group;

typedef struct {
    const void *input_norm, *post_norm;  /* (hidden,) */
    weight_group qkv, o, gate_up, down;
    void *k_cache, *v_cache;             /* (num_blocks, block_size, num_kv_heads, head_dim) */
} decode_layer;

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
    int64_t block_size, max_blocks, window;
    float eps, scale;
    int dtype;  /* of x, the norms, cos/sin and the caches: TYPE_F32 or TYPE_BF16 */
} decode_shape;

/* Output columns per pool chunk: about 8 chunks a thread (for balance), at least 32 (a
 * claim costs ~0.1 us, a chunk of one row's 32 columns ~1 us). */
static int64_t chunk_columns(int64_t n, int threads) {
    int64_t columns = (n / (8 * (int64_t)threads) + 15) / 16 * 16;
    return columns < 32 ? 32 : columns;
}

typedef struct {
    const quant_matmul *quant;  /* a quantized group, or */
    const float_group *floats;  /* a float one */
    const void *x;
    void *y;
    int64_t m, k, n, columns;
} columns_job;

static void columns_task(void *ctx, int64_t chunk) {
    const columns_job *job = (const columns_job *)ctx;
    int64_t c0 = chunk * job->columns, c1 = c0 + job->columns < job->n ? c0 + job->columns : job->n;
    if (job->quant) quant_columns(job->quant, (float *)job->y, c0, c1);
    else gemv_group_columns(job->floats, job->x, job->y, job->m, job->k, c0, c1);
}

/* The float GEMV for weights of GGUF type ``weights`` and activations of ``activations``
 * (bf16 weights with float32 activations: a BF16 file on a CPU without bf16 arithmetic) */
static int gemv_kind(int weights, int activations) {
    if (weights == TYPE_F32) return GEMV_F32;
    return activations == TYPE_BF16 ? GEMV_BF16 : GEMV_BF16_WEIGHTS;
}

/* y = x W^T (+ b) for the group, its columns split over the decode pool (pool.c); x and y
 * of type ``activations`` */
static int matmul(const weight_group *w, const void *x, void *y, int64_t m, int64_t k, int threads,
                  int rows_alone, int activations) {
    columns_job job = {0, 0, x, y, m, k, 0, 0};
    if (w->qtypes[0] == TYPE_F32 || w->qtypes[0] == TYPE_BF16) {
        float_group g = {w->count, gemv_kind(w->qtypes[0], activations), (const void *const *)w->weights, w->rows,
                         w->biases, 0};
        for (int i = 0; i < w->count; i++) g.n += w->rows[i];
        job.floats = &g, job.n = g.n, job.columns = chunk_columns(g.n, threads);
        pool_run(threads, columns_task, &job, (job.n + job.columns - 1) / job.columns);
        return 0;
    }
    quant_matmul q;
    int status = quant_prepare(&q, w->count, w->qtypes, w->weights, w->row_bytes, w->rows,
                               (const float *const *)w->biases, (const float *)x, m, k, threads, rows_alone);
    if (status) return status;
    /* GEMM panels are GEMM_PANEL columns: a chunk of one panel wastes none and balances best */
    job.quant = &q, job.n = q.n, job.columns = q.use_gemm ? GEMM_PANEL : chunk_columns(q.n, threads);
    pool_run(threads, columns_task, &job, (job.n + job.columns - 1) / job.columns);
    quant_release(&q);
    return 0;
}

/* ------------------------------------------------------- the row kernels, by dtype */
static int rms_norm(int bf16, const void *x, const void *w, void *y, int64_t m, int64_t n, float eps, int threads) {
    return bf16 ? inferpath_rms_norm_bf16(x, w, y, m, n, eps, threads)
                : inferpath_rms_norm_f32(x, w, y, m, n, eps, threads);
}

static int rope(int bf16, const void *qk, int64_t stride, const decode_shape *s, int64_t q_size, const void *cos,
                const void *sin, void *q, void *k, int64_t m, int threads) {
    return bf16 ? inferpath_rope_bf16(qk, stride, s->num_heads, (const uint16_t *)qk + q_size, stride,
                                      s->num_kv_heads, cos, sin, q, k, m, s->head_dim, threads)
                : inferpath_rope_f32(qk, stride, s->num_heads, (const float *)qk + q_size, stride, s->num_kv_heads,
                                     cos, sin, q, k, m, s->head_dim, threads);
}

/* Less attention work (positions x heads x head dim) than this stays on the calling thread */
#define ATTENTION_PARALLEL_MIN_WORK (1 << 16)

/* the step's paged attention (drivers/decode_attention.c), its key parts split over the pool */
static int attention(int bf16, const void *q, const decode_layer *L, const int64_t *tables, const int64_t *seq_lens,
                     void *out, int64_t m, const decode_shape *s, int threads) {
    attention_job job = {q, L->k_cache, L->v_cache, out, tables, seq_lens, m, s->num_heads, s->num_kv_heads,
                         s->head_dim, s->block_size, s->max_blocks, s->window, 0, s->scale, bf16, 0, 0, 0};
    int status = attention_plan(&job);
    if (status) return status;
    pool_run(attention_work(&job) >= ATTENTION_PARALLEL_MIN_WORK ? threads : 1, attention_task, &job, job.tasks);
    attention_finish(&job);
    return 0;
}

static int silu_mul(int bf16, const void *gate_up, void *out, int64_t m, int64_t n, int threads) {
    return bf16 ? inferpath_silu_mul_bf16(gate_up, 2 * n, (const uint16_t *)gate_up + n, 2 * n, out, n, m, n, threads)
                : inferpath_silu_mul_f32(gate_up, 2 * n, (const float *)gate_up + n, 2 * n, out, n, m, n, threads);
}

/* x += p over count values: PyTorch's residual add (a bf16 sum is the float32 sum rounded) */
static void add_residual(int bf16, void *x, const void *p, int64_t count) {
    if (bf16) {
        uint16_t *a = (uint16_t *)x;
        const uint16_t *b = (const uint16_t *)p;
        for (int64_t i = 0; i < count; i++) a[i] = bf16_round(bf16_value(a[i]) + bf16_value(b[i]));
    } else {
        float *a = (float *)x;
        const float *b = (const float *)p;
        for (int64_t i = 0; i < count; i++) a[i] = a[i] + b[i];
    }
}

/* x (m, hidden) in place through num_layers layers. cos, sin (m, head_dim): the rows'
 * RoPE; slots (m,): where each row's K/V go; block_tables (m, max_blocks) and seq_lens
 * (m,): each row's context, its new token included. Returns 0, a kernel's error code,
 * -2 out of memory or -3 an unknown dtype. */
int inferpath_decode_layers(const decode_layer *layers, int num_layers, const decode_shape *s, void *x, int64_t m,
                            const void *cos, const void *sin, const int64_t *slots, const int64_t *block_tables,
                            const int64_t *seq_lens, int num_threads, int rows_alone) {
    if (s->dtype != TYPE_F32 && s->dtype != TYPE_BF16) return -3;
    const int bf16 = s->dtype == TYPE_BF16;
    const size_t size = bf16 ? 2 : 4;
    const int64_t q_size = s->num_heads * s->head_dim, kv_size = s->num_kv_heads * s->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    size_t values = (size_t)(m * (s->hidden * 2 + qkv_size + q_size + kv_size + q_size + 3 * s->intermediate));
    char *buffer = (char *)malloc(size * values);
    if (!buffer) return -2;
    char *normed = buffer, *qkv = normed + size * m * s->hidden, *q = qkv + size * m * qkv_size;
    char *k = q + size * m * q_size, *attended = k + size * m * kv_size, *projected = attended + size * m * q_size;
    char *gate_up = projected + size * m * s->hidden, *act = gate_up + size * m * 2 * s->intermediate;
    int status = 0;
    for (int l = 0; l < num_layers && !status; l++) {
        const decode_layer *L = &layers[l];
        status = rms_norm(bf16, x, L->input_norm, normed, m, s->hidden, s->eps, num_threads);
        if (!status) status = matmul(&L->qkv, normed, qkv, m, s->hidden, num_threads, rows_alone, s->dtype);
        if (!status) status = rope(bf16, qkv, qkv_size, s, q_size, cos, sin, q, k, m, num_threads);
        if (status) break;
        for (int64_t i = 0; i < m; i++) {  /* this step's K/V into the cache */
            memcpy((char *)L->k_cache + size * slots[i] * kv_size, k + size * i * kv_size, size * (size_t)kv_size);
            memcpy((char *)L->v_cache + size * slots[i] * kv_size, qkv + size * (i * qkv_size + q_size + kv_size),
                   size * (size_t)kv_size);
        }
        status = attention(bf16, q, L, block_tables, seq_lens, attended, m, s, num_threads);
        if (!status) status = matmul(&L->o, attended, projected, m, q_size, num_threads, rows_alone, s->dtype);
        if (status) break;
        add_residual(bf16, x, projected, m * s->hidden);
        status = rms_norm(bf16, x, L->post_norm, normed, m, s->hidden, s->eps, num_threads);
        if (!status) status = matmul(&L->gate_up, normed, gate_up, m, s->hidden, num_threads, rows_alone, s->dtype);
        if (!status) status = silu_mul(bf16, gate_up, act, m, s->intermediate, num_threads);
        if (!status) status = matmul(&L->down, act, projected, m, s->intermediate, num_threads, rows_alone, s->dtype);
        if (status) break;
        add_residual(bf16, x, projected, m * s->hidden);
    }
    free(buffer);
    return status;
}
