/* GAT's edge softmax over a CSR by destination, fused into parallel passes over the rows
 * (gnnpar/models/gat.py, EdgeSoftmax; issue 21).
 *
 * Per layer, torch needs ~12 small operations for the attention weights (two gathers, add,
 * leaky ReLU, segment max, gather, sub, exp, segment sum, gather, div, the dropout product)
 * and as many for their gradient, three of whose backward passes are scatters; segment_reduce
 * and the scatters run on one thread. Here the forward is two passes over the rows (torch's exp
 * between them) and the backward two (over the rows, then over the sources), each one OpenMP
 * loop.
 *
 * The arithmetic is torch's, operation for operation, in torch's order: every value is the
 * result of the same IEEE float operations on the same operands (row sums and scatters add in
 * entry order from 0, as segment_reduce and a one-thread scatter do; the gradient of a / b
 * with respect to b is -g * ((a / b) / b), as autograd computes it), so the results equal the
 * torch path to the bit. exp is left to torch (its vectorised exp is not libm's). Build it
 * without -ffast-math and without FMA contraction (setup.py passes -ffp-contract=off).
 *
 * Plain C with OpenMP; no Python or torch headers. It is loaded with ctypes after torch, so its
 * libgomp.so.1 is torch's own (one thread pool); callers pass torch's thread count.
 * Layouts: a_src [n_src, k], a_dst [n_dst, k], per-entry arrays [E, k], all float32 and
 * contiguous; crow [n_dst + 1], col [E], t_crow [n_src + 1], t_entry [E] int64 (t_entry: the
 * entries of each source in CSR order).
 *
 * The models' dropout masks are drawn here too (gnnpar/models/dropout.py; at the end).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define GNNPAR_GAT_KERNEL_VERSION 4

int64_t gnnpar_gat_kernel_version(void) { return GNNPAR_GAT_KERNEL_VERSION; }

int64_t gnnpar_gat_max_threads(void) {
#ifdef _OPENMP
    extern int omp_get_max_threads(void);
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static inline float leaky(float v, float slope) { return v > 0 ? v : v * slope; }

/* s = a_src[col] + a_dst[row]; d = leaky(s) - max over the row of leaky(s). */
void gnnpar_softmax_logits(const float *a_src, const float *a_dst, const int64_t *crow,
                           const int64_t *col, int64_t n_dst, int64_t k, float slope, float *s,
                           float *d, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n_dst; i++) {
        float top[k];
        for (int64_t h = 0; h < k; h++) top[h] = -INFINITY;
        for (int64_t e = crow[i]; e < crow[i + 1]; e++) {
            const float *src = a_src + col[e] * k;
            for (int64_t h = 0; h < k; h++) {
                float v = src[h] + a_dst[i * k + h];
                s[e * k + h] = v;
                v = leaky(v, slope);
                top[h] = (isnan(v) || v > top[h]) ? v : top[h]; /* NaN wins, as in torch */
            }
        }
        for (int64_t e = crow[i]; e < crow[i + 1]; e++)
            for (int64_t h = 0; h < k; h++)
                d[e * k + h] = leaky(s[e * k + h], slope) - top[h];
    }
}

/* total = (sum over the row of ex) + eps; out = ex / total (* keep, where keep is given). */
void gnnpar_softmax_normalise(const float *ex, const float *keep, const int64_t *crow,
                              int64_t n_dst, int64_t k, float eps, float *total, float *out,
                              int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n_dst; i++) {
        float *t = total + i * k;
        for (int64_t h = 0; h < k; h++) t[h] = 0.0f;
        for (int64_t e = crow[i]; e < crow[i + 1]; e++)
            for (int64_t h = 0; h < k; h++) t[h] = t[h] + ex[e * k + h];
        for (int64_t h = 0; h < k; h++) t[h] = t[h] + eps;
        for (int64_t e = crow[i]; e < crow[i + 1]; e++)
            for (int64_t h = 0; h < k; h++) {
                float a = ex[e * k + h] / t[h];
                out[e * k + h] = keep ? a * keep[e * k + h] : a;
            }
    }
}

/* The gradient of the above with respect to s (grad_s, [E, k]) and a_dst (its row sums). */
void gnnpar_softmax_backward(const float *grad, const float *keep, const float *s,
                             const float *ex, const float *total, const int64_t *crow,
                             int64_t n_dst, int64_t k, float slope, float *grad_s,
                             float *grad_a_dst, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n_dst; i++) {
        const float *t = total + i * k;
        float g_total[k];
        float *g_dst = grad_a_dst + i * k;
        for (int64_t h = 0; h < k; h++) g_total[h] = 0.0f;
        for (int64_t e = crow[i]; e < crow[i + 1]; e++)
            for (int64_t h = 0; h < k; h++) {
                float g = keep ? grad[e * k + h] * keep[e * k + h] : grad[e * k + h];
                g_total[h] = g_total[h] + -g * ((ex[e * k + h] / t[h]) / t[h]);
            }
        for (int64_t h = 0; h < k; h++) g_dst[h] = 0.0f;
        for (int64_t e = crow[i]; e < crow[i + 1]; e++)
            for (int64_t h = 0; h < k; h++) {
                float g = keep ? grad[e * k + h] * keep[e * k + h] : grad[e * k + h];
                float g_ex = g / t[h] + g_total[h];
                float g_d = g_ex * ex[e * k + h];
                float g_s = s[e * k + h] > 0 ? g_d : g_d * slope;
                grad_s[e * k + h] = g_s;
                g_dst[h] = g_dst[h] + g_s;
            }
    }
}

