/* The work around the products of one token's decode step (storelab.models.decode), one call each.
 *
 * rms_norm_f32:   y = x * (1 / sqrt(mean(x^2) + eps)) * w            (storelab.ops.norm.rms_norm, fp32)
 * attend_one_f32: one query per head over L cached entries (and, optionally, one new entry not yet
 *                 written), softmax with an optional sink per head added to the denominator:
 *
 *     s_l = scale * q_h . k_l,   o_h = sum_l exp(s_l - m) v_l / (sum_l exp(s_l - m) + exp(sink_h - m))
 *
 * The H query heads share G key/value heads (head h reads group h / (H / G)); the rep = H / G heads of a
 * group are scored together. The rows go by blocks of ``BLOCK``: every head's scores over the block's key
 * rows, then a running softmax (max and denominator per head, the output rescaled where the max grows),
 * then the block's value rows, which lie beside its keys in the cache's row buffer: one pass over the
 * cache, at the memory rate. Keys and values are strided views (a row stride and a head stride each: the
 * cache's shared row buffer, a window's ring), read in place. ``work`` holds H * (2 + V + BLOCK) floats. With
 * ``k_dst`` / ``v_dst``, the new entry is then written there (its row of the cache: heads at the same strides).
 * The rows' work goes into a part (attend_part_f32) that attend_finish_f32 normalises; parts over disjoint rows
 * merge there too. (Splitting the rows between two threads through a Python pool was slower here: torch's OpenMP
 * threads spin on the cores between the products.) The sums run in SIMD lanes (``omp simd``, no fast-math): another order than the fused
 * kernel's, the same numbers to fp32 rounding (tests/test_decode_fast.py).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd_exp.h"

/* The softmax's e^x (x <= 0: a score minus the row's largest) is simd_exp.h's exp_simd, within 1 ulp there. */
#define AHEAD 4    /* rows prefetched ahead of the scores (keys and values: the values' pass finds them) */
#define BLOCK 64   /* key rows per block of the running softmax: its scores stay in L1 */

void rms_norm_f32(const float *x, const float *w, float *y, long D, float eps) {
    float ss = 0.0f;
    _Pragma("omp simd reduction(+:ss)")
    for (long i = 0; i < D; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)D + eps);
    _Pragma("omp simd")
    for (long i = 0; i < D; i++) y[i] = (x[i] * inv) * w[i];
}

/* Floats of the ``work`` a part needs (callers size their scratch by it, not by a copy of BLOCK). */
long attend_work_floats(long H, long V) { return H * (2 + V + BLOCK); }


/* Dot products of one query with four rows, sums in 16 lanes then halved (16 -> 8 -> 4 -> 2 -> 1): a fixed order
 * (the same on every machine and thread count) that stays in vector registers. An ``omp simd`` reduction's last
 * step was compiled here (GCC 12, no fast-math) as lane-by-lane adds: most of the read's time went to it. */
static inline __attribute__((always_inline)) void dots4(const float *q, const float *k0, const float *k1,
                                                        const float *k2, const float *k3, long K, float *out) {
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    long c = 0;
    for (; c + 16 <= K; c += 16)
        for (int i = 0; i < 16; i++) {
            float qc = q[c + i];
            a0[i] += qc * k0[c + i]; a1[i] += qc * k1[c + i]; a2[i] += qc * k2[c + i]; a3[i] += qc * k3[c + i];
        }
    for (int i = 0; c + i < K; i++) {
        float qc = q[c + i];
        a0[i] += qc * k0[c + i]; a1[i] += qc * k1[c + i]; a2[i] += qc * k2[c + i]; a3[i] += qc * k3[c + i];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) { a0[i] += a0[i + w]; a1[i] += a1[i + w]; a2[i] += a2[i + w]; a3[i] += a3[i + w]; }
    out[0] = a0[0]; out[1] = a1[0]; out[2] = a2[0]; out[3] = a3[0];
}

/* Row l of key/value group g: the cache's (row and head strides) for l < L, else the new entry (``fresh``, groups of
 * ``width`` channels side by side). */
static inline const float *row_at(const float *base, const float *fresh, long l, long L, long row, long head, long g,
                                  long width) {
    return l < L ? base + l * row + g * head : fresh + g * width;
}

/* Rows r0..r1-1 of the n = L (+1 with k_new) entries into a part: work = [m (H) | den (H) | acc (H*V) | scores
 * (H*BLOCK)], the running max, denominator and unnormalised output per head (attend_finish_f32 merges the parts). */
