"""Node partitions for Cluster-GCN mini-batches (Chiang et al., KDD 2019; study 003 algorithm 2).

A graph is split into ``n`` parts; mini-batch ``p`` is the subgraph induced by part ``p`` (edges
between parts are dropped). Two partitioners:

* ``random`` (study 003 algorithm 2): every node goes to a part uniformly at random (a seeded
  permutation split evenly, so part sizes differ by at most one).
* ``metis`` (Cluster-GCN's choice): pymetis' k-way partition minimising the edge cut. METIS needs
  an undirected simple graph, so it gets the symmetric closure of ``edge_index`` without
  self-loops or duplicates (directed inputs, self-loops and isolated nodes such as CiteSeer's 48
  are all fine; an isolated node just goes wherever balance puts it).

One sort by part builds every mini-batch at once (no per-node or per-part scan of the edges):
nodes are ordered by part, so part ``p`` is the row range ``node_ptr[p]:node_ptr[p+1]`` of the
reordered features, and intra-part edges, sorted by destination, are the column range
``edge_ptr[p]:edge_ptr[p+1]`` of one local ``edge_index``. Each batch is a set of views into these
tensors. They are cached on disk and memory-mapped, so the ranks of one machine share one copy of
the reordered graph (study 003 likewise stores the partitioned subgraphs once and excludes the
partition time from the training time).

    gnnpar train --dataset citeseer --model gcn --partitions 8 --partitioner metis
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse
import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from gnnpar.data.cache import (
    TMP_MARK,
    brief,
    check_file,
    load_tensors,
    remove_stale_temporaries,
    save_tensors,
)
from gnnpar.data.filelock import DEFAULT_LOCK_TIMEOUT_S, exclusive_lock
from gnnpar.errors import UsageError

if TYPE_CHECKING:
    from gnnpar.data.types import GraphDataset

FORMAT_VERSION = 1
NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")
EDGE_CHUNK = 1 << 24  # edges handled at once while building: bounds temporary memory


# ------------------------------------------------------------------------------- partitioners
def random_partition(num_nodes: int, num_parts: int, seed: int) -> torch.Tensor:
    """part[i] in [0, num_parts): a balanced random assignment (a permutation split evenly)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_nodes, generator=g)
    part = torch.empty(num_nodes, dtype=torch.long)
    part[perm] = torch.arange(num_nodes) % num_parts
    return part


