/* Rotary position embedding (HF's half-split layout) applied in place to the query and key heads
 * of the fused qkv projection's output, CPU float32.
 *
 * In PyTorch it is seven ops per layer (a gather of the cos/sin rows once per step, then per
 * layer: the rotated copy by cat and neg, two multiplies, an add, a cast), each a few microseconds
 * of dispatch and a pass over memory: at 64 decode rows of the d256 model about 5% of a step.
 * Here one pass per token, reading that token's cos/sin row from the model's tables directly.
 */
#include <stdint.h>

#include "kernels.h"

/* x: `tokens` rows of `heads` heads of `D` floats (head h of token t at x + t*x_row + h*D), the
 * first `heads` of the row rotated (the q and k heads; v follows them, untouched). pos[t]: token
 * t's position, a row of the (max_len, D) tables cos and sin. For d < D/2:
 *   x[d] <- x[d] cos[d] - x[d + D/2] sin[d],   x[d + D/2] <- x[d + D/2] cos[d + D/2] + x[d] sin[d + D/2]
 * which is HF's x * cos + rotate_half(x) * sin. */
void rope_inplace(float *x, int64_t x_row, int64_t tokens, int64_t heads, int64_t D,
                  const int64_t *pos, const float *cos, const float *sin) {
    const int64_t half = D / 2;
/* Tokens split across threads from 8192 elements (a 64-row step's RoPE 0.033 -> 0.025 ms on the
 * d256 model, 0.066 -> 0.048 on the bundled one). */
#pragma omp parallel for if (tokens * heads * D > 8192) schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos + pos[t] * D, *s = sin + pos[t] * D;
        for (int64_t h = 0; h < heads; ++h) {
            float *a = x + t * x_row + h * D, *b = a + half;
#pragma omp simd
            for (int64_t d = 0; d < half; ++d) {
                const float lo = a[d], hi = b[d];
                a[d] = lo * c[d] - hi * s[d];
                b[d] = hi * c[half + d] + lo * s[half + d];
            }
        }
    }
}
