/* A decode step's layers in one call: for each layer, the same kernels in the same order
 * as the PyTorch modules call them one by one (kernels/fused.py, modules.py, quantized.py),
 * so the result is the same to the bit, without a Python round trip per kernel (a decode
 * step of a small model is otherwise mostly those round trips: SmolLM2 makes ~360 of them).
 *
 * Per layer, x (m, hidden) the residual stream:
 *   h = rms_norm(x) ; qkv = [Wq; Wk; Wv] h (+ b) ; q, k = rope(q, k) ; cache[slot] = k, v ;
 *   a = paged_attention(q) ; x += Wo a (+ b) ; h = rms_norm(x) ;
 *   g, u = [Wg; Wu] h ; x += Wd (silu(g) * u)
 * A row is one sequence's next token (a decode row: the paged decode attention over its
 * context) or one of a short chunk's tokens of one sequence (a speculative verification, a
 * short prompt chunk: the rows of a decode_chunk, attended causally by the prefill
 * attention kernel the module path runs for that chunk, passed in). Every row's K/V are
 * written before attention, so a chunk's row i sees the chunk's rows 0..i.
 * Two kinds of model: weights in GGUF blocks (quant/matmul.c) with float32 activations,
 * or float weights (float32 or bfloat16, the level's GEMV; for bf16 on a CPU with AMX, the
 * AMX GEMM for the row counts the module path runs through it) with activations, norms, RoPE
 * tables and KV cache in the weights' type (each kernel rounds where its module does: a
 * bf16 residual add is one rounding of the float32 sum, as PyTorch's), or bf16 weights
 * with everything else float32 (a CPU without bf16 arithmetic). Either way the
 * matmuls' output columns are split over the decode pool (pool.c; the AMX GEMM's over its
 * OpenMP threads, as in the module path). Llama-family layers
 * only (the Python side checks the model: no QK-norm, no sandwich norms, no soft-capping,
 * SwiGLU).
 *
 * Traced (stage_seconds not NULL), each stage's wall time is added to its slot, summed
 * over the layers (clock_gettime at each stage boundary, so the slots cover the whole loop);
 * untraced, no clock is read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* The bf16 AMX GEMM's signature (avx512/amx.c, or its reference drivers/amx_reference.c):
 * y (m, n) = x (m, k) w^T (+ bias), bf16, row-major */
typedef int (*amx_gemm_fn)(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t m,
                           int64_t n, int64_t k, int num_threads);

enum { GROUP_QKV, GROUP_O, GROUP_GATE_UP, GROUP_DOWN };  /* bits of decode_shape.amx_groups */

typedef struct {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
    int64_t block_size, max_blocks, window;
    float eps, scale;
    int dtype;  /* of x, the norms, cos/sin and the caches: TYPE_F32 or TYPE_BF16 */
    /* bf16 weights and activations only: the AMX GEMM the module path runs this step's row
     * count through (ops.float_kernel_for), and which of a layer's groups take it (bit
     * GROUP_*); the others take the GEMV. NULL / 0: every group the GEMV. */
    amx_gemm_fn amx;
    int amx_groups;
    /* of the caches: dtype's, or TYPE_BF16 beside float32 activations (a bfloat16 KV cache:
     * this step's K and V rounded to bf16 once, in their rows too, so that every read of them,
     * from the cache or the rows, sees the same values) */
    int kv_dtype;
} decode_shape;

/* One sequence's chunk of rows [first_row, first_row + rows) of x, at positions context ..
 * context + rows - 1. table: its blocks (its context and its own keys, read from the cache),
 * or NULL when context is 0 (its keys are its own rows, as the module path reads them). */
typedef struct {
    int64_t first_row, rows, context;
    const int64_t *table;
} decode_chunk;

/* avx512/ or avx2/prefill_attention.c's entry point for the activations' type (the module path's) */
typedef int (*prefill_attention_fn)(const void *q, const void *k, const void *v, void *out, int64_t n, int64_t h,
                                    int64_t kvh, int64_t d, int64_t q_stride, int64_t k_stride, int64_t v_stride,
                                    const int64_t *table, int64_t block_size, int64_t context, float scale,
                                    int num_threads);

