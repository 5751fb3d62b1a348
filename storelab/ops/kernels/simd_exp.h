/* e^x for float in SIMD lanes (``omp declare simd``), shared by the kernels that include it.
 *
 * x is clamped to [-87.3, 88]; x = n ln2 + r with |r| <= ln2 / 2 (n rounded to nearest by the 1.5 * 2^23 trick),
 * e^r by Cephes' degree-7 polynomial, times 2^n built in the exponent bits. Measured against double precision
 * (2026-12-07): within 1 ulp of e^x (at most 0.992) on every float of [-87, 0] (decode_step.c's softmax: scores
 * minus the row's largest), and (at most 0.990) on 100 million evenly spaced floats of [0, 88], every float of
 * [0, 1e-3] and of [87.9, 88] (delta_chunk.c's decay factors, exponents in [-60, 60]). Below -87.3 (e^x under 1e-38) it gives 2^-126 times e^r's few ulp: as good as zero
 * beside the terms it is summed with. */
#ifndef STORELAB_SIMD_EXP_H
#define STORELAB_SIMD_EXP_H
#include <stdint.h>
#include <string.h>

#pragma omp declare simd
static inline float exp_simd(float x)
{
    x = x < -87.3f ? -87.3f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}
#endif
