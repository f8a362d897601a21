/* SwiGLU's gate, silu(gate) * up, from the fused gate/up projection's output, CPU float32: one
 * pass instead of PyTorch's split, silu and multiply (three passes and an intermediate). */
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

/* x: `rows` rows of 2F floats (gate then up) at x + r*x_row; y: rows of F at y + r*F.
 * silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) <= 1 so no exp overflows. */
void silu_mul(const float *x, int64_t x_row, int64_t rows, int64_t F, float *y) {
#pragma omp parallel for if (rows * F > 16384) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = x + r * x_row, *u = g + F;
        float *yr = y + r * F;
#pragma omp simd
        for (int64_t i = 0; i < F; ++i) {
            const float a = g[i], e = exp_nonpos(a < 0.f ? a : -a);
            const float sig = (a < 0.f ? e : 1.f) / (1.f + e);
            yr[i] = a * sig * u[i];
        }
    }
}
