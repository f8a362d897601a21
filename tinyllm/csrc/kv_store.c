/* A step's new K and V rows into a layer of the paged pool, CPU float32: both in one call (two
 * PyTorch index_copy_ calls cost ~40 us each at decode sizes, almost all of it dispatch). */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Token t's K (`row` floats at k + t*src_row) goes to pool row write[t] of k_pool (rows of `row`
 * floats, contiguous); the same for V. */
void kv_store(const float *k, const float *v, int64_t src_row, int64_t tokens, int64_t row,
              const int64_t *write, float *k_pool, float *v_pool) {
    for (int64_t t = 0; t < tokens; ++t) {
        memcpy(k_pool + write[t] * row, k + t * src_row, sizeof(float) * (size_t)row);
        memcpy(v_pool + write[t] * row, v + t * src_row, sizeof(float) * (size_t)row);
    }
}
