/* bfloat16 values as uint16_t bit patterns, for the level-independent drivers (the kernel
 * levels' common.h files have their own: drivers/ is compiled beside either). */
#ifndef INFERPATH_DRIVERS_BF16_H
#define INFERPATH_DRIVERS_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t bf16_round(float f) {  /* to nearest even, as PyTorch (and common.h) round */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0xffffu) ? 0x40 : 0));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif
