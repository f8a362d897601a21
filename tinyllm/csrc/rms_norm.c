/* RMSNorm for CPU float32, one pass over each row.
 *
 * In PyTorch 2.13 on CPU it is six ops (square, mean, add, rsqrt, two multiplies), each a few
 * microseconds of dispatch on a handful of decode rows: at 64 rows of the d256 model the norms
 * took ~7% of a step. Built with the attention kernel (tinyllm/native.py); the model calls it
 * where that library loaded, PyTorch's F.rms_norm otherwise.
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for each of `rows` rows of `dim` floats. x and y
 * may be the same array. The sum of squares is accumulated in double: a float sum over thousands
 * of large activations would round more than PyTorch's. */
void rms_norm(const float *x, int64_t x_row, const float *w, float *y, int64_t y_row,
              int64_t rows, int64_t dim, float eps) {
/* Rows split across threads from 8192 elements (64 rows of a d256 or d384 model: the norms of a
 * 64-row step 0.09 -> 0.06 ms and 0.18 -> 0.11 ms; the fork costs more than it saves below). */
#pragma omp parallel for if (rows * dim > 8192) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_row;
        float *yr = y + r * y_row;
        double ss = 0.0;
#pragma omp simd reduction(+:ss)
        for (int64_t d = 0; d < dim; ++d) ss += (double)xr[d] * xr[d];
        const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) yr[d] = xr[d] * inv * w[d];
    }
}