static inline __attribute__((always_inline)) void attend_part(
        const float *q, const float *k, const float *v, const float *k_new, const float *v_new, float *work, long H,
        long G, long K, long V, long L, long r0, long r1, long k_row, long k_head, long v_row, long v_head, float scale) {
    long rep = H / G;
    float *m = work, *den = work + H, *out = work + 2 * H, *sc = out + H * V;
    for (long h = 0; h < H; h++) { m[h] = -INFINITY; den[h] = 0.0f; }
    for (long i = 0; i < H * V; i++) out[i] = 0.0f;
    for (long l0 = r0; l0 < r1; l0 += BLOCK) {
        long nb = r1 - l0 < BLOCK ? r1 - l0 : BLOCK;
        for (long j = 0; j < nb; j++) {              /* the rows a few ahead asked from memory now */
            long l = l0 + j;
            if (l + AHEAD < r1 && l + AHEAD < L)
                for (long g = 0; g < G; g++) {
                    const char *pk = (const char *)(k + (l + AHEAD) * k_row + g * k_head);
                    const char *pv = (const char *)(v + (l + AHEAD) * v_row + g * v_head);
                    for (long b = 0; b < K * 4; b += 64) __builtin_prefetch(pk + b, 0, 3);
                    for (long b = 0; b < V * 4; b += 64) __builtin_prefetch(pv + b, 0, 3);
                }
        }
        for (long g = 0; g < G; g++) {               /* the block's scores: per head, four key rows per pass */
            for (long r = 0; r < rep; r++) {         /* (four sums in flight, q read once for the four) */
                const float *qh = q + (g * rep + r) * K;
                float *sh = sc + (g * rep + r) * BLOCK;
                long j = 0;
                for (; j + 4 <= nb; j += 4) {
                    long l = l0 + j;
                    float d[4];
                    dots4(qh, row_at(k, k_new, l, L, k_row, k_head, g, K), row_at(k, k_new, l + 1, L, k_row, k_head, g, K),
                          row_at(k, k_new, l + 2, L, k_row, k_head, g, K), row_at(k, k_new, l + 3, L, k_row, k_head, g, K), K, d);
                    sh[j] = d[0] * scale; sh[j + 1] = d[1] * scale; sh[j + 2] = d[2] * scale; sh[j + 3] = d[3] * scale;
                }
                for (; j < nb; j++) {
                    const float *kl = row_at(k, k_new, l0 + j, L, k_row, k_head, g, K);
                    float a = 0.0f;
                    _Pragma("omp simd reduction(+:a)")
                    for (long c = 0; c < K; c++) a += qh[c] * kl[c];
                    sh[j] = a * scale;
                }
            }
        }
        for (long h = 0; h < H; h++) {               /* the running softmax: rescale where the max grew */
            float *s = sc + h * BLOCK, bm = -INFINITY, add = 0.0f;
            _Pragma("omp simd reduction(max:bm)")
            for (long j = 0; j < nb; j++) bm = s[j] > bm ? s[j] : bm;
            if (bm > m[h]) {
                float f = exp_simd(m[h] - bm), *o = out + h * V;
                den[h] *= f;
                _Pragma("omp simd")
                for (long c = 0; c < V; c++) o[c] *= f;
                m[h] = bm;
            }
            float mh = m[h];
            _Pragma("omp simd reduction(+:add)")
            for (long j = 0; j < nb; j++) { float e = exp_simd(s[j] - mh); s[j] = e; add += e; }
            den[h] += add;
        }
        for (long h = 0; h < H; h++) {               /* the block's values (in cache since its scores): each head's */
            long g = h / rep;                         /* output, four rows per pass (one load and store of it) */
            float *restrict o = out + h * V;
            const float *p = sc + h * BLOCK;
            long j = 0;
            for (; j + 4 <= nb; j += 4) {
                long l = l0 + j;
                const float *restrict v0 = row_at(v, v_new, l, L, v_row, v_head, g, V);
                const float *restrict v1 = row_at(v, v_new, l + 1, L, v_row, v_head, g, V);
                const float *restrict v2 = row_at(v, v_new, l + 2, L, v_row, v_head, g, V);
                const float *restrict v3 = row_at(v, v_new, l + 3, L, v_row, v_head, g, V);
                float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
                _Pragma("omp simd")
                for (long c = 0; c < V; c++) o[c] += ((p0 * v0[c] + p1 * v1[c]) + p2 * v2[c]) + p3 * v3[c];
            }
            for (; j < nb; j++) {
                const float *restrict vl = row_at(v, v_new, l0 + j, L, v_row, v_head, g, V);
                float pj = p[j];
                _Pragma("omp simd")
                for (long c = 0; c < V; c++) o[c] += pj * vl[c];
            }
        }
    }
}

