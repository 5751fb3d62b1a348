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
        for (long j = 0; j < nb; j++) {              /* the block's scores, each key row read once */
            long l = l0 + j;
            if (l + AHEAD < r1 && l + AHEAD < L)      /* the rows a few ahead asked from memory now */
                for (long g = 0; g < G; g++) {
                    const char *pk = (const char *)(k + (l + AHEAD) * k_row + g * k_head);
                    const char *pv = (const char *)(v + (l + AHEAD) * v_row + g * v_head);
                    for (long b = 0; b < K * 4; b += 64) __builtin_prefetch(pk + b, 0, 3);
                    for (long b = 0; b < V * 4; b += 64) __builtin_prefetch(pv + b, 0, 3);
                }
            for (long g = 0; g < G; g++) {
                const float *kl = l < L ? k + l * k_row + g * k_head : k_new + g * K;
                for (long r = 0; r < rep; r++) {
                    const float *qh = q + (g * rep + r) * K;
                    float s = 0.0f;
                    _Pragma("omp simd reduction(+:s)")
                    for (long c = 0; c < K; c++) s += qh[c] * kl[c];
                    sc[(g * rep + r) * BLOCK + j] = s * scale;
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
            long g = h / rep;                         /* output summed over the block, then stored once */
            float *restrict o = out + h * V;
            const float *p = sc + h * BLOCK;
            for (long j = 0; j < nb; j++) {
                long l = l0 + j;
                const float *restrict vl = l < L ? v + l * v_row + g * v_head : v_new + g * V;
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
