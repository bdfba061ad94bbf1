/* AMX's tile configuration (palette 1), as _tile_loadconfig reads it: shared by the bf16
 * GEMM (amx.c) and the int8 panels (amx_int8.c). */
#ifndef INFERPATH_AVX512_TILE_CONFIG_H
#define INFERPATH_AVX512_TILE_CONFIG_H

#include <stdint.h>

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#endif
