/* The matrix-vector products of kernels/matvec.c (see there), as a macro: matvec.c makes the exported functions
 * and decode_step.c its own static copies for a layer's step in one call (layer_run_f32). */
#ifndef STORELAB_MATVEC_BODY_H
#define STORELAB_MATVEC_BODY_H
#include <stdint.h>
#include <string.h>

static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define MATVEC(LINKAGE, NAME, WTYPE, LOAD, SCALE)                                                              \
LINKAGE void NAME(const float *x, const WTYPE *W, const float *s, float *y, long K, long r0, long r1) { \
    (void)s;                                                                                          \
    long r = r0;                                                                                      \
    const char *end = (const char *)(W + r1 * K);                                                     \
    for (; r + 4 <= r1; r += 4) {                                                                     \
        const WTYPE *w0 = W + r * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;                        \
        const char *next = (const char *)(W + (r + 4) * K);    /* the next four rows, asked for now */ \
        for (long b = 0; b < 4 * K * (long)sizeof(WTYPE) && next + b < end; b += 64)                  \
            __builtin_prefetch(next + b);                                                             \
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;                                             \
        _Pragma("omp simd reduction(+:a0,a1,a2,a3)")                                                  \
        for (long k = 0; k < K; k++) {                                                                \
            float xk = x[k];                                                                          \
            a0 += LOAD(w0[k]) * xk; a1 += LOAD(w1[k]) * xk;                                           \
            a2 += LOAD(w2[k]) * xk; a3 += LOAD(w3[k]) * xk;                                           \
        }                                                                                             \
        y[r] = SCALE(a0, r); y[r + 1] = SCALE(a1, r + 1); y[r + 2] = SCALE(a2, r + 2); y[r + 3] = SCALE(a3, r + 3); \
    }                                                                                                 \
    for (; r < r1; r++) {                                                                             \
        const WTYPE *w0 = W + r * K;                                                                  \
        float a0 = 0.0f;                                                                              \
        _Pragma("omp simd reduction(+:a0)")                                                           \
        for (long k = 0; k < K; k++) a0 += LOAD(w0[k]) * x[k];                                        \
        y[r] = SCALE(a0, r);                                                                          \
    }                                                                                                 \
}

#define AS_FLOAT(w) ((float)(w))
#define NO_SCALE(a, r) (a)
#define ROW_SCALE(a, r) ((a) * s[r])
#endif
