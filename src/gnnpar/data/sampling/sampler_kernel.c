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
 * from its own stream, seeded by mix64(seed ^ mix64(key_i + 1)), where `seed` is one 64-bit
 * number the caller draws per hop from its torch.Generator and key_i is the node's ORIGINAL id
 * (keys[i]; the node id itself when keys is NULL): the same generator seed gives the same
 * batches, a node's draws depend neither on the other nodes nor on its place in the frontier,
 * and whichever process samples a node (the owner of its shard, gnnpar.data.sampling.
 * distributed) draws the same neighbours as one process over the unsharded graph.
 * Integers below m: Lemire's multiply-shift, (r * m) >> 64, bias < m / 2^64.
 * Without replacement: Floyd's algorithm (Bentley and Floyd, CACM 1987): for j = d-k .. d-1 draw
 * t in [0, j]; keep t unless already kept, else keep j. Each k-subset has probability 1/C(d, k),
 * with exactly k draws. Membership: a linear scan for k <= 32, else an open-addressing table.
 *
 * gnnpar_visit_hop (the feature cache's ranking, gnnpar/data/visits.py) is the one part in
 * floating point: a multiply, a division and floor per row, then sums of whole numbers below
 * 2^53 (exact in any order); built without FMA contraction (setup.py), it gives numpy's bits.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GNNPAR_KERNEL_VERSION 4
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

/* Pass 1 of a hop: positions in col of the sampled in-edges of rows[0..n) (into out_pos) and
 * the index i of the row each belongs to plus tgt_base (into out_tgt), rows in order.
 * keys: the stream key of each row (its original node id); NULL: rows[i] itself.
 * fanout: neighbours per node (-1: all); replace: draw with replacement.
 * table: scratch of gnnpar_table_size(fanout) int64 (used only when fanout > SCAN_MAX).
 * Returns the number of sampled edges. */
static int64_t draw_hop(const int64_t *rowptr, const int64_t *rows, const int64_t *keys,
                        int64_t n, int64_t tgt_base, int64_t fanout, int64_t replace,
                        uint64_t seed, int64_t *out_pos, int64_t *out_tgt, int64_t *table) {
    int64_t e = 0;
    int64_t kept[SCAN_MAX];
    const int64_t cap = fanout > SCAN_MAX ? gnnpar_table_size(fanout) : 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = rows[i];
        const int64_t start = rowptr[v];
        const int64_t d = rowptr[v + 1] - start;
        const int64_t tgt = tgt_base + i;
        if (d == 0) continue;
        if (fanout < 0 || (!replace && d <= fanout)) {
            for (int64_t j = 0; j < d; j++) {
                out_pos[e] = start + j;
                out_tgt[e++] = tgt;
            }
            continue;
        }
        const uint64_t key = (uint64_t)(keys ? keys[i] : v);
        uint64_t s = mix64(seed ^ mix64(key + 1));
        if (replace) {
            for (int64_t j = 0; j < fanout; j++) {
                out_pos[e] = start + below(&s, (uint64_t)d);
                out_tgt[e++] = tgt;
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
                out_pos[e] = start + t;
                out_tgt[e++] = tgt;
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
                out_pos[e] = start + t;
                out_tgt[e++] = tgt;
            }
        }
    }
    return e;
}

/* Relabel e neighbours given by reader(k) with the node-mark array: a node seen for the first
 * time gets the next local id (total + count so far) and is appended to out_new; out_row[k]
 * receives the local id of neighbour k. Returns the number of new nodes. */
#define RELABEL(READ)                                                                     \
    for (int64_t k = 0; k < e; k++) {                                                     \
        const int64_t u = (READ);                                                         \
        int64_t l = local[u];                                                             \
        if (l < 0) {                                                                      \
            l = total + nn;                                                               \
            local[u] = l;                                                                 \
            out_new[nn++] = u;                                                            \
        }                                                                                 \
        out_row[k] = l;                                                                   \
    }

