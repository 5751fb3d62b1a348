/* The short causal convolution for one element type: included by short_conv.c with REAL and SUF defined. */

#define NAME2(a, b) a##b
#define NAME(a, b) NAME2(a, b)

/* pre[b, t] = sum_i w[i] * u[b, t + s_i] (s_i = i - (W - 1) + p; rows before u's start read zeros), for the
 * output rows r = b * T + t in [r0, r1). u [B, L = p + T, C], wT [W, C], pre [B, T, C]. */
void NAME(conv_forward_, SUF)(const REAL *u, const REAL *wT, REAL *pre, long B, long L, long T, long C, long W,
                              long r0, long r1)
{
    const long p = L - T;
    for (long r = r0; r < r1 && r < B * T; r++) {
        const long b = r / T, t = r % T;
        REAL *y = pre + r * C;
        for (long c = 0; c < C; c++) y[c] = 0;
        for (long i = 0; i < W; i++) {
            const long j = t + i - (W - 1) + p;
            if (j < 0) continue;
            const REAL *ur = u + (b * L + j) * C, *wr = wT + i * C;
            #pragma omp simd
            for (long c = 0; c < C; c++) y[c] += wr[c] * ur[c];
        }
    }
}

/* du[b, j] = sum_i w[i] * d[b, j - s_i] over the taps whose output row j - s_i lies in [0, T), for the input
 * rows r = b * L + j in [r0, r1): each row gathered, so row ranges run on separate threads. */
void NAME(conv_input_grad_, SUF)(const REAL *d, const REAL *wT, REAL *du, long B, long L, long T, long C, long W,
                                 long r0, long r1)
{
    const long p = L - T;
    for (long r = r0; r < r1 && r < B * L; r++) {
        const long b = r / L, j = r % L;
        REAL *x = du + r * C;
        for (long c = 0; c < C; c++) x[c] = 0;
        for (long i = 0; i < W; i++) {
            const long t = j - (i - (W - 1) + p);
            if (t < 0 || t >= T) continue;
            const REAL *dr = d + (b * T + t) * C, *wr = wT + i * C;
            #pragma omp simd
            for (long c = 0; c < C; c++) x[c] += wr[c] * dr[c];
        }
    }
}

/* dw_part[i, c] += sum over the output rows r in [r0, r1) of d[r, c] * u[b, t + s_i, c], summed in double. */
void NAME(conv_weight_grad_, SUF)(const REAL *u, const REAL *d, double *dw_part, long B, long L, long T, long C,
                                  long W, long r0, long r1)
{
    const long p = L - T;
    for (long r = r0; r < r1 && r < B * T; r++) {
        const long b = r / T, t = r % T;
        const REAL *dr = d + r * C;
        for (long i = 0; i < W; i++) {
            const long j = t + i - (W - 1) + p;
            if (j < 0) continue;
            const REAL *ur = u + (b * L + j) * C;
            double *acc = dw_part + i * C;
            #pragma omp simd
            for (long c = 0; c < C; c++) acc[c] += (double)dr[c] * (double)ur[c];
        }
    }
}

#undef NAME
#undef NAME2
