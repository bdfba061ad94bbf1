/* A decode step's layers in one call: for each layer, the same kernels in the same order
 * as the PyTorch modules call them one by one (kernels/fused.py, modules.py, quantized.py),
 * so the result is the same to the bit, without a Python round trip per kernel (a decode
 * step of a small model is otherwise mostly those round trips: SmolLM2 makes ~360 of them).
 *
 * Per layer, x (m, hidden) the residual stream, every row one sequence's next token:
 *   h = rms_norm(x) ; qkv = [Wq; Wk; Wv] h (+ b) ; q, k = rope(q, k) ; cache[slot] = k, v ;
 *   a = paged_attention(q) ; x += Wo a (+ b) ; h = rms_norm(x) ;
 *   g, u = [Wg; Wu] h ; x += Wd (silu(g) * u)
 * Weights in GGUF blocks (matmul.c), activations float32. Llama-family layers only (the
 * Python side checks the model: no QK-norm, no sandwich norms, no soft-capping, SwiGLU).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_parts.h"
#include "pool.h"
#include "prepared.h"

/* the kernels this calls, from the same library (portable/ or avx512/, and matmul.c) */
int inferpath_rms_norm_f32(const float *x, const float *w, float *y, int64_t m, int64_t n, float eps,
                           int num_threads);
int inferpath_rope_f32(const float *q, int64_t q_stride, int64_t heads, const float *k, int64_t k_stride,
                       int64_t kv_heads, const float *cos, const float *sin, float *q_out, float *k_out,
                       int64_t tokens, int64_t d, int num_threads);
int inferpath_silu_mul_f32(const float *gate, int64_t gate_stride, const float *up, int64_t up_stride,
                           float *out, int64_t out_stride, int64_t m, int64_t n, int num_threads);

/* Several quantized weights sharing an input (QuantGroup's arrays; a group of one for a
 * single projection). */
typedef struct {
    int count;
    const int *qtypes;
    const uint8_t *const *weights;
    const int64_t *row_bytes;
    const int64_t *rows;
    const float *const *biases;
} quant_weights;

typedef struct {
    const float *input_norm, *post_norm;  /* (hidden,) */
    quant_weights qkv, o, gate_up, down;
    float *k_cache, *v_cache;             /* (num_blocks, block_size, num_kv_heads, head_dim) */
} decode_layer;

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
    int64_t block_size, max_blocks, window;
    float eps, scale;
} decode_shape;

/* Output columns per pool chunk: about 8 chunks a thread (for balance), at least 32 (a
 * claim costs ~0.1 us, a chunk of one row's 32 columns ~1 us). */
static int64_t chunk_columns(int64_t n, int threads) {
    int64_t columns = (n / (8 * (int64_t)threads) + 15) / 16 * 16;
    return columns < 32 ? 32 : columns;
}

typedef struct {
    const quant_matmul *q;
    float *y;
    int64_t columns;
} columns_job;

static void columns_task(void *ctx, int64_t chunk) {
    const columns_job *job = (const columns_job *)ctx;
    int64_t c0 = chunk * job->columns, c1 = c0 + job->columns < job->q->n ? c0 + job->columns : job->q->n;
    quant_columns(job->q, job->y, c0, c1);
}

/* y = x W^T (+ b) for the group, its columns split over the decode pool (pool.c) */
static int matmul(const quant_weights *w, const float *x, float *y, int64_t m, int64_t k, int threads,
                  int rows_alone) {
    quant_matmul q;
    int status = quant_prepare(&q, w->count, w->qtypes, w->weights, w->row_bytes, w->rows, w->biases, x, m, k,
                               threads, rows_alone);
    if (status) return status;
    columns_job job = {&q, y, chunk_columns(q.n, threads)};
    pool_run(threads, columns_task, &job, (q.n + job.columns - 1) / job.columns);
    quant_release(&q);
    return 0;
}

/* Less attention work (positions x heads x head dim) than this stays on the calling thread */
#define ATTENTION_PARALLEL_MIN_WORK (1 << 16)

