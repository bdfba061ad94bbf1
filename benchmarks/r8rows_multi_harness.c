/* r8_rows at the AVX2 level with r8_multi.c (Q6_K: every x row in one pass over a group)
 * against r8.c's own tiles (four x rows a pass), the kernels alone (no Python, no x
 * quantization), in one binary and interleaved: 64 groups of a 512 x 1536 repacked weight
 * (L2), random bytes, 1..8 rows of x in one int8 pass, best of 30 x 20 sweeps of process
 * CPU time; ns per group, sub-block and x row, the two outputs compared to the bit. r8.c is
 * included a second time with r8_multi_rows stubbed out (returning 0: its own tiles serve).
 * Build and run from the repo root:
 *
 *   Q=src/inferpath/kernels/csrc/quant; gcc -O3 -mavx2 -mfma -mf16c -I$Q benchmarks/r8rows_multi_harness.c \
 *       $Q/r8.c $Q/r8_multi.c -o /tmp/r8multi -lm && /tmp/r8multi 1 && /tmp/r8multi 0
 * (argument 1: Q6_K, 0: Q4_K, which r8_multi.c leaves to r8.c: the two columns then agree)
 */
#define r8_multi_rows tiles_only_multi
#define r8_rows tiles_only_rows
#define r8_dequantize tiles_only_dequantize
#define inferpath_quant_repack tiles_only_repack
#include "r8.c"
#undef r8_multi_rows
#undef r8_rows
#undef r8_dequantize
#undef inferpath_quant_repack

#include <stdio.h>
#include <time.h>

int tiles_only_multi(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out) {
    (void)qtype, (void)group, (void)x, (void)rows, (void)out;
    return 0;
}
void r8_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows, float *out);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int qtype = argc > 1 && atoi(argv[1]) ? Q6_K_R8 : Q4_K_R8;
    const int64_t k = 1536, nsb = k / 256, gb = nsb * (qtype == Q4_K_R8 ? Q4_K_R8_BYTES : Q6_K_R8_BYTES), G = 64;
    uint8_t *w = aligned_alloc(64, G * gb);
    for (int64_t i = 0; i < G * gb; i++) w[i] = (uint8_t)rand();
    for (int64_t g = 0; g < G; g++)  /* float16 d (and dmin) of moderate size: high bytes 0x20 */
        for (int64_t t = 0; t < nsb; t++)
            for (int r = 0; r < 16; r++) w[g * gb + t * (gb / nsb) + 2 * r + 1] = 0x20;
    int8_t *q = malloc(8 * k), *zero = calloc(8 * k, 1);
    float *d = malloc(8 * k / 32 * sizeof(float)), *s = malloc(8 * k / 32 * sizeof(float));
    float *h = malloc(8 * k / 16 * sizeof(float)), a[64], b[64];
    for (int64_t i = 0; i < 8 * k; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (int64_t i = 0; i < 8 * k / 32; i++) d[i] = 0.01f * (1 + rand() % 7), s[i] = 0.3f * (rand() % 5 - 2);
    for (int64_t i = 0; i < 8 * k / 16; i++) h[i] = 0.1f * (rand() % 9 - 4);
    double one = 0;
    for (int rows = 1; rows <= 8; rows++) {
        const q8_rows x = {q, zero, d, s, h, k, rows == 1 ? 1 : 8, 1};
        int differ = 0;
        for (int64_t g = 0; g < G; g++) {
            tiles_only_rows(qtype, w + g * gb, &x, rows, a), r8_rows(qtype, w + g * gb, &x, rows, b);
            differ += memcmp(a, b, sizeof(float) * 8 * rows) != 0;
        }
        double tiles = 1e9, multi = 1e9;
        for (int rep = 0; rep < 30; rep++) {
            double t0 = now();
            for (int it = 0; it < 20; it++)
                for (int64_t g = 0; g < G; g++) tiles_only_rows(qtype, w + g * gb, &x, rows, a);
            double t1 = now();
            for (int it = 0; it < 20; it++)
                for (int64_t g = 0; g < G; g++) r8_rows(qtype, w + g * gb, &x, rows, b);
            double t2 = now();
            tiles = t1 - t0 < tiles ? t1 - t0 : tiles, multi = t2 - t1 < multi ? t2 - t1 : multi;
        }
        const double units = 20.0 * G * nsb * 8 * rows;
        if (rows == 1) one = tiles / units;
        printf("%s rows %d: r8.c's tiles %.2f ns/sub-block-row, with r8_multi.c %.2f (%.2fx); per row vs 1 row "
               "%.2f -> %.2f; groups differing %d\n", qtype == Q6_K_R8 ? "Q6_K" : "Q4_K", rows, tiles / units * 1e9,
               multi / units * 1e9, multi / tiles, tiles / units / one, multi / units / one, differ);
    }
    return 0;
}
