/* Byte-level BPE merges for many short words at once: the spec is BytePairEncoder.merge
 * (bpe.py), this is the same loop over ids in portable C.
 *
 * Per word: map its UTF-8 bytes to ids (byte_ids), then repeatedly merge the adjacent pair
 * of lowest rank, leftmost first, until no adjacent pair has a rank. The merge table is an
 * open-addressing hash (linear probing, a power-of-two size): key left * ID_SPAN + right + 1
 * (0 = empty slot), value rank << 32 | merged id. O(n^2) per word, fine for the short words
 * (<= max_word bytes) it is given; long ones stay on the Python heap path.
 *
 * data: the words' bytes back to back; starts: (num_words + 1) offsets into data;
 * out: room for data's length ids; out_starts: (num_words + 1) offsets into out.
 * Returns 0, or -1 when a byte has no id (the caller then uses the Python path) or a word
 * is longer than max_word.
 */
#include <stdint.h>
#include <string.h>

#define ID_SPAN ((uint64_t)1 << 24)
#define NO_RANK ((uint64_t)1 << 62)
#define MAX_WORD 256

static inline uint64_t lookup(const uint64_t *keys, const uint64_t *values, uint64_t mask,
                              uint64_t left, uint64_t right) {
    uint64_t key = left * ID_SPAN + right + 1;
    uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
    while (keys[slot]) {
        if (keys[slot] == key) return values[slot];
        slot = (slot + 1) & mask;
    }
    return NO_RANK;
}

int inferpath_bpe_merge_words(const uint64_t *keys, const uint64_t *values, int64_t mask,
                              const int32_t *byte_ids, const uint8_t *data, const int64_t *starts,
                              int64_t num_words, int32_t *out, int64_t *out_starts, int64_t max_word) {
    int32_t ids[MAX_WORD];
    uint64_t ranks[MAX_WORD];
    if (max_word > MAX_WORD) return -1;
    int64_t written = 0;
    out_starts[0] = 0;
    for (int64_t w = 0; w < num_words; w++) {
        int64_t n = starts[w + 1] - starts[w];
        if (n > max_word) return -1;
        for (int64_t i = 0; i < n; i++) {
            int32_t id = byte_ids[data[starts[w] + i]];
            if (id < 0) return -1;
            ids[i] = id;
        }
        for (int64_t i = 0; i + 1 < n; i++) ranks[i] = lookup(keys, values, (uint64_t)mask, ids[i], ids[i + 1]);
        while (n > 1) {
            int64_t best_i = 0;
            uint64_t best = ranks[0];
            for (int64_t i = 1; i + 1 < n; i++)
                if (ranks[i] < best) { best = ranks[i]; best_i = i; }  /* strict: leftmost wins */
            if (best == NO_RANK) break;
            int64_t i = best_i;
            ids[i] = (int32_t)(best & 0xFFFFFFFFu);
            memmove(ids + i + 1, ids + i + 2, (size_t)(n - i - 2) * sizeof ids[0]);
            memmove(ranks + i, ranks + i + 1, (size_t)(n - i - 2) * sizeof ranks[0]);
            n--;
            if (i + 1 < n) ranks[i] = lookup(keys, values, (uint64_t)mask, ids[i], ids[i + 1]);
            if (i > 0) ranks[i - 1] = lookup(keys, values, (uint64_t)mask, ids[i - 1], ids[i]);
        }
        memcpy(out + written, ids, (size_t)n * sizeof ids[0]);
        written += n;
        out_starts[w + 1] = written;
    }
    return 0;
}

/* Fill the open-addressing table (keys/values zeroed, mask + 1 slots, at most half full)
 * from num pairs: key left * ID_SPAN + right, value rank << 32 | merged id. The first
 * entry of a key wins. */
int inferpath_bpe_build_table(const uint64_t *pair_keys, const uint64_t *pair_values, int64_t num,
                              uint64_t *keys, uint64_t *values, int64_t mask) {
    for (int64_t p = 0; p < num; p++) {
        uint64_t key = pair_keys[p] + 1;
        uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> 20 & (uint64_t)mask;
        while (keys[slot] && keys[slot] != key) slot = (slot + 1) & (uint64_t)mask;
        if (!keys[slot]) {
            keys[slot] = key;
            values[slot] = pair_values[p];
        }
    }
    return 0;
}
