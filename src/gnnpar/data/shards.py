"""A prepared graph sharded across hosts: ``gnnpar prepare ... --shards H --out FOLDER``.

Layout (prepared format version 1, :mod:`gnnpar.data.prepared`, with its ``shards`` list)::

    FOLDER/
      manifest.json     the graph's counts, dtypes and splits as for an unsharded folder, its
                        "shards" list and its "partition" record (below); written last
      edge_order.npy    only when "edge_index_order" is "permuted" (as unsharded)
      shard-<h>/        one folder per host, h = 0 .. H-1:
        manifest.json   {"format": "gnnpar-prepared-shard", "shard": h, "of": H,
                         "nodes": [first, end], "num_nodes": end - first, "graph_nodes": N,
                         "num_edges": its in-edges, "arrays": {...}} (records as unsharded)
        indptr.npy      int64 [n_h + 1]  the in-edge CSR of the shard's nodes
        indices.npy     int32/int64 [E_h]  every in-edge's source, a *global* (renumbered) id;
                        within a row, the order of the unsharded folder's row
        features.npy    [n_h, F]  in the stored dtype
        labels.npy      [n_h] (or [n_h, C] multi-label)
        train.npy, val.npy, test.npy   int64 global (renumbered) ids of the shard's nodes in
                        each split, ascending
        orig_ids.npy    int64 [n_h]  the original id of every node of the shard

Nodes are renumbered so that shard h owns the contiguous id range ``[first, end)``: the nodes of
part 0 in ascending original id, then those of part 1, and so on. The top manifest's ``shards``
names each shard's folder, range and the SHA-256 of its manifest (whose records hold the ends
and full checksums of every array), and ``partition`` records the partitioner, its seed, the
edge cut (edges whose ends lie in different shards: count and share) and the balance (the
largest shard's nodes over the mean).

Partitioners (``--partitioner``): ``metis`` (pymetis over the symmetric closure; the structure
must fit in memory: O(E)), ``stream`` (LDG, Stanton & Kliot, KDD'12: one pass over the nodes in
id order, each placed in the shard holding most of its already placed in-neighbours, weighted by
the room left; O(N) memory plus one CSR chunk), ``random`` (a balanced random deal).

A folder holding every shard trains on one host as one graph: :func:`load_sharded` maps the ids
back and gives the unsharded graph, tensor for tensor. In a run of several hosts, host h (its
node rank: torchrun's ``GROUP_RANK``, SLURM's ``SLURM_NODEID``) owns ``shard-<h>``; the ranks
agree through the store, within ``--timeout``, before any step (gnnpar.runtime.shard_hosts):
a missing or damaged shard is named with its host on every rank, exit 2. Hosts that each hold
only their own shard (plus the top manifest) train across shards with ``--strategy sampled``
(gnnpar.data.sampling.distributed: the owners sample their nodes' neighbours and serve their
feature rows) and with Cluster-GCN's ``allreduce`` and ``gossip`` (gnnpar.data.shard_parts:
each host's parts lie within its shard; gossip fetches another host's subgraph from it); the
other strategies need every shard on every host, and are told so, exit 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gnnpar.data import prepared
from gnnpar.data.prepared import CHUNK_BYTES, MANIFEST, SPLITS, Damaged
from gnnpar.errors import UsageError

SHARD_FORMAT = "gnnpar-prepared-shard"
PARTITIONERS = ("metis", "stream", "random")
LDG_CHUNK_NODES = 1 << 16


def shard_folder(h: int) -> str:
    return f"shard-{h}"


# ------------------------------------------------------------------------------ partitioning
def _rows(ptr: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """CSR positions of the rows of ``nodes`` (in that order), concatenated."""
    starts, ends = ptr[nodes], ptr[nodes + 1]
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return np.arange(total, dtype=np.int64) + offs


def random_parts(n: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    part = np.empty(n, dtype=np.int64)
    part[rng.permutation(n)] = np.arange(n) % h
    return part


def ldg_parts(p: prepared.Prepared, h: int) -> np.ndarray:
    """Linear deterministic greedy, one pass over the nodes in id order: node v goes to the
    shard s maximising |placed in-neighbours of v in s| * (1 - size_s / capacity), ties to the
    smaller shard, then the lower index. Memory: the assignment plus one chunk of the CSR."""
    n = p.num_nodes
    ptr, idx = p.array("indptr"), p.array("indices")
    part = np.full(n, -1, dtype=np.int64)
    size = np.zeros(h, dtype=np.int64)
    cap = -(-n // h)
    for lo in range(0, n, LDG_CHUNK_NODES):
        hi = min(n, lo + LDG_CHUNK_NODES)
        a, b = int(ptr[lo]), int(ptr[hi])
        src = np.asarray(idx[a:b], dtype=np.int64)
        local = np.asarray(ptr[lo : hi + 1], dtype=np.int64) - a
        for v in range(lo, hi):
            nb = part[src[local[v - lo] : local[v - lo + 1]]]
            nb = nb[nb >= 0]
            counts = np.bincount(nb, minlength=h).astype(np.float64)
            score = counts * (1.0 - size / cap)
            score[size >= cap] = -1.0
            best = np.flatnonzero(score == score.max())
            s = int(best[np.argmin(size[best])])
            part[v] = s
            size[s] += 1
    return part


def metis_parts(p: prepared.Prepared, h: int, seed: int) -> np.ndarray:
    import torch

    from gnnpar.data.partition import metis_partition

    ptr = p.tensor("indptr")
    src = p.tensor("indices").long()
    dst = torch.repeat_interleave(torch.arange(p.num_nodes), ptr[1:] - ptr[:-1])
    part = metis_partition(torch.stack([src, dst]), p.num_nodes, h, seed).numpy()
    return np.asarray(part, dtype=np.int64)


def partition(p: prepared.Prepared, h: int, method: str, seed: int) -> np.ndarray:
    if method == "random":
        return random_parts(p.num_nodes, h, seed)
    if method == "stream":
        return ldg_parts(p, h)
    if method == "metis":
        return metis_parts(p, h, seed)
    raise UsageError(f"--partitioner {method}: choose {', '.join(PARTITIONERS)}.")


def cut_and_balance(p: prepared.Prepared, part: np.ndarray, h: int) -> dict[str, Any]:
    """Edges whose ends are in different parts (chunk by chunk) and the node balance."""
    ptr, idx = p.array("indptr"), p.array("indices")
    n, e = p.num_nodes, int(p.manifest["num_edges"])
    cut = 0
    step = max(1, CHUNK_BYTES // 8)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        a, b = int(ptr[lo]), int(ptr[hi])
        tgt = np.repeat(part[lo:hi], np.diff(np.asarray(ptr[lo : hi + 1], dtype=np.int64)))
        cut += int(np.count_nonzero(part[np.asarray(idx[a:b], dtype=np.int64)] != tgt))
    sizes = np.bincount(part, minlength=h)
    return {
        "edge_cut": cut,
        "edge_cut_share": cut / e if e else 0.0,
        "balance": float(sizes.max() / (n / h)) if n else 1.0,
        "shard_nodes": [int(s) for s in sizes],
    }


# ----------------------------------------------------------------------------------- writing
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def write_shards(
    source: str | os.PathLike,
    out: str | os.PathLike,
    h: int,
    method: str,
    seed: int,
    progress=None,  # noqa: ANN001
) -> tuple[Path, dict[str, Any]]:
    """Shard the prepared folder ``source`` into ``out`` (atomic, as every prepare); returns the
    folder and its partition record. Memory: O(N) integers plus one chunk.

    Why one function: one streaming pass per shard over the prepared arrays, in bounded memory,
    inside the atomic write that every prepare uses; its buffers and offsets are shared by the
    passes."""
    if method not in PARTITIONERS:
        raise UsageError(f"--partitioner {method}: choose {', '.join(PARTITIONERS)}.")
    p = prepared.open_prepared(source)
    m = p.manifest
    n = p.num_nodes
    if not 1 <= h <= max(1, n):
        raise UsageError(f"--shards {h}: give 1 to the node count ({n}).")
    part = partition(p, h, method, seed)
    record = {"partitioner": method, "seed": seed, **cut_and_balance(p, part, h)}
    orig_of_new = np.argsort(part, kind="stable").astype(np.int64)
    new_of_orig = np.empty(n, dtype=np.int64)
    new_of_orig[orig_of_new] = np.arange(n, dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(np.bincount(part, minlength=h)))).astype(np.int64)
    del part
    need = sum(int(r["bytes"]) for r in m["arrays"].values()) + 8 * n + h * 4096
    ptr, idx = p.array("indptr"), p.array("indices")
    x, labels = p.array("features"), p.array("labels")
    idt = prepared.index_dtype(n)
    split_new = {s: np.sort(new_of_orig[np.asarray(p.array(s))]) for s in SPLITS}
    shards = []
    with prepared.Writer(out, need) as w:
        assert w.tmp is not None
        if "edge_order" in m["arrays"]:
            w.put("edge_order", np.asarray(p.array("edge_order")))
        for s in range(h):
            first, end = int(bounds[s]), int(bounds[s + 1])
            folder = w.tmp / shard_folder(s)
            folder.mkdir()
            nodes = orig_of_new[first:end]
            deg = np.asarray(ptr[nodes + 1] - ptr[nodes], dtype=np.int64)
            sptr = np.concatenate(([0], np.cumsum(deg))).astype(np.int64)
            records = {}

            def put(name: str, dtype, shape, chunks, folder=folder, records=records) -> None:  # noqa: ANN001
                a = prepared.Array(folder, name, dtype, shape)
                w._open.append(a)
                for c in chunks:
                    a.write(c)
                records[name] = a.finish()

            step = max(1, CHUNK_BYTES // max(1, x[:1].nbytes, 64))
            put("indptr", np.int64, (len(sptr),), [sptr])
            put(
                "indices",
                idt,
                (int(sptr[-1]),),
                (
                    new_of_orig[np.asarray(idx[_rows(ptr, nodes[i : i + step])], dtype=np.int64)]
                    for i in range(0, len(nodes), step)
                ),
            )
            put(
                "features",
                x.dtype,
                (len(nodes), *x.shape[1:]),
                (x[nodes[i : i + step]] for i in range(0, len(nodes), step)),
            )
            put("labels", labels.dtype, (len(nodes), *labels.shape[1:]), [labels[nodes]])
            for sp in SPLITS:
                ids = split_new[sp]
                ids = ids[(ids >= first) & (ids < end)]
                put(sp, np.int64, (len(ids),), [ids])
            put("orig_ids", np.int64, (len(nodes),), [nodes])
            manifest = {
                "format": SHARD_FORMAT,
                "format_version": prepared.FORMAT_VERSION,
                "name": m["name"],
                "shard": s,
                "of": h,
                "nodes": [first, end],
                "num_nodes": end - first,
                "graph_nodes": n,
                "num_edges": int(sptr[-1]),
                "num_features": int(m["num_features"]),
                "num_classes": int(m["num_classes"]),
                "multilabel": bool(m.get("multilabel")),
                "feature_dtype": m["feature_dtype"],
                "arrays": records,
            }
            _write_json(folder / MANIFEST, manifest)
            shards.append(
                {
                    "folder": shard_folder(s),
                    "nodes": [first, end],
                    "num_edges": int(sptr[-1]),
                    "manifest_sha256": _digest(folder / MANIFEST),
                }
            )
            if progress:
                progress("shards", s + 1, h)
        top = {k: v for k, v in m.items() if k != "arrays"}
        top["shards"] = shards
        top["partition"] = record
        return w.commit(top), record


# ----------------------------------------------------------------------------------- reading
def is_sharded(manifest: dict[str, Any]) -> bool:
    return bool(manifest.get("shards"))


def check_top(folder: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``shards`` list, checked for form: contiguous ranges covering 0..N."""
    shards = manifest.get("shards")
    ok = isinstance(shards, list) and all(
        isinstance(s, dict)
        and isinstance(s.get("folder"), str)
        and isinstance(s.get("manifest_sha256"), str)
        and isinstance(s.get("nodes"), list)
        and len(s["nodes"]) == 2
        and all(isinstance(v, int) for v in s["nodes"])
        for s in shards
    )
    if ok:
        at = 0
        for i, s in enumerate(shards):
            ok = ok and s["folder"] == shard_folder(i) and s["nodes"][0] == at
            ok = ok and s["nodes"][1] >= at
            at = s["nodes"][1]
        ok = ok and at == manifest.get("num_nodes")
    if not ok:
        raise Damaged(f"{folder}: {MANIFEST}'s list of shards is damaged.")
    return shards


