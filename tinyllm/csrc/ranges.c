/* The index ranges the kernels trust, checked in one pass: the first entry of x (n int64 values)
 * outside lo..hi, or -1. A step checks five index arrays (K/V write rows, block tables, lengths,
 * table numbers, rotary positions); as PyTorch reductions (a min and a max each) they were ~10
 * dispatches a step, each ~10-80 us with the caches cold after the weights went through. */
#include <stdint.h>

#include "kernels.h"

int64_t first_outside(const int64_t *x, int64_t n, int64_t lo, int64_t hi) {
    int64_t bad = 0;
#pragma omp simd reduction(|:bad)
    for (int64_t i = 0; i < n; ++i) bad |= (x[i] < lo) | (x[i] > hi);
    if (!bad) return -1;
    for (int64_t i = 0; i < n; ++i)
        if (x[i] < lo || x[i] > hi) return i;
    return -1;
}