def symmetric_csr(edge_index: torch.Tensor, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, indices; int64, columns sorted in each row) of the simple undirected graph
    under ``edge_index``: both directions of every edge, no self-loops, no duplicates (what METIS
    requires).

    Built as ``A + A^T`` of scipy's compiled CSR kernels (a counting sort by row, per-row sorts,
    a linear merge) rather than one sort of all ``2E`` combined keys: 6.5x less CPU time at
    synthetic-reddit scale 0.1 (BENCHMARKS.md, "Cluster-GCN partitioning"), same output.
    """
    src, dst = edge_index.to(torch.long).numpy()
    keep = src != dst
    src, dst = np.compress(keep, src), np.compress(keep, dst)
    shape = (num_nodes, num_nodes)
    adj = scipy.sparse.csr_array((np.ones(src.size, dtype=bool), (src, dst)), shape=shape)
    sym = (adj + adj.T).tocsr()  # bool: a duplicate or a two-way edge stays one entry
    sym.sum_duplicates()  # canonical (sorted, unique) already; a no-op that states the need
    return sym.indptr.astype(np.int64), sym.indices.astype(np.int64)


def metis_partition(
    edge_index: torch.Tensor, num_nodes: int, num_parts: int, seed: int
) -> torch.Tensor:
    """pymetis partition of the symmetric closure of ``edge_index`` (seeded).

    pymetis picks k-way for more than 8 parts and recursive bisection otherwise; PyG's
    ``ClusterData`` calls k-way (``recursive=False``), so at 40 parts both run the same METIS
    routine, with METIS' default options except the seed.
    """
    import pymetis

    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)
    indptr, indices = symmetric_csr(edge_index, num_nodes)
    dtype = pymetis.zero_copy_dtype()
    adjacency = pymetis.CSRAdjacency(
        np.ascontiguousarray(indptr, dtype=dtype), np.ascontiguousarray(indices, dtype=dtype)
    )
    _, membership = pymetis.part_graph(
        num_parts, adjacency=adjacency, options=pymetis.Options(seed=int(seed % 2**31))
    )
    return torch.as_tensor(np.asarray(membership), dtype=torch.long)


def partition_nodes(
    method: str, edge_index: torch.Tensor, num_nodes: int, num_parts: int, seed: int
) -> torch.Tensor:
    if method == "random":
        return random_partition(num_nodes, num_parts, seed)
    if method == "metis":
        return metis_partition(edge_index, num_nodes, num_parts, seed)
    raise UsageError(f"Unknown --partitioner '{method}'. Choose one of: random, metis.")


# ------------------------------------------------------------------------------ batches
@dataclass
class PartitionedGraph:
    """A graph reordered by part; ``batch(p)`` is the subgraph induced by part ``p`` (views)."""

    tensors: dict[str, torch.Tensor]

    @property
    def num_parts(self) -> int:
        return int(self.tensors["node_ptr"].numel() - 1)

    def __len__(self) -> int:
        return self.num_parts

    def sizes(self) -> list[int]:
        return torch.diff(self.tensors["node_ptr"]).tolist()

    def batch(self, p: int) -> Data:
        t = self.tensors
        a, b = int(t["node_ptr"][p]), int(t["node_ptr"][p + 1])
        ea, eb = int(t["edge_ptr"][p]), int(t["edge_ptr"][p + 1])
        out = Data(edge_index=t["edge_index"][:, ea:eb], n_id=t["n_id"][a:b])
        for key in NODE_KEYS:
            if key in t:
                out[key] = t[key][a:b]
        out.num_nodes = b - a
        return out

    def batches(self) -> list[Data]:
        return [self.batch(p) for p in range(self.num_parts)]


def build_partitioned(data: Data, part: torch.Tensor, num_parts: int) -> PartitionedGraph:
    """Reorder ``data`` by ``part`` and keep only intra-part edges, relabelled per part.

    Vectorised, no loop over parts: one stable sort of the nodes by part, one pass over the
    edges in chunks of ``EDGE_CHUNK`` (each edge looked at once, whatever ``num_parts``), then
    the kept edges are ordered by (destination position, source) with scipy's CSR build (a
    counting sort by destination and short per-row sorts) instead of a comparison sort of them
    all. The result is the same as sorting the kept edges by ``dst_pos * n + src_pos``.
    """
    n = int(data.num_nodes)
    if part.numel() != n or (n and (int(part.min()) < 0 or int(part.max()) >= num_parts)):
        raise ValueError("part must hold one id in [0, num_parts) per node")
    # more parts than nodes is refused before bincount allocates num_parts counters
    counts = torch.bincount(part, minlength=num_parts) if num_parts <= n else None
    if counts is None or bool((counts == 0).any()):
        empty = num_parts - n if counts is None else int((counts == 0).sum())
        raise UsageError(
            f"Cannot split a graph of {n} nodes into {num_parts} non-empty partitions "
            f"({empty} would be empty). Use fewer --partitions."
        )
    n_id = torch.argsort(part, stable=True)  # node ids grouped by part, ascending inside a part
    node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
    node_ptr[1:] = torch.cumsum(counts, 0)
    # numpy's take/compress are ~3x faster than torch's indexing on one thread, and a narrow
    # part table halves the bytes of the per-edge comparison.
    part_np = part.numpy().astype(np.int16 if num_parts < 2**15 else np.int64)
    pos = np.empty(n, dtype=np.int64)  # position of each node in the reordered graph
    pos[n_id.numpy()] = np.arange(n)
    local = pos - node_ptr.numpy()[part.numpy()]  # id of each node inside its part
    kept_src, kept_dst = [], []
    ei = data.edge_index.to(torch.long).numpy()
    for i in range(0, ei.shape[1], EDGE_CHUNK):
        src, dst = ei[0, i : i + EDGE_CHUNK], ei[1, i : i + EDGE_CHUNK]
        same = part_np.take(src) == part_np.take(dst)
        kept_src.append(local.take(np.compress(same, src)))
        kept_dst.append(pos.take(np.compress(same, dst)))
    src = np.concatenate(kept_src) if kept_src else np.empty(0, dtype=np.int64)
    dst = np.concatenate(kept_dst) if kept_dst else np.empty(0, dtype=np.int64)
    # Row = destination position, column = source id inside the part: CSR order is the order
    # wanted (edges grouped by part, as positions are; destination, then source, inside it).
    # Duplicate edges become one entry counting them, expanded again below.
    width = int(counts.max())
    ones = np.ones(src.size, dtype=np.int32)
    by_dst = scipy.sparse.csr_array((ones, (dst, src)), shape=(n, width))
    by_dst.sum_duplicates()  # canonical (sorted, duplicates counted) already; states the need
    entry_dst = np.repeat(local[n_id.numpy()], np.diff(by_dst.indptr))
    entry_src, multiplicity = by_dst.indices.astype(np.int64), by_dst.data
    ends = np.zeros(by_dst.nnz + 1, dtype=np.int64)  # edges up to each entry, duplicates counted
    np.cumsum(multiplicity, dtype=np.int64, out=ends[1:])
    if by_dst.nnz != src.size:
        entry_dst, entry_src = (
            np.repeat(entry_dst, multiplicity),
            np.repeat(entry_src, multiplicity),
        )
    edge_ptr = torch.from_numpy(ends[by_dst.indptr[node_ptr.numpy()]])
    tensors = {
        "part": part,
        "n_id": n_id,
        "node_ptr": node_ptr,
        "edge_ptr": edge_ptr,
        "edge_index": torch.from_numpy(np.stack([entry_src, entry_dst])),
    }
    for key in NODE_KEYS:
        if key in data:
            tensors[key] = _take_rows(data[key], n_id)
    return PartitionedGraph(tensors)


def _take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]``; numpy's take where the dtype allows it (2x faster than torch on 1 thread)."""
    try:
        return torch.from_numpy(np.take(t.numpy(), index.numpy(), axis=0))
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16), or a tensor needing grad
        return t[index]