/* The slots of stage_seconds, in the order a layer runs them (kernels/decode_stack.py's
 * NATIVE_STAGES names them); slot NUM_STAGES counts the calls that filled them. */
enum {
    STAGE_RMSNORM_ATTN, STAGE_QKV, STAGE_ROPE, STAGE_KV_WRITE, STAGE_ATTENTION, STAGE_O_PROJ, STAGE_RESIDUAL_ATTN,
    STAGE_RMSNORM_FFN, STAGE_GATE_UP, STAGE_SILU_MUL, STAGE_DOWN, STAGE_RESIDUAL_FFN, NUM_STAGES
};

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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

/* y = x W^T (+ b) for a bf16 group through the AMX GEMM, one weight at a time as the module
 * path runs the projections one by one when its row count takes AMX: each weight's columns
 * land in its columns of y (a group of several through a buffer of one weight's output) */
static int amx_matmul(amx_gemm_fn amx, const weight_group *w, const uint16_t *x, uint16_t *y, int64_t m,
                      int64_t k, int threads) {
    int64_t n = 0, widest = 0;
    for (int i = 0; i < w->count; i++) {
        n += w->rows[i];
        if (w->rows[i] > widest) widest = w->rows[i];
    }
    if (w->count == 1)
        return amx(x, (const uint16_t *)w->weights[0], (const uint16_t *)w->biases[0], y, m, n, k, threads);
    uint16_t *part = (uint16_t *)malloc((size_t)(m * widest) * sizeof(uint16_t));
    if (!part) return -2;
    int status = 0;
    for (int i = 0, column = 0; i < w->count && !status; column += (int)w->rows[i], i++) {
        status = amx(x, (const uint16_t *)w->weights[i], (const uint16_t *)w->biases[i], part, m, w->rows[i], k,
                     threads);
        for (int64_t j = 0; j < m && !status; j++)
            memcpy(y + j * n + column, part + j * w->rows[i], (size_t)w->rows[i] * sizeof(uint16_t));
    }
    free(part);
    return status;
}

/* y = x W^T (+ b) for the group, its columns split over the decode pool (pool.c), or through
 * ``amx`` (not NULL: bf16 weights and activations, module doc); x and y of type ``activations`` */
static int matmul(const weight_group *w, const void *x, void *y, int64_t m, int64_t k, int threads,
                  int rows_alone, int activations, amx_gemm_fn amx) {
    columns_job job = {0, 0, x, y, m, k, 0, 0};
    if (amx) {
        if (w->qtypes[0] != TYPE_BF16 || activations != TYPE_BF16 || rows_alone) return -4;
        return amx_matmul(amx, w, (const uint16_t *)x, (uint16_t *)y, m, k, threads);
    }
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
    job.quant = &q, job.n = q.n, job.columns = q.gemm_panels ? GEMM_PANEL : chunk_columns(q.n, threads);
    pool_run(threads, columns_task, &job, (job.n + job.columns - 1) / job.columns);
    quant_release(&q);
    return 0;
}

/* The probe's view of the step's matmuls (explain/probe_kernels.py): y = x W^T for each of
 * num_weights weights of one shape in turn, through matmul() and the decode pool as a stage
 * of the step calls them, with no Python between the calls: what a call shape costs the
 * native step. weights: num_weights pointers to rows x row_bytes of GGUF type qtype (or
 * TYPE_F32 / TYPE_BF16 rows of k values); x (m, k), y (m, rows) of type ``activations``. */
int inferpath_decode_matmuls(int num_weights, int qtype, const uint8_t *const *weights, int64_t row_bytes,
                             int64_t rows, const void *x, void *y, int64_t m, int64_t k, int num_threads,
                             int rows_alone, int activations) {
    const void *no_bias = NULL;
    for (int i = 0; i < num_weights; i++) {
        weight_group g = {1, &qtype, &weights[i], &row_bytes, &rows, &no_bias};
        int status = matmul(&g, x, y, m, k, num_threads, rows_alone, activations, NULL);
        if (status) return status;
    }
    return 0;
}

