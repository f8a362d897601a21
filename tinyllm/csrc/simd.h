/* Shared by the C kernels (tinyllm/csrc): 8-float vectors, the widest the CPU has, and an inlined exp. */
#ifndef TINYLLM_SIMD_H
#define TINYLLM_SIMD_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* 8 floats: compiled to AVX, SSE or NEON as the machine has. */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 load8(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }
static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }
static inline float hsum8(v8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

/* bfloat16, a K/V pool's 16-bit option: the upper half of a float32 (same exponent range, 8 bits
 * of mantissa). Widening is exact (a shift); narrowing rounds to nearest even, bit for bit as
 * PyTorch's .to(torch.bfloat16) (c10's round_to_nearest_even), so the C and PyTorch paths store
 * the same pool. A NaN stays a NaN: 0xFFFF, what PyTorch's vectorized CPU conversion writes (its
 * scalar one, on a tensor's last few elements, writes 0x7FC0). */
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
/* NAME(p): the vector VEC of bfloat16s at p, widened (HALF: as many uint16, WORD: as many uint32). */
#define BF16_LOADER(NAME, VEC, HALF, WORD)                                   \
    static inline VEC NAME(const uint16_t *p) {                              \
        HALF h;                                                              \
        memcpy(&h, p, sizeof h);                                             \
        const WORD w = __builtin_convertvector(h, WORD) << 16;               \
        VEC r;                                                               \
        memcpy(&r, &w, sizeof r);                                            \
        return r;                                                            \
    }
BF16_LOADER(load8_bf16, v8, u16x8, u32x8)

/* The widest vector the compiler targets: 16 floats with AVX-512, else 8 (AVX, SSE, NEON). */
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef uint16_t vh __attribute__((vector_size(VW * 2)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
static inline vf loadv(const float *p) { vf r; memcpy(&r, p, sizeof r); return r; }
static inline void storev(float *p, vf x) { memcpy(p, &x, sizeof x); }
/* w in every lane, by initializer: `(vf){0} + w` would add 0.f first (an instruction per use) */
static inline vf splat(float w) {
#if VW == 16
    return (vf){w, w, w, w, w, w, w, w, w, w, w, w, w, w, w, w};
#else
    return (vf){w, w, w, w, w, w, w, w};
#endif
}
BF16_LOADER(loadv_bf16, vf, vh, vu)
static inline float bf16_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}
static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;              /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* e^x for x <= 0 (a score minus its row's max): 2^n e^r with |r| <= ln2/2 and a degree-6 Taylor
 * polynomial (relative error ~1e-7, float's own precision), inlined (libm's expf is one call per
 * score). Below -87 (where e^x is under float's smallest normal) it is 0: the clamp keeps the
 * exponent from wrapping, the select makes the result exact there (silu(-1e30) is -0, not -1e-8). */
static inline float exp_nonpos(float x) {
    const float c = x < -87.f ? -87.f : x;
    const float n = floorf(c * 1.44269504f + 0.5f);
    const float r = c - n * 0.693145752f - n * 1.42860677e-6f;
    const float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 + r * (1.f / 720))))));
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.f ? 0.f : p * scale;
}

#endif