/* One hop.
 * rowptr, col: incoming CSR (row v lists the sources of v's in-edges); col is int32 when
 *   col32, else int64.
 * frontier[0..n): the nodes to sample for; they have local ids frontier_begin + i.
 * keys: their original ids (the streams' keys); NULL: the frontier's ids are the original ones.
 * fanout: neighbours per node (-1: all); replace: draw with replacement.
 * local[num_nodes]: local id of every node seen so far in this batch, -1 otherwise; updated.
 * total: number of nodes in the batch so far (the next new node gets local id total).
 * out_row, out_col: local (source, target) of each sampled edge, capacity given by the caller
 *   (n * fanout, or the frontier's total degree for fanout -1).
 * out_new: global ids of the nodes first reached in this hop, in order of first appearance.
 * table: scratch of gnnpar_table_size(fanout) int64 (used only when fanout > SCAN_MAX).
 * Returns the number of sampled edges; *n_new receives the number of new nodes. */
static int64_t sample_hop(const int64_t *rowptr, const void *col, int col32,
                          const int64_t *frontier, const int64_t *keys,
                          int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                          uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                          int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    int64_t nn = 0;
    /* Pass 1: positions in col of the sampled edges (into out_row) and their targets. */
    const int64_t e = draw_hop(rowptr, frontier, keys, n, frontier_begin, fanout, replace, seed,
                               out_row, out_col, table);
    /* Pass 2: read the neighbours (random reads of col, prefetched ahead: the misses overlap)
     * and relabel: a node seen for the first time gets the next local id. */
#define PREFETCHED(COL) \
    ((k + PREFETCH < e ? __builtin_prefetch((COL) + out_row[k + PREFETCH]) : (void)0), \
     (int64_t)(COL)[out_row[k]])
    if (col32) {
        const int32_t *c = (const int32_t *)col;
        RELABEL(PREFETCHED(c))
    } else {
        const int64_t *c = (const int64_t *)col;
        RELABEL(PREFETCHED(c))
    }
#undef PREFETCHED
    *n_new = nn;
    return e;
}

/* One hop over a CSR whose col is int64 (see sample_hop). */
int64_t gnnpar_sample_hop(const int64_t *rowptr, const int64_t *col, const int64_t *frontier,
                          const int64_t *keys, int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                          uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                          int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    return sample_hop(rowptr, col, 0, frontier, keys, n, frontier_begin, fanout, replace, seed, local,
                      total, out_row, out_col, out_new, n_new, table);
}

/* The same hop over a CSR whose col is int32 (a prepared graph's indices.npy, read in place):
 * the same draws and the same output as gnnpar_sample_hop over the same values. */
int64_t gnnpar_sample_hop32(const int64_t *rowptr, const int32_t *col, const int64_t *frontier,
                            const int64_t *keys, int64_t n, int64_t frontier_begin, int64_t fanout, int64_t replace,
                            uint64_t seed, int64_t *local, int64_t total, int64_t *out_row,
                            int64_t *out_col, int64_t *out_new, int64_t *n_new, int64_t *table) {
    return sample_hop(rowptr, col, 1, frontier, keys, n, frontier_begin, fanout, replace, seed, local,
                      total, out_row, out_col, out_new, n_new, table);
}

/* The owner's half of a hop over its shard (gnnpar.data.sampling.distributed): for rows[0..n)
 * (row indices of the shard's CSR) with stream keys keys[0..n) (their original ids), the same
 * draws as sample_hop, without relabelling: out_tgt[k] the index i of the row of sampled edge k,
 * out_nbr[k] its source (a global id, as col holds it). col is int32 when col32. Returns the
 * number of sampled edges (capacity as sample_hop's). */