/* ------------------------------------------------------- the row kernels, by dtype
 * Row by row on the decode pool, each row the kernel's own single-threaded call (the same
 * bits: rows are independent), where there are enough values; never the kernels' own
 * OpenMP regions, whose threads woke beside the pool's spinning workers on the same cores
 * (a batch-8 step of the 1.5B file spent 2.9 ms of ~90 in the SwiGLU gate, 0.1 ms per row
 * alone). */

/* Fewer values (rows x row length) than this stay on the calling thread (the kernels'
 * own OpenMP threshold) */
#define ROWS_PARALLEL_MIN_VALUES 65536

typedef struct {
    int bf16;
    const char *in, *in2, *w;  /* rms_norm: x, -, weight; silu_mul: gate_up, -, -; rope: qkv, cos, sin */
    char *out, *out2;          /* rope: q, k */
    int64_t n;
    float eps;
    const decode_shape *s;
    int64_t stride, q_size;    /* rope */
} row_job;

static int rms_norm_rows(int bf16, const void *x, const void *w, void *y, int64_t m, int64_t n, float eps) {
    return bf16 ? inferpath_rms_norm_bf16(x, w, y, m, n, eps, 1) : inferpath_rms_norm_f32(x, w, y, m, n, eps, 1);
}

static void rms_norm_task(void *ctx, int64_t row) {
    const row_job *j = (const row_job *)ctx;
    const size_t size = j->bf16 ? 2 : 4;
    rms_norm_rows(j->bf16, j->in + size * row * j->n, j->w, j->out + size * row * j->n, 1, j->n, j->eps);
}

static int rms_norm(int bf16, const void *x, const void *w, void *y, int64_t m, int64_t n, float eps, int threads) {
    if (m < 1 || n < 1) return -1;
    if (threads < 2 || m < 2 || m * n < ROWS_PARALLEL_MIN_VALUES) return rms_norm_rows(bf16, x, w, y, m, n, eps);
    row_job job = {bf16, (const char *)x, NULL, (const char *)w, (char *)y, NULL, n, eps, NULL, 0, 0};
    pool_run(threads, rms_norm_task, &job, m);
    return 0;
}

static int rope_rows(int bf16, const void *qk, int64_t stride, const decode_shape *s, int64_t q_size, const void *cos,
                     const void *sin, void *q, void *k, int64_t m) {
    return bf16 ? inferpath_rope_bf16(qk, stride, s->num_heads, (const uint16_t *)qk + q_size, stride,
                                      s->num_kv_heads, cos, sin, q, k, m, s->head_dim, 1)
                : inferpath_rope_f32(qk, stride, s->num_heads, (const float *)qk + q_size, stride, s->num_kv_heads,
                                     cos, sin, q, k, m, s->head_dim, 1);
}

static void rope_task(void *ctx, int64_t row) {
    const row_job *j = (const row_job *)ctx;
    const size_t size = j->bf16 ? 2 : 4;
    const int64_t d = j->s->head_dim;
    rope_rows(j->bf16, j->in + size * row * j->stride, j->stride, j->s, j->q_size, j->in2 + size * row * d,
              j->w + size * row * d, j->out + size * row * j->s->num_heads * d,
              j->out2 + size * row * j->s->num_kv_heads * d, 1);
}

static int rope(int bf16, const void *qk, int64_t stride, const decode_shape *s, int64_t q_size, const void *cos,
                const void *sin, void *q, void *k, int64_t m, int threads) {
    if (threads < 2 || m * stride < ROWS_PARALLEL_MIN_VALUES) return rope_rows(bf16, qk, stride, s, q_size, cos, sin, q, k, m);
    if (m < 1 || s->head_dim < 32 || s->head_dim % 32) return -1;  /* the kernel's own checks */
    row_job job = {bf16, (const char *)qk, (const char *)cos, (const char *)sin, (char *)q, (char *)k, 0, 0.0f, s,
                   stride, q_size};
    pool_run(threads, rope_task, &job, m);
    return 0;
}

/* Less attention work (positions x heads x head dim) than this stays on the calling thread */
#define ATTENTION_PARALLEL_MIN_WORK (1 << 16)

