/* One hop of gnnpar's neighbour sampler, fused: draw each frontier node's neighbours and relabel
 * them with the node-mark array in the same pass (see gnnpar/data/sampling/sampler.py).
 *
 * Plain C with no Python or torch headers. setup.py compiles it (-O3, as a shared library named
 * like an extension module, _sampler_kernel.cpython-311-x86_64-linux-gnu.so, though it is never
 * imported) whenever pip installs gnnpar or builds a wheel, and scripts/setup.sh rebuilds it in a
 * checkout; sampling/kernel.py loads it and sampling/sampler.py calls it through ctypes on the
 * tensors' memory, so it does not depend on the torch version or build (CPU or CUDA) the user
 * has. It is integer-only: compiler flags change its speed, never its output.
 *
 * Random numbers: splitmix64 (Steele, Lea and Flood, OOPSLA 2014). Frontier node i of a hop draws
 * from its own stream, seeded by mix64(seed ^ mix64(i + 1)), where `seed` is one 64-bit number
 * the caller draws per hop from its torch.Generator: the same generator seed gives the same
 * batches, and node i's draws do not depend on the other nodes.
 * Integers below m: Lemire's multiply-shift, (r * m) >> 64, bias < m / 2^64.
 * Without replacement: Floyd's algorithm (Bentley and Floyd, CACM 1987): for j = d-k .. d-1 draw
 * t in [0, j]; keep t unless already kept, else keep j. Each k-subset has probability 1/C(d, k),
 * with exactly k draws. Membership: a linear scan for k <= 32, else an open-addressing table.
 */
#include <stdint.h>
#include <string.h>

#define GNNPAR_KERNEL_VERSION 1
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define SCAN_MAX 32
#define PREFETCH 16 /* edges ahead */

int64_t gnnpar_kernel_version(void) { return GNNPAR_KERNEL_VERSION; }

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t next64(uint64_t *s) {
    *s += GOLDEN;
    return mix64(*s);
}

static inline int64_t below(uint64_t *s, uint64_t m) {
    return (int64_t)(((__uint128_t)next64(s) * m) >> 64);
}

/* Size of the open-addressing table for k keys: a power of two >= 2k. */
int64_t gnnpar_table_size(int64_t k) {
    int64_t cap = 1;
    while (cap < 2 * k) cap <<= 1;
    return cap;
}

/* One hop.
 * rowptr, col: incoming CSR (row v lists the sources of v's in-edges); col is int32 when
 *   col32, else int64.
 * frontier[0..n): the nodes to sample for; they have local ids frontier_begin + i.
 * fanout: neighbours per node (-1: all); replace: draw with replacement.
 * local[num_nodes]: local id of every node seen so far in this batch, -1 otherwise; updated.
 * total: number of nodes in the batch so far (the next new node gets local id total).
 * out_row, out_col: local (source, target) of each sampled edge, capacity given by the caller
 *   (n * fanout, or the frontier's total degree for fanout -1).
 * out_new: global ids of the nodes first reached in this hop, in order of first appearance.
 * table: scratch of gnnpar_table_size(fanout) int64 (used only when fanout > SCAN_MAX).
 * Returns the number of sampled edges; *n_new receives the number of new nodes. */
static int64_t sample_hop(const int64_t *rowptr, const void *col, int col32,
                          const int64_t *frontier,
                          int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                          uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                          int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    int64_t e = 0, nn = 0;
    int64_t kept[SCAN_MAX];
    const int64_t cap = fanout > SCAN_MAX ? gnnpar_table_size(fanout) : 0;
    /* Pass 1: positions in col of the sampled edges (into out_row) and their targets. */
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = frontier[i];
        const int64_t start = rowptr[v];
        const int64_t d = rowptr[v + 1] - start;
        const int64_t tgt = frontier_begin + i;
        if (d == 0) continue;
        if (fanout < 0 || (!replace && d <= fanout)) {
            for (int64_t j = 0; j < d; j++) {
                out_row[e] = start + j;
                out_col[e++] = tgt;
            }
            continue;
        }
        uint64_t s = mix64(seed ^ mix64((uint64_t)i + 1));
        if (replace) {
            for (int64_t j = 0; j < fanout; j++) {
                out_row[e] = start + below(&s, (uint64_t)d);
                out_col[e++] = tgt;
            }
        } else if (fanout <= SCAN_MAX) {
            int64_t c = 0;
            for (int64_t j = d - fanout; j < d; j++) {
                int64_t t = below(&s, (uint64_t)j + 1);
                for (int64_t m = 0; m < c; m++) {
                    if (kept[m] == t) {
                        t = j; /* j was never drawable before this step: not kept yet */
                        break;
                    }
                }
                kept[c++] = t;
                out_row[e] = start + t;
                out_col[e++] = tgt;
            }
        } else {
            const uint64_t mask = (uint64_t)(cap - 1);
            memset(table, 0xff, (size_t)cap * sizeof(int64_t)); /* all -1 */
            for (int64_t j = d - fanout; j < d; j++) {
                int64_t t = below(&s, (uint64_t)j + 1);
                uint64_t h = mix64((uint64_t)t) & mask;
                while (table[h] >= 0 && table[h] != t) h = (h + 1) & mask;
                if (table[h] == t) {
                    t = j;
                    h = mix64((uint64_t)t) & mask;
                    while (table[h] >= 0) h = (h + 1) & mask;
                }
                table[h] = t;
                out_row[e] = start + t;
                out_col[e++] = tgt;
            }
        }
    }
    /* Pass 2: read the neighbours (random reads of col, prefetched ahead: the misses overlap)
     * and relabel: a node seen for the first time gets the next local id. */
#define RELABEL(COL)                                                                      \
    for (int64_t k = 0; k < e; k++) {                                                     \
        if (k + PREFETCH < e) __builtin_prefetch((COL) + out_row[k + PREFETCH]);          \
        const int64_t u = (int64_t)(COL)[out_row[k]];                                     \
        int64_t l = local[u];                                                             \
        if (l < 0) {                                                                      \
            l = total + nn;                                                               \
            local[u] = l;                                                                 \
            out_new[nn++] = u;                                                            \
        }                                                                                 \
        out_row[k] = l;                                                                   \
    }
    if (col32) {
        RELABEL((const int32_t *)col)
    } else {
        RELABEL((const int64_t *)col)
    }
#undef RELABEL
    *n_new = nn;
    return e;
}

/* One hop over a CSR whose col is int64 (see sample_hop). */
int64_t gnnpar_sample_hop(const int64_t *rowptr, const int64_t *col, const int64_t *frontier,
                          int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                          uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                          int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    return sample_hop(rowptr, col, 0, frontier, n, frontier_begin, fanout, replace, seed, local,
                      total, out_row, out_col, out_new, n_new, table);
}

/* The same hop over a CSR whose col is int32 (a prepared graph's indices.npy, read in place):
 * the same draws and the same output as gnnpar_sample_hop over the same values. */
int64_t gnnpar_sample_hop32(const int64_t *rowptr, const int32_t *col, const int64_t *frontier,
                            int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                            uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                            int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    return sample_hop(rowptr, col, 1, frontier, n, frontier_begin, fanout, replace, seed, local,
                      total, out_row, out_col, out_new, n_new, table);
}
