/* Weights repacked at load into groups of eight output rows (K-quants: r8.c; Q8_0, Q5_0
 * and Q4_1: r8_legacy.c), for matmul.c.
 *
 * A repacked tensor keeps its GGUF format's values, scales and float16 d / dmin, laid out
 * so that one 32-byte load holds four quant values of each of eight rows for the same
 * four input positions (a 32-bit lane per row): one broadcast of x's four bytes and one
 * vpdpbusd (AVX2: vpmaddubsw, vpmaddwd) accumulate the eight rows' partial dots side by
 * side, and the lanes are the eight outputs, with no horizontal reduction. Per group of
 * eight rows and per super-block of 256 values (t), bytes:
 *
 *   Q4_K_R8 1184 (= 8 x 148, the file's 8 x 144 + 2.8%):
 *       0  d[8]     float16, a row each        16  dmin[8] float16
 *      32  scales[8 sub-blocks][8 rows] uint8 (6-bit values unpacked)
 *      96  mins[8][8] uint8
 *     160  quants[4 pairs p][8 quads g][8 rows][4]: byte (p, g, r, e) holds row r's value
 *          4g + e of sub-block 2p in its low nibble, of sub-block 2p + 1 in its high one
 *   Q5_K_R8 1440 (= 8 x 180, the file's 8 x 176 + 2.3%): Q4_K_R8's first 160 bytes, then
 *     160  qh[8 quads g][8 rows][4]: bit s of byte (g, r, e) is the fifth bit of row r's
 *          value 4g + e of sub-block s (the file's qh[4g + e])
 *     416  quants as Q4_K_R8's at 160
 *   Q6_K_R8 1696 (= 8 x 212, the file's 8 x 210 + 1%):
 *       0  d[8] float16                        16  scales[16 halves][8 rows] int8
 *     144  16 bytes of zeros: every 32-byte load below (and each super-block) 32-byte
 *          aligned (1680 bytes unpadded: half the loads split cache lines, and a
 *          streamed 8960 x 1536 weight ran at 4 GB/s instead of 18)
 *          then, in the order the kernel first reads them (p0 with h0, p1, p2 with h1,
 *          p3: a forward stream; regions in the order of the fields, read back and forth
 *          between them, streamed at a third of the rate):
 *     p    low four bits of pair p (sub-blocks 2p, 2p + 1): [8 quads][8 rows][4], as
 *          Q4_K_R8's quants, at 160, 672, 928, 1440 (q6_ql_at)
 *     h    high two bits of quarter h (sub-blocks 4h..4h+3): [8 quads][8 rows][4], bits
 *          2i, 2i+1 of byte (g, r, e): value 4g + e of sub-block 4h + i; at 416, 1184
 *
 * Q8_0, Q5_0 and Q4_1 (r8_legacy.c), per group of eight rows and 32-value block, bytes:
 *
 *   Q8_0_R8 272 (= 8 x 34, the file's):
 *       0  d[8] float16        16  q[8 quads g][8 rows][4] int8: row r's values 4g..4g+3
 *   Q5_0_R8 176 (= 8 x 22, the file's):
 *       0  d[8] float16        16  qh[8 rows][4]: bit g of byte (r, e) is the fifth bit of
 *                                  row r's value 4g + e (a quad's bits: one shift, one and)
 *      48  q[4 quads g][8 rows][4]: byte (g, r, e) holds row r's value 4g + e in its low
 *          nibble and 16 + 4g + e in its high one (the file's q[4g + e])
 *   Q4_1_R8 160 (= 8 x 20, the file's):
 *       0  d[8] float16        16  m[8] float16 (the rows' mins)
 *      32  q[4 quads g][8 rows][4] as Q5_0_R8's at 48
 *
 * A repacked tensor of n rows (n a multiple of 8) is n rows of R8_ROW_BYTES per
 * super-block (Q8_0, Q5_0: per block) in matmul.c's terms: rows 8G..8G+7 together hold group G, so row ranges at
 * multiples of 8 are ranges of groups.
 */
#ifndef INFERPATH_QUANT_R8_H
#define INFERPATH_QUANT_R8_H

#include <stdint.h>

#include "activations.h"
#include "blocks.h"

#define R8_ROWS 8
#define Q4_K_R8_BYTES 1184  /* a group's super-block */
#define Q5_K_R8_BYTES 1440
#define Q6_K_R8_BYTES 1696