def induced_batch(data: Data, nodes: torch.Tensor) -> Data:
    """The subgraph induced by ``nodes`` (relabelled 0..n-1): a slow reference for tests."""
    edge_index, _ = subgraph(nodes, data.edge_index, relabel_nodes=True, num_nodes=data.num_nodes)
    batch = Data(x=data.x[nodes], edge_index=edge_index, y=data.y[nodes])
    for key in ("train_mask", "val_mask", "test_mask"):
        if key in data:
            batch[key] = data[key][nodes]
    batch.n_id = nodes
    return batch


# ------------------------------------------------------------------------------ disk cache
def cache_path(root: str | os.PathLike, dataset: str, parts: int, method: str, seed: int) -> Path:
    """``<data_root>/cache/partitions/<dataset>-<method>-<parts>-seed<seed>.pt``; ``dataset`` is
    :func:`dataset_key`'s name for the graph."""
    name = f"{dataset}-{method}-{parts}-seed{seed}.pt"
    return Path(root) / "cache" / "partitions" / name


def dataset_key(ds: GraphDataset, scale: float) -> str:
    """What names a graph in the partition cache: ``<name>-scale<scale>`` for a registered
    dataset, ``user-<sha256[:20]>`` for a user's graph, its content fingerprint (user.py; the
    name of its dataset cache entry too). A user's graph is not keyed by its file name: two
    different ``graph.pt`` files would evict each other's partitions, while a renamed copy
    should hit them; ``--scale`` does not apply to it."""
    fingerprint = ds.info.get("fingerprint")
    if fingerprint:
        return f"user-{fingerprint[:20]}"
    return f"{ds.name}-scale{scale:g}"


