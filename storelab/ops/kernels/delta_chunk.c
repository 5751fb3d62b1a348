/* The sequential part of the chunked delta rules (storelab.ops.delta, ``_chunk_group``).
 *
 * Chunk by chunk, per head, the state S (K x V) is read and written: four small products per chunk whose
 * cost as tensor calls is mostly per call (a few microseconds each, 512 calls for 4,096 tokens in chunks
 * of 32). Here a head's whole loop runs in one call with its state in the first-level cache; the heads
 * [h0, h1) of a call are independent, so callers split them between threads.
 *
 * Products: blocks of 4 rows x one panel of 256 bytes of columns held in registers, the inner dimension
 * streamed (a broadcast of A times a row of B, fused multiply-adds where the machine has them: rounded
 * once, where torch's products may round twice; tests hold both forms to the reference). Triangular
 * factors (T, the masked scores) are read up to each block's last row only.
 * The algorithm, its equations and its papers (WY/UT, arXiv 2406.06484; Gated DeltaNet, arXiv 2412.06464;
 * KDA, arXiv 2510.26692) head storelab/ops/delta.py.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* the accumulators' copy loops stay loops (as calls to memmove they left the registers: 20 % of the time) */
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

#define REAL float
#define SUF f32
#ifdef __FMA__
#define FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif
#define EXP(x) expf(x)
#include "delta_chunk_body.h"
#undef EXP
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
#include "delta_chunk_body.h"
#undef EXP
#undef FMA
#undef REAL
#undef SUF
