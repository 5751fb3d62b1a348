/* The chunked delta rules' sequential loop for one element type: included by delta_chunk.c with REAL (float or
 * double), SUF (the name suffix) and FMA (a fused multiply-add of that type) defined. See delta_chunk.c. */

#define NAME2(a, b) a##b
#define NAME(a, b) NAME2(a, b)
#define PW (256 / (int)sizeof(REAL)) /* a panel: the columns one block of rows keeps in registers (4 x 512 bits) */

/* Rows [r0, r0 + RB) of out = init + alpha A B over the panel [j0, j0 + w): A's row r, column c at
 * A[r * ars + c * acs], B's row c at B + c * ldb, init's row r at init + r * ldi (NULL: zeros). Only the
 * columns c < kend of A are read (a triangular A passes its last row's bound). RB and w fixed at compile
 * time where the caller passes constants (the accumulators then stay in registers). */
static inline __attribute__((always_inline)) void NAME(block_, SUF)(
    int RB, int rows, int w, int kend, REAL alpha, const REAL *A, long ars, long acs, const REAL *B, long ldb,
    const REAL *init, long ldi, REAL *out, long ldo, int r0, int j0)
{
    REAL acc[4][PW];
    for (int r = 0; r < RB; r++) {
        if (init && r < rows) {
            _Pragma("omp simd")
            for (int j = 0; j < w; j++) acc[r][j] = init[(long)(r0 + r) * ldi + j0 + j];
        } else {
            _Pragma("omp simd")
            for (int j = 0; j < w; j++) acc[r][j] = 0;
        }
    }
    for (int c = 0; c < kend; c++) {
        const REAL *b = B + (long)c * ldb + j0;
        REAL a[4];
        for (int r = 0; r < RB; r++) a[r] = r < rows ? alpha * A[(long)(r0 + r) * ars + (long)c * acs] : 0;
        for (int r = 0; r < RB; r++) {
            _Pragma("omp simd")
            for (int j = 0; j < w; j++) acc[r][j] = FMA(a[r], b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _Pragma("omp simd")
        for (int j = 0; j < w; j++) out[(long)(r0 + r) * ldo + j0 + j] = acc[r][j];
    }
}

/* out [M x W] = init + alpha A [M x Kd] B [Kd x W]; tri: A is lower triangular (its entries past the
 * diagonal are zeros, never needed: a block of rows reads A's columns up to its last row). out may be init
 * (each block of rows is read before it is written). */
static void NAME(gemm_, SUF)(int M, int Kd, int W, REAL alpha, const REAL *A, long ars, long acs, const REAL *B,
                             long ldb, const REAL *init, long ldi, REAL *out, long ldo, int tri)
{
    for (int r0 = 0; r0 < M; r0 += 4) {
        const int rows = M - r0 < 4 ? M - r0 : 4;
        const int kend = tri ? (r0 + rows < Kd ? r0 + rows : Kd) : Kd;
        for (int j0 = 0; j0 < W; j0 += PW) {
            const int w = W - j0 < PW ? W - j0 : PW;
            if (rows == 4 && w == PW)
                NAME(block_, SUF)(4, 4, PW, kend, alpha, A, ars, acs, B, ldb, init, ldi, out, ldo, r0, j0);
            else if (rows == 4 && w == PW / 2)
                NAME(block_, SUF)(4, 4, PW / 2, kend, alpha, A, ars, acs, B, ldb, init, ldi, out, ldo, r0, j0);
            else
                NAME(block_, SUF)(4, rows, w, kend, alpha, A, ars, acs, B, ldb, init, ldi, out, ldo, r0, j0);
        }
    }
}

/* The loop over the N chunks of one group for the heads [h0, h1) (see delta_chunk.c). Per head h and chunk i
 * (x_i below is x + i * xs_n + h * xs_h, rows of D numbers one after another):
 *     delta (T given):  X = bV_i - bK_i S,  Vn = T_i X          else  Vn = bV_i
 *     o_i = q_i S + A_i Vn                  (A_i lower triangular, its diagonal included)
 *     S = diag(d_i) S + kd_i^T Vn           (d NULL: no decay; d_per_channel: K numbers, else one)
 * S [heads, K, V] in place; work: 2 C V numbers for this thread. */
void NAME(delta_chunk_loop_, SUF)(
    int N, int C, int K, int V, const REAL *q, long qs_n, long qs_h, const REAL *kd, long ks_n, long ks_h,
    const REAL *bK, long bks_n, long bks_h, const REAL *bV, long bvs_n, long bvs_h, const REAL *T, long ts_n,
    long ts_h, const REAL *A, long as_n, long as_h, const REAL *d, long ds_n, long ds_h, int d_per_channel,
    REAL *o, long os_n, long os_h, REAL *S, long h0, long h1, REAL *work)
{
    REAL *X = work, *Vn = work + (long)C * V;
    for (long h = h0; h < h1; h++) {
        REAL *Sh = S + h * K * V;
        for (int i = 0; i < N; i++) {
            const REAL *vn;
            if (T) {
                NAME(gemm_, SUF)(C, K, V, -1, bK + i * bks_n + h * bks_h, K, 1, Sh, V, bV + i * bvs_n + h * bvs_h,
                                 V, X, V, 0);
                NAME(gemm_, SUF)(C, C, V, 1, T + i * ts_n + h * ts_h, C, 1, X, V, NULL, 0, Vn, V, 1);
                vn = Vn;
            } else {
                vn = bV + i * bvs_n + h * bvs_h;
            }
            REAL *oi = o + i * os_n + h * os_h;
            NAME(gemm_, SUF)(C, K, V, 1, q + i * qs_n + h * qs_h, K, 1, Sh, V, NULL, 0, oi, V, 0);
            NAME(gemm_, SUF)(C, C, V, 1, A + i * as_n + h * as_h, C, 1, vn, V, oi, V, oi, V, 1);
            if (d) {
                const REAL *di = d + i * ds_n + h * ds_h;
                for (int r = 0; r < K; r++) {
                    const REAL f = d_per_channel ? di[r] : di[0];
                    _Pragma("omp simd")
                    for (int j = 0; j < V; j++) Sh[(long)r * V + j] *= f;
                }
            }
            const REAL *ki = kd + i * ks_n + h * ks_h;  /* kd_i^T: row r of it is column r of kd_i */
            NAME(gemm_, SUF)(K, C, V, 1, ki, 1, K, vn, V, Sh, V, Sh, V, 0);
        }
    }
}

/* The same over all heads, split between ``threads`` threads of the OpenMP runtime (torch's own, where it is
 * loaded first: the threads that run torch's operations take these heads too). ``work``: 2 C V numbers per thread. */
void NAME(delta_chunk_loop_threads_, SUF)(
    int N, int C, int K, int V, const REAL *q, long qs_n, long qs_h, const REAL *kd, long ks_n, long ks_h,
    const REAL *bK, long bks_n, long bks_h, const REAL *bV, long bvs_n, long bvs_h, const REAL *T, long ts_n,
    long ts_h, const REAL *A, long as_n, long as_h, const REAL *d, long ds_n, long ds_h, int d_per_channel,
    REAL *o, long os_n, long os_h, REAL *S, long heads, int threads, REAL *work)
{
    if (threads > heads) threads = (int)heads;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++)
        NAME(delta_chunk_loop_, SUF)(N, C, K, V, q, qs_n, qs_h, kd, ks_n, ks_h, bK, bks_n, bks_h, bV, bvs_n,
                                     bvs_h, T, ts_n, ts_h, A, as_n, as_h, d, ds_n, ds_h, d_per_channel, o, os_n,
                                     os_h, S, heads * t / threads, heads * (t + 1) / threads,
                                     work + (long)t * 2 * C * V);
}

/* The whole chunked form for the heads of one call, per head decays only (see delta_chunk.c): per head, chunk
 * by chunk, the chunk's inputs are read into small buffers, its scores, decays and T made there, then the
 * loop's four products; nothing of a chunk leaves the cache but its output rows. */
typedef struct {
    REAL *QK, *KT, *bK, *bV, *P, *Aqk, *Akk, *X, *Vn, *Ot, *G, *eG, *kd, *b, *f, *inv_f;
} NAME(bufs_, SUF);

static void NAME(chunk_, SUF)(int n, int C, int K, int V, const REAL *q, const REAL *k, const REAL *v,
                              const REAL *g, const REAL *beta, const long *st, REAL scale, REAL limit, REAL *o,
                              REAL *Sh, NAME(bufs_, SUF) *w)
{
    /* st: q (t, h) strides, then k, v, g, beta, o; the caller moved the pointers to (b, t0, h) */
    REAL *Q = w->QK, *Kc = w->QK + (long)C * K;
    for (int i = 0; i < n; i++) {
        const REAL *qi = q + i * st[0], *ki = k + i * st[2];
        _Pragma("omp simd")
        for (int d = 0; d < K; d++) { Q[(long)i * K + d] = qi[d]; Kc[(long)i * K + d] = ki[d]; }
        for (int d = 0; d < K; d++) w->KT[(long)d * C + i] = ki[d];
    }
    /* cumulative log decay (each step clamped at -limit, as the tensor form does), its factors */
    REAL acc = 0;
    for (int i = 0; i < n; i++) {
        REAL gi = g ? g[i * st[6]] : 0;
        acc += gi < -limit ? -limit : gi;
        w->G[i] = acc;
        w->b[i] = beta ? beta[i * st[8]] : 1;
    }
    /* exp(G_i - G_j) = exp(G_i - m) exp(m - G_j), m the mid decay, both factors within exp(+-span / 2): 2 n
     * exponentials in place of n^2 / 2, while the span is within twice the limit (else pairwise, as the tensor
     * form does beyond its fast range) */
    const REAL m = acc / 2;
    const int fast = -acc <= 2 * limit;
    for (int i = 0; i < n; i++) {
        w->eG[i] = EXP(w->G[i]);
        w->kd[i] = EXP(acc - w->G[i]);
        w->f[i] = EXP(w->G[i] - m);
        w->inv_f[i] = EXP(m - w->G[i]);
    }
    /* the scores: [Q; K] K^T (2n x n), decayed pairwise (exp(G_i - G_j) <= 1 for j <= i), the upper part cleared */
    if (n == C) {
        NAME(gemm_, SUF)(2 * n, K, n, 1, w->QK, K, 1, w->KT, C, NULL, 0, w->P, C, 0);
    } else {  /* rows of Q and K are C apart in QK: two calls */
        NAME(gemm_, SUF)(n, K, n, 1, Q, K, 1, w->KT, C, NULL, 0, w->P, C, 0);
        NAME(gemm_, SUF)(n, K, n, 1, Kc, K, 1, w->KT, C, NULL, 0, w->P + (long)C * C, C, 0);
    }
    const REAL *KK = w->P + (long)C * C;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j <= i; j++) {
            const REAL gam = fast ? w->f[i] * w->inv_f[j] : EXP(w->G[i] - w->G[j]);
            w->Aqk[(long)i * C + j] = w->P[(long)i * C + j] * gam;
            w->Akk[(long)i * C + j] = j < i ? w->b[i] * KK[(long)i * C + j] * gam : 0;  /* A_kk, strictly lower */
        }
        for (int j = i + 1; j < n; j++) w->Aqk[(long)i * C + j] = 0;
    }
    const REAL *vn;
    if (beta) {
        for (int i = 0; i < n; i++) {
            const REAL *vi = v + i * st[4];
            const REAL bi = w->b[i], bki = w->b[i] * w->eG[i];
            _Pragma("omp simd")
            for (int d = 0; d < V; d++) w->bV[(long)i * V + d] = bi * vi[d];
            _Pragma("omp simd")
            for (int d = 0; d < K; d++) w->bK[(long)i * K + d] = bki * Kc[(long)i * K + d];
        }
        NAME(gemm_, SUF)(n, K, V, -1, w->bK, K, 1, Sh, V, w->bV, V, w->X, V, 0);   /* X = bV - bK S */
        /* Vn = (I + A_kk)^-1 X by forward substitution, row by row: Vn_i = X_i - sum_{m < i} A_kk[i, m] Vn_m */
        for (int i = 0; i < n; i++) {
            REAL *Vi = w->Vn + (long)i * V;
            const REAL *Ai = w->Akk + (long)i * C;
            _Pragma("omp simd")
            for (int j = 0; j < V; j++) Vi[j] = w->X[(long)i * V + j];
            for (int m = 0; m < i; m++) {
                const REAL f = -Ai[m];
                const REAL *Vm = w->Vn + (long)m * V;
                _Pragma("omp simd")
                for (int j = 0; j < V; j++) Vi[j] = FMA(f, Vm[j], Vi[j]);
            }
        }
        vn = w->Vn;
    } else {
        for (int i = 0; i < n; i++) {
            const REAL *vi = v + i * st[4];
            _Pragma("omp simd")
            for (int d = 0; d < V; d++) w->Vn[(long)i * V + d] = vi[d];
        }
        vn = w->Vn;
    }
    for (int i = 0; i < n; i++) {  /* q exp(G), k exp(G_C - G): the queries read the state, the keys write it */
        const REAL e = w->eG[i], kdi = w->kd[i];
        _Pragma("omp simd")
        for (int d = 0; d < K; d++) { Q[(long)i * K + d] *= e; Kc[(long)i * K + d] *= kdi; }
    }
    NAME(gemm_, SUF)(n, K, V, 1, Q, K, 1, Sh, V, NULL, 0, w->Ot, V, 0);           /* O = q exp(G) S */
    NAME(gemm_, SUF)(n, n, V, 1, w->Aqk, C, 1, vn, V, w->Ot, V, w->Ot, V, 1);    /*   + A_qk Vn */
    if (g) {
        const REAL eC = EXP(acc);
        _Pragma("omp simd")
        for (long j = 0; j < (long)K * V; j++) Sh[j] *= eC;
    }
    NAME(gemm_, SUF)(K, n, V, 1, Kc, 1, K, vn, V, Sh, V, Sh, V, 0);              /* S += (k exp(G_C - G))^T Vn */
    for (int i = 0; i < n; i++) {
        REAL *oi = o + i * st[10];
        _Pragma("omp simd")
        for (int d = 0; d < V; d++) oi[d] = scale * w->Ot[(long)i * V + d];
    }
}

