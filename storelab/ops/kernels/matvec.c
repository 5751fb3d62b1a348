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
#include "matvec_body.h"

MATVEC(, matvec_f32, float, AS_FLOAT, NO_SCALE)
MATVEC(, matvec_bf16, uint16_t, widen_bf16, NO_SCALE)
MATVEC(, matvec_i8, int8_t, AS_FLOAT, ROW_SCALE)

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
