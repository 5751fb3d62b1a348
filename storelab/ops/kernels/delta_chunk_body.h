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

/* The whole chunked form for the heads of one call (see delta_chunk.c): per head, chunk
 * by chunk, the chunk's inputs are read into small buffers, its scores, decays and A_kk made there, then the
 * loop's four products; nothing of a chunk leaves the cache but its output rows. */
typedef struct {
    REAL *QK, *KT, *bK, *bV, *P, *Aqk, *Akk, *X, *Vn, *Ot, *G, *eG, *kd, *b, *f, *inv_f, *F, *em, *eC;
} NAME(bufs_, SUF);

static void NAME(chunk_, SUF)(int n, int C, int K, int V, const REAL *q, const REAL *k, const REAL *v,
                              const REAL *g, int per_channel, const REAL *beta, const long *st, REAL scale,
                              REAL limit, REAL *o, REAL *Sh, NAME(bufs_, SUF) *w)
{
    /* st: q (t, h) strides, then k, v, g, beta, o; the caller moved the pointers to (b, t0, h) */
    REAL *Q = w->QK, *Kc = w->QK + (long)C * K;
    for (int i = 0; i < n; i++) {
        const REAL *qi = q + i * st[0], *ki = k + i * st[2];
        _Pragma("omp simd")
        for (int d = 0; d < K; d++) { Q[(long)i * K + d] = qi[d]; Kc[(long)i * K + d] = ki[d]; }
        for (int d = 0; d < K; d++) w->KT[(long)d * C + i] = ki[d];
        w->b[i] = beta ? beta[i * st[8]] : 1;
    }
    /* cumulative log decay within the chunk, each step clamped at -limit as the tensor form does: G [n] per
     * head, [n][K] per channel. exp(G_i - G_j) = exp(G_i - m) exp(m - G_j), m = G_C / 2, both factors within
     * exp(+-span / 2) while the chunk decays by at most twice the limit ("fast"): 2 n (per channel 2 n K)
     * exponentials in place of n^2 / 2 (n^2 K / 2). Beyond, the decays are taken pairwise. */
    REAL *G = w->G;
    int fast = 1;
    REAL acc = 0;  /* per head: G_C */
    if (!per_channel) {
        for (int i = 0; i < n; i++) {
            const REAL gi = g ? g[i * st[6]] : 0;
            acc += gi < -limit ? -limit : gi;
            G[i] = acc;
        }
        const REAL m = acc / 2;
        fast = -acc <= 2 * limit;
        for (int i = 0; i < n; i++) {
            w->eG[i] = EXP(G[i]);
            w->kd[i] = EXP(acc - G[i]);
            w->f[i] = EXP(G[i] - m);
            w->inv_f[i] = EXP(m - G[i]);
        }
    } else {
        for (int i = 0; i < n; i++) {
            const REAL *gi = g + i * st[6];
            REAL *Gi = G + (long)i * K;
            _Pragma("omp simd")
            for (int c = 0; c < K; c++) {
                const REAL step = gi[c] < -limit ? -limit : gi[c];
                Gi[c] = (i ? Gi[c - K] : 0) + step;
            }
        }
        const REAL *GC = G + (long)(n - 1) * K;
        for (int c = 0; c < K; c++) fast &= -GC[c] <= 2 * limit;
        if (fast) {  /* the factors ride on the rows: [q f; k f] (k / f)^T, f = exp(G - m) */
            _Pragma("omp simd")
            for (int c = 0; c < K; c++) { w->em[c] = EXPV(GC[c] / 2); w->eC[c] = EXPV(GC[c]); }
            for (int i = 0; i < n; i++) {
                REAL *Fi = w->F + (long)i * K;
                _Pragma("omp simd")
                for (int c = 0; c < K; c++) {
                    Fi[c] = EXPV(G[(long)i * K + c] - GC[c] / 2);
                    Q[(long)i * K + c] *= Fi[c];
                    Kc[(long)i * K + c] *= Fi[c];
                }
                for (int c = 0; c < K; c++) w->KT[(long)c * C + i] /= Fi[c];
            }
        } else {
            _Pragma("omp simd")
            for (int c = 0; c < K; c++) w->eC[c] = EXPV(GC[c]);
        }
    }
    /* the scores: [Q; K] K^T (2n x n), decayed (exp(G_i - G_j) <= 1 for j <= i), the upper part cleared */
    if (per_channel && !fast) {  /* pairwise, channel by channel (a chunk decaying beyond exp's range: rare) */
        for (int i = 0; i < n; i++)
            for (int j = 0; j <= i; j++) {
                REAL sq = 0, sk = 0;
                const REAL *Gi = G + (long)i * K, *Gj = G + (long)j * K;
                _Pragma("omp simd reduction(+:sq, sk)")
                for (int c = 0; c < K; c++) {
                    const REAL kj = Kc[(long)j * K + c] * EXPV(Gi[c] - Gj[c]);
                    sq += Q[(long)i * K + c] * kj;
                    sk += Kc[(long)i * K + c] * kj;
                }
                w->P[(long)i * C + j] = sq;
                w->P[(long)(C + i) * C + j] = sk;
            }
    } else if (n == C) {
        NAME(gemm_, SUF)(2 * n, K, n, 1, w->QK, K, 1, w->KT, C, NULL, 0, w->P, C, 0);
    } else {  /* rows of Q and K are C apart in QK: two calls */
        NAME(gemm_, SUF)(n, K, n, 1, Q, K, 1, w->KT, C, NULL, 0, w->P, C, 0);
        NAME(gemm_, SUF)(n, K, n, 1, Kc, K, 1, w->KT, C, NULL, 0, w->P + (long)C * C, C, 0);
    }
    const REAL *KK = w->P + (long)C * C;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j <= i; j++) {
            const REAL gam = per_channel ? 1 : fast ? w->f[i] * w->inv_f[j] : EXP(G[i] - G[j]);
            w->Aqk[(long)i * C + j] = w->P[(long)i * C + j] * gam;
            w->Akk[(long)i * C + j] = j < i ? w->b[i] * KK[(long)i * C + j] * gam : 0;  /* A_kk, strictly lower */
        }
        for (int j = i + 1; j < n; j++) w->Aqk[(long)i * C + j] = 0;
    }
    /* q exp(G) (the queries read the state), beta k exp(G) (what the state predicts), and the keys' decay to
     * the chunk's end exp(G_C - G) (they write the state): kept in Q, bK, and Kc (per head) or KT (per
     * channel, whose rows the state's update reads) */
    if (!per_channel) {
        for (int i = 0; i < n; i++) {
            const REAL e = w->eG[i], kdi = w->kd[i], bki = w->b[i] * e;
            _Pragma("omp simd")
            for (int d = 0; d < K; d++) {
                w->bK[(long)i * K + d] = bki * Kc[(long)i * K + d];
                Q[(long)i * K + d] *= e;
                Kc[(long)i * K + d] *= kdi;
            }
        }
    } else if (fast) {  /* Q, Kc hold q f, k f; KT k / f: times exp(m), q exp(G), k exp(G), k exp(G_C - G) */
        for (int i = 0; i < n; i++) {
            const REAL bi = w->b[i];
            _Pragma("omp simd")
            for (int c = 0; c < K; c++) {
                w->bK[(long)i * K + c] = bi * Kc[(long)i * K + c] * w->em[c];
                Q[(long)i * K + c] *= w->em[c];
            }
        }
        for (int c = 0; c < K; c++) {
            const REAL e = w->em[c];
            _Pragma("omp simd")
            for (int i = 0; i < n; i++) w->KT[(long)c * C + i] *= e;
        }
    } else {
        const REAL *GC = G + (long)(n - 1) * K;
        for (int i = 0; i < n; i++) {
            const REAL bi = w->b[i];
            const REAL *Gi = G + (long)i * K;
            _Pragma("omp simd")
            for (int c = 0; c < K; c++) {
                const REAL e = EXPV(Gi[c]);
                w->bK[(long)i * K + c] = bi * Kc[(long)i * K + c] * e;
                Q[(long)i * K + c] *= e;
            }
            for (int c = 0; c < K; c++) w->KT[(long)c * C + i] *= EXPV(GC[c] - Gi[c]);
        }
    }
    const REAL *vn;
    if (beta) {
        for (int i = 0; i < n; i++) {
            const REAL *vi = v + i * st[4];
            const REAL bi = w->b[i];
            _Pragma("omp simd")
            for (int d = 0; d < V; d++) w->bV[(long)i * V + d] = bi * vi[d];
        }
        NAME(gemm_, SUF)(n, K, V, -1, w->bK, K, 1, Sh, V, w->bV, V, w->X, V, 0);   /* X = bV - bK S */
        /* Vn = (I + A_kk)^-1 X by forward substitution, Vn_i = X_i - sum_{m < i} A_kk[i, m] Vn_m, four rows at a
         * time: the rows already found enter as one product (registers held over the block), then the four
         * among themselves */
        for (int i0 = 0; i0 < n; i0 += 4) {
            const int rows = n - i0 < 4 ? n - i0 : 4;
            NAME(gemm_, SUF)(rows, i0, V, -1, w->Akk + (long)i0 * C, C, 1, w->Vn, V, w->X + (long)i0 * V, V,
                             w->Vn + (long)i0 * V, V, 0);
            for (int i = i0 + 1; i < i0 + rows; i++) {
                REAL *Vi = w->Vn + (long)i * V;
                const REAL *Ai = w->Akk + (long)i * C;
                for (int m = i0; m < i; m++) {
                    const REAL f = -Ai[m];
                    const REAL *Vm = w->Vn + (long)m * V;
                    _Pragma("omp simd")
                    for (int j = 0; j < V; j++) Vi[j] = FMA(f, Vm[j], Vi[j]);
                }
            }
        }
    } else {
        for (int i = 0; i < n; i++) {
            const REAL *vi = v + i * st[4];
            _Pragma("omp simd")
            for (int d = 0; d < V; d++) w->Vn[(long)i * V + d] = vi[d];
        }
    }
    vn = w->Vn;
    NAME(gemm_, SUF)(n, K, V, 1, Q, K, 1, Sh, V, NULL, 0, w->Ot, V, 0);           /* O = q exp(G) S */
    NAME(gemm_, SUF)(n, n, V, 1, w->Aqk, C, 1, vn, V, w->Ot, V, w->Ot, V, 1);    /*   + A_qk Vn */
    if (g && !per_channel) {
        const REAL eC = EXP(acc);
        _Pragma("omp simd")
        for (long j = 0; j < (long)K * V; j++) Sh[j] *= eC;
    } else if (g) {
        for (int c = 0; c < K; c++) {
            const REAL e = w->eC[c];
            _Pragma("omp simd")
            for (int j = 0; j < V; j++) Sh[(long)c * V + j] *= e;
        }
    }
    if (!per_channel)
        NAME(gemm_, SUF)(K, n, V, 1, Kc, 1, K, vn, V, Sh, V, Sh, V, 0);          /* S += (k exp(G_C - G))^T Vn */
    else
        NAME(gemm_, SUF)(K, n, V, 1, w->KT, C, 1, vn, V, Sh, V, Sh, V, 0);
    for (int i = 0; i < n; i++) {
        REAL *oi = o + i * st[10];
        _Pragma("omp simd")
        for (int d = 0; d < V; d++) oi[d] = scale * w->Ot[(long)i * V + d];
    }
}

