/* The wide kernel's interface (wide.c), for matmul.c. */
#ifndef INFERPATH_QUANT_WIDE_H
#define INFERPATH_QUANT_WIDE_H

#include <stdint.h>

/* A tile of x as the wide kernel reads it: interleaved int8 (activations.h) and the
 * tile's per-block scalars. */
typedef struct {
    const int8_t *q, *r;           /* [k / 32][8 groups][TILE_ROWS][4] */
    const float *d, *s, *h;        /* as in q8_rows */
    int64_t k;
    int one_pass;                  /* r is zero (activations.h): skipped */
} wide_rows;

/* one weight row against the TILE_ROWS rows of a tile: out[TILE_ROWS] */
typedef void (*wide_fn)(const uint8_t *row, const wide_rows *x, float *out);

/* The wide kernel of a GGUF format at this level, or NULL (none: the portable level). */
__attribute__((visibility("hidden"))) wide_fn wide_kernel(int qtype);

/* Tiles with fewer rows than this take the row kernel. */
#define WIDE_MIN_ROWS 6

#endif
