/* The short causal depthwise convolution in front of the recurrent stores, both ways (storelab.ops.conv).
 *
 *     pre_t[c] = sum_{i<W} w[c, i] u_{t + s_i}[c]        du_j[c] = sum_i w[c, i] d_{j - s_i}[c]
 *     dw[c, i] = sum_t d_t[c] u_{t + s_i}[c]             (s_i = i - (W - 1) + p, p rows of history in u)
 *
 * One pass over the rows each way, channels innermost (``omp simd``); the activation stays in torch.
 * Layout: u [B, p + T, C], the weight transposed to [W, C], pre and d [B, T, C], all contiguous. Each call
 * runs a range of rows, so callers split the rows between threads (the weight's sums per thread).
 */
#define REAL float
#define SUF f32
#include "short_conv_body.h"
#undef REAL
#undef SUF

#define REAL double
#define SUF f64
#include "short_conv_body.h"
#undef REAL
#undef SUF
