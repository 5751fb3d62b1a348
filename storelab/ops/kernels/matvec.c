/* One vector times a weight matrix, the weight in fp32, bf16 or int8 with a scale per row (storelab.ops.matvec).
 *
 *     y[r] = sum_k W[r, k] x[k]                  (fp32, bf16: the weight widened to fp32 exactly)
 *     y[r] = s[r] * sum_k q[r, k] x[k]           (int8, per-output-channel scale)
 *
 * A decode step reads every weight once for one token, so the time is the weight's bytes over the memory
 * rate: a narrower weight is read faster, and the products stay in fp32 (x is not rounded). Four rows per
 * pass share each load of x; the sums over k run in SIMD lanes (``omp simd reduction``, no fast-math).
 * Layout: W [rows, K] contiguous (nn.Linear's), x [K], y [rows]; matvec_* runs rows r0..r1, matvec_threads_*
 * all of them on OpenMP threads.
 * The next four rows are prefetched while four are summed: without it the narrow weights did not reach the
 * memory rate (one thread, 1536 x 576 weights streamed from memory, 2026-12-07: bf16 6.1 -> 9.9 GB/s, int8
 * 4.7 -> 6.7 GB/s, fp32 12.7 -> 13.0 GB/s; the same weights per second as fp32 before, the memory's rate
 * after for bf16).
 */
#include <stdint.h>
#include <string.h>

static inline float widen_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define MATVEC(NAME, WTYPE, LOAD, SCALE)                                                              \
void NAME(const float *x, const WTYPE *W, const float *s, float *y, long K, long r0, long r1) {        \
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

MATVEC(matvec_f32, float, AS_FLOAT, NO_SCALE)
MATVEC(matvec_bf16, uint16_t, widen_bf16, NO_SCALE)
MATVEC(matvec_i8, int8_t, AS_FLOAT, ROW_SCALE)

/* All N rows, cut into ``threads`` ranges of whole groups of four rows, run by the threads of the OpenMP runtime
 * (torch's, see storelab.ops.compiled: the threads that run torch's products run these too); under 64 rows a
 * thread, one thread. */
#define MATVEC_THREADS(NAME, ONE, WTYPE)                                                                \
void NAME(const float *x, const WTYPE *W, const float *s, float *y, long K, long N, int threads) {      \
    if (threads > N / 64) threads = (int)(N / 64);                                                      \
    if (threads <= 1) { ONE(x, W, s, y, K, 0, N); return; }                                             \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                   \
    for (int t = 0; t < threads; t++) {                                                                 \
        long r0 = N * t / threads / 4 * 4, r1 = t + 1 < threads ? N * (t + 1) / threads / 4 * 4 : N;   \
        ONE(x, W, s, y, K, r0, r1);                                                                     \
    }                                                                                                   \
}

MATVEC_THREADS(matvec_threads_f32, matvec_f32, float)
MATVEC_THREADS(matvec_threads_bf16, matvec_bf16, uint16_t)
MATVEC_THREADS(matvec_threads_i8, matvec_i8, int8_t)