class Shard:
    """One shard folder, checked against the top manifest (its manifest's SHA-256, every
    array's size and ends checksum; ``full``: every byte)."""

    def __init__(self, top: Path, rec: dict[str, Any], index: int, full: bool = False) -> None:
        self.folder = top / rec["folder"]
        self.index = index
        where = f"{top}: shard {index} ({self.folder})"
        path = self.folder / MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise Damaged(f"{where} is missing (no {MANIFEST}).") from None
        except OSError as e:
            raise Damaged(f"{where} cannot be read ({type(e).__name__}).") from None
        if hashlib.sha256(raw).hexdigest() != rec["manifest_sha256"]:
            raise Damaged(f"{where} is damaged: its {MANIFEST} differs from what was written.")
        self.manifest = json.loads(raw)
        problems = prepared.check_arrays(self.folder, self.manifest, full)
        if problems:
            raise Damaged(f"{where} is damaged: {'; '.join(problems)}.")
        self.first, self.end = (int(v) for v in rec["nodes"])
        self._arrays: dict[str, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            path = self.folder / Path(self.manifest["arrays"][name]["file"]).name
            try:
                self._arrays[name] = prepared.map_array(path)
            except (OSError, ValueError) as e:
                raise Damaged(f"{self.folder}: {path.name} cannot be read ({e}).") from None
        return self._arrays[name]


def open_shards(folder: str | os.PathLike, full: bool = False) -> list[Shard]:
    top = Path(folder).expanduser().absolute()
    m = prepared.read_manifest(top)
    recs = check_top(top, m)
    problems = prepared.check_arrays(top, m, full)  # edge_order.npy, when there is one
    if problems:
        raise Damaged(f"{top}: the sharded graph is damaged: {'; '.join(problems)}.")
    return [Shard(top, rec, i, full) for i, rec in enumerate(recs)]


_HOSTS_AGREE = [False]  # set while checking flags for a run of several hosts


@contextlib.contextmanager
def hosts_agree_later() -> Iterator[None]:
    """While checking a run of several hosts before it starts: check the top manifest only; the
    ranks agree on every host's shard once joined (a host that refused alone would leave the
    others waiting at the rendezvous)."""
    _HOSTS_AGREE[0] = True
    try:
        yield
    finally:
        _HOSTS_AGREE[0] = False


def check_folder(folder: str | os.PathLike) -> None:
    """``--dataset FOLDER``'s check before any rank starts: the top manifest, and every shard
    this host holds, intact (UsageError naming the first damaged one). Shards that are absent
    may be on other hosts: the ranks agree on them once they have joined (:func:`host_status`,
    gnnpar.runtime.shard_hosts); a run of one host alone needs every shard (load_sharded)."""
    top = Path(folder).expanduser().absolute()
    m = prepared.read_manifest(top)
    recs = check_top(top, m)
    problems = prepared.check_arrays(top, m)
    if problems:
        raise Damaged(f"{top}: the sharded graph is damaged: {'; '.join(problems)}.")
    if _HOSTS_AGREE[0] or (os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")):
        return  # a rank of several (or an agent of several hosts): shard_hosts.agree says it
    for i, rec in enumerate(recs):
        if (top / rec["folder"]).exists():
            Shard(top, rec, i)


def host_status(folder: str | os.PathLike, host: int) -> dict[str, Any]:
    """What this host holds of a sharded folder: ``{"host": h, "shards": H, "own": None or
    why shard h cannot be used, "every": does it hold every shard, intact}``."""
    top = Path(folder).expanduser().absolute()
    recs = check_top(top, prepared.read_manifest(top))
    status: dict[str, Any] = {"host": host, "shards": len(recs), "own": None, "lacks": []}
    for i, rec in enumerate(recs):
        try:
            Shard(top, rec, i)
        except UsageError as e:
            status["lacks"].append(i)
            if i == host:
                status["own"] = str(e)
    status["every"] = not status["lacks"]
    if host >= len(recs) and not status["every"]:
        status["own"] = f"{top} holds {len(recs)} shards; host {host} has none of its own."
    return status


def agreed(statuses: list[dict[str, Any]], across: bool = False) -> bool:
    """Every rank's :func:`host_status`, in rank order, judged the same way on every rank:
    UsageError naming the first host whose shard is missing or damaged, or (unless ``across``:
    the strategy trains across shards) the hosts that hold only their own shard. True when the
    run trains across shards (some host lacks another's shard), False when every host holds
    every shard (each trains on the whole graph)."""
    for r, st in enumerate(statuses):
        if st["own"] is not None:
            raise UsageError(
                f"host {st['host']} (rank {r}) cannot use its shard {st['host']}: {st['own']} "
                f"Give host {st['host']} the folder's manifest.json and an intact "
                f"shard-{st['host']}/ (gnnpar prepare --verify checks one)."
            )
    partial = {st["host"]: st.get("lacks", []) for st in statuses if not st["every"]}
    hosts = {st["host"] for st in statuses}
    n_shards = max((int(st.get("shards", 0)) for st in statuses), default=0)
    if partial and across and hosts != set(range(n_shards)):
        missing = sorted(set(range(n_shards)) - hosts)
        extra = sorted(hosts - set(range(n_shards)))
        why = (
            f"no rank runs on host {missing[0]}, which holds shard {missing[0]}"
            if missing
            else f"host {extra[0]} has no shard of its own"
        )
        raise UsageError(
            f"{why}: a graph of {n_shards} shards trains across shards on exactly {n_shards} "
            f"hosts (torchrun --nnodes {n_shards}), host h (its node rank) holding shard-<h>/."
        )
    if partial and across:
        return True
    if partial:
        what = "; ".join(
            f"host {h} lacks shard {', '.join(map(str, lacks))}"
            for h, lacks in sorted(partial.items())
        )
        raise UsageError(
            f"{what}: only --strategy sampled, allreduce, gossip and gossip-bipartite train "
            "across shards that each host holds alone; the other strategies need every shard "
            "on every host (copy the whole folder to every host)."
        )
    return False


def assemble(folder: str | os.PathLike) -> dict[str, Any]:
    """The unsharded graph's tensors from every shard, in the original ids and the original
    edge order: ``x`` (float32), ``edge_index``, ``y``, the three masks; and the manifest."""
    import torch

    top = Path(folder).expanduser().absolute()
    m = prepared.read_manifest(top)
    shards = open_shards(top)
    n = int(m["num_nodes"])
    orig_of_new = np.concatenate([np.asarray(s.array("orig_ids")) for s in shards])
    if len(orig_of_new) != n or not np.array_equal(np.sort(orig_of_new), np.arange(n)):
        raise Damaged(f"{top}: the shards' orig_ids.npy do not map every node once.")
    new_of_orig = np.empty(n, dtype=np.int64)
    new_of_orig[orig_of_new] = np.arange(n)
    # the CSR in new ids, rows in new order
    deg_new = np.concatenate([np.diff(np.asarray(s.array("indptr"))) for s in shards])
    idx_new = np.concatenate([np.asarray(s.array("indices"), dtype=np.int64) for s in shards])
    ptr_new = np.concatenate(([0], np.cumsum(deg_new))).astype(np.int64)
    if len(idx_new) and (idx_new.min() < 0 or idx_new.max() >= n):
        raise Damaged(f"{top}: a shard's indices.npy holds a node outside 0..{n - 1}.")
    # the original CSR: row o is new row new_of_orig[o], its sources mapped back
    rows = new_of_orig
    idx = orig_of_new[idx_new[_rows(ptr_new, rows)]]
    deg = deg_new[rows]
    ptr = torch.from_numpy(np.concatenate(([0], np.cumsum(deg))).astype(np.int64))
    src = torch.from_numpy(idx)
    e = src.numel()
    dst = torch.repeat_interleave(torch.arange(n), ptr[1:] - ptr[:-1], output_size=e)
    how = m["edge_index_order"]
    if how == "source":
        ei = torch.stack([dst, src])
    else:
        ei = torch.stack([src, dst])
        if how == "permuted":
            order = np.load(top / "edge_order.npy", allow_pickle=False)
            ei = ei[:, torch.from_numpy(np.asarray(order, dtype=np.int64))]

    def gather(name: str) -> np.ndarray:
        a = np.concatenate([np.asarray(s.array(name)) for s in shards])
        return a[new_of_orig]

    x = torch.from_numpy(gather("features"))
    if m["feature_dtype"] == "bf16":
        x = x.view(torch.bfloat16)
    out = {"x": x.float(), "edge_index": ei, "y": torch.from_numpy(gather("labels"))}
    for sp in SPLITS:
        ids = np.concatenate([np.asarray(s.array(sp)) for s in shards])
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(orig_of_new[ids])] = True
        out[f"{sp}_mask"] = mask
    return {"tensors": out, "manifest": m}


def load_sharded(folder: str | os.PathLike):
    """The GraphDataset of a folder holding every shard: the unsharded graph, in memory."""
    from torch_geometric.data import Data

    from gnnpar.data.types import GraphDataset

    got = assemble(folder)
    t, m = got["tensors"], got["manifest"]
    data = Data(**t)
    info = {"source": str(Path(folder).expanduser().absolute()), **_graph_info(m)}
    return GraphDataset(m["name"], data, int(m["num_classes"]), bool(m.get("multilabel")), info)


def _graph_info(m: dict) -> dict:
    """What a sharded folder's top manifest says of the whole graph, for a dataset's ``info``
    (the same on a host holding every shard and on one holding its own)."""
    return {
        "sharded": len(m["shards"]),
        "partition": m.get("partition", {}),
        "fingerprint": hashlib.sha256(json.dumps(m["shards"], sort_keys=True).encode()).hexdigest(),
        "directed": bool(m.get("directed", False)),
        "split": m.get("made", {}).get("split", "given"),
        "split_counts": dict(m["splits"]),
        "num_nodes": int(m["num_nodes"]),
        "num_edges": int(m["num_edges"]),
        "num_features": int(m["num_features"]),
        "feature_dtype": m["feature_dtype"],
        "made": m.get("made", {}),
    }


def load_shard_host(folder: str | os.PathLike, host: int):
    """The GraphDataset of a host that holds only its own shard (training across shards): no
    graph tensors in memory (gnnpar.data.sampling.distributed maps the shard); ``info`` says
    where it is (``source``, ``host``, ``across_shards``) and what the whole graph is."""
    from torch_geometric.data import Data

    from gnnpar.data.types import GraphDataset

    top = Path(folder).expanduser().absolute()
    m = prepared.read_manifest(top)
    recs = check_top(top, m)
    Shard(top, recs[host], host)  # intact (agreed on already; checked again where it is used)
    data = Data(num_nodes=int(m["num_nodes"]))
    info = {"source": str(top), "host": host, "across_shards": True, **_graph_info(m)}
    return GraphDataset(m["name"], data, int(m["num_classes"]), bool(m.get("multilabel")), info)