/* the step's paged attention (drivers/decode_attention.c), its key parts split over the pool */
static int attention(int bf16, const void *q, const decode_layer *L, const int64_t *tables, const int64_t *seq_lens,
                     void *out, int64_t m, const decode_shape *s, int threads) {
    attention_job job = {.q = q, .k_cache = L->k_cache, .v_cache = L->v_cache, .out = out, .block_tables = tables,
                         .seq_lens = seq_lens, .b_count = m, .h_count = s->num_heads, .kvh_count = s->num_kv_heads,
                         .d = s->head_dim, .block_size = s->block_size, .max_blocks = s->max_blocks,
                         .window = s->window, .scale = s->scale, .is_bf16 = bf16,
                         .kv_bf16 = !bf16 && s->kv_dtype == TYPE_BF16};
    int status = attention_plan(&job);
    if (status) return status;
    pool_run(attention_work(&job) >= ATTENTION_PARALLEL_MIN_WORK ? threads : 1, attention_task, &job, job.tasks);
    attention_finish(&job);
    return 0;
}

/* Which rows of the step attend how (module doc): decode rows, each over its own context,
 * and chunks, each one sequence's rows attended causally by ``prefill``. */
typedef struct {
    const int64_t *decode_rows;              /* (num_decodes,) rows of x; NULL: rows 0 .. num_decodes - 1 */
    int64_t num_decodes;
    const int64_t *block_tables, *seq_lens;  /* (num_decodes, max_blocks), (num_decodes,): each decode's context */
    const decode_chunk *chunks;              /* (num_chunks,) */
    int64_t num_chunks;
    prefill_attention_fn prefill;            /* NULL: no chunks */
    prefill_attention_fn prefill_cached;     /* a bfloat16 cache beside float32 activations: the chunks
                                              * with a table read it through this one (float32 q, bf16 K/V) */
} step_rows;

/* Whether the rows are consistent: every index inside the m rows of x, a prefill kernel for chunks */
static int rows_valid(const step_rows *r, int64_t m, int mixed_kv) {
    if (r->num_decodes < 0 || r->num_chunks < 0 || (r->num_chunks && !r->prefill)) return 0;
    if (!r->decode_rows && r->num_decodes > m) return 0;
    for (int64_t i = 0; r->decode_rows && i < r->num_decodes; i++)
        if (r->decode_rows[i] < 0 || r->decode_rows[i] >= m) return 0;
    for (int64_t i = 0; i < r->num_chunks; i++) {
        const decode_chunk *c = &r->chunks[i];
        if (c->first_row < 0 || c->rows < 1 || c->first_row + c->rows > m || c->context < 0
            || (c->context && !c->table) || (c->table && mixed_kv && !r->prefill_cached)) return 0;
    }
    return 1;
}

/* out (m, q_size) <- attention of q (m, q_size) for every row: the decode rows through the
 * paged decode attention (gathered into contiguous rows when not rows 0..), each chunk
 * through the prefill kernel, keys from the cache or, with no context, from its own rows of
 * k (roped) and qkv (v), as the module path passes them */
static int step_attention(int bf16, const char *q, const char *k, const char *qkv, const decode_layer *L,
                          const step_rows *r, char *out, char *gathered_q, char *gathered_out, const decode_shape *s,
                          int threads) {
    const size_t size = bf16 ? 2 : 4;
    const int64_t q_size = s->num_heads * s->head_dim, kv_size = s->num_kv_heads * s->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    int status = 0;
    if (r->num_decodes) {
        const char *dq = q;
        char *dout = out;
        if (r->decode_rows) {
            for (int64_t i = 0; i < r->num_decodes; i++)
                memcpy(gathered_q + size * i * q_size, q + size * r->decode_rows[i] * q_size, size * (size_t)q_size);
            dq = gathered_q, dout = gathered_out;
        }
        status = attention(bf16, dq, L, r->block_tables, r->seq_lens, dout, r->num_decodes, s, threads);
        if (status) return status;
        for (int64_t i = 0; r->decode_rows && i < r->num_decodes; i++)
            memcpy(out + size * r->decode_rows[i] * q_size, gathered_out + size * i * q_size, size * (size_t)q_size);
    }
    for (int64_t i = 0; i < r->num_chunks && !status; i++) {
        const decode_chunk *c = &r->chunks[i];
        const void *keys = c->table ? L->k_cache : (const void *)(k + size * c->first_row * kv_size);
        const void *values = c->table ? L->v_cache : (const void *)(qkv + size * (c->first_row * qkv_size + q_size + kv_size));
        const prefill_attention_fn prefill = c->table && !bf16 && s->kv_dtype == TYPE_BF16 ? r->prefill_cached : r->prefill;
        status = prefill(q + size * c->first_row * q_size, keys, values, out + size * c->first_row * q_size, c->rows,
                            s->num_heads, s->num_kv_heads, s->head_dim, q_size, kv_size, c->table ? kv_size : qkv_size,
                            c->table, s->block_size, c->context, s->scale, threads);
    }
    return status;
}

