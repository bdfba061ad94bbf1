/* x's rows quantized to int8 for the dot products (matmul.c, wide.c): two int8 passes per
 * value, q and the residual r, and per-block scalars laid out tile by tile. */
#ifndef INFERPATH_QUANT_ACTIVATIONS_H
#define INFERPATH_QUANT_ACTIVATIONS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A row tile: one weight row against up to TILE_ROWS rows of x. */
#define TILE_ROWS 8

/* Rows of x quantized. The per-block scalars are laid out tile by tile, block by block,
 * a lane per row of the tile ([m / TILE_ROWS][k / 32][TILE_ROWS], unused lanes zero), so
 * that a tile's eight values for one block are one vector. */
typedef struct {
    const int8_t *q;   /* (m, k) */
    const int8_t *r;   /* (m, k): the residual x / d_x - q in steps of 1 / RESIDUAL_STEPS */
    const float *d;    /* d_x / RESIDUAL_STEPS per block */
    const float *s;    /* d_x * sum(q + r / RESIDUAL_STEPS) over the block */
    const float *h;    /* the same sum over each half block: [..][k / 32][2][TILE_ROWS] */
    int64_t k;
} q8_rows;

/* where row j's value for block b lies in a tile-major array, and its half-block pair */
static inline int64_t lane_of(int64_t j, int64_t b, int64_t nb) { return (j / TILE_ROWS * nb + b) * TILE_ROWS + j % TILE_ROWS; }
static inline int64_t half_lane_of(int64_t j, int64_t b, int64_t nb, int half) {
    return ((j / TILE_ROWS * nb + b) * 2 + half) * TILE_ROWS + j % TILE_ROWS;
}

/* x = d_x (q + r / RESIDUAL_STEPS) + e with |e| <= d_x / 512: the residual |x/d_x - q| <=
 * 1/2 is itself rounded to int8, so the activations carry ~15 bits through two int8 dot
 * products, summed in int32 as (w.q << RESIDUAL_SHIFT) + w.r. One pass alone (q8_0)
 * flipped 1.9% of SmolLM2's greedy tokens against its float32 self over 520 tokens of
 * text; two flip none of them. */
#define RESIDUAL_SHIFT 8
#define RESIDUAL_STEPS 256.0f

static inline void quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, int8_t *r, float *d, float *s, float *h,
                          int num_threads) {
    int64_t nb = k / 32;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (m * k >= 65536)
    for (int64_t i = 0; i < m * nb; i++) {
        const float *xb = x + i * 32;
        float amax = 0.0f;
        for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(xb[e]));
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sums[2] = {0, 0}, residual_sums[2] = {0, 0};
        for (int e = 0; e < 32; e++) {
            float v = xb[e] * inv;
            float whole = nearbyintf(v);
            float rest = nearbyintf((v - whole) * RESIDUAL_STEPS);
            rest = fminf(fmaxf(rest, -127.0f), 127.0f);
            q[i * 32 + e] = (int8_t)whole;
            r[i * 32 + e] = (int8_t)rest;
            sums[e / 16] += (int)whole;
            residual_sums[e / 16] += (int)rest;
        }
        int64_t j = i / nb, b = i % nb;
        float lo = scale * ((float)sums[0] + (float)residual_sums[0] / RESIDUAL_STEPS);
        float hi = scale * ((float)sums[1] + (float)residual_sums[1] / RESIDUAL_STEPS);
        d[lane_of(j, b, nb)] = scale / RESIDUAL_STEPS;
        s[lane_of(j, b, nb)] = lo + hi;
        h[half_lane_of(j, b, nb, 0)] = lo;
        h[half_lane_of(j, b, nb, 1)] = hi;
    }
}

/* x's int8 rows interleaved for the wide kernel (wide.c): for each tile of TILE_ROWS rows,
 * each block and each group of four values, the tile's rows' four bytes side by side
 * (32 bytes: one register, a 32-bit lane per row). Rows past m are zero. */
static inline void interleave_rows(const int8_t *src, int64_t m, int64_t k, int8_t *dst) {
    int64_t nb = k / 32, tiles = (m + TILE_ROWS - 1) / TILE_ROWS;
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t b = 0; b < nb; b++)
            for (int g = 0; g < 8; g++) {
                int8_t *out = dst + ((t * nb + b) * 8 + g) * 4 * TILE_ROWS;
                for (int j = 0; j < TILE_ROWS; j++) {
                    int64_t i = t * TILE_ROWS + j;
                    if (i < m) memcpy(out + 4 * j, src + i * k + 32 * b + 4 * g, 4);
                    else memset(out + 4 * j, 0, 4);
                }
            }
}

#endif