/* the bytes a group of a repacked K-quant takes per super-block, 0 if none */
static inline int64_t r8_block_bytes(int qtype) {
    return qtype == Q4_K_R8 ? Q4_K_R8_BYTES : qtype == Q5_K_R8 ? Q5_K_R8_BYTES : qtype == Q6_K_R8 ? Q6_K_R8_BYTES : 0;
}
/* the bytes a repacked format takes per row and super-block (a group's / 8), 0 if none */
static inline int64_t r8_row_bytes(int qtype) { return r8_block_bytes(qtype) / R8_ROWS; }
/* Q4_K_R8 and Q5_K_R8 (the latter's fifth bits beside): where sub-block pair p's nibbles lie */
static inline int k4_quants_at(int qtype, int p) { return (qtype == Q5_K_R8 ? 416 : 160) + 256 * p; }
static inline int r8_format(int qtype) { return r8_row_bytes(qtype) != 0; }

/* Q8_0, Q5_0 and Q4_1 repacked (r8_legacy.c): ids as R8_BASE + the GGUF type, bytes per
 * group and 32-value block */
enum { Q4_1_R8 = R8_BASE + Q4_1, Q5_0_R8 = R8_BASE + Q5_0, Q8_0_R8 = R8_BASE + Q8_0 };
#define Q8_0_R8_BYTES 272
#define Q5_0_R8_BYTES 176
#define Q4_1_R8_BYTES 160
/* the bytes a group takes per 32-value block, 0 if not one of these */
static inline int64_t r8_legacy_block_bytes(int qtype) {
    return qtype == Q8_0_R8 ? Q8_0_R8_BYTES : qtype == Q5_0_R8 ? Q5_0_R8_BYTES : qtype == Q4_1_R8 ? Q4_1_R8_BYTES : 0;
}
/* the bytes a row takes per 32-value block (a group's / 8), 0 if not one of these */
static inline int64_t r8_legacy_row_bytes(int qtype) { return r8_legacy_block_bytes(qtype) / R8_ROWS; }
/* where a legacy group's block keeps its quads' nibbles (Q5_0_R8, Q4_1_R8) */
static inline int r8_legacy_nibbles_at(int qtype) { return qtype == Q4_1_R8 ? 32 : 48; }
static inline int r8_legacy_format(int qtype) { return r8_legacy_row_bytes(qtype) != 0; }
/* any format repacked by groups of eight rows (r8.c or r8_legacy.c) */
static inline int r8_grouped(int qtype) { return r8_format(qtype) || r8_legacy_format(qtype); }

/* The weight stream read ahead of the kernel by software prefetch, R8_PREFETCH_BYTES
 * beyond the bytes in hand: a kernel prefetches each slice of a super-block (or block) as
 * it starts on it, so a thread keeps ~4 KB of its contiguous range in flight. The hardware
 * prefetcher alone left a one-row decode step's kernel waiting on memory: at one thread
 * on an AVX2-only AMD EPYC (Zen 3), 8960 x 1536 streamed from memory, Q4_K_R8 ran 1.3x
 * and Q6_K_R8 1.2x as fast with it (4 KB and 2 KB ahead measured alike;
 * docs/kquant_kernels.md). Past a tensor's end it reads nothing (a prefetch never faults).
 * At the avx512 level written as the instruction itself (prefetch_line): GCC 12 emitted
 * none of r8.c's and r8_legacy.c's __builtin_prefetch calls there (at avx2 it did; there
 * the asm, a barrier to the compiler's scheduling, made r8_multi.c's Q6_K tiles 2x slower). */
#define R8_PREFETCH_BYTES 4096
static inline void prefetch_line(const uint8_t *at) {
#if defined(__x86_64__) && defined(__AVX512F__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)at));
#else  /* the builtin where GCC keeps it: the asm, a barrier to its scheduling, halved r8_multi.c's rate */
    __builtin_prefetch(at, 0, 3);
#endif
}
static inline void r8_prefetch(const uint8_t *at, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) prefetch_line(at + R8_PREFETCH_BYTES + c);
}

/* A pair of groups (r8_pair.c) is group A at a and group B at a + step, a super-block (or
 * block) of each in turn. matmul.c pairs a range's first half of groups with its second
 * half (group g with g + half), so that A's groups, pair after pair, are one contiguous
 * stream and B's another, each read straight through: each is prefetched R8_PAIR_AHEAD bytes
 * ahead of the slice in hand (``at``: its offset within A's group), past the group's end
 * into the next pair's. Adjacent groups as pairs (B at A + group_bytes) make each stream
 * jump a group at every pair, two streams a group apart: at one thread on an AMD EPYC
 * Zen 5, streamed, one row, Q4_K_R8 8960 x 1536 read 25-28 GB/s that way and 34-39 GB/s
 * as two straight streams, 1536 x 8960 30-32 against 35-37, and two processes at once
 * (8960 x 1536, a core each) 35-40 against 47 (a C harness timing r8_pair_rows alone,
 * docs/kquant_kernels.md); 4 KB ahead measured best there (8 KB 0.9-1.0x). The 32-value
 * formats' tiles of 3 rows or more, bound by their arithmetic, ran 1.02-1.2x slower as
 * halves than as adjacent pairs: matmul.c keeps those adjacent, each stream then
 * R8_ADJACENT_PAIR_AHEAD ahead and past its group's end into the same stream of the next
 * pair (the next pair's A for A, its B for B). */
