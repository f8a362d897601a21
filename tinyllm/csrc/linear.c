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
 * NEON has 32). Where the compiler targets AVX-512 (-march=native on such a CPU) a panel is one
 * 16-float vector and a tile is up to 12 rows times two neighbouring panels: 24 accumulators of 16
 * floats, two loads and twelve broadcasts per k (of 32 registers): twice the arithmetic per
 * instruction, 1.45-1.6x faster than the AVX2 tile at 16-64 rows on a Xeon with AVX-512 (where
 * the AVX2 tile was 1.4x slower than PyTorch's GEMM; it is now 1.1x faster; docs/benchmarks.md). The
 * packing is the same either way, and each output is the same sum over k in the same order, fused
 * multiply-adds from zero: the same bits from either tile. Panels are split across threads; a block of up to 96 rows of x stays in
 * cache while the panels pass, and each panel's K x 16 floats stay in L1/L2 while its row tiles run.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* GCC's -O3 (the library's level) takes ~3 s on this file (it tries to vectorize and version the
 * inlined tiles' loops over k, which are already vector code) and gains nothing measurable over
 * -O2 here, which takes ~0.2 s for the AVX2 tiles and ~1.6 s for the 26 AVX-512 ones (12 heights
 * x one or two panels, and the full height again with requests ahead; 24 took ~1.3 s): the
 * kernels build on first use, so the build time counts. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O2")
#endif

#define NR 16           /* output columns per panel: two vectors of 8, or one of 16 */
#define ROW_BLOCK 96    /* rows of x per pass over the panels */

/* A panel's row k is one 64-byte cache line (16 floats). A tile that is given `ahead` (the first
 * row tile of each pass over a panel) requests row k of the `np` panels at `ahead` into L2 as it
 * works on its own row k: the thread's next panels arrive while it computes, where the hardware's
 * prefetcher, its stream broken by the later tiles reading the panel again, left each panel's
 * first tile waiting on memory.
 * In a decode step the weights come from L3 or memory (the K/V read between layers push them
 * out): a 64-row step's linear layers 1.13-1.16x faster on an AVX-512 Xeon (docs/benchmarks.md). */
static inline __attribute__((always_inline)) void request_rows(const float *ahead, int64_t k, int64_t K, int np) {
    for (int j = 0; j < np; ++j) __builtin_prefetch(ahead + (j * K + k) * NR, 0, 2);
}

#if defined(__AVX512F__)
#define MR_MAX 12       /* rows per tile; vf (simd.h) is 16 floats here */

/* y[0..ncols) = acc (+ add[0..ncols)): a whole panel's columns, or the last panel's few. */
static inline void put(float *y, vf acc, int64_t ncols, const float *add) {
    if (!add && ncols == NR) {
        memcpy(y, &acc, sizeof acc);
        return;
    }
    float tmp[NR];
    memcpy(tmp, &acc, sizeof acc);
    for (int64_t j = 0; j < ncols; ++j) y[j] = add ? add[j] + tmp[j] : tmp[j];
}

/* MR rows (a constant 1..12 once inlined) of x times NP (a constant 1 or 2) neighbouring panels:
 * two panels' loads per k serve 24 multiply-adds with each broadcast used twice (one panel's
 * tile would load as often as it multiplies). Only the second panel can be the matrix's last. */
#define EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
static inline __attribute__((always_inline))
void tile(const float *x, int64_t x_row, const float *panel, int64_t K, float *y, int64_t y_row,
          int64_t ncols, const float *add, int64_t add_row, const int MR, const int NP, const float *ahead) {
    const float *panel1 = panel + (NP > 1 ? K * NR : 0);
#define DECLARE(i) vf acc##i = {0}, accb##i = {0}; const float *x##i = x + (i < MR ? i : 0) * x_row;
    EACH_ROW(DECLARE)
    for (int64_t k = 0; k < K; ++k) {
        if (ahead) request_rows(ahead, k, K, 2);            /* (a constant NULL but in full tiles) */
        const vf b0 = loadv(panel + k * NR), b1 = NP > 1 ? loadv(panel1 + k * NR) : b0;
#define MULTIPLY(i) if (i < MR) { const float s = x##i[k]; \
                                  const vf a = splat(s); \
                                  acc##i += a * b0; if (NP > 1) accb##i += a * b1; }
        EACH_ROW(MULTIPLY)
    }
#define STORE(i) if (i < MR) { float *yi = y + i * y_row; const float *ai = add ? add + i * add_row : 0; \
                               if (NP > 1) { put(yi, acc##i, NR, ai); put(yi + NR, accb##i, ncols, ai ? ai + NR : 0); } \
                               else put(yi, acc##i, ncols, ai); }
    EACH_ROW(STORE)
}
#else
#define MR_MAX 6        /* rows per tile */

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
          int64_t ncols, const float *add, int64_t add_row, const int MR, const float *ahead) {
#define DECLARE(i) v8 lo##i = {0}, hi##i = {0}; const float *x##i = x + (i < MR ? i : 0) * x_row;
    EACH_ROW(DECLARE)
    for (int64_t k = 0; k < K; ++k) {
        if (ahead) request_rows(ahead, k, K, 1);            /* (a constant NULL but in full tiles) */
        const v8 b0 = load8(panel + k * NR), b1 = load8(panel + k * NR + 8);
        /* a broadcast by initializer: `(v8){0} + s` would add 0.f first (an extra instruction) */
#define MULTIPLY(i) if (i < MR) { const float s = x##i[k]; const v8 a = {s, s, s, s, s, s, s, s}; \
                                  lo##i += a * b0; hi##i += a * b1; }
        EACH_ROW(MULTIPLY)
    }
#define STORE(i) if (i < MR) put(y + i * y_row, lo##i, hi##i, ncols, add ? add + i * add_row : 0);
    EACH_ROW(STORE)
}

#endif

/* y (M, N) at y + m*y_row = x (M, K) at x + m*x_row times W^T, W packed as above; plus add (M, N)
 * at add + m*add_row when add is not NULL (a residual: the sum first, then the add, so the same
 * bits as adding afterwards). y must not overlap x or the panels; it may be add. */
void linear_packed(const float *x, int64_t x_row, int64_t M, int64_t K, const float *packed, int64_t N,
                   float *y, int64_t y_row, const float *add, int64_t add_row, int threads) {
    const int64_t panels = (N + NR - 1) / NR;
#if MR_MAX == 12
    const int64_t step = 2;                        /* panels per tile */
#else
    const int64_t step = 1;
#endif
    for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
        const int64_t m1 = M - m0 < ROW_BLOCK ? M : m0 + ROW_BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && (m1 - m0) * K * N > 32768)
        for (int64_t p0 = 0; p0 < panels; p0 += step) {
            const float *panel = packed + p0 * K * NR;
            const int64_t last = p0 + step < panels ? p0 + step - 1 : panels - 1;   /* this tile's last panel */
            const int64_t ncols = N - last * NR < NR ? N - last * NR : NR;           /* its columns */
            for (int64_t i = m0; i < m1; i += MR_MAX) {
                const float *xi = x + i * x_row, *ai = add ? add + i * add_row + p0 * NR : 0;
                float *yi = y + i * y_row + p0 * NR;
                const int64_t mr = m1 - i < MR_MAX ? m1 - i : MR_MAX;
                /* With more than one row tile per panel, the first requests the next tile's panels
                 * (whole ones; the last is left out). One tile reads its panels once, in order,
                 * which the hardware follows alone: requests there only cost (1-row calls 5-10%). */
                const float *ahead = i == m0 && m1 - m0 > MR_MAX && p0 + 2 * step <= panels ? panel + step * K * NR : NULL;
#if MR_MAX == 12
#define TILE_CALL(MR, AHEAD) if (last > p0) tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, MR, 2, AHEAD); \
                             else tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, MR, 1, AHEAD);
#else
#define TILE_CALL(MR, AHEAD) tile(xi, x_row, panel, K, yi, y_row, ncols, ai, add_row, MR, AHEAD);
#endif
#define TILE(MR) TILE_CALL(MR, NULL) break;
                if (ahead) {                                 /* (mr is MR_MAX): the only tiles compiled with requests */
                    TILE_CALL(MR_MAX, ahead)
                    continue;
                }
                switch (mr) {                                /* a constant MR: unrolled */
#if MR_MAX == 12
                    case 12: TILE(12)
                    case 11: TILE(11)
                    case 10: TILE(10)
                    case 9: TILE(9)
                    case 8: TILE(8)
                    case 7: TILE(7)
#endif
                    case 6: TILE(6)
                    case 5: TILE(5)
                    case 4: TILE(4)
                    case 3: TILE(3)
                    case 2: TILE(2)
                    default: TILE(1)
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
