/* Attention that reads a paged KV pool in place (CPU; float32 queries, a float32 or bfloat16
 * pool), one query token per row.
 *
 * Each row is one query token (every head) attending its own sequence's first `lens[r]`
 * positions, found through its block table: no gather into a dense window first (the PyTorch
 * path copies every row's blocks once per layer, then reads them again). A decode is one row; a
 * prefill chunk of n tokens is n rows sharing their sequence's table (`row_table`), with lengths
 * start+1 .. start+n, which is causal attention from the chunk's start. So every token of a step,
 * decode or prefill, is computed the same way, whatever the chunking. A row is one work item:
 * its keys are read once, block by block, in memory order (a token's K for every KV head is one
 * contiguous run in the token-major pool), for all query heads (GQA: g query heads share a KV
 * head), eight positions at a time; then its values, the same way, for a group's query heads
 * together, their weighted sums held in registers (they were added into the output in memory
 * token by token, and each head read the values again). Each score and output is the same sum in
 * the same order however positions and heads are grouped: the same bits as one at a time (tests/
 * test_native.py). Reading the pool from memory costs most (a d256-shaped step's attention takes
 * ~3x as long with its pool in memory as in L2), so the loops follow the memory, and each block's
 * successor is requested while it is worked on (1.2-1.3x at 64 rows of the d256 model on an AVX2
 * machine; docs/benchmarks.md); the arithmetic is the rest (the grouping above: 1.4x with the pool in
 * L2, 1.05-1.2x in a step).
 *
 * Plain C (GCC/Clang vector extensions), no PyTorch headers, so it compiles in well under a
 * second wherever a C compiler is found (tinyllm/native.py builds it on first use and stays on
 * PyTorch without one). Rows run in parallel through OpenMP when built with it: linked against
 * the libgomp PyTorch already loaded, the loop uses PyTorch's own worker threads (threads of a
 * second pool would compete with them for the same cores).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* q . k over D (a multiple of 16) before its horizontal sum, k a pool row of float32 or (bf16)
 * bfloat16, widened as it is read: two chains of 8 lanes (d mod 16 below 8, and the rest) added
 * together. hsum8 of this is the dot product. On every machine in lanes of 8: sums over 16 lanes
 * rounded differently enough that a greedy run against the PyTorch path (tests/test_kv_dtype.py)
 * picked another token. With AVX-512 the two chains are one vector of 16 (its low half the first,
 * its high half the second): the same sums in the same order, half the instructions. */
static inline __attribute__((always_inline))
v8 dot_lanes(const float *a, const void *k, int64_t D, const int bf16) {
    const float *bf = k;
    const uint16_t *bh = k;
#if VW == 16
    vf acc = {0};
    for (int64_t d = 0; d < D; d += 16) acc += loadv(a + d) * (bf16 ? loadv_bf16(bh + d) : loadv(bf + d));
    v8 a0, a1;
    memcpy(&a0, &acc, sizeof a0);
    memcpy(&a1, (const char *)&acc + sizeof a0, sizeof a1);
#else
    v8 a0 = {0}, a1 = {0};                                       /* two chains: FMA latency */
    for (int64_t d = 0; d < D; d += 16) {
        a0 += load8(a + d) * (bf16 ? load8_bf16(bh + d) : load8(bf + d));
        a1 += load8(a + d + 8) * (bf16 ? load8_bf16(bh + d + 8) : load8(bf + d + 8));
    }
#endif
    return a0 + a1;
}

/* q . k over any D: hsum8(dot_lanes) where D is a multiple of 16, else a plain sum in order. */
static inline __attribute__((always_inline))
float dot(const float *a, const void *k, int64_t D, const int bf16) {
    if (D % 16 == 0) return hsum8(dot_lanes(a, k, D, bf16));
    const float *bf = k;
    const uint16_t *bh = k;
    float acc = 0.f;
    for (int64_t d = 0; d < D; ++d) acc += a[d] * (bf16 ? bf16_to_float(bh[d]) : bf[d]);
    return acc;
}

