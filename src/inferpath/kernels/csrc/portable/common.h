/* Helpers shared by the portable kernels: plain C, no intrinsics.
 *
 * This is the reference level and the one every CPU runs. Loops that the compiler should
 * vectorise carry `omp simd` (a float reduction is only reordered where a pragma allows
 * it), so the same source becomes SSE2 code at the generic level, AVX2+FMA code at the
 * avx2 level (-mavx2 -mfma -mf16c) and NEON on aarch64. bf16 values travel as uint16_t
 * bit patterns; arithmetic is float32 and rounding to bf16 is to nearest even, as
 * PyTorch rounds.
 */
#ifndef INFERPATH_PORTABLE_COMMON_H
#define INFERPATH_PORTABLE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint16_t round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40 : 0));
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float f32_identity(float v) { return v; }

#endif