/* q, k [B,T,H,K], v, o [B,T,H,V], g, beta [B,T,H] or NULL, rows contiguous; st: the (b, t, h) strides of q, k,
 * v, g, beta, o (18 numbers); S [B*H, K, V] in place (the initial state, or zeros). */
int NAME(delta_chunked_, SUF)(int B, int T, int H, int K, int V, int C, const REAL *q, const REAL *k,
                              const REAL *v, const REAL *g, const REAL *beta, const long *st, REAL scale,
                              REAL limit, REAL *o, REAL *S, int threads)
{
    const long heads = (long)B * H;
    int failed = 0;
    if (threads > heads) threads = (int)heads;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        const long floats = 4L * C * K + 4L * C * C + 3L * C * V + (long)C * (V > C ? V : C) + 6L * C;
        REAL *mem = (REAL *)malloc(sizeof(REAL) * floats);
        if (!mem) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        int all_ok;  /* where one thread has no buffers, none works (and the caller is told) */
#pragma omp atomic read
        all_ok = failed;
        all_ok = !all_ok;
        NAME(bufs_, SUF) w;
        REAL *p = mem;
        w.QK = p; p += 2L * C * K;  w.KT = p; p += (long)K * C;  w.bK = p; p += (long)C * K;
        w.bV = p; p += (long)C * V;  w.P = p; p += 2L * C * C;  w.Aqk = p; p += (long)C * C;
        w.Akk = p; p += (long)C * C;  w.X = p; p += (long)C * (V > C ? V : C);  w.Vn = p; p += (long)C * V;
        w.Ot = p; p += (long)C * V;  w.G = p; p += C;  w.eG = p; p += C;  w.kd = p; p += C;  w.b = p; p += C;
        w.f = p; p += C;  w.inv_f = p; p += C;
        /* each thread its own range of heads, taken chunk by chunk: a chunk's rows of all those heads lie
         * together in memory (and their states, K V numbers each, stay in the second-level cache) */
        const int t_id = omp_get_thread_num(), t_n = omp_get_num_threads();
        const long h0 = all_ok ? heads * t_id / t_n : 0, h1 = all_ok ? heads * (t_id + 1) / t_n : 0;
        for (int t0 = 0; t0 < T && h0 < h1; t0 += C) {
            const int n = T - t0 < C ? T - t0 : C;
            for (long bh = h0; bh < h1; bh++) {
                const long b = bh / H, h = bh % H;
                REAL *Sh = S + bh * K * V;
                {   /* the next head's rows (or the next chunk's first) are asked for now, to arrive during this one */
                    const long nb = bh + 1 < h1 ? (bh + 1) / H : h0 / H, nh = bh + 1 < h1 ? (bh + 1) % H : h0 % H;
                    const int nt = bh + 1 < h1 ? t0 : t0 + C;
                    const int nn = T - nt < C ? T - nt : C;
                    for (int i = 0; i < nn; i++) {
                        const REAL *pq = q + nb * st[0] + (long)(nt + i) * st[1] + nh * st[2];
                        const REAL *pk = k + nb * st[3] + (long)(nt + i) * st[4] + nh * st[5];
                        const REAL *pv = v + nb * st[6] + (long)(nt + i) * st[7] + nh * st[8];
                        for (int d = 0; d < K; d += 64 / (int)sizeof(REAL)) {
                            __builtin_prefetch(pq + d);
                            __builtin_prefetch(pk + d);
                        }
                        for (int d = 0; d < V; d += 64 / (int)sizeof(REAL)) __builtin_prefetch(pv + d);
                    }
                }
                const long lst[12] = {st[1], 0, st[4], 0, st[7], 0, st[10], 0, st[13], 0, st[16], 0};
                NAME(chunk_, SUF)(n, C, K, V, q + b * st[0] + t0 * st[1] + h * st[2],
                                  k + b * st[3] + t0 * st[4] + h * st[5], v + b * st[6] + t0 * st[7] + h * st[8],
                                  g ? g + b * st[9] + t0 * st[10] + h * st[11] : NULL,
                                  beta ? beta + b * st[12] + t0 * st[13] + h * st[14] : NULL, lst, scale, limit,
                                  o + b * st[15] + t0 * st[16] + h * st[17], Sh, &w);
            }
        }
        free(mem);
    }
    return failed ? -1 : 0;
}

#undef PW
