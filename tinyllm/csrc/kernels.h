/* The kernels' signatures, in one place: each .c file includes this, so the compiler checks every
 * definition against what decoder_layer.c (and native.py's ctypes declarations) call. */
#ifndef TINYLLM_KERNELS_H
#define TINYLLM_KERNELS_H
#include <stdint.h>

void rms_norm(const float *x, int64_t x_row, const float *w, float *y, int64_t y_row,
              int64_t rows, int64_t dim, float eps);
void linear_packed(const float *x, int64_t x_row, int64_t M, int64_t K, const float *packed, int64_t N,
                   float *y, int64_t y_row, const float *add, int64_t add_row, int threads);
void pack_linear_weight(const float *w, int64_t N, int64_t K, float *packed);
void rope_inplace(float *x, int64_t x_row, int64_t tokens, int64_t heads, int64_t D,
                  const int64_t *pos, const float *cos, const float *sin);
void kv_store(const float *k, const float *v, int64_t src_row, int64_t tokens, int64_t row,
              const int64_t *write, void *k_pool, void *v_pool, int kv_bf16);
int paged_decode_attention(const float *q, int64_t q_row, int64_t q_head, const void *k, const void *v,
                           const int64_t *tables, int64_t table_width, const int64_t *row_table, const int64_t *lens,
                           float *out, int64_t o_row, int64_t o_head, int64_t rows, int64_t H, int64_t Hkv,
                           int64_t D, int64_t block_size, float scale, int threads, int kv_bf16);
void silu_mul(const float *x, int64_t x_row, int64_t rows, int64_t F, float *y);
void argmax_rows(const float *x, int64_t x_row, int64_t rows, int64_t cols, int64_t *out);
int64_t first_outside(const int64_t *x, int64_t n, int64_t lo, int64_t hi);
int64_t ragged_rows(const int64_t *slot, const int64_t *start, const int64_t *n, int64_t items,
                    const int64_t *tables, int64_t n_tables, int64_t width, int64_t block_size, int64_t n_blocks,
                    int64_t total, int64_t *pos, int64_t *write, int64_t *lens, int64_t *row_table);

#endif