/* attend_part with the head widths of the common models fixed at compile time (loops of known length, the
 * output's channels held in registers over a block), any other widths as they come. */
void attend_part_f32(const float *q, const float *k, const float *v, const float *k_new, const float *v_new,
                     float *work, long H, long G, long K, long V, long L, long r0, long r1,
                     long k_row, long k_head, long v_row, long v_head, float scale) {
#define PART(KK, VV) attend_part(q, k, v, k_new, v_new, work, H, G, KK, VV, L, r0, r1, k_row, k_head, v_row, v_head, scale)
    if (K == 64 && V == 64) PART(64, 64);
    else if (K == 128 && V == 128) PART(128, 128);
    else if (K == 256 && V == 256) PART(256, 256);
    else PART(K, V);
#undef PART
}

/* The parts (``n_parts`` works, ``stride`` floats apart) merged into one softmax, the sinks added to its
 * denominator, normalised into out [H*V]; then, with ``k_dst`` / ``v_dst``, the new entry written into its cache
 * row (heads at k_head / v_head), after every read. */
void attend_finish_f32(const float *works, long n_parts, long stride, const float *sinks, float *out, long H, long V,
                       long G, long K, const float *k_new, const float *v_new, float *k_dst, float *v_dst,
                       long k_head, long v_head) {
    for (long h = 0; h < H; h++) {
        float m = sinks ? sinks[h] : -INFINITY, d = 0.0f, *o = out + h * V;
        for (long p = 0; p < n_parts; p++) m = works[p * stride + h] > m ? works[p * stride + h] : m;
        for (long c = 0; c < V; c++) o[c] = 0.0f;
        for (long p = 0; p < n_parts; p++) {
            const float *w = works + p * stride, *acc = w + 2 * H + h * V;
            if (w[H + h] == 0.0f) continue;          /* a part with no rows */
            float f = exp_simd(w[h] - m);
            d += w[H + h] * f;
            _Pragma("omp simd")
            for (long c = 0; c < V; c++) o[c] += acc[c] * f;
        }
        if (sinks) d += exp_simd(sinks[h] - m);     /* a sink adds exp(sink_h) to the denominator only */
        float inv = 1.0f / d;
        _Pragma("omp simd")
        for (long c = 0; c < V; c++) o[c] *= inv;
    }
    if (k_dst)
        for (long g = 0; g < G; g++) {
            memcpy(k_dst + g * k_head, k_new + g * K, K * sizeof(float));
            memcpy(v_dst + g * v_head, v_new + g * V, V * sizeof(float));
        }
}

void attend_one_f32(const float *q, const float *k, const float *v, const float *k_new, const float *v_new,
                    float *k_dst, float *v_dst, const float *sinks, float *work, float *out, long H, long G, long K,
                    long V, long L, long k_row, long k_head, long v_row, long v_head, float scale) {
    long n = L + (k_new ? 1 : 0);
    attend_part_f32(q, k, v, k_new, v_new, work, H, G, K, V, L, 0, n, k_row, k_head, v_row, v_head, scale);
    attend_finish_f32(work, 1, 0, sinks, out, H, V, G, K, k_new, v_new, k_dst, v_dst, k_head, v_head);
}

/* attend_one_f32 with the rows cut into ``threads`` parts read at once by the threads of the OpenMP runtime (torch's:
 * see storelab.ops.compiled), each into its own work (``threads`` works of attend_work_floats, one after another),
 * then merged. Fewer than 2 BLOCKs of rows per part: one thread. */
void attend_one_threads_f32(const float *q, const float *k, const float *v, const float *k_new, const float *v_new,
                            float *k_dst, float *v_dst, const float *sinks, float *work, float *out, long H, long G,
                            long K, long V, long L, long k_row, long k_head, long v_row, long v_head, float scale,
                            int threads) {
    long n = L + (k_new ? 1 : 0), stride = attend_work_floats(H, V);
    if (threads > n / (2 * BLOCK)) threads = (int)(n / (2 * BLOCK));
    if (threads <= 1) {
        attend_one_f32(q, k, v, k_new, v_new, k_dst, v_dst, sinks, work, out, H, G, K, V, L, k_row, k_head, v_row,
                       v_head, scale);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        long r0 = n * t / threads, r1 = n * (t + 1) / threads;
        r0 -= r0 % BLOCK;                                 /* parts begin on a block, as one thread's would */
        if (t + 1 < threads) r1 -= r1 % BLOCK;
        attend_part_f32(q, k, v, k_new, v_new, work + t * stride, H, G, K, V, L, r0, r1, k_row, k_head, v_row,
                        v_head, scale);
    }
    attend_finish_f32(work, threads, stride, sinks, out, H, V, G, K, k_new, v_new, k_dst, v_dst, k_head, v_head);
}

