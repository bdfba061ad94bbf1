/* AMX-INT8 tiles for r8_pair.c's case (a pair of repacked Q4_K groups against 1..8 rows of
 * x in one int8 pass), a probe, not a kernel of the library: is a verification's or a batch's
 * few rows cheaper through the tile unit than through vpdpbusd? Per 32-value sub-block, the
 * 16 columns' unpacked quads are stored as one B tile (8 rows x 64 bytes: r8.h's layout is
 * already AMX's group-of-four order, two groups side by side), x's rows are the A tile read
 * in place (R rows x 32 bytes), TDPBSUD sums them into a C tile, and the C tile is stored
 * and scaled by r8_pair.c's float chain. Software pipelined by super-blocks: super-block
 * t + 1 is unpacked while t's tiles run, and t - 1's sums are scaled (a store to a tile load,
 * or a tile store to a vector load, waits for the store to commit: one step at a time ran
 * at 100 cycles a step). Checks its outputs against r8_pair_rows to the bit (the integer
 * sums are the same, the float operations the same and in the same order), then times both,
 * best of 30 x 20 sweeps of 64 groups of a 512 x 1536 weight (L2), process CPU time.
 *
 *   Q=src/inferpath/kernels/csrc/quant; gcc -O3 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c \
 *       -mamx-tile -mamx-int8 -I$Q benchmarks/r8_amx_probe.c $Q/r8.c $Q/r8_pair.c $Q/r8_multi.c -o /tmp/r8amx -lm \
 *       && /tmp/r8amx
 *
 * Needs a CPU with AMX-INT8 and Linux >= 5.16 (the tile state asked with arch_prctl).
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "r8.h"

typedef struct { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tile_config;

/* tiles 0, 1: C (R rows x 16 int32); 2, 3: A (R rows x 32 bytes); 4, 5: B (8 rows x 64 bytes) */
static void configure(int R) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = (uint8_t)R, c.colsb[t] = 64;
    for (int t = 2; t < 4; t++) c.rows[t] = (uint8_t)R, c.colsb[t] = 32;
    for (int t = 4; t < 6; t++) c.rows[t] = 8, c.colsb[t] = 64;
    __asm__ volatile("" : : "r"(&c) : "memory");  /* GCC 12 dropped the field stores before ldtilecfg */
    _tile_loadconfig(&c);
}
static inline __m512i load_pair(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)), _mm256_loadu_si256((const __m256i *)b), 1);
}
static inline __m512 cvt16(const uint8_t *a, const uint8_t *b) {
    __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
}
static inline __m512 halves16(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)), _mm_loadu_si128((const __m128i *)b), 1));
}
/* unpack super-block t's eight B tiles into bt[8][64] */
static inline __attribute__((always_inline)) void unpack_sb(const uint8_t *a, int64_t step, int64_t t, uint8_t bt[8][8][64]) {
    const __m512i low = _mm512_set1_epi8(0xf);
    const uint8_t *o = a + t * Q4_K_R8_BYTES, *p = o + step;
    for (int pr = 0; pr < 4; pr++) {
        const int at = k4_quants_at(Q4_K_R8, pr);
        r8_prefetch_pair(a, step, t * Q4_K_R8_BYTES + pr * (Q4_K_R8_BYTES / 4), Q4_K_R8_BYTES / 4);
        for (int g = 0; g < 8; g++) {
            const __m512i v = load_pair(o + at + 32 * g, p + at + 32 * g);
            _mm512_store_si512(bt[2 * pr][g], _mm512_and_si512(v, low));
            _mm512_store_si512(bt[2 * pr + 1][g], _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
        }
    }
}
static inline __attribute__((always_inline)) void epilogue_sb(const uint8_t *a, int64_t step, int64_t t, const q8_rows *x, const int R,
                                                             int32_t c[8][8][16], __m512 *acc) {
    const int64_t lanes = x->lanes;
    const uint8_t *o = a + t * Q4_K_R8_BYTES, *p = o + step;
    const __m512 d = _mm512_mul_ps(halves16(o, p), _mm512_set1_ps(RESIDUAL_STEPS));
    const __m512 dmin = _mm512_sub_ps(_mm512_setzero_ps(), halves16(o + 16, p + 16));
    for (int s = 0; s < 8; s++) {
        const int64_t b = 8 * t + s;
        const __m512 dsc = _mm512_mul_ps(d, cvt16(o + 32 + 8 * s, p + 32 + 8 * s));
        const __m512 dmn = _mm512_mul_ps(dmin, cvt16(o + 96 + 8 * s, p + 96 + 8 * s));
        for (int j = 0; j < R; j++) {
            const __m512 dx = _mm512_set1_ps(x->d[b * lanes + j]), sx = _mm512_set1_ps(x->s[b * lanes + j]);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[s][j])), _mm512_mul_ps(dsc, dx), acc[j]);
            acc[j] = _mm512_fmadd_ps(dmn, sx, acc[j]);
        }
    }
}
static inline __attribute__((always_inline)) void tiles_sb(const q8_rows *x, int64_t t, uint8_t bt[8][8][64], int32_t c[8][8][16]) {
    const int64_t k = x->k;
    for (int s = 0; s < 8; s += 2) {
        const int64_t b = 8 * t + s;
        _tile_loadd(4, bt[s], 64); _tile_loadd(2, x->q + 32 * b, k); _tile_zero(0); _tile_dpbsud(0, 2, 4); _tile_stored(0, c[s], 64);
        _tile_loadd(5, bt[s + 1], 64); _tile_loadd(3, x->q + 32 * (b + 1), k); _tile_zero(1); _tile_dpbsud(1, 3, 5); _tile_stored(1, c[s + 1], 64);
    }
}
static inline __attribute__((always_inline)) void tile(const uint8_t *a, int64_t step, const q8_rows *x, const int R, float *out) {
    const int64_t nsb = x->k / 256;
    __m512 acc[8];
    uint8_t bt[2][8][8][64] __attribute__((aligned(64)));
    int32_t c[2][8][8][16] __attribute__((aligned(64)));
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    unpack_sb(a, step, 0, bt[0]);
    for (int64_t t = 0; t < nsb; t++) {
        if (t + 1 < nsb) unpack_sb(a, step, t + 1, bt[(t + 1) & 1]);
        tiles_sb(x, t, bt[t & 1], c[t & 1]);
        if (t > 0) epilogue_sb(a, step, t - 1, x, R, c[(t - 1) & 1], acc);
    }
    epilogue_sb(a, step, nsb - 1, x, R, c[(nsb - 1) & 1], acc);
    for (int j = 0; j < R; j++) _mm512_storeu_ps(out + 16 * j, acc[j]);
}
static void amx_pair_q4k(const uint8_t *a, int64_t step, const q8_rows *x, int64_t rows, float *out) {
    switch (rows) {
#define C_(R) case R: tile(a, step, x, R, out); break;
    C_(1) C_(2) C_(3) C_(4) C_(5) C_(6) C_(7) C_(8)
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("the kernel refused the AMX tile state\n"); return 1; }
    const int64_t k = 1536, nsb = k / 256, gb = nsb * Q4_K_R8_BYTES;
    const int G = 64;
    uint8_t *w = aligned_alloc(64, G * gb);
    for (int64_t i = 0; i < G * gb; i++) w[i] = (uint8_t)rand();
    for (int g = 0; g < G; g++)  /* small positive float16 d and dmin */
        for (int t = 0; t < nsb; t++)
            for (int r = 0; r < 16; r++) w[g * gb + t * Q4_K_R8_BYTES + 2 * r + 1] = 0x20;
    int8_t *q = malloc(8 * k), *rr = calloc(8 * k, 1);
    float *d = malloc(8 * k / 32 * 4), *s = malloc(8 * k / 32 * 4), *h = malloc(8 * k / 16 * 4);
    for (int i = 0; i < 8 * k; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (int i = 0; i < 8 * k / 32; i++) d[i] = 0.01f * (1 + i % 7), s[i] = 0.3f * (i % 5 - 2);
    for (int i = 0; i < 8 * k / 16; i++) h[i] = 0.1f;
    float o1[256], o2[256];
    for (int rows = 1; rows <= 8; rows++) {
        q8_rows x = {q, rr, d, s, h, k, rows == 1 ? 1 : 8, 1, NULL};
        configure(rows);
        int mismatched = 0;
        for (int g = 0; g < G; g += 2) {
            r8_pair_rows(Q4_K_R8, w + g * gb, gb, &x, rows, o1);
            amx_pair_q4k(w + g * gb, gb, &x, rows, o2);
            mismatched += memcmp(o1, o2, rows * 16 * sizeof(float)) != 0;
        }
        double vnni = 1e9, amx = 1e9;
        for (int rep = 0; rep < 30; rep++) {
            double t0 = now();
            for (int it = 0; it < 20; it++)
                for (int g = 0; g < G; g += 2) r8_pair_rows(Q4_K_R8, w + g * gb, gb, &x, rows, o1);
            double t1 = now() - t0;
            t0 = now();
            for (int it = 0; it < 20; it++)
                for (int g = 0; g < G; g += 2) amx_pair_q4k(w + g * gb, gb, &x, rows, o2);
            double t2 = now() - t0;
            vnni = t1 < vnni ? t1 : vnni, amx = t2 < amx ? t2 : amx;
        }
        const double per = 20.0 * G * nsb * 8 * rows / 1e9;  /* ns per group, sub-block and row */
        printf("rows %d: vnni %.2f  amx %.2f ns per group, sub-block and row  (amx / vnni %.2f)  pairs not equal: %d\n",
               rows, vnni / per, amx / per, amx / vnni, mismatched);
        _tile_release();
    }
    return 0;
}
