/* The decode pool (pool.c): persistent worker threads that spin a little, then sleep. */
#ifndef INFERPATH_QUANT_POOL_H
#define INFERPATH_QUANT_POOL_H

#include <stdint.h>

typedef void (*pool_task)(void *ctx, int64_t chunk);

/* Runs fn(ctx, c) for every c in [0, chunks) on the calling thread and up to threads - 1
 * workers, and returns when all are done. Chunks are claimed one at a time, so a worker
 * that is not running (its core taken) leaves its share to the others. */
__attribute__((visibility("hidden"))) void pool_run(int threads, pool_task fn, void *ctx, int64_t chunks);

#endif