#define R8_PAIR_AHEAD 4096
#define R8_ADJACENT_PAIR_AHEAD 8192
static inline __attribute__((always_inline)) void r8_prefetch_pair(const uint8_t *a, int64_t step, int64_t group_bytes,
                                                                   int64_t at, int64_t bytes) {
    const uint8_t *to = a + at + R8_PAIR_AHEAD;
    if (step == group_bytes) {  /* adjacent groups */
        const int64_t ahead = at + R8_ADJACENT_PAIR_AHEAD, pairs = ahead / group_bytes;
        to = a + pairs * 2 * group_bytes + (ahead - pairs * group_bytes);
    }
    for (int64_t c = 0; c < bytes; c += 64) prefetch_line(to + c), prefetch_line(to + step + c);
}

/* where Q6_K_R8's low bits of pair p and high bits of quarter h lie in a super-block */
static inline int q6_ql_at(int p) { return p == 0 ? 160 : p == 1 ? 672 : p == 2 ? 928 : 1440; }
static inline int q6_qh_at(int h) { return h == 0 ? 416 : 1184; }

/* One group (8 weight rows, k values each) against rows 0..rows-1 (<= TILE_ROWS) of x:
 * out[j * 8 + r] = weight row r . x row j. Each x row's float sums are one multiply-add
 * chain over the super-blocks and sub-blocks, whatever ``rows`` is (batch invariance),
 * and every level (this file's portable form included) runs the same chain: equal to the
 * bit across levels. */
__attribute__((visibility("hidden"))) void r8_rows(int qtype, const uint8_t *group, const q8_rows *x, int64_t rows,
                                                   float *out);

/* Two groups of one tensor (group A at ``group``, B at group + step, step a multiple of the
 * group's bytes) against rows 0..rows-1 (<= TILE_ROWS) of x at once, in 512-bit registers
 * (r8_pair.c): out[j * 16 + r] = group A's weight row r . x row j (r < 8), group B's row
 * r - 8 (r >= 8), the bits of r8_rows (r8_legacy_rows for Q8_0_R8, Q5_0_R8 and Q4_1_R8) on
 * each group. 1, or 0 where the level has no 512-bit VNNI (the caller then runs r8_rows or
 * r8_legacy_rows per group). */
__attribute__((visibility("hidden"))) int r8_pair_rows(int qtype, const uint8_t *group, int64_t step,
                                                       const q8_rows *x, int64_t rows, float *out);
/* 1 where r8_pair_rows runs at this level (512-bit VNNI), else 0 */
__attribute__((visibility("hidden"))) int r8_pairs_ready(void);

/* One Q6_K_R8 group against rows 0..rows-1 (2..TILE_ROWS) of x in one int8 pass, at the
 * AVX2 level without VNNI, all rows in one pass over the group (r8_multi.c): r8_rows' out
 * and bits. 1, or 0 at another level, for one row, for x in two passes or for another
 * format (r8_rows' own tiles serve). r8_rows calls it first. */
__attribute__((visibility("hidden"))) int r8_multi_rows(int qtype, const uint8_t *group, const q8_rows *x,
                                                        int64_t rows, float *out);

/* The rows [0, rows) (a multiple of 8) of a repacked tensor as float32 (rows, k), equal to
 * the bit to matmul.c's dequantizer of the file's blocks. */
__attribute__((visibility("hidden"))) void r8_dequantize(int qtype, const uint8_t *w, int64_t rows, int64_t k,
                                                         float *out, int num_threads);

/* r8_rows and r8_dequantize for Q8_0_R8, Q5_0_R8 and Q4_1_R8 (r8_legacy.c), with the same contract:
 * batch invariant, equal to the bit across levels; the values equal to matmul.c's
 * dequantizer of the file's blocks */
__attribute__((visibility("hidden"))) void r8_legacy_rows(int qtype, const uint8_t *group, const q8_rows *x,
                                                          int64_t rows, float *out);
__attribute__((visibility("hidden"))) void r8_legacy_dequantize(int qtype, const uint8_t *w, int64_t rows, int64_t k,
                                                                float *out, int num_threads);

#endif
