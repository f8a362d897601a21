/* The decoder layers of a ragged step (the token-budget engine's forward), CPU float32: one layer
 * in one call (decoder_layer), and every layer then the final norm in one call (decoder_layers).
 *
 * The layer is the same kernels the model calls one by one from Python (RMSNorm, the packed
 * linear layers, RoPE, the K/V store, the paged attention, SwiGLU), called in the same order on
 * the same buffers, so it gives the same bits: nothing is computed here that is not computed
 * there (tinyllm/model/transformer.py's Block.forward stays the one definition of the layer).
 * What it saves is the Python between them: a dozen wrapper calls, views and allocations a layer,
 * ~2 ms of a d256 model's step (4 layers) on this project's machine (docs/benchmarks.md).
 * tinyllm/model/c_layers.py fills the two structs and checks what the kernels trust, once per
 * forward (the attention's index ranges: as kv/ragged.py builds them, in ragged_rows.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef struct {                       /* one layer's weights */
    const float *input_norm, *post_attention_norm;        /* RMSNorm weights, (d,) */
    const float *qkv, *o, *gate_up, *down;                /* packed by pack_linear_weight */
    void *k_pool, *v_pool;                                /* this layer's pool, (tokens, Hkv, D) */
} LayerWeights;

typedef struct {                       /* one forward's shapes, positions and scratch, for every layer */
    int64_t tokens, d, H, Hkv, D, F;
    float eps, scale;
    const int64_t *pos;                                   /* RoPE: each token's row of cos, sin */
    const float *cos, *sin;
    const int64_t *write;                                 /* each token's pool row for its K/V */
    const int64_t *tables, *row_table, *lens;             /* the attention's plan (paged_attention.c) */
    int64_t table_width, block_size;
    float *h, *qkv, *attn, *gate_up, *act;                /* scratch: (tokens, d / q+k+v / H*D / 2F / F) */
    int threads;
    int kv_bf16;                                          /* the pool's element: 1 bfloat16, 0 float32 */
} LayerStep;

/* y = the layer applied to x (both (tokens, d), distinct). Returns the attention's code: 0 on
 * success, 1 if it could not allocate its scores. */
int decoder_layer(const LayerWeights *w, const LayerStep *s, const float *x, float *y) {
    const int64_t T = s->tokens, d = s->d, F = s->F, nq = s->H * s->D, nkv = s->Hkv * s->D;
    const int64_t row = nq + 2 * nkv;                     /* a token's q, k, v heads */
    rms_norm(x, d, w->input_norm, s->h, d, T, d, s->eps);
    linear_packed(s->h, d, T, d, w->qkv, row, s->qkv, row, NULL, 0, s->threads);
    rope_inplace(s->qkv, row, T, s->H + s->Hkv, s->D, s->pos, s->cos, s->sin);
    kv_store(s->qkv + nq, s->qkv + nq + nkv, row, T, nkv, s->write, w->k_pool, w->v_pool, s->kv_bf16);
    const int rc = paged_decode_attention(s->qkv, row, s->D, w->k_pool, w->v_pool, s->tables, s->table_width,
                                          s->row_table, s->lens, s->attn, nq, s->D, T, s->H, s->Hkv, s->D,
                                          s->block_size, s->scale, s->threads, s->kv_bf16);
    if (rc) return rc;
    linear_packed(s->attn, nq, T, nq, w->o, d, y, d, x, d, s->threads);                 /* y = x + o(attn) */
    rms_norm(y, d, w->post_attention_norm, s->h, d, T, d, s->eps);
    linear_packed(s->h, d, T, d, w->gate_up, 2 * F, s->gate_up, 2 * F, NULL, 0, s->threads);
    silu_mul(s->gate_up, 2 * F, T, F, s->act);
    linear_packed(s->act, F, T, F, w->down, d, y, d, y, d, s->threads);                 /* y += down(act) */
    return 0;
}

/* Every layer of the forward, then the model's final RMSNorm (weight ``norm``, epsilon ``eps``):
 * x (tokens, d) is the embedding's output, only read; a and b are buffers like it that the layers
 * take turns writing (the first layer writes a), and the norm writes the one the last layer did
 * not. The result is in b when the model has an odd number of layers, else in a.
 * One call instead of one per layer (each was a ctypes call, an allocation and Python between). */
int decoder_layers(const LayerWeights *w, int64_t n_layers, const LayerStep *s, const float *x, float *a,
                   float *b, const float *norm, float eps) {
    const float *in = x;
    float *out = a;
    for (int64_t i = 0; i < n_layers; ++i) {
        const int rc = decoder_layer(&w[i], s, in, out);
        if (rc) return rc;
        in = out;
        out = out == a ? b : a;
    }
    rms_norm(in, s->d, norm, out, s->d, s->tokens, s->d, eps);
    return 0;
}