def _identity(data: Data) -> dict[str, int]:
    """What must match for a cached file to belong to this graph (a regenerated graph differs)."""
    ei = data.edge_index
    step = max(1, ei.size(1) // 4096)
    return {
        "num_nodes": int(data.num_nodes),
        "num_edges": int(ei.size(1)),
        "num_features": int(data.x.size(1)),
        "edge_sample": int(ei[:, ::step].sum()),  # a cheap check that the edges are the same
    }


def integrity_path(path: Path) -> Path:
    """``<file>.json`` next to a partition file: its size and checksums (cache.save_tensors)."""
    return path.with_name(f"{path.name}.json")


def _read(path: Path, data: Data) -> tuple[PartitionedGraph | None, str | None]:
    """``(graph, None)`` for a valid file; else ``(None, why)``: ``why`` is None if the file is
    absent or belongs to another graph or format (rebuilt silently), and names the damage
    otherwise (rebuilt with a warning)."""
    if not path.exists():
        return None, None
    try:
        record = json.loads(integrity_path(path).read_text())
    except FileNotFoundError:
        record = None  # written before records existed: torch.load is the only check
    except (OSError, ValueError) as e:
        return None, f"{integrity_path(path).name} cannot be read ({brief(e)})"
    why = check_file(path, record if isinstance(record, dict) else None)
    if why is not None:
        return None, why
    try:
        blob = load_tensors(path)
        meta = blob.get("meta", {})
    except Exception as e:
        return None, f"torch.load failed ({brief(e)})"
    if meta.get("format") != FORMAT_VERSION or meta.get("graph") != _identity(data):
        return None, None
    return PartitionedGraph(blob["tensors"]), None


def load_or_build(
    data: Data,
    method: str,
    num_parts: int,
    seed: int,
    path: Path | None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> tuple[PartitionedGraph, bool]:
    """The partitioned graph, read from ``path`` if cached there; returns ``(graph, cache_hit)``.

    On-disk format (one file, written by this function): ``torch.save`` of a dict
    ``{"meta": {"format": 1, "method", "num_parts", "seed", "graph": {num_nodes, num_edges,
    num_features}}, "tensors": {...}}`` with tensors ``part`` [N] (part of each original node),
    ``n_id`` [N] (original node ids ordered by part, ascending inside a part), ``node_ptr``
    [P+1] and ``edge_ptr`` [P+1] (offsets of part p's nodes and edges), ``edge_index`` [2, E_in]
    (intra-part edges sorted by part then destination; ids local to the part, 0..size_p-1), and
    ``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask`` reordered by ``n_id``. It is read
    with ``torch.load(mmap=True)``, so local ranks share its pages. Next to it, ``<file>.json``
    holds its size and checksums (``{size, sha256_ends, sha256}``), checked on every read (size
    and the SHA-256 of its first and last MiB); a damaged file is rebuilt with a warning.

    Concurrency: the builder holds an exclusive ``flock`` on ``<path>.lock`` (released by the
    kernel if it dies); others wait on the lock (at most ``lock_timeout_s`` of the holder's
    silence: filelock.exclusive_lock), then read. The file is written to a temporary name in the
    same folder and renamed into place, so a reader never sees a partial file; temporary files
    of killed builds are removed by the next holder of the lock.

    Why one function: the cache's read, its checks against the graph and the settings, the build
    and the atomic write of the one file format above, under one lock.
    """

    def build() -> PartitionedGraph:
        part = partition_nodes(method, data.edge_index, int(data.num_nodes), num_parts, seed)
        return build_partitioned(data, part, num_parts)

    if path is None:
        return build(), False
    found, _ = _read(path, data)
    if found is not None:
        return found, True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"Cannot create the partition cache folder {path.parent} ({e}). Point --data-root "
            "or $GNNPAR_DATA at a writable folder."
        ) from e
    with exclusive_lock(f"{path}.lock", str(path), lock_timeout_s):
        remove_stale_temporaries(path.parent, own=path.name)
        for old in path.parent.glob(f".{glob.escape(path.name)}.*"):
            if old.is_file():  # a killed build's temporary file (older naming, no .tmp- mark)
                old.unlink(missing_ok=True)
        found, why = _read(path, data)  # built while we waited?
        if found is not None:
            return found, True
        if why is not None:
            warnings.warn(
                f"The partition cache file {path} is damaged ({why}); rebuilding it.",
                stacklevel=2,
            )
        graph = build()
        meta: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "method": method,
            "num_parts": num_parts,
            "seed": seed,
            "graph": _identity(data),
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
        os.close(fd)
        fd, tmp_record = tempfile.mkstemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent)
        os.close(fd)
        try:
            record = save_tensors({"meta": meta, "tensors": graph.tensors}, tmp)
            Path(tmp_record).write_text(json.dumps(record))
            for name in (tmp, tmp_record):
                os.chmod(name, 0o644)  # mkstemp makes it private; a cache is readable like data
            # The file, then its record: a reader between the two sees a mismatch, waits for
            # this lock, and reads again.
            os.replace(tmp, path)
            os.replace(tmp_record, integrity_path(path))
        finally:
            for name in (tmp, tmp_record):
                if os.path.exists(name):
                    os.unlink(name)
    # Read back memory-mapped, so this rank shares the pages with the others instead of
    # keeping its private copy of the reordered features.
    del graph
    shared, why = _read(path, data)
    if shared is None:
        raise RuntimeError(f"The partition file {path} just written cannot be read back ({why}).")
    return shared, False


def load_partitions(cfg, ds) -> tuple[PartitionedGraph, float, bool]:
    """Partition ``ds`` per ``cfg.data`` (cached under ``cfg.data.data_root``).

    Returns the partitioned graph, the seconds spent (reported as partition_time_s, never as
    train time) and whether it came from the cache.
    """
    t0 = time.perf_counter()
    d = cfg.data
    path = None
    if d.data_root:
        key = dataset_key(ds, d.scale)
        path = cache_path(d.data_root, key, d.partitions, d.partitioner, cfg.run.seed)
    graph, hit = load_or_build(
        ds.data, d.partitioner, d.partitions, cfg.run.seed, path, cfg.strategy.timeout_s
    )
    return graph, time.perf_counter() - t0, hit


def build_partition_batches(cfg, ds) -> tuple[list[Data], float]:
    """One induced subgraph per part (views into the cached reordered graph), and the seconds."""
    graph, seconds, _ = load_partitions(cfg, ds)
    return graph.batches(), seconds
