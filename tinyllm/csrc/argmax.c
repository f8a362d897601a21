/* Greedy sampling's argmax over each row of logits, CPU float32. PyTorch 2.13's CPU argmax is not
 * vectorized: ~400 us for 64 rows of a 4096-token vocabulary (a max over the same rows takes 70);
 * here one vectorized max per row, then the first index holding it (found 64 values at a time:
 * a scalar search for it cost twice the max pass); rows split over the threads
 * when there are many (64 rows of 4,096: 1.02x the d256 step, noise on the bundled one). */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

/* out[r] = the first index of row r's largest value, or of its first NaN if it has one (as
 * torch.argmax: NaN counts as larger than everything). */
void argmax_rows(const float *x, int64_t x_row, int64_t rows, int64_t n, int64_t *out) {
#pragma omp parallel for if (rows * n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * x_row;
        float top = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max:top) reduction(|:nan)
        for (int64_t i = 0; i < n; ++i) {
            top = xr[i] > top ? xr[i] : top;
            nan |= xr[i] != xr[i];
        }
        int64_t at = 0;
        if (nan) {
            while (xr[at] == xr[at]) ++at;
        } else {                     /* the first chunk of 64 holding top, compared in vectors, */
                                     /* then scanned (a scalar search cost 2x the max pass).    */
            at = 0;                  /* No value equals top only in a row of -inf under clang:  */
                                     /* its max reduction starts from -FLT_MAX, not -inf        */
            for (int64_t c = 0; c < n; c += 64) {
                const int64_t end = c + 64 < n ? c + 64 : n;
                int hit = 0;
#pragma omp simd reduction(|:hit)
                for (int64_t i = c; i < end; ++i) hit |= xr[i] == top;
                if (hit) {
                    at = c;
                    while (xr[at] != top) ++at;
                    break;
                }
            }
        }
        out[r] = at;
    }
}
