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
 * The models' dropout masks are drawn here too (gnnpar/models/dropout.py), and the CSR x dense
 * products of GCN, trimmed SAGE and GAT (gat_kernel.py, csr_mm; at the end).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define GNNPAR_GAT_KERNEL_VERSION 6

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

/* Elements are drawn in chunks of DROPOUT_CHUNK blocks (8 elements each), in three passes
 * over a chunk that the compiler vectorises apart from the hashes: the hashes' bytes, the
 * comparisons with t, then the products; the rare blocks with a byte equal to t (one in ~32,
 * found with a test for a zero byte) are decided afterwards from their 32 extra bits. */
#define DROPOUT_CHUNK 256
#define BYTES_01 0x0101010101010101ULL
#define BYTES_80 0x8080808080808080ULL

/* The masks of elements 0..n-1, written where asked (a pointer may be NULL):
 *   out[i] = (x[i] * scale) * keep_i   (the dropout of x, float32),
 *   out[i] = scale * keep_i            (x NULL: the dropout factors of the attention weights),
 *   keep[i] = keep_i                   (0 or 1, the mask itself). */
void gnnpar_dropout(const float *x, float *out, uint8_t *keep, int64_t n, uint64_t seed,
                    uint64_t p40, float scale, int64_t threads) {
    const uint64_t t = p40 >> 32, f = p40 & 0xffffffffULL;
    const int64_t blocks = (n + 7) / 8;
    const int64_t chunks = (blocks + DROPOUT_CHUNK - 1) / DROPOUT_CHUNK;
    const uint8_t tb = t > 255 ? 255 : (uint8_t)t;
    const uint64_t tie = BYTES_01 * tb;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t c = 0; c < chunks; c++) {
        uint8_t bytes[DROPOUT_CHUNK * 8], flags[DROPOUT_CHUNK * 8];
        int64_t tied[DROPOUT_CHUNK];
        int nt = 0;
        const int64_t b0 = c * DROPOUT_CHUNK;
        const int64_t b1 = b0 + DROPOUT_CHUNK < blocks ? b0 + DROPOUT_CHUNK : blocks;
        const int64_t i0 = b0 * 8, len = (b1 * 8 < n ? b1 * 8 : n) - i0;
        for (int64_t b = b0; b < b1; b++) {
            const uint64_t h = splitmix64(seed + (uint64_t)(b + 1) * GNNPAR_GAMMA), v = h ^ tie;
            for (int j = 0; j < 8; j++) bytes[(b - b0) * 8 + j] = (uint8_t)(h >> (8 * j));
            if ((v - BYTES_01) & ~v & BYTES_80) tied[nt++] = b; /* some byte equals t */
        }
        uint8_t *k = keep ? keep + i0 : flags;
        if (t > 255) /* p rounds to 1: every element dropped */
            for (int64_t i = 0; i < len; i++) k[i] = 0;
        else {
            for (int64_t i = 0; i < len; i++) k[i] = bytes[i] > tb;
            for (int q = 0; q < nt; q++)
                for (int64_t i = tied[q] * 8 - i0; i < tied[q] * 8 - i0 + 8 && i < len; i++)
                    if (bytes[i] == tb)
                        k[i] = (splitmix64(~seed + (uint64_t)(i0 + i + 1) * GNNPAR_GAMMA) &
                                0xffffffffULL) >= f;
        }
        if (out && x) {
            const float *xc = x + i0;
            float *oc = out + i0;
            for (int64_t i = 0; i < len; i++) oc[i] = (xc[i] * scale) * (float)k[i];
        } else if (out) {
            float *oc = out + i0;
            for (int64_t i = 0; i < len; i++) oc[i] = scale * (float)k[i];
        }
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

/* ------------------------------------------------------------------------------------------
 * CSR x dense products (gnnpar/models/gat_kernel.py, csr_mm; issue 21): out = A @ h for a CSR
 * A [n, *] (crow [n + 1], col, val) and a row-major float32 h [*, m]:
 *
 *     out[i, q] = (...((0 + val[e0] * h[col[e0], q]) + val[e1] * h[col[e1], q]) + ...)
 *
 * over row i's entries e0, e1, ... in CSR order: each product rounded, then added in entry
 * order from zero, as PyG's message passing computes it (the messages, then a one-thread
 * scatter-add). No element's sum is split or reassociated, so the vector width changes the
 * speed and never a bit: the SSE2, AVX2 and AVX-512 builds below return the same floats on
 * every x86-64 CPU (MKL's sparse product, which torch.sparse.mm calls, rounds otherwise, and
 * differently by CPU). A row's columns are taken in vectors of W floats, four vectors (four
 * independent sums) per pass over its entries; the last vector of a row whose width is not a
 * multiple of W is placed to end at m, overlapping the one before it (the overlapped floats are
 * computed twice, identically).
 */
typedef float gp_vf16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef float gp_vf8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef float gp_vf4 __attribute__((vector_size(16), aligned(4), may_alias));
#define GP_LOAD(V, p) (*(const V *)(p))
#define GP_STORE(V, p, a) (*(V *)(p) = (a))

/* one pass over a row's entries for N (1-4) vectors of type V at column offsets q0..q3 */
#define GP_PASS(V, N, q0, q1, q2, q3)                                                          \
    do {                                                                                       \
        V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                              \
        for (int64_t e = e0; e < e1; e++) {                                                    \
            const float v = val[e];                                                            \
            const float *hj = h + col[e] * m;                                                  \
            a0 = a0 + v * GP_LOAD(V, hj + (q0));                                               \
            if ((N) > 1) a1 = a1 + v * GP_LOAD(V, hj + (q1));                                  \
            if ((N) > 2) a2 = a2 + v * GP_LOAD(V, hj + (q2));                                  \
            if ((N) > 3) a3 = a3 + v * GP_LOAD(V, hj + (q3));                                  \
        }                                                                                      \
        GP_STORE(V, o + (q0), a0);                                                             \
        if ((N) > 1) GP_STORE(V, o + (q1), a1);                                                \
        if ((N) > 2) GP_STORE(V, o + (q2), a2);                                                \
        if ((N) > 3) GP_STORE(V, o + (q3), a3);                                                \
    } while (0)

/* a row's m >= W columns in vectors of W floats, the last one ending at m */
#define GP_ROW(V, W)                                                                           \
    do {                                                                                       \
        const int64_t nv = (m + (W) - 1) / (W);                                                \
        for (int64_t k = 0; k < nv; k += 4) {                                                  \
            int64_t q[4];                                                                      \
            for (int j = 0; j < 4; j++) q[j] = k + j < nv - 1 ? (k + j) * (W) : m - (W);       \
            switch (nv - k < 4 ? nv - k : 4) {                                                 \
            case 4: GP_PASS(V, 4, q[0], q[1], q[2], q[3]); break;                              \
            case 3: GP_PASS(V, 3, q[0], q[1], q[2], q[2]); break;                              \
            case 2: GP_PASS(V, 2, q[0], q[1], q[1], q[1]); break;                              \
            default: GP_PASS(V, 1, q[0], q[0], q[0], q[0]);                                    \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#define GP_CSR_MM(NAME, V, W, ATTR)                                                            \
    ATTR static void NAME(const int64_t *crow, const int64_t *col, const float *val,           \
                          const float *h, int64_t n, int64_t m, float *out, int64_t threads) {   \
        _Pragma("omp parallel for schedule(guided) num_threads(threads) if (threads > 1)")     \
        for (int64_t i = 0; i < n; i++) {                                                      \
            const int64_t e0 = crow[i], e1 = crow[i + 1];                                      \
            float *o = out + i * m;                                                            \
            if (m >= (W))                                                                      \
                GP_ROW(V, W);                                                                  \
            else if (m >= 4)                                                                   \
                GP_ROW(gp_vf4, 4);                                                             \
            else                                                                               \
                for (int64_t c = 0; c < m; c++) {                                              \
                    float a = 0.0f;                                                            \
                    for (int64_t e = e0; e < e1; e++) a = a + val[e] * h[col[e] * m + c];      \
                    o[c] = a;                                                                  \
                }                                                                              \
        }                                                                                      \
    }

GP_CSR_MM(csr_mm_base, gp_vf4, 4, )
#if defined(__x86_64__) && defined(__GNUC__)
GP_CSR_MM(csr_mm_avx2, gp_vf8, 8, __attribute__((target("avx2"))))
GP_CSR_MM(csr_mm_avx512, gp_vf16, 16, __attribute__((target("avx512f"))))
#endif

/* the widest build this CPU runs: 2 AVX-512, 1 AVX2, 0 the baseline */
int64_t gnnpar_csr_mm_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

/* out [n, m] = A @ h with the build of ``level`` (at most gnnpar_csr_mm_level()) */
void gnnpar_csr_mm(const int64_t *crow, const int64_t *col, const float *val, const float *h,
                   int64_t n, int64_t m, float *out, int64_t threads, int64_t level) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (level >= 2) {
        csr_mm_avx512(crow, col, val, h, n, m, out, threads);
        return;
    }
    if (level == 1) {
        csr_mm_avx2(crow, col, val, h, n, m, out, threads);
        return;
    }
#endif
    (void)level;
    csr_mm_base(crow, col, val, h, n, m, out, threads);
}
