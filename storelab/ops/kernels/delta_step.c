/* The delta rules token by token, forward and backward, for small states (storelab.ops.delta_step).
 *
 * Per head, with S the K x V state, a = exp(g_t) (one per head, or one per key channel) and s the scale:
 *     P = diag(a) S_{t-1},   r = v_t - P^T k_t,   u = beta_t r   (u = v_t without beta: linear attention)
 *     S_t = P + k_t u^T,     o_t = s S_t^T q_t
 * Backward, dS the gradient on S_t (dS_final to start):
 *     dS += s q do^T,  dq = s (P do + k (u . do)),  dk = dS u,  du = dS^T k
 *     dv = beta du,  dbeta = du . r,  dp = -beta du,  dP = dS + k dp^T,  dk += P dp
 *     dg_i = sum_j dP_ij P_ij (summed over i for one decay per head),  dS <- diag(a) dP
 * Forward keeps the state entering every span of L tokens; backward runs each span forward again from it.
 * (Per token, the delta rule of Schlag et al., arXiv 2102.11174; gated, arXiv 2412.06464; per channel, KDA,
 * arXiv 2510.26692.)
 *
 * Layout: q, k [B,T,H,K], v [B,T,H,V], g [B,T,H] (g_mode 1) or [B,T,H,K] (g_mode 2) or NULL (g_mode 0),
 * beta [B,T,H] or NULL, states [B,H,K,V], all contiguous.
 *
 * Lanes: LANES heads run side by side, every array of a token held as [width][LANES], so each step of the
 * rule is a loop over the lanes (one SIMD register wide, ``omp simd``) and no sum runs across a vector.
 * Heads b * H + h are taken LANES at a time (lane groups, the last one padded); a call runs the groups
 * [g0, g1), so callers split the groups between threads.
 */
#include <math.h>
#include <stdlib.h>

#ifndef LANES
/* 16 fp32 lanes: one AVX-512 register, two AVX2 ones (measured at K = V = 16: 16 lanes 2.4x the chunked
 * form, 8 lanes 1.7x) */
#define LANES 16
#endif

#define REAL float
#define SUF f32
#include "delta_step_body.h"
#undef REAL
#undef SUF

#define REAL double
#define SUF f64
#include "delta_step_body.h"
#undef REAL
#undef SUF

int delta_step_lanes(void) { return LANES; }
