/* A ragged step's rows from its items, in one pass: item i is sequence slot[i]'s context
 * positions start[i] .. start[i]+n[i]-1 (a decode: n = 1). Each row (one token) gets its position,
 * the pool row its K/V is written to (through its slot's block table), the length it attends
 * (position + 1: a chunk's tokens are causal from its start) and the table it reads (its slot's
 * row of `tables`). Built in Python, a loop over every token with a table lookup each, this was
 * ~0.3 ms of a 64-row step with the caches cold after the weights went through.
 *
 * Checked, since the kernels trust what it writes: each item in range (its slot one of the
 * tables, start >= 0, n >= 1, its positions within the table's width, no more tokens than
 * `total`), and every block id its tokens read or write (its table's first ceil((start+n) /
 * block_size) entries) one of the pool's `n_blocks`; so every write row is in the pool, every
 * length within the table, every table row one of the tables. Returns 0; i + 1 for item i out of
 * the tables' range; -(i + 1) for item i's table lacking a pool block for a position it reads;
 * items + 1 when the items' tokens are not `total`. Nothing past the tables or the outputs is
 * touched. */
#include <stdint.h>

#include "kernels.h"

int64_t ragged_rows(const int64_t *slot, const int64_t *start, const int64_t *n, int64_t items,
                    const int64_t *tables, int64_t n_tables, int64_t width, int64_t block_size, int64_t n_blocks,
                    int64_t total, int64_t *pos, int64_t *write, int64_t *lens, int64_t *row_table) {
    int64_t r = 0;
    for (int64_t i = 0; i < items; ++i) {
        const int64_t s = slot[i], a = start[i], c = n[i];
        if (s < 0 || s >= n_tables || a < 0 || c < 1 || a > width * block_size - c) return i + 1;
        if (c > total - r) return items + 1;
        const int64_t *table = tables + s * width;
        for (int64_t b = 0; b < (a + c + block_size - 1) / block_size; ++b)
            if (table[b] < 0 || table[b] >= n_blocks) return -(i + 1);
        for (int64_t p = a; p < a + c; ++p, ++r) {
            pos[r] = p;
            write[r] = table[p / block_size] * block_size + p % block_size;
            lens[r] = p + 1;
            row_table[r] = s;
        }
    }
    return r == total ? 0 : items + 1;
}