/* A step's query and key heads, in place in the products' buffer: rows 0..n_q-1 are the query heads, the next n_k
 * the key heads, K channels each. With ``qw`` (``kw``), each query (key) head is RMS-normed over its K channels
 * with those weights, as rms_norm_f32; with R > 0, the first R channels of every head are rotated in halves
 * (rotate-half pairing: channel i < R/2 with i + R/2), by the step's angles cos, sin [R/2]:
 *     y_i = x_i cos_i - x_{i+R/2} sin_i,   y_{i+R/2} = x_{i+R/2} cos_i + x_i sin_i,   the rest as it is. */
void qk_prepare_f32(float *qk, long n_q, long n_k, long K, const float *qw, const float *kw, float eps,
                    long R, const float *cos, const float *sin) {
    long half = R / 2;
    for (long h = 0; h < n_q + n_k; h++) {
        float *x = qk + h * K;
        const float *w = h < n_q ? qw : kw;
        if (w) rms_norm_f32(x, w, x, K, eps);
        for (long i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            x[i] = a * cos[i] - b * sin[i];
            x[i + half] = b * cos[i] + a * sin[i];
        }
    }
}

/* The gated activation of a feed-forward layer, swiglu: out_i = silu(g_i) u_i = g_i / (1 + e^{-g_i}) u_i,
 * g = gu[0..F-1], u = gu[F..2F-1]; e^{-|g|} by exp_simd, in SIMD lanes. */