int64_t gnnpar_draw_hop(const int64_t *rowptr, const void *col, int64_t col32,
                        const int64_t *rows, const int64_t *keys, int64_t n, int64_t fanout,
                        int64_t replace, uint64_t seed, int64_t *out_tgt, int64_t *out_nbr,
                        int64_t *table) {
    const int64_t e = draw_hop(rowptr, rows, keys, n, 0, fanout, replace, seed, out_nbr, out_tgt,
                               table);
    if (col32) {
        const int32_t *c = (const int32_t *)col;
        for (int64_t k = 0; k < e; k++) {
            if (k + PREFETCH < e) __builtin_prefetch(c + out_nbr[k + PREFETCH]);
            out_nbr[k] = (int64_t)c[out_nbr[k]];
        }
    } else {
        const int64_t *c = (const int64_t *)col;
        for (int64_t k = 0; k < e; k++) {
            if (k + PREFETCH < e) __builtin_prefetch(c + out_nbr[k + PREFETCH]);
            out_nbr[k] = c[out_nbr[k]];
        }
    }
    return e;
}

/* The requester's half: relabel nbr[0..e) (global ids, the hop's sampled sources in frontier
 * order) with the node-mark array, as sample_hop's second pass does. out_row[k]: local id of
 * nbr[k]; out_new: nodes first reached, in order of first appearance. Returns their number. */
int64_t gnnpar_relabel(const int64_t *nbr, int64_t e, int64_t *local, int64_t total,
                       int64_t *out_row, int64_t *out_new) {
    int64_t nn = 0;
    RELABEL(nbr[k])
    return nn;
}

/* ------------------------------------------------------------------ rows read from a file
 * gnnpar_pread_rows: rows[0..n) (ascending) of a row-major array stored at byte `base` of the
 * file `fd`, row_bytes each, copied to out[i * row_bytes], by `threads` threads at once.
 *
 * Why: a memory-mapped gather takes one page fault at a time, and each fault either waits for
 * one page (MADV_RANDOM: the disk at queue depth 1) or reads the device's whole read-ahead
 * window around it (8 MiB on a virtio disk: at papers100m 0.1 every step re-read most of the
 * 5.7 GB file). Here many threads each wait for their own small reads, so the disk sees a deep
 * queue of exactly the blocks the batch needs. Rows whose bytes lie within `gap` of the previous
 * row's are read with it in one call (at most SPAN_MAX bytes). With `align` > 1 (a descriptor
 * opened with O_DIRECT: the page cache is bypassed, nothing is charged to a memory cgroup, no
 * page needs reclaiming first) every read is widened to `align`-aligned offsets and lengths,
 * into a buffer aligned to `align`. Returns 0, or
 * the errno of the first read that failed (EIO for a file shorter than a row's end). */
#define SPAN_MAX (256 * 1024)
#define ROWS_PER_TAKE 64

typedef struct {
    int fd;
    int64_t base, row_bytes, align, gap, n;
    const int64_t *rows;
    char *out;
    int64_t next; /* the next row to take, shared */
    int err;
} pread_job;

static int read_span(const pread_job *j, char *buf, int64_t lo_row, int64_t hi_row,
                     int64_t first, int64_t last) {
    /* rows[first..last] lie in [lo_row, hi_row] (row numbers); read them and copy them out */
    int64_t off = j->base + lo_row * j->row_bytes;
    int64_t end = j->base + (hi_row + 1) * j->row_bytes;
    int64_t a = j->align > 1 ? j->align : 1;
    int64_t lo = off - off % a, hi = end + (a - end % a) % a;
    int64_t got = 0;
    while (got < end - lo) {
        ssize_t r = pread(j->fd, buf + got, (size_t)(hi - lo - got), lo + got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) return EIO;
        got += r;
        if (a > 1 && got % a) break; /* a short direct read: only at the file's end */
    }
    if (got < end - lo) return EIO;
    for (int64_t i = first; i <= last; i++)
        memcpy(j->out + i * j->row_bytes, buf + (off - lo) + (j->rows[i] - lo_row) * j->row_bytes,
               (size_t)j->row_bytes);
    return 0;
}

