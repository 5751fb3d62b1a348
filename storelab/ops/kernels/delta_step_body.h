/* The per-token delta rule for one element type: included by delta_step.c with REAL (float or double)
 * and SUF (the name suffix) defined. See delta_step.c for the equations, the layout and the lanes. */

#define NAME2(a, b) a##b
#define NAME(a, b) NAME2(a, b)
#define LANE _Pragma("omp simd") for (int l = 0; l < LANES; l++)

/* The lanes' rows of x [B,T,H,D] at token t, into buf [D][LANES] (zeros for lanes past the heads); bh[l] is
 * lane l's row at t = 0, b * T * H + h (-1: no head), so its row at t is bh[l] + t * H. */
static void NAME(gather_, SUF)(const REAL *x, long t, long H, long D, const long *bh, REAL *buf)
{
    for (int l = 0; l < LANES; l++) {
        if (bh[l] < 0) { for (long d = 0; d < D; d++) buf[d * LANES + l] = 0; continue; }
        const REAL *row = x + (bh[l] + t * H) * D;
        for (long d = 0; d < D; d++) buf[d * LANES + l] = row[d];
    }
}

static void NAME(scatter_, SUF)(REAL *x, long t, long H, long D, const long *bh, const REAL *buf)
{
    for (int l = 0; l < LANES; l++) {
        if (bh[l] < 0) continue;
        REAL *row = x + (bh[l] + t * H) * D;
        for (long d = 0; d < D; d++) row[d] = buf[d * LANES + l];
    }
}

/* One token's inputs for the lanes: q, k [K][L], v [V][L], a = exp(g) [1 or K][L], beta [L]. */
typedef struct {
    REAL *q, *k, *v, *a, *b;
} NAME(tok_, SUF);

static void NAME(load_, SUF)(NAME(tok_, SUF) *x, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                             const REAL *beta, long t, long H, long K, long V, int g_mode,
                             const long *bh)
{
    if (q) NAME(gather_, SUF)(q, t, H, K, bh, x->q);
    NAME(gather_, SUF)(k, t, H, K, bh, x->k);
    NAME(gather_, SUF)(v, t, H, V, bh, x->v);
    if (g_mode == 0) LANE x->a[l] = 1;
    else {
        const long D = g_mode == 2 ? K : 1;
        NAME(gather_, SUF)(g, t, H, D, bh, x->a);
        for (long d = 0; d < D * LANES; d++) x->a[d] = (REAL)exp((double)x->a[d]);
    }
    if (beta) NAME(gather_, SUF)(beta, t, H, 1, bh, x->b);
}

/* One token: P = diag(a) S (into P), r = v - P^T k, u = beta r (v without beta), S_out = P + k u^T. */
static void NAME(token_, SUF)(const REAL *S, REAL *P, REAL *S_out, const NAME(tok_, SUF) *x, int per_channel,
                             int has_beta, REAL *r, REAL *u, long K, long V)
{
    for (long j = 0; j < V * LANES; j++) r[j] = 0;
    for (long i = 0; i < K; i++) {
        const REAL *ai = x->a + (per_channel ? i : 0) * LANES, *ki = x->k + i * LANES;
        for (long j = 0; j < V; j++) {
            const REAL *Sij = S + (i * V + j) * LANES;
            REAL *Pij = P + (i * V + j) * LANES, *rj = r + j * LANES;
            LANE { Pij[l] = ai[l] * Sij[l]; rj[l] += ki[l] * Pij[l]; }
        }
    }
    for (long j = 0; j < V; j++) {
        REAL *rj = r + j * LANES, *uj = u + j * LANES;
        const REAL *vj = x->v + j * LANES;
        LANE { rj[l] = vj[l] - rj[l]; uj[l] = has_beta ? x->b[l] * rj[l] : vj[l]; }
    }
    for (long i = 0; i < K; i++) {
        const REAL *ki = x->k + i * LANES;
        for (long j = 0; j < V; j++) {
            const REAL *Pij = P + (i * V + j) * LANES, *uj = u + j * LANES;
            REAL *Sij = S_out + (i * V + j) * LANES;
            LANE Sij[l] = Pij[l] + ki[l] * uj[l];
        }
    }
}

/* Lane l of group gi is head n = gi * LANES + l of the B * H: bh[l] its row at t = 0 (-1 past the heads), and
 * hs[l] = n its index in the states [B*H, K, V]. */
static void NAME(lanes_, SUF)(long gi, long BH, long T, long H, long *bh, long *hs)
{
    for (int l = 0; l < LANES; l++) {
        const long n = gi * LANES + l;
        hs[l] = n < BH ? n : -1;
        bh[l] = n < BH ? (n / H) * T * H + n % H : -1;
    }
}

/* Forward: o [B,T,H,V]; ckpt [G, NC+1, K, V, LANES]: the state entering each span of L tokens, then the
 * final one (G lane groups of the B*H heads). */