static int silu_mul_rows(int bf16, const void *gate_up, void *out, int64_t m, int64_t n) {
    return bf16 ? inferpath_silu_mul_bf16(gate_up, 2 * n, (const uint16_t *)gate_up + n, 2 * n, out, n, m, n, 1)
                : inferpath_silu_mul_f32(gate_up, 2 * n, (const float *)gate_up + n, 2 * n, out, n, m, n, 1);
}

static void silu_mul_task(void *ctx, int64_t row) {
    const row_job *j = (const row_job *)ctx;
    const size_t size = j->bf16 ? 2 : 4;
    silu_mul_rows(j->bf16, j->in + size * row * 2 * j->n, j->out + size * row * j->n, 1, j->n);
}

static int silu_mul(int bf16, const void *gate_up, void *out, int64_t m, int64_t n, int threads) {
    if (m < 1 || n < 1) return -1;
    if (threads < 2 || m < 2 || m * n < ROWS_PARALLEL_MIN_VALUES) return silu_mul_rows(bf16, gate_up, out, m, n);
    row_job job = {bf16, (const char *)gate_up, NULL, NULL, (char *)out, NULL, n, 0.0f, NULL, 0, 0};
    pool_run(threads, silu_mul_task, &job, m);
    return 0;
}

/* A float32 row of K or V into a bf16 cache: rounded to nearest even (PyTorch's .to(bfloat16)),
 * and the row itself left holding the rounded values, which the chunks without a table read */
static void write_rounded(float *row, uint16_t *cache, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        cache[i] = bf16_round(row[i]);
        row[i] = bf16_value(cache[i]);
    }
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

/* the AMX GEMM for a layer's group ``group`` (GROUP_*) this step, or NULL: the GEMV */
static amx_gemm_fn amx_for(const decode_shape *s, int group) {
    return s->amx && (s->amx_groups >> group & 1) ? s->amx : NULL;
}

/* x (m, hidden) in place through num_layers layers. cos, sin (m, head_dim): the rows'
 * RoPE; slots (m,): where each row's K/V go; rows: how each row attends (step_rows).
 * stage_seconds: NULL, or NUM_STAGES + 1 doubles the stages' seconds are added to (and
 * the call counted in the last). Returns 0, a kernel's error code, -1 inconsistent rows,
 * -2 out of memory, -3 an unknown dtype or -4 AMX asked of a group that is not bf16. */
