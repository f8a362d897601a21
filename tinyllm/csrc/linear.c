/* y = x W^T (+ add), CPU float32, from W packed once in panels of 16 output columns.
 *
 * Why not oneDNN (what PyTorch's packed CPU linear calls): each call costs ~50 us before any
 * arithmetic (measured here, 64x64 at one row: 53 us vs 3 us for F.linear), about 1.5 ms of
 * every decode step of a 6-layer model, and at a few rows it reads the weight at a third of the
 * memory's speed. MKL's packed GEMM is quicker at one row but gives a row a different result in a
 * batch than alone (it picks kernels by row count), which would break greedy == solo. This one
 * computes every output as a plain sum over k in order, so a row's result is the same bits
 * whatever rows share its call, however many, on any thread count.
 *
 * The weight (N, K) row-major, as nn.Linear holds it, is packed (tinyllm/native.py) into
 * ceil(N/16) panels, panel p = (K, 16): P[p][k][j] = W[16p + j][k], zero past N. A tile is up
 * to 6 rows of x times one panel: 12 accumulators of 8 floats, two loads of the panel and six
 * broadcasts of x per k (the classic AVX2 6x16 register tile; it fits the 16 vector registers;
 * NEON has 32). Panels are split across threads; a block of up to 96 rows of x stays in cache
 * while the panels pass, and each panel's K x 16 floats stay in L1/L2 while its row tiles run.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* GCC's -O3 (the library's level) takes ~3 s on this file (it tries to vectorize and version the
 * six inlined tiles' loops over k, which are already vector code) and gains nothing measurable
 * over -O2 here, which takes ~0.5 s: the kernels build on first use, so the build time counts. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O2")
#endif

#define NR 16           /* output columns per panel: two vectors of 8 */
#define MR_MAX 6        /* rows per tile */
#define ROW_BLOCK 96    /* rows of x per pass over the panels */

/* y[0..ncols) = lo|hi (+ add[0..ncols)): a whole panel's columns, or the last panel's few. */
static inline void put(float *y, v8 lo, v8 hi, int64_t ncols, const float *add) {
    if (!add && ncols == NR) {
        store8(y, lo);
        store8(y + 8, hi);
        return;
    }
    float tmp[NR];
    store8(tmp, lo);
    store8(tmp + 8, hi);
    for (int64_t j = 0; j < ncols; ++j) y[j] = add ? add[j] + tmp[j] : tmp[j];
}

/* MR rows (a constant 1..6 once inlined) of x times one panel. Written out row by row (not as an
 * array of accumulators) so the compiler keeps all of them in registers. */
#define EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5)
static inline __attribute__((always_inline))
void tile(const float *x, int64_t x_row, const float *panel, int64_t K, float *y, int64_t y_row,
          int64_t ncols, const float *add, int64_t add_row, const int MR) {
#define DECLARE(i) v8 lo##i = {0}, hi##i = {0}; const float *x##i = x + (i < MR ? i : 0) * x_row;
    EACH_ROW(DECLARE)
    for (int64_t k = 0; k < K; ++k) {
        const v8 b0 = load8(panel + k * NR), b1 = load8(panel + k * NR + 8);
        /* a broadcast by initializer: `(v8){0} + s` would add 0.f first (an extra instruction) */
#define MULTIPLY(i) if (i < MR) { const float s = x##i[k]; const v8 a = {s, s, s, s, s, s, s, s}; \
                                  lo##i += a * b0; hi##i += a * b1; }
        EACH_ROW(MULTIPLY)
    }
#define STORE(i) if (i < MR) put(y + i * y_row, lo##i, hi##i, ncols, add ? add + i * add_row : 0);
    EACH_ROW(STORE)
}

/* y (M, N) at y + m*y_row = x (M, K) at x + m*x_row times W^T, W packed as above; plus add (M, N)
 * at add + m*add_row when add is not NULL (a residual: the sum first, then the add, so the same
 * bits as adding afterwards). y must not overlap x or the panels; it may be add. */
void linear_packed(const float *x, int64_t x_row, int64_t M, int64_t K, const float *packed, int64_t N,
                   float *y, int64_t y_row, const float *add, int64_t add_row, int threads) {
    const int64_t panels = (N + NR - 1) / NR;
    for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const int64_t m1 = M - m0 < ROW_BLOCK ? M : m0 + ROW_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && (m1 - m0) * K * N > 32768)
        for (int64_t p = 0; p < panels; ++p) {
            const float *panel = packed + p * K * NR;
            const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
            for (int64_t i = m0; i < m1; i += MR_MAX) {
                const float *xi = x + i * x_row, *ai = add ? add + i * add_row + p * NR : 0;
                float *yi = y + i * y_row + p * NR;
                switch (m1 - i < MR_MAX ? m1 - i : MR_MAX) {     /* a constant MR: unrolled */
                    case 6: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 6); break;
                    case 5: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 5); break;
                    case 4: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 4); break;
                    case 3: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 3); break;
                    case 2: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 2); break;
                    default: tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, 1);
                }
            }
        }
    }
}

/* The panels of W (N, K) row-major: P[p][k][j] = W[16p + j][k], zero where 16p + j >= N.
 * `packed` holds ceil(N/16) * K * 16 floats. */
void pack_linear_weight(const float *w, int64_t N, int64_t K, float *packed) {
    const int64_t panels = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static) if (N * K > 65536)
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < NR; ++j)
                packed[(p * K + k) * NR + j] = p * NR + j < N ? w[(p * NR + j) * K + k] : 0.f;
}