void silu_mul_f32(const float *gu, float *out, long F) {
    _Pragma("omp simd")
    for (long i = 0; i < F; i++) {
        float g = gu[i], e = exp_simd(g < 0.0f ? g : -g);          /* e^{-|g|} */
        float sig = g < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
        out[i] = (g * sig) * gu[F + i];
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * A run of layers in one call: layer_run_f32.
 *
 * The per-call functions above leave the layer's order to Python: norm, products, read, activation, each a
 * call, each product split between the threads again. Between them the threads wait and Python runs (a SmolLM2
 * step at 2 threads, 2026-12-07: the products 27.5 of 39.6 ms). Here one OpenMP region runs a whole run of
 * pre-norm (or sandwich) layers of attention and a gated FFN, and the threads meet only where a phase needs
 * another's rows (barriers):
 *
 *   x = norm1(h)                      each thread its own copy (D floats: cheaper than a barrier)
 *   q, k, v = Wq x, Wk x, Wv x         the heads cut between the threads; each thread then norms and rotates
 *                                      its own q and k heads and scales its v heads           | barrier
 *   read: rows cut into parts          attend_part over each part                               | barrier
 *   merge the parts, sinks             thread 0; the new entry written into the cache after     | barrier
 *   y = Wo o                           rows cut; h += post1(y) (post1: after a barrier, the
 *                                      norm's sum of squares taken by each thread)              | barrier
 *   x = norm2(h)                       each thread its own copy
 *   g, u = Wg x, Wu x; a = act(g) u    rows of F cut: a thread's gate and up rows are the same  | barrier
 *   y = Wd a, h += post2(y)            as for Wo                                                | barrier
 *
 * then, where a head is given, x = norm(h) and the logits = W_head x, rows cut. The arithmetic is the
 * per-call functions' (the same kernels), so the numbers are theirs.
 * ------------------------------------------------------------------------------------------------------------ */
#ifdef _OPENMP
#include <omp.h>
#endif
#include "matvec_body.h"

MATVEC(static, mv_f32, float, AS_FLOAT, NO_SCALE)
MATVEC(static, mv_bf16, uint16_t, widen_bf16, NO_SCALE)
MATVEC(static, mv_i8, int8_t, AS_FLOAT, ROW_SCALE)

enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_I8 = 2 };
enum { ACT_SWIGLU = 0, ACT_GEGLU_TANH = 1 };

typedef struct {            /* a weight [rows, cols] in its format (storelab.ops.matvec.PackedWeight) */
    const void *w;
    const float *scale;     /* int8: one per row */
    const float *bias;      /* or NULL */
    long rows;
    int fmt;
} weight_t;

typedef struct {            /* a layer: what does not change between steps */
    const float *norm1, *post1, *norm2, *post2;   /* RMSNorm weights (post: sandwich norms, or NULL) */
    float eps1, eps_post1, eps2, eps_post2;
    weight_t q, k, v, o, gate, up, down;
    long H, G, K, V, R, F;   /* heads, key/value heads, widths, rotated channels, FFN width */
    float scale, value_scale, qk_eps;
    const float *qn, *kn;    /* per-head RMSNorm of q and k (K weights), or NULL */
    const float *sinks;      /* [H] or NULL */
    int act;
} layer_t;

typedef struct {            /* a layer: what a step gives it */
    const float *cos, *sin;  /* the rotation's angles [R/2] */
    const float *k, *v;      /* the cache's rows: row l of head g at k + l k_row + g k_head */
    long L, k_row, k_head, v_row, v_head;
    float *k_dst, *v_dst;    /* where the new entry goes, after the read */
} layer_step_t;

static void mv(const weight_t *w, const float *x, float *y, long K, long r0, long r1) {
    if (r1 <= r0) return;
    if (w->fmt == FMT_F32) mv_f32(x, (const float *)w->w, w->scale, y, K, r0, r1);
    else if (w->fmt == FMT_BF16) mv_bf16(x, (const uint16_t *)w->w, w->scale, y, K, r0, r1);
    else mv_i8(x, (const int8_t *)w->w, w->scale, y, K, r0, r1);
    if (w->bias)
        for (long r = r0; r < r1; r++) y[r] += w->bias[r];
}

static inline void cut4(long n, int t, int nth, long *r0, long *r1) {   /* thread t's rows, whole groups of four */
    *r0 = n * t / nth / 4 * 4;
    *r1 = t + 1 < nth ? n * (t + 1) / nth / 4 * 4 : n;
}

static float inv_rms(const float *x, long D, float eps) {
    float ss = 0.0f;
    _Pragma("omp simd reduction(+:ss)")
    for (long i = 0; i < D; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)D + eps);
}

/* h[r0..r1) += y (or post(y), the norm over all D of y), after y is whole */
static void add_residual(float *h, const float *y, const float *post, float eps, long D, long r0, long r1) {
    if (!post) {
        for (long r = r0; r < r1; r++) h[r] = h[r] + y[r];
        return;
    }
    float inv = inv_rms(y, D, eps);
    for (long r = r0; r < r1; r++) h[r] = h[r] + (y[r] * inv) * post[r];
}

/* gelu's tanh form, 0.5 g (1 + tanh(c (g + 0.044715 g^3))), tanh(z) = 1 - 2 / (e^{2z} + 1) by exp_simd */
static void act_mul(const float *g, const float *u, float *a, long f0, long f1, int act) {
    if (act == ACT_SWIGLU) {
        _Pragma("omp simd")
        for (long i = f0; i < f1; i++) {
            float x = g[i], e = exp_simd(x < 0.0f ? x : -x);
            float sig = x < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
            a[i] = (x * sig) * u[i];
        }
    } else {
        _Pragma("omp simd")
        for (long i = f0; i < f1; i++) {
            float x = g[i], z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            float t = 1.0f - 2.0f / (exp_simd(2.0f * z) + 1.0f);
            a[i] = (0.5f * x * (1.0f + t)) * u[i];
        }
    }
}

/* The floats of scratch a run needs at ``threads`` threads (layer_run_f32's ``work``). */
long layer_run_floats(const layer_t *ls, long n, long D, int threads) {
    long most = 0;
    for (long i = 0; i < n; i++) {
        const layer_t *l = ls + i;
        long qkv = (l->H + l->G) * l->K + l->G * l->V;
        long need = qkv + l->H * l->V + D + 3 * l->F + threads * attend_work_floats(l->H, l->V);
        most = need > most ? need : most;
    }
    return threads * D + most;
}

/* Layers ls[0..n) over the residual h [D] (updated in place), one token; with ``head`` (and ``fnorm``), then
 * logits = head(norm(h)). ``work``: layer_run_floats(...) floats. */
void layer_run_f32(const layer_t *ls, const layer_step_t *st, long n, float *h, long D, const float *fnorm,
                   float feps, const weight_t *head, float *logits, float *work, int threads) {
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), nth = omp_get_num_threads();
#else
        int t = 0, nth = 1;
#endif
        float *x = work + t * D;                       /* this thread's normed copy of h */
        float *shared = work + threads * D;
        for (long i = 0; i < n; i++) {
            const layer_t *l = ls + i;
            const layer_step_t *s = st + i;
            long H = l->H, G = l->G, K = l->K, V = l->V, F = l->F;
            float *qkv = shared, *o = qkv + (H + G) * K + G * V, *y = o + H * V, *gu = y + D, *a = gu + 2 * F;
            float *parts = a + F;
            long wf = attend_work_floats(H, V);
            /* norm1 */
            float inv = inv_rms(h, D, l->eps1);
            for (long c = 0; c < D; c++) x[c] = (h[c] * inv) * l->norm1[c];
            /* q, k, v: whole heads per thread, each then normed, rotated, scaled by the thread that made it */
            long U = H + 2 * G, u0 = U * t / nth, u1 = U * (t + 1) / nth;
            for (long u = u0; u < u1; u++) {
                float *dst;
                if (u < H) { dst = qkv + u * K; mv(&l->q, x, qkv, D, u * K, (u + 1) * K); }
                else if (u < H + G) { long g = u - H; dst = qkv + H * K + g * K; mv(&l->k, x, qkv + H * K, D, g * K, (g + 1) * K); }
                else { long g = u - H - G; dst = qkv + (H + G) * K + g * V;
                       mv(&l->v, x, qkv + (H + G) * K, D, g * V, (g + 1) * V);
                       if (l->value_scale != 1.0f) for (long c = 0; c < V; c++) dst[c] *= l->value_scale;
                       continue; }
                const float *nw = u < H ? l->qn : l->kn;
                if (nw) rms_norm_f32(dst, nw, dst, K, l->qk_eps);
                long half = l->R / 2;
                for (long c = 0; c < half; c++) {
                    float p = dst[c], q2 = dst[c + half];
                    dst[c] = p * s->cos[c] - q2 * s->sin[c];
                    dst[c + half] = q2 * s->cos[c] + p * s->sin[c];
                }
            }
#pragma omp barrier
            /* the read: rows cut into parts (as attend_one_threads_f32 cuts them) */
            const float *qp = qkv, *kn = qkv + H * K, *vn = qkv + (H + G) * K;
            long rows = s->L + 1;
            int np = (int)(rows / (2 * BLOCK));
            np = np < 1 ? 1 : np > nth ? nth : np;
            if (t < np) {
                long r0 = rows * t / np, r1 = rows * (t + 1) / np;
                r0 -= r0 % BLOCK;
                if (t + 1 < np) r1 -= r1 % BLOCK;
                attend_part_f32(qp, s->k, s->v, kn, vn, parts + t * wf, H, G, K, V, s->L, r0, r1, s->k_row,
                                s->k_head, s->v_row, s->v_head, l->scale);
            }
#pragma omp barrier
            if (t == 0)
                attend_finish_f32(parts, np, wf, l->sinks, o, H, V, G, K, kn, vn, s->k_dst, s->v_dst, s->k_head,
                                  s->v_head);
#pragma omp barrier
            long r0, r1;
            cut4(D, t, nth, &r0, &r1);
            mv(&l->o, o, y, H * V, r0, r1);
            if (l->post1) {
#pragma omp barrier
            }
            add_residual(h, y, l->post1, l->eps_post1, D, r0, r1);
#pragma omp barrier
            if (F == 0) continue;
            inv = inv_rms(h, D, l->eps2);
            for (long c = 0; c < D; c++) x[c] = (h[c] * inv) * l->norm2[c];
            long f0, f1;
            cut4(F, t, nth, &f0, &f1);
            mv(&l->gate, x, gu, D, f0, f1);
            mv(&l->up, x, gu + F, D, f0, f1);
            act_mul(gu, gu + F, a, f0, f1, l->act);
#pragma omp barrier
            mv(&l->down, a, y, F, r0, r1);
            if (l->post2) {
#pragma omp barrier
            }
            add_residual(h, y, l->post2, l->eps_post2, D, r0, r1);
#pragma omp barrier
        }
        if (head) {
            float inv = inv_rms(h, D, feps);
            for (long c = 0; c < D; c++) x[c] = (h[c] * inv) * fnorm[c];
            long r0, r1;
            cut4(head->rows, t, nth, &r0, &r1);
            mv(head, x, logits, D, r0, r1);
        }
    }
}