int inferpath_decode_layers(const decode_layer *layers, int num_layers, const decode_shape *s, void *x, int64_t m,
                            const void *cos, const void *sin, const int64_t *slots, const step_rows *rows,
                            int num_threads, int rows_alone, double *stage_seconds) {
    if (s->dtype != TYPE_F32 && s->dtype != TYPE_BF16) return -3;
    if (s->kv_dtype != s->dtype && !(s->dtype == TYPE_F32 && s->kv_dtype == TYPE_BF16)) return -3;
    const int mixed_kv = s->kv_dtype != s->dtype;  /* float32 activations, a bf16 cache */
    if (!rows_valid(rows, m, mixed_kv)) return -1;
    const int bf16 = s->dtype == TYPE_BF16;
    const size_t size = bf16 ? 2 : 4;
    const int64_t q_size = s->num_heads * s->head_dim, kv_size = s->num_kv_heads * s->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    size_t values = (size_t)(m * (s->hidden * 2 + qkv_size + q_size + kv_size + q_size + 3 * s->intermediate
                                  + 2 * q_size));
    char *buffer = (char *)malloc(size * values);
    if (!buffer) return -2;
    char *normed = buffer, *qkv = normed + size * m * s->hidden, *q = qkv + size * m * qkv_size;
    char *k = q + size * m * q_size, *attended = k + size * m * kv_size, *projected = attended + size * m * q_size;
    char *gate_up = projected + size * m * s->hidden, *act = gate_up + size * m * 2 * s->intermediate;
    char *gathered_q = act + size * m * s->intermediate, *gathered_out = gathered_q + size * m * q_size;
    double *times = stage_seconds, last = times ? seconds_now() : 0.0;
#define STAGE_DONE(stage) do { if (times) { double now_ = seconds_now(); times[stage] += now_ - last; last = now_; } } while (0)
    int status = 0;
    for (int l = 0; l < num_layers && !status; l++) {
        const decode_layer *L = &layers[l];
        status = rms_norm(bf16, x, L->input_norm, normed, m, s->hidden, s->eps, num_threads);
        STAGE_DONE(STAGE_RMSNORM_ATTN);
        if (!status)
            status = matmul(&L->qkv, normed, qkv, m, s->hidden, num_threads, rows_alone, s->dtype,
                            amx_for(s, GROUP_QKV));
        STAGE_DONE(STAGE_QKV);
        if (!status) status = rope(bf16, qkv, qkv_size, s, q_size, cos, sin, q, k, m, num_threads);
        STAGE_DONE(STAGE_ROPE);
        if (status) break;
        for (int64_t i = 0; i < m; i++) {  /* this step's K/V into the cache */
            if (mixed_kv) {
                write_rounded((float *)k + i * kv_size, (uint16_t *)L->k_cache + slots[i] * kv_size, kv_size);
                write_rounded((float *)qkv + i * qkv_size + q_size + kv_size,
                              (uint16_t *)L->v_cache + slots[i] * kv_size, kv_size);
                continue;
            }
            memcpy((char *)L->k_cache + size * slots[i] * kv_size, k + size * i * kv_size, size * (size_t)kv_size);
            memcpy((char *)L->v_cache + size * slots[i] * kv_size, qkv + size * (i * qkv_size + q_size + kv_size),
                   size * (size_t)kv_size);
        }
        STAGE_DONE(STAGE_KV_WRITE);
        status = step_attention(bf16, q, k, qkv, L, rows, attended, gathered_q, gathered_out, s, num_threads);
        STAGE_DONE(STAGE_ATTENTION);
        if (!status)
            status = matmul(&L->o, attended, projected, m, q_size, num_threads, rows_alone, s->dtype,
                            amx_for(s, GROUP_O));
        STAGE_DONE(STAGE_O_PROJ);
        if (status) break;
        add_residual(bf16, x, projected, m * s->hidden);
        STAGE_DONE(STAGE_RESIDUAL_ATTN);
        status = rms_norm(bf16, x, L->post_norm, normed, m, s->hidden, s->eps, num_threads);
        STAGE_DONE(STAGE_RMSNORM_FFN);
        if (!status)
            status = matmul(&L->gate_up, normed, gate_up, m, s->hidden, num_threads, rows_alone, s->dtype,
                            amx_for(s, GROUP_GATE_UP));
        STAGE_DONE(STAGE_GATE_UP);
        if (!status) status = silu_mul(bf16, gate_up, act, m, s->intermediate, num_threads);
        STAGE_DONE(STAGE_SILU_MUL);
        if (!status)
            status = matmul(&L->down, act, projected, m, s->intermediate, num_threads, rows_alone, s->dtype,
                            amx_for(s, GROUP_DOWN));
        STAGE_DONE(STAGE_DOWN);
        if (status) break;
        add_residual(bf16, x, projected, m * s->hidden);
        STAGE_DONE(STAGE_RESIDUAL_FFN);
    }
#undef STAGE_DONE
    free(buffer);
    if (times) times[NUM_STAGES] += 1.0;
    return status;
}
