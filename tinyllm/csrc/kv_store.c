/* A step's new K and V rows into a layer of the paged pool, CPU; float32 in, the pool float32 or
 * bfloat16 (rounded to nearest even as PyTorch's .to(torch.bfloat16) rounds: simd.h): both in one
 * call (two PyTorch index_copy_ calls cost ~40 us each at decode sizes, almost all of it dispatch). */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* Token t's K (`row` floats at k + t*src_row) goes to pool row write[t] of k_pool (rows of `row`
 * elements, contiguous); the same for V. */
void kv_store(const float *k, const float *v, int64_t src_row, int64_t tokens, int64_t row,
              const int64_t *write, void *k_pool, void *v_pool, int kv_bf16) {
/* Tokens split across threads from 4096 elements (each token writes its own pool row): the pool's
 * rows are cold, so a 64-row step's stores wait on memory (0.067 -> 0.05 ms d256, 0.13 -> 0.1 ms
 * bundled). */
#pragma omp parallel for if (tokens * row > 4096) schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
        if (kv_bf16) {
            uint16_t *kd = (uint16_t *)k_pool + write[t] * row, *vd = (uint16_t *)v_pool + write[t] * row;
            const float *ks = k + t * src_row, *vs = v + t * src_row;
            for (int64_t i = 0; i < row; ++i) {
                kd[i] = float_to_bf16(ks[i]);
                vd[i] = float_to_bf16(vs[i]);
            }
        } else {
            memcpy((float *)k_pool + write[t] * row, k + t * src_row, sizeof(float) * (size_t)row);
            memcpy((float *)v_pool + write[t] * row, v + t * src_row, sizeof(float) * (size_t)row);
        }
    }
}