void NAME(delta_forward_, SUF)(const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                               const REAL *S0, REAL *o, REAL *ckpt, long B, long T, long H, long K, long V,
                               int g_mode, REAL scale, long L, long g0, long g1)
{
    const long NC = (T + L - 1) / L, KV = K * V, BH = B * H, G = (BH + LANES - 1) / LANES;
    for (long gi = g0; gi < g1 && gi < G; gi++) {
        long bh[LANES], hs[LANES];
        NAME(lanes_, SUF)(gi, BH, T, H, bh, hs);
        REAL *C = ckpt + gi * (NC + 1) * KV * LANES;
        REAL *work = malloc(sizeof(REAL) * LANES * (KV + 5 * V + 3 * K + 1));
        REAL *S = work, *r = S + KV * LANES, *u = r + V * LANES, *ob = u + V * LANES;
        NAME(tok_, SUF) x = {ob + V * LANES, ob + V * LANES + K * LANES, ob + V * LANES + 2 * K * LANES,
                             ob + 2 * V * LANES + 2 * K * LANES, ob + 2 * V * LANES + 3 * K * LANES};
        for (int l = 0; l < LANES; l++)
            for (long e = 0; e < KV; e++) S[e * LANES + l] = (S0 && hs[l] >= 0) ? S0[hs[l] * KV + e] : 0;
        for (long t = 0; t < T; t++) {
            if (t % L == 0) for (long e = 0; e < KV * LANES; e++) C[(t / L) * KV * LANES + e] = S[e];
            NAME(load_, SUF)(&x, q, k, v, g, beta, t, H, K, V, g_mode, bh);
            NAME(token_, SUF)(S, S, S, &x, g_mode == 2, beta != 0, r, u, K, V);
            for (long j = 0; j < V * LANES; j++) ob[j] = 0;
            for (long i = 0; i < K; i++) {
                const REAL *qi = x.q + i * LANES;
                for (long j = 0; j < V; j++) {
                    const REAL *Sij = S + (i * V + j) * LANES;
                    REAL *oj = ob + j * LANES;
                    LANE oj[l] += qi[l] * Sij[l];
                }
            }
            for (long j = 0; j < V * LANES; j++) ob[j] *= scale;
            NAME(scatter_, SUF)(o, t, H, V, bh, ob);
        }
        for (long e = 0; e < KV * LANES; e++) C[NC * KV * LANES + e] = S[e];
        free(work);
    }
}

/* Backward: from do [B,T,H,V] and dS_final [B,H,K,V] (or NULL) the gradients dq, dk [B,T,H,K], dv [B,T,H,V],
 * dg (as g), dbeta [B,T,H] (when beta) and dS0 [B,H,K,V]; each span of L tokens is run forward again from
 * its checkpoint, keeping P_t, r_t and u_t, then walked backward. */