/* the step's paged attention (quant/decode_attention.c), its parts split over the decode pool */
static int attention(const decode_layer *L, const decode_shape *s, const float *q, const int64_t *block_tables,
                     const int64_t *seq_lens, float *out, int64_t m, int threads) {
    attention_job job = {q, L->k_cache, L->v_cache, out, block_tables, seq_lens, m, s->num_heads, s->num_kv_heads,
                         s->head_dim, s->block_size, s->max_blocks, s->window, 0, s->scale, 0, 0, 0, 0};
    int status = attention_plan(&job);
    if (status) return status;
    pool_run(attention_work(&job) >= ATTENTION_PARALLEL_MIN_WORK ? threads : 1, attention_task, &job, job.tasks);
    attention_finish(&job);
    return 0;
}

/* x (m, hidden) in place through num_layers layers. cos, sin (m, head_dim): the rows'
 * RoPE; slots (m,): where each row's K/V go; block_tables (m, max_blocks) and seq_lens
 * (m,): each row's context, its new token included. Returns 0, a kernel's error code, or
 * -2 out of memory. */
int inferpath_decode_layers(const decode_layer *layers, int num_layers, const decode_shape *s, float *x,
                            int64_t m, const float *cos, const float *sin, const int64_t *slots,
                            const int64_t *block_tables, const int64_t *seq_lens, int num_threads, int rows_alone) {
    const int64_t q_size = s->num_heads * s->head_dim, kv_size = s->num_kv_heads * s->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    size_t floats = (size_t)(m * (s->hidden * 2 + qkv_size + q_size + kv_size + q_size + 3 * s->intermediate));
    float *buffer = (float *)malloc(sizeof(float) * floats);
    if (!buffer) return -2;
    float *normed = buffer, *qkv = normed + m * s->hidden, *q = qkv + m * qkv_size, *k = q + m * q_size;
    float *attended = k + m * kv_size, *projected = attended + m * q_size, *gate_up = projected + m * s->hidden;
    float *act = gate_up + m * 2 * s->intermediate;
    int status = 0;
    for (int l = 0; l < num_layers && !status; l++) {
        const decode_layer *L = &layers[l];
        status = inferpath_rms_norm_f32(x, L->input_norm, normed, m, s->hidden, s->eps, num_threads);
        if (!status) status = matmul(&L->qkv, normed, qkv, m, s->hidden, num_threads, rows_alone);
        if (!status)
            status = inferpath_rope_f32(qkv, qkv_size, s->num_heads, qkv + q_size, qkv_size, s->num_kv_heads, cos, sin,
                                        q, k, m, s->head_dim, num_threads);
        if (status) break;
        for (int64_t i = 0; i < m; i++) {  /* this step's K/V into the cache */
            memcpy(L->k_cache + slots[i] * kv_size, k + i * kv_size, sizeof(float) * (size_t)kv_size);
            memcpy(L->v_cache + slots[i] * kv_size, qkv + i * qkv_size + q_size + kv_size,
                   sizeof(float) * (size_t)kv_size);
        }
        status = attention(L, s, q, block_tables, seq_lens, attended, m, num_threads);
        if (!status) status = matmul(&L->o, attended, projected, m, q_size, num_threads, rows_alone);
        if (status) break;
        for (int64_t i = 0; i < m * s->hidden; i++) x[i] = x[i] + projected[i];
        status = inferpath_rms_norm_f32(x, L->post_norm, normed, m, s->hidden, s->eps, num_threads);
        if (!status) status = matmul(&L->gate_up, normed, gate_up, m, s->hidden, num_threads, rows_alone);
        if (!status)
            status = inferpath_silu_mul_f32(gate_up, 2 * s->intermediate, gate_up + s->intermediate,
                                            2 * s->intermediate, act, s->intermediate, m, s->intermediate,
                                            num_threads);
        if (!status) status = matmul(&L->down, act, projected, m, s->intermediate, num_threads, rows_alone);
        if (status) break;
        for (int64_t i = 0; i < m * s->hidden; i++) x[i] = x[i] + projected[i];
    }
    free(buffer);
    return status;
}