static void *pread_worker(void *arg) {
    pread_job *j = (pread_job *)arg;
    int64_t cap = SPAN_MAX > 2 * j->row_bytes + 2 * j->align ? SPAN_MAX
                                                              : 2 * j->row_bytes + 2 * j->align;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, j->align > 64 ? (size_t)j->align : 64, (size_t)cap)) {
        __atomic_store_n(&j->err, ENOMEM, __ATOMIC_RELAXED);
        return NULL;
    }
    for (;;) {
        int64_t s = __atomic_fetch_add(&j->next, ROWS_PER_TAKE, __ATOMIC_RELAXED);
        if (s >= j->n || __atomic_load_n(&j->err, __ATOMIC_RELAXED)) break;
        int64_t e = s + ROWS_PER_TAKE < j->n ? s + ROWS_PER_TAKE : j->n;
        int64_t first = s;
        while (first < e) {
            int64_t last = first, lo = j->rows[first];
            while (last + 1 < e) {
                int64_t nxt = j->rows[last + 1];
                int64_t gap = (nxt - j->rows[last] - 1) * j->row_bytes;
                int64_t span = (nxt - lo + 1) * j->row_bytes + 2 * j->align;
                if (gap > j->gap || span > cap) break;
                last++;
            }
            int err = read_span(j, buf, lo, j->rows[last], first, last);
            if (err) {
                __atomic_store_n(&j->err, err, __ATOMIC_RELAXED);
                break;
            }
            first = last + 1;
        }
    }
    free(buf);
    return NULL;
}

int64_t gnnpar_pread_rows(int64_t fd, int64_t base, int64_t row_bytes, const int64_t *rows,
                          int64_t n, char *out, int64_t threads, int64_t align, int64_t gap) {
    pread_job j = {(int)fd, base, row_bytes, align, gap, n, rows, out, 0, 0};
    if (n <= 0) return 0;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (threads > (n + ROWS_PER_TAKE - 1) / ROWS_PER_TAKE)
        threads = (n + ROWS_PER_TAKE - 1) / ROWS_PER_TAKE;
    pthread_t tid[256];
    int64_t started = 0;
    for (int64_t t = 1; t < threads; t++, started++)
        if (pthread_create(&tid[t], NULL, pread_worker, &j)) break;
    pread_worker(&j); /* the calling thread takes rows too */
    for (int64_t t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    return j.err;
}

/* One hop of the expected-visits estimate over CSR rows [0, rows) (gnnpar.data.visits._propagate,
 * the same arithmetic): each row t, of degree d, sends w = floor(v[t] * p) to each of its sources,
 * p = fanout / max(d, max(fanout, 1)) (1 for fanout < 0); went[t] = w; with share non-NULL, each
 * source also gets floor(p * share_unit). nxt and share are over the whole graph's ids (col's),
 * v and went over the rows. */
int64_t gnnpar_visit_hop(const int64_t *rowptr, const void *col, int64_t col32, int64_t rows,
                         const double *v, int64_t fanout, double share_unit, double *nxt,
                         double *went, double *share) {
    const int32_t *c32 = (const int32_t *)col;
    const int64_t *c64 = (const int64_t *)col;
    int64_t least = fanout > 1 ? fanout : 1;
    for (int64_t t = 0; t < rows; t++) {
        int64_t lo = rowptr[t], hi = rowptr[t + 1], d = hi - lo;
        double p = fanout < 0 ? 1.0 : (double)fanout / (double)(d > least ? d : least);
        double w = floor(v[t] * p);
        went[t] = w;
        if (share != NULL) {
            double sp = floor(p * share_unit);
            for (int64_t e = lo; e < hi; e++)
                share[col32 ? (int64_t)c32[e] : c64[e]] += sp;
        }
        if (w > 0)
            for (int64_t e = lo; e < hi; e++)
                nxt[col32 ? (int64_t)c32[e] : c64[e]] += w;
    }
    return 0;
}