void NAME(delta_backward_, SUF)(const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                                const REAL *ckpt, const REAL *dout, const REAL *dS_final, REAL *dq, REAL *dk,
                                REAL *dv, REAL *dg, REAL *dbeta, REAL *dS0, long B, long T, long H, long K,
                                long V, int g_mode, REAL scale, long L, long g0, long g1)
{
    const long NC = (T + L - 1) / L, KV = K * V, BH = B * H, G = (BH + LANES - 1) / LANES;
    for (long gi = g0; gi < g1 && gi < G; gi++) {
        long bh[LANES], hs[LANES];
        NAME(lanes_, SUF)(gi, BH, T, H, bh, hs);
        const REAL *C = ckpt + gi * (NC + 1) * KV * LANES;
        const long nbuf = L * KV + 2 * KV + 2 * L * V + 6 * V + 6 * K + 3;
        REAL *work = malloc(sizeof(REAL) * LANES * nbuf);
        REAL *Pb = work, *dS = Pb + L * KV * LANES, *S = dS + KV * LANES, *rb = S + KV * LANES;
        REAL *ub = rb + L * V * LANES, *du = ub + L * V * LANES, *dp = du + V * LANES, *dob = dp + V * LANES;
        REAL *dvb = dob + V * LANES, *dqb = dvb + V * LANES, *dkb = dqb + K * LANES, *dgb = dkb + K * LANES;
        REAL *tmp = dgb + K * LANES, *udo = tmp + V * LANES, *dbb = udo + LANES;
        NAME(tok_, SUF) x = {dbb + LANES, dbb + LANES + K * LANES, dbb + LANES + 2 * K * LANES,
                             dbb + LANES + 2 * K * LANES + V * LANES, dbb + LANES + 3 * K * LANES + V * LANES};
        for (int l = 0; l < LANES; l++)
            for (long e = 0; e < KV; e++)
                dS[e * LANES + l] = (dS_final && hs[l] >= 0) ? dS_final[hs[l] * KV + e] : 0;
        for (long c = NC - 1; c >= 0; c--) {
            const long t0 = c * L, t1 = (t0 + L < T) ? t0 + L : T;
            for (long e = 0; e < KV * LANES; e++) S[e] = C[c * KV * LANES + e];
            for (long t = t0; t < t1; t++) {  /* again forward: P_t, r_t, u_t kept */
                const long s = t - t0;
                NAME(load_, SUF)(&x, NULL, k, v, g, beta, t, H, K, V, g_mode, bh);
                NAME(token_, SUF)(S, Pb + s * KV * LANES, S, &x, g_mode == 2, beta != 0, rb + s * V * LANES,
                                  ub + s * V * LANES, K, V);
            }
            for (long t = t1 - 1; t >= t0; t--) {
                const long s = t - t0;
                const REAL *P = Pb + s * KV * LANES, *r = rb + s * V * LANES, *u = ub + s * V * LANES;
                NAME(load_, SUF)(&x, q, k, v, g, beta, t, H, K, V, g_mode, bh);
                NAME(gather_, SUF)(dout, t, H, V, bh, dob);
                /* o = s S_t^T q, S_t = P + k u^T: dq = s (P do + k (u . do)); dS += s q do^T; dk = dS u; du = dS^T k */
                LANE udo[l] = 0;
                for (long j = 0; j < V; j++) {
                    const REAL *uj = u + j * LANES, *dj = dob + j * LANES;
                    LANE udo[l] += uj[l] * dj[l];
                }
                for (long j = 0; j < V * LANES; j++) du[j] = 0;
                for (long i = 0; i < K; i++) {
                    const REAL *qi = x.q + i * LANES, *ki = x.k + i * LANES;
                    REAL aq[LANES] = {0}, ak[LANES] = {0};  /* sums over j kept in registers, not in memory */
                    for (long j = 0; j < V; j++) {
                        const REAL *Pij = P + (i * V + j) * LANES, *dj = dob + j * LANES, *uj = u + j * LANES;
                        REAL *dSij = dS + (i * V + j) * LANES, *duj = du + j * LANES;
                        LANE {
                            const REAL dSn = dSij[l] + scale * qi[l] * dj[l];
                            aq[l] += Pij[l] * dj[l];
                            ak[l] += dSn * uj[l];
                            duj[l] += dSn * ki[l];
                            dSij[l] = dSn;
                        }
                    }
                    REAL *dqi = dqb + i * LANES, *dki = dkb + i * LANES;
                    LANE { dqi[l] = scale * (aq[l] + ki[l] * udo[l]); dki[l] = ak[l]; }
                }
                /* u = beta r, r = v - P^T k */
                LANE dbb[l] = 0;
                for (long j = 0; j < V; j++) {
                    const REAL *duj = du + j * LANES, *rj = r + j * LANES;
                    REAL *dvj = dvb + j * LANES, *dpj = dp + j * LANES;
                    if (beta) LANE { dvj[l] = x.b[l] * duj[l]; dbb[l] += duj[l] * rj[l]; dpj[l] = -x.b[l] * duj[l]; }
                    else LANE { dvj[l] = duj[l]; dpj[l] = 0; }
                }
                /* dP = dS + k dp^T; dk += P dp; dg from dP * P; the state entering: dS = diag(a) dP */
                const long D = g_mode == 2 ? K : 1;
                for (long d = 0; d < D * LANES; d++) dgb[d] = 0;
                for (long i = 0; i < K; i++) {
                    const REAL *ki = x.k + i * LANES, *ai = x.a + (g_mode == 2 ? i : 0) * LANES;
                    REAL ak[LANES] = {0}, ag[LANES] = {0};
                    for (long j = 0; j < V; j++) {
                        const REAL *Pij = P + (i * V + j) * LANES, *dpj = dp + j * LANES;
                        REAL *dSij = dS + (i * V + j) * LANES;
                        LANE {
                            const REAL dPij = dSij[l] + ki[l] * dpj[l];
                            ak[l] += Pij[l] * dpj[l];
                            ag[l] += dPij * Pij[l];
                            dSij[l] = ai[l] * dPij;
                        }
                    }
                    REAL *dki = dkb + i * LANES, *dgi = dgb + (g_mode == 2 ? i : 0) * LANES;
                    LANE { dki[l] += ak[l]; dgi[l] += ag[l]; }
                }
                NAME(scatter_, SUF)(dq, t, H, K, bh, dqb);
                NAME(scatter_, SUF)(dk, t, H, K, bh, dkb);
                NAME(scatter_, SUF)(dv, t, H, V, bh, dvb);
                if (g_mode) NAME(scatter_, SUF)(dg, t, H, D, bh, dgb);
                if (beta) NAME(scatter_, SUF)(dbeta, t, H, 1, bh, dbb);
            }
        }
        for (int l = 0; l < LANES; l++)
            if (hs[l] >= 0) for (long e = 0; e < KV; e++) dS0[hs[l] * KV + e] = dS[e * LANES + l];
        free(work);
    }
}

#undef LANE
#undef NAME
#undef NAME2
