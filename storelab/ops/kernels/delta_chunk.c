/* The chunked delta rules in C (storelab.ops.delta, ``_chunked_compiled``).
 *
 * delta_chunked_*: per head, chunk by chunk, everything of a chunk made in buffers that stay in the first
 * levels of cache: its rows of q, k, v, its cumulative decays and their factors (per head, or per key
 * channel for KDA), the scores [q; k] k^T, the writes V_new by forward substitution through
 * I + strict_tril(beta (k k^T * decay)) (no inverse), then the state's products. Heads are independent:
 * each thread of the OpenMP runtime (torch's, see storelab.ops.compiled) takes a range of them, chunk by
 * chunk, the next head's rows asked for (prefetched) while one is computed. As tensor calls, the same work
 * was mostly cost per call: thousands of small products and copies per call.
 *
 * Products: blocks of 4 rows x one panel of 256 bytes of columns held in registers, the inner dimension
 * streamed (a broadcast of A times a row of B, fused multiply-adds where the machine has them: rounded
 * once, where torch's products may round twice; tests hold every form to the per-token rule). Triangular
 * factors (the masked scores) are read up to each block's last row only.
 * The algorithm, its equations and its papers (WY/UT, arXiv 2406.06484; Gated DeltaNet, arXiv 2412.06464;
 * KDA, arXiv 2510.26692; the factored decays, GLA, arXiv 2312.06635) head storelab/ops/delta.py.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* the accumulators' copy loops stay loops (as calls to memmove they left the registers: 20 % of the time) */
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

#include "simd_exp.h"  /* exp_simd: e^x in SIMD lanes, within 1 ulp on [-87, 88] */

#define REAL float
#define SUF f32
#define EXPV(x) exp_simd(x)
#ifdef __FMA__
#define FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif
#define EXP(x) expf(x)
#include "delta_chunk_body.h"
#undef EXP
#undef EXPV
#undef FMA
#undef REAL
#undef SUF

#define REAL double
#define SUF f64
#ifdef __FMA__
#define FMA(a, b, c) __builtin_fma(a, b, c)
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif
#define EXP(x) exp(x)
#define EXPV(x) exp(x)
#include "delta_chunk_body.h"
#undef EXP
#undef EXPV
#undef FMA
#undef REAL
#undef SUF