/* Lane u of the result is hsum8(c[u]): the same additions in the same order, for eight vectors at
 * once (an 8x8 transpose, 24 shuffles, then seven vector adds), where eight horizontal sums are
 * ~80 scalar operations, each a chain of dependent steps (they were a third of the keys' loop). */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int32_t v8i __attribute__((vector_size(32)));
#define SHUF8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif
static inline __attribute__((always_inline)) v8 hsum8x8(const v8 c[8]) {
    v8 t[8], s[8], lane[8];
    for (int i = 0; i < 8; i += 2) {                    /* pairs of rows interleaved, per 128-bit half */
        t[i] = SHUF8(c[i], c[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = SHUF8(c[i], c[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {                    /* s[i + l]: lanes l and l + 4 of rows i..i+3 */
        s[i] = SHUF8(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        s[i + 1] = SHUF8(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        s[i + 2] = SHUF8(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        s[i + 3] = SHUF8(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int l = 0; l < 4; ++l) {                       /* lane[l][u] = c[u][l] */
        lane[l] = SHUF8(s[l], s[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        lane[l + 4] = SHUF8(s[l], s[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* Start loading token t's row (`row` bytes) of a block that is read next: called once per token
 * of the block being worked on, so the requests for the next block spread over the current one's
 * work and it is in cache when its turn comes (the pool is far larger than the caches, its blocks
 * are scattered, and the hardware prefetcher does not cross from one block to the next). */
static inline void prefetch_row(const char *block, int64_t t, int64_t row) {
    const char *p = block + t * row;
    for (int64_t c = 0; c < row; c += 64) __builtin_prefetch(p + c);
}

typedef struct {
    const float *q;            /* query (row, head, d) at q[row*q_row + head*q_head + d] */
    const char *k, *v;         /* this layer's pool, token-major: (tokens, Hkv, D), contiguous */
    const int64_t *tables;     /* block ids, (n_tables, table_width) */
    const int64_t *row_table;  /* row r reads table row_table[r]; NULL: table r */
    const int64_t *lens;       /* positions each row attends (its context, this token included) */
    float *out;                /* like q, with its own strides */
    int64_t q_row, q_head, o_row, o_head;
    int64_t H, Hkv, D, block_size, table_width;
    float scale;
} Args;

/* Start loading `bytes` at p (a value row of a block read next). */
static inline void prefetch_span(const char *p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(p + c);
}

/* Vector registers the values' sums may hold: n query heads of D floats each, with room left for
 * the weights and the loads (32 registers with AVX-512, 16 with AVX2). */
#define SUM_REGS (VW == 16 ? 16 : 8)

/* out_j (D) = sum over the row's L positions of p_j[t] times KV head h's value at t, for the n
 * query heads j of a group (scores p + j*L, outputs out + j*o_head), each position's value read
 * through the table, block by block, once for all n. Where D is a multiple of the vector and the
 * n sums fit the registers (D and n constants: the loops unroll) they stay there across all
 * positions; otherwise (n is then 1) the sum is added into `out` position by position, in
 * vectors of 8 where D allows. Either way out_j[d] = fma(p_j[t], v[t][d], ...) from t = 0 up,
 * from zero: the same bits whatever n. With `first` (a group's first call) each next block is
 * requested meanwhile (as the keys are); later calls read the values again from cache. */
static inline __attribute__((always_inline))
void weigh_values(const Args *a, const int64_t *table, const float *p, int64_t L, int64_t h, float *out,
                  int64_t D, const int bf16, const int first, const int n) {
    const int64_t bs = a->block_size, elem = bf16 ? 2 : 4, row = a->Hkv * D * elem, block = bs * row;
    const int64_t head = h * D * elem;                               /* this KV head's offset in a row */
    const int regs = D % VW == 0 && n * (D / VW) <= SUM_REGS;        /* (decided when compiled) */
    vf acc[4][SUM_REGS];
    if (regs)
        for (int j = 0; j < n; ++j)
            for (int64_t d = 0; d < D / VW; ++d) acc[j][d] = splat(0.f);
    else
        memset(out, 0, sizeof(float) * (size_t)D);
    for (int64_t t0 = 0, b = 0; t0 < L; t0 += bs, ++b) {
        const int64_t m = L - t0 < bs ? L - t0 : bs;
        const char *vb = a->v + table[b] * block + head;
        const char *next = first && t0 + bs < L ? a->v + table[b + 1] * block + head : NULL;
        for (int64_t t = 0; t < m; ++t) {
            if (next) prefetch_span(next + t * row, D * elem);
            const float *xf = (const float *)(vb + t * row);
            const uint16_t *xh = (const uint16_t *)(vb + t * row);
            if (regs) {
                vf w[4];
                for (int j = 0; j < n; ++j) w[j] = splat(p[j * L + t0 + t]);
                for (int64_t d = 0; d < D / VW; ++d) {
                    const vf x = bf16 ? loadv_bf16(xh + d * VW) : loadv(xf + d * VW);
                    for (int j = 0; j < n; ++j) acc[j][d] += w[j] * x;
                }
                continue;
            }
            const float w = p[t0 + t];
            int64_t d = 0;
            if (D % 8 == 0) {
                const v8 w8 = {w, w, w, w, w, w, w, w};
                for (; d < D; d += 8)
                    store8(out + d, load8(out + d) + w8 * (bf16 ? load8_bf16(xh + d) : load8(xf + d)));
            }
            for (; d < D; ++d) out[d] += w * (bf16 ? bf16_to_float(xh[d]) : xf[d]);
        }
    }
    if (regs)
        for (int j = 0; j < n; ++j)
            for (int64_t d = 0; d < D / VW; ++d) storev(out + j * a->o_head + d * VW, acc[j][d]);
}

/* The values of KV head h for its g query heads (from query head i0): as many at a time as the
 * registers hold (n a constant per call, up to 4), one at a time where they hold none. */
static inline __attribute__((always_inline))
void weigh_group(const Args *a, const int64_t *table, const float *scores, int64_t L, int64_t h, int64_t i0,
                 int64_t g, float *o, int64_t D, const int bf16) {
    const int64_t per_head = D % VW == 0 ? D / VW : SUM_REGS + 1;
    const int64_t fit = SUM_REGS / per_head;
    for (int64_t j = 0; j < g;) {
        const float *p = scores + (i0 + j) * L;
        float *out = o + (i0 + j) * a->o_head;
        const int64_t left = g - j, n = left < fit ? left : fit;
        switch (n < 4 ? n : 4) {                                   /* a constant n: unrolled */
            case 4: weigh_values(a, table, p, L, h, out, D, bf16, j == 0, 4); j += 4; break;
            case 3: weigh_values(a, table, p, L, h, out, D, bf16, j == 0, 3); j += 3; break;
            case 2: weigh_values(a, table, p, L, h, out, D, bf16, j == 0, 2); j += 2; break;
            default: weigh_values(a, table, p, L, h, out, D, bf16, j == 0, 1); j += 1;
        }
    }
}

/* One row: scores (H, L) for every query head, softmax, weighted values. Inlined with D a
 * constant for the common head sizes and bf16 (the pool's element: 1 bfloat16, 0 float32), so
 * the loops over D unroll and each pool type gets its own loop. */
static inline __attribute__((always_inline))
void attend_row(const Args *a, int64_t r, int64_t D, float *scores, const int bf16) {
    const int64_t H = a->H, Hkv = a->Hkv, g = H / Hkv, bs = a->block_size, L = a->lens[r];
    const int64_t elem = bf16 ? 2 : 4, row = Hkv * D * elem, block = bs * row;   /* bytes */
    const int64_t *table = a->tables + (a->row_table ? a->row_table[r] : r) * a->table_width;
    const float *q = a->q + r * a->q_row;
    float *o = a->out + r * a->o_row;
    for (int64_t t0 = 0, b = 0; t0 < L; t0 += bs, ++b) {           /* keys, block by block */
        const int64_t n = L - t0 < bs ? L - t0 : bs;
        const char *kb = a->k + table[b] * block;
        const char *next = t0 + bs < L ? a->k + table[b + 1] * block    /* then the first values */
                                       : a->v + table[0] * block;
        int64_t t = 0;
        if (D % 16 == 0)                                             /* eight positions at a time */
            for (; t + 8 <= n; t += 8) {
                for (int u = 0; u < 8; ++u) prefetch_row(next, t + u, row);
                for (int64_t h = 0, i = 0; h < Hkv; ++h)          /* i = h * g + j: no division */
                    for (int64_t j = 0; j < g; ++j, ++i) {
                        v8 c[8];
                        for (int u = 0; u < 8; ++u)
                            c[u] = dot_lanes(q + i * a->q_head, kb + (t + u) * row + h * D * elem, D, bf16);
                        store8(scores + i * L + t0 + t, a->scale * hsum8x8(c));
                    }
            }
        for (; t < n; ++t) {
            prefetch_row(next, t, row);
            for (int64_t h = 0, i = 0; h < Hkv; ++h)
                for (int64_t j = 0; j < g; ++j, ++i)
                    scores[i * L + t0 + t] = a->scale * dot(q + i * a->q_head, kb + t * row + h * D * elem, D, bf16);
        }
    }
    for (int64_t i = 0; i < H; ++i) {                                 /* softmax, per query head */
        float *s = scores + i * L, top = s[0], sum = 0.f;
#pragma omp simd reduction(max:top)
        for (int64_t t = 1; t < L; ++t) top = s[t] > top ? s[t] : top;
#pragma omp simd reduction(+:sum)
        for (int64_t t = 0; t < L; ++t) { s[t] = exp_nonpos(s[t] - top); sum += s[t]; }
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t t = 0; t < L; ++t) s[t] *= inv;
    }
    for (int64_t h = 0; h < Hkv; ++h)                                   /* values */
        weigh_group(a, table, scores, L, h, h * g, g, o, D, bf16);
}

/* Returns 0 on success, 1 if scratch memory for the scores could not be allocated, 3 for a head
 * layout it cannot run. */
int paged_decode_attention(const float *q, int64_t q_row, int64_t q_head,
                           const void *k, const void *v,
                           const int64_t *tables, int64_t table_width, const int64_t *row_table,
                           const int64_t *lens,
                           float *out, int64_t o_row, int64_t o_head,
                           int64_t rows, int64_t H, int64_t Hkv, int64_t D, int64_t block_size,
                           float scale, int threads, int kv_bf16) {
    if (Hkv <= 0 || H % Hkv || D <= 0 || block_size <= 0 || threads < 1) return 3;
    const Args a = {q, (const char *)k, (const char *)v, tables, row_table, lens, out, q_row, q_head, o_row, o_head, H, Hkv, D, block_size,
                    table_width, scale};
    int64_t longest = 1;
    for (int64_t r = 0; r < rows; ++r) longest = lens[r] > longest ? lens[r] : longest;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (rows > 1 && threads > 1)
    {
        float *scores = malloc(sizeof(float) * (size_t)(H * longest));
#pragma omp for schedule(dynamic, 2)
        for (int64_t r = 0; r < rows; ++r) {
            if (!scores) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            if (kv_bf16) {
                switch (D) {                              /* a constant D: unrolled loops */
                    case 64: attend_row(&a, r, 64, scores, 1); break;
                    case 128: attend_row(&a, r, 128, scores, 1); break;
                    default: attend_row(&a, r, D, scores, 1);
                }
            } else {
                switch (D) {
                    case 64: attend_row(&a, r, 64, scores, 0); break;
                    case 128: attend_row(&a, r, 128, scores, 0); break;
                    default: attend_row(&a, r, D, scores, 0);
                }
            }
        }
        free(scores);
    }
    return failed ? 1 : 0;
}