/* q, k [B,T,H,K], v, o [B,T,H,V], g [B,T,H] (or [B,T,H,K] with per_channel) or NULL, beta [B,T,H] or NULL,
 * rows contiguous; st: the (b, t, h) strides of q, k, v, g, beta, o (18 numbers); S [B*H, K, V] in place (the
 * initial state, or zeros). 0, or -1 where a thread's buffers could not be had (nothing is then done). */
int NAME(delta_chunked_, SUF)(int B, int T, int H, int K, int V, int C, const REAL *q, const REAL *k,
                              const REAL *v, const REAL *g, int per_channel, const REAL *beta, const long *st,
                              REAL scale,
                              REAL limit, REAL *o, REAL *S, int threads)
{
    const long heads = (long)B * H;
    int failed = 0;
    if (threads > heads) threads = (int)heads;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        const long floats = 6L * C * K + 4L * C * C + 3L * C * V + (long)C * (V > C ? V : C) + 6L * C + 2L * K;
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
        w.Ot = p; p += (long)C * V;  w.G = p; p += (long)C * K;  w.eG = p; p += C;  w.kd = p; p += C;  w.b = p; p += C;
        w.f = p; p += C;  w.inv_f = p; p += C;  w.F = p; p += (long)C * K;  w.em = p; p += K;  w.eC = p; p += K;
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
                                  g ? g + b * st[9] + t0 * st[10] + h * st[11] : NULL, per_channel,
                                  beta ? beta + b * st[12] + t0 * st[13] + h * st[14] : NULL, lst, scale, limit,
                                  o + b * st[15] + t0 * st[16] + h * st[17], Sh, &w);
            }
        }
        free(mem);
    }
    return failed ? -1 : 0;
}

#undef PW