/* out[j] = the sum of grad_s over source j's entries, in CSR order (a scatter by col). */
void gnnpar_sum_by_source(const float *grad_s, const int64_t *t_crow, const int64_t *t_entry,
                          int64_t n_src, int64_t k, float *out, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t j = 0; j < n_src; j++) {
        float *o = out + j * k;
        for (int64_t h = 0; h < k; h++) o[h] = 0.0f;
        for (int64_t p = t_crow[j]; p < t_crow[j + 1]; p++)
            for (int64_t h = 0; h < k; h++) o[h] = o[h] + grad_s[t_entry[p] * k + h];
    }
}

/* out[e] = g[row of e] * x[col[e]] elementwise, m floats per row (the products of the weighted
 * sum's gradient with respect to the attention weights; torch sums them over the channels). */
void gnnpar_edge_products(const float *g, const float *x, const int64_t *crow, const int64_t *col,
                          int64_t n_dst, int64_t m, float *out, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n_dst; i++)
        for (int64_t e = crow[i]; e < crow[i + 1]; e++) {
            const float *gi = g + i * m, *xj = x + col[e] * m;
            float *o = out + e * m;
            for (int64_t q = 0; q < m; q++) o[q] = gi[q] * xj[q];
        }
}


/* ------------------------------------------------------------------------------------------
 * Dropout masks (gnnpar/models/dropout.py; issue 21).
 *
 * Element i is dropped with probability P / 2^40 (P = round(p * 2^40)): its uniform variate is
 * the 40-bit number (byte_i << 32 | v_i), compared with P. byte_i is byte i % 8 of
 * splitmix64(seed + (i / 8 + 1) * GAMMA), so one 64-bit hash serves 8 elements; v_i, the low 32
 * bits of splitmix64(~seed + (i + 1) * GAMMA), is computed only when byte_i alone cannot decide
 * (byte_i == P >> 32, one element in 256). torch.rand's masks resolve p to 2^-24 and cost one
 * mt19937 draw and a float conversion per element; these resolve it to 2^-40 for ~1/8 of a hash.
 * The masks are a function of (seed, i) only: the same for any number of threads, on any
 * machine, and equal to dropout.py's torch fallback, which computes the same hashes.
 */
#define GNNPAR_GAMMA 0x9e3779b97f4a7c15ULL

static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* the keep flags (0 or 1) of elements [8b, 8b + m), m <= 8 */
static inline void keep_block(uint64_t seed, uint64_t t, uint64_t f, int64_t b, int m,
                              uint8_t *k) {
    uint64_t h = splitmix64(seed + (uint64_t)(b + 1) * GNNPAR_GAMMA);
    for (int j = 0; j < 8; j++) k[j] = ((h >> (8 * j)) & 0xff) > t;
    for (int j = 0; j < m; j++)
        if (__builtin_expect(((h >> (8 * j)) & 0xff) == t, 0))
            k[j] = (splitmix64(~seed + (uint64_t)(b * 8 + j + 1) * GNNPAR_GAMMA) &
                    0xffffffffULL) >= f;
}

/* The masks of elements 0..n-1, written where asked (a pointer may be NULL):
 *   out[i] = (x[i] * scale) * keep_i   (the dropout of x, float32),
 *   out[i] = scale * keep_i            (x NULL: the dropout factors of the attention weights),
 *   keep[i] = keep_i                   (0 or 1, the mask itself). */
void gnnpar_dropout(const float *x, float *out, uint8_t *keep, int64_t n, uint64_t seed,
                    uint64_t p40, float scale, int64_t threads) {
    const uint64_t t = p40 >> 32, f = p40 & 0xffffffffULL;
    const int64_t blocks = (n + 7) / 8;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t b = 0; b < blocks; b++) {
        int m = n - b * 8 < 8 ? (int)(n - b * 8) : 8;
        uint8_t k[8];
        keep_block(seed, t, f, b, m, k);
        float *ob = out ? out + b * 8 : NULL;
        if (ob && x)
            for (int j = 0; j < m; j++) ob[j] = (x[b * 8 + j] * scale) * (float)k[j];
        else if (ob)
            for (int j = 0; j < m; j++) ob[j] = scale * (float)k[j];
        if (keep)
            for (int j = 0; j < m; j++) keep[b * 8 + j] = k[j];
    }
}

/* grad_in[i] = (grad[i] * scale) * keep[i]: gnnpar_dropout's backward; i < n */
void gnnpar_dropout_backward_f32(const float *grad, const uint8_t *keep, float *grad_in,
                                 int64_t n, float scale, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) grad_in[i] = (grad[i] * scale) * (float)keep[i];
}

/* ------------------------------------------------------------------------------------------
 * A CSR's transpose (gnnpar/models/gat_kernel.py, order_by_key): the entries ordered by their
 * key (a column), stably, by counting: O(e + n) where a comparison sort is O(e log e).
 * key[i] in [0, n) (checked by the caller); ptr [n + 1] receives each key's offsets, next [n]
 * is scratch, order [e] receives the entries of key 0 in index order, then key 1's, ...
 */
void gnnpar_order_by_key(const int64_t *key, int64_t e, int64_t n, int64_t *ptr, int64_t *next,
                         int64_t *order) {
    for (int64_t k = 0; k <= n; k++) ptr[k] = 0;
    for (int64_t i = 0; i < e; i++) ptr[key[i] + 1]++;
    for (int64_t k = 0; k < n; k++) {
        ptr[k + 1] += ptr[k];
        next[k] = ptr[k];
    }
    for (int64_t i = 0; i < e; i++) order[next[key[i]]++] = i;
}
