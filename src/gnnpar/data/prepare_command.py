"""``gnnpar prepare``: any graph gnnpar reads, written as a prepared folder (:mod:`gnnpar.data.prepared`).

    gnnpar prepare --dataset synthetic-papers100m --scale 0.02 --out papers-002
    gnnpar prepare --dataset my_graph.pt --feature-dtype bf16 --out my-graph
    gnnpar prepare --dataset ./graphbolt_folder --out my-graph   # DGL GraphBolt OnDiskDataset
    gnnpar prepare --verify papers-002

What ``--dataset`` accepts is what ``gnnpar train`` accepts (named, generated with ``--scale``,
``FILE.pt``, an OGB-layout folder, ``module:function``, another prepared folder), plus a DGL
GraphBolt ``OnDiskDataset`` folder (``metadata.yaml`` over numpy arrays: one node type, one edge
type, a node feature ``feat``, labels as a node feature ``label`` or in the node-classification
task's sets). A user graph without split masks is split with ``--seed`` (60/20/20 stratified, as
training does) and the split is stored: the folder trains the same split whatever ``--seed``.

Memory: ``synthetic-reddit``, ``synthetic-amazon`` and ``synthetic-papers100m`` are generated
straight into the folder chunk by chunk (:func:`gnnpar.data.synthetic.stream_reddit`, the same
arrays as the in-memory generator's; :func:`gnnpar.data.synthetic.stream_graph`: peak memory
O(nodes) plus fixed buffers, at any ``--scale``); every other graph is read as training reads it (in memory, or
memory-mapped from gnnpar's cache), its features written in chunks of 64 MiB and its CSR built
from its edge_index in memory (O(edges)).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gnnpar.data import prepared
from gnnpar.errors import UsageError

GRAPHBOLT_META = "metadata.yaml"


class Progress:
    """One line on stderr, redrawn in place on a terminal; silent with ``quiet``."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.tty = quiet, sys.stderr.isatty()
        self.t0, self.last = time.monotonic(), 0.0

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty and (now - self.last > 0.2 or done == total):
            self.last = now
            pct = 100.0 * done / max(1, total)
            sys.stderr.write(f"\rgnnpar prepare: {what} {pct:5.1f}% ({now - self.t0:.1f} s)")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _stream(dataset: str, scale: float | None, seed: int, out, fdt: str, progress):
    """The generated graphs written chunk by chunk (synthetic.stream_graph, and
    synthetic.stream_reddit for synthetic-reddit); None for others."""
    from gnnpar.data import synthetic

    if dataset not in (*synthetic.STREAMED, synthetic.REDDIT.name):
        return None
    _return_freed_blocks()
    if scale is not None and scale <= 0:
        raise UsageError(f"--scale {scale}: give a number in (0, 1].")
    s = 1.0 if scale is None else scale
    write = synthetic.stream_reddit if dataset == synthetic.REDDIT.name else synthetic.stream_graph
    return write(synthetic.RECIPES[dataset], s, seed, out, fdt, progress)


def _return_freed_blocks() -> None:
    """glibc only: allocations of 1 MiB and more are mapped on their own, so a freed block goes
    back to the system at once. By default glibc raises that threshold to the largest block
    freed (up to 32 MiB) and keeps the freed blocks in its heap: the streams' many 8-64 MB
    temporaries then held ~0.33 GiB more at synthetic-reddit's scale 1 (peak RSS 0.72 against
    0.40 GiB with the threshold fixed). Elsewhere nothing is done."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError, TypeError):
        pass


def run_prepare(
    dataset: str | None,
    out: str | None,
    scale: str | None,
    seed: str | None,
    feature_dtype: str | None,
    data_root: str | None,
    verify: str | None,
    quiet: bool = False,
    shards: str | None = None,
    partitioner: str | None = None,
) -> str:
    """What the command does; returns the line to print. UsageError for every bad input."""
    if verify is not None:
        if dataset is not None or out is not None:
            raise UsageError("--verify FOLDER checks a prepared folder: give it alone.")
        if prepared.is_sharded(verify):
            from gnnpar.data import shards

            got = shards.open_shards(verify, full=True)
            shards.assemble(verify)  # the id maps and the ranges hold together
            return f"{verify}: intact ({len(got)} shards; every byte checked)"
        p = prepared.verify(verify)
        m = p.manifest
        return (
            f"{p.folder}: intact ({m['num_nodes']:,} nodes, {m['num_edges']:,} edges, "
            f"{m['num_features']} {m['feature_dtype']} features; every byte checked)"
        )
    if dataset is None or out is None:
        raise UsageError("gnnpar prepare needs --dataset D and --out FOLDER (or --verify FOLDER).")
    fdt = feature_dtype or "fp32"
    if fdt not in prepared.FEATURE_DTYPES:
        raise UsageError(f"--feature-dtype {fdt}: choose fp32, fp16 or bf16.")
    seed_v = _int(seed, "--seed", 0)
    if not 0 <= seed_v < 2**32:
        raise UsageError(f"--seed {seed}: give an integer from 0 to 2**32-1.")
    scale_v = _scale(scale)
    hosts = _shards(shards, partitioner)
    out_path = Path(out).expanduser().absolute()
    prepared.check_destination(out_path, 0)  # before reading anything: --out is usable
    progress = Progress(quiet)
    if hosts is not None:
        return _prepare_sharded(
            dataset,
            out_path,
            scale_v,
            seed_v,
            feature_dtype,
            fdt,
            data_root,
            progress,
            hosts,
            partitioner or "metis",
        )
    folder = _stream(dataset, scale_v, seed_v, out_path, fdt, progress)
    if folder is None:
        tensors, meta, made = read_source(dataset, scale_v, seed_v, data_root)
        folder = prepared.write_graph(tensors, meta, out_path, fdt, made, progress)
    m = prepared.read_manifest(folder)
    size = sum(r["bytes"] for r in m["arrays"].values())
    return (
        f"{folder}: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges, {m['num_features']} "
        f"{fdt} features, {size / 2**30:.2f} GiB; train with --dataset {folder}"
    )


def _shards(shards: str | None, partitioner: str | None) -> int | None:
    from gnnpar.data.shards import PARTITIONERS

    if shards is None:
        if partitioner is not None:
            raise UsageError("--partitioner applies with --shards H only.")
        return None
    h = _int(shards, "--shards", 1)
    if h < 1:
        raise UsageError(f"--shards {shards}: give the number of hosts, 1 or more.")
    if partitioner is not None and partitioner not in PARTITIONERS:
        raise UsageError(f"--partitioner {partitioner}: choose {', '.join(PARTITIONERS)}.")
    return h


def _prepare_sharded(
    dataset, out_path, scale_v, seed_v, feature_dtype, fdt, data_root, progress, hosts, method
) -> str:  # noqa: ANN001
    """The graph prepared unsharded (a prepared folder given is used as it is), then dealt into
    ``hosts`` shards by gnnpar.data.shards; the unsharded copy is removed."""
    import shutil

    from gnnpar.data import shards

    given = Path(dataset).expanduser()
    temp = None
    if prepared.is_prepared(given) and not prepared.is_sharded(given):
        if scale_v is not None or feature_dtype is not None:
            raise UsageError(
                "--scale and --feature-dtype do not apply to a prepared folder being sharded."
            )
        source = given.absolute()
    else:
        temp = out_path.parent / f"{out_path.name}{prepared.TMP_MARK}{os.getpid()}-unsharded"
        source = _stream(dataset, scale_v, seed_v, temp, fdt, progress)
        if source is None:
            tensors, meta, made = read_source(dataset, scale_v, seed_v, data_root)
            source = prepared.write_graph(tensors, meta, temp, fdt, made, progress)
            del tensors
    try:
        folder, rec = shards.write_shards(source, out_path, hosts, method, seed_v, progress)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    m = prepared.read_manifest(folder)
    sizes = ", ".join(f"{s['nodes'][1] - s['nodes'][0]:,}" for s in m["shards"])
    return (
        f"{folder}: {m['num_nodes']:,} nodes, {m['num_edges']:,} edges in {hosts} shards "
        f"({method}: edge cut {rec['edge_cut']:,} = {100 * rec['edge_cut_share']:.1f}%, "
        f"balance {rec['balance']:.3f}; nodes per shard {sizes}); train with --dataset "
        f"{folder} where the folder holds every shard"
    )


def _int(v: str | None, flag: str, default: int) -> int:
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"{flag} {v}: give an integer.") from None


def _scale(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        s = float(v)
    except ValueError:
        raise UsageError(f"--scale {v}: give a number in (0, 1].") from None
    if not 0 < s <= 1:
        raise UsageError(f"--scale {v}: give a number in (0, 1].")
    return s


def read_source(
    dataset: str, scale: float | None, seed: int, data_root: str | None
) -> tuple[dict, dict[str, Any], dict[str, Any]]:
    """(tensors, meta, made) of ``--dataset``: x, edge_index, y and the three masks."""
    from gnnpar.data import registry, synthetic

    if dataset in registry.DATASETS:
        named = registry.DATASETS[dataset]
        if named.kind != "graph":
            raise UsageError(f"--dataset {dataset}: holds images; gnnpar prepare writes graphs.")
        if scale is not None and not named.generated:
            raise UsageError(f"--scale applies to generated datasets only, not to {dataset}.")
        if dataset in synthetic.RECIPES:  # generated here, not through the cache
            s = 1.0 if scale is None else scale
            t, meta = synthetic.generate_graph(synthetic.RECIPES[dataset], s, seed)
            made = prepared.made_record(dataset, s, seed, "generated", generator=synthetic.VERSION)
            return t, meta, made
    elif scale is not None:
        raise UsageError(f"--scale applies to generated datasets only, not to {dataset}.")
    path = Path(dataset).expanduser()
    if path.is_dir() and (path / GRAPHBOLT_META).is_file():
        t, meta = read_graphbolt(path)
        return t, meta, prepared.made_record(str(path.absolute()), None, seed, "given")
    from gnnpar.config.parse import check_data_root, default_data_root
    from gnnpar.data.datasets import load_dataset

    check_data_root(data_root or default_data_root(), given=data_root is not None)
    ds = load_dataset(dataset, Path(data_root or default_data_root()), scale or 1.0, seed)
    if ds.kind != "graph":
        raise UsageError(f"--dataset {dataset}: holds images; gnnpar prepare writes graphs.")
    d = ds.data
    t = {k: d[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}
    meta = {
        "name": ds.name,
        "num_classes": ds.num_classes,
        "multilabel": ds.multilabel,
        "directed": bool(ds.info.get("directed", False)),
    }
    source = ds.info.get("source", dataset)
    made = prepared.made_record(source, None, seed, ds.info.get("split", "given"))
    return t, meta, made


# ------------------------------------------------------------------------- GraphBolt folders
def read_graphbolt(folder: Path) -> tuple[dict, dict[str, Any]]:
    """A DGL GraphBolt ``OnDiskDataset`` folder's numpy edges, features, labels and sets."""
    import torch

    from gnnpar.data.user import stratified_split

    meta = _yaml(folder / GRAPHBOLT_META)
    where = f"{folder / GRAPHBOLT_META}"
    try:
        graph = meta["graph"]
        (nodes,) = graph["nodes"]
        edges = graph["edges"]
        n = int(nodes["num"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(
            f"{where}: no graph with one node type (graph: nodes: [num: N], edges: ...)."
        ) from None
    if not isinstance(edges, list) or len(edges) != 1:
        raise UsageError(f"{where}: gnnpar reads graphs with one edge type only.")
    ei = _npy(folder, edges[0], where, "edges")
    if ei.ndim != 2 or 2 not in ei.shape:
        raise UsageError(f"{where}: the edges array holds {list(ei.shape)}, not [2, E].")
    ei = ei if ei.shape[0] == 2 else ei.T
    feats = {f.get("name"): f for f in meta.get("feature_data") or [] if isinstance(f, dict)}
    if "feat" not in feats:
        raise UsageError(f"{where}: no node feature named feat (feature_data).")
    x = _npy(folder, feats["feat"], where, "feat")
    if x.ndim != 2 or x.shape[0] != n:
        raise UsageError(f"{where}: feat holds {list(x.shape)}, not [{n}, F].")
    tasks = meta.get("tasks") or [{}]
    task = tasks[0] if isinstance(tasks[0], dict) else {}
    y = np.zeros(n, dtype=np.int64)
    if "label" in feats:
        y = np.array(_npy(folder, feats["label"], where, "label"), dtype=np.int64).reshape(n)
    masks: dict[str, torch.Tensor] = {}
    for key, split in (("train_set", "train"), ("validation_set", "val"), ("test_set", "test")):
        sets = task.get(key)
        if not sets:
            continue
        items = {d.get("name"): d for d in (sets[0].get("data") or []) if isinstance(d, dict)}
        seeds_rec = items.get("seeds") or items.get("seed_nodes")
        if seeds_rec is None:
            raise UsageError(f"{where}: the task's {key} names no seeds.")
        seeds = np.array(_npy(folder, seeds_rec, where, key), dtype=np.int64).reshape(-1)
        if len(seeds) and (seeds.min() < 0 or seeds.max() >= n):
            raise UsageError(f"{where}: {key} holds a node outside 0..{n - 1}.")
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(seeds)] = True
        masks[f"{split}_mask"] = mask
        if "labels" in items and "label" not in feats:
            y[seeds] = np.asarray(_npy(folder, items["labels"], where, key), dtype=np.int64)
    yt = torch.from_numpy(y)
    if len(y) and y.min() < 0:
        raise UsageError(f"{where}: a label is negative.")
    classes = int(task.get("num_classes") or (int(y.max()) + 1 if len(y) else 1))
    if len(y) and y.max() >= classes:
        raise UsageError(f"{where}: a label is {int(y.max())}, beyond num_classes {classes}.")
    if len(masks) != 3:
        masks = {**stratified_split(yt, False, 0, masks)}
    t = {
        "x": torch.from_numpy(x) if x.dtype == np.float32 else torch.from_numpy(x).float(),
        "edge_index": torch.from_numpy(np.asarray(ei, dtype=np.int64)),
        "y": yt,
        **masks,
    }
    e = t["edge_index"]
    if e.numel() and (int(e.min()) < 0 or int(e.max()) >= n):
        raise UsageError(f"{where}: an edge names a node outside 0..{n - 1}.")
    name = str(meta.get("dataset_name") or folder.absolute().name)
    return t, {"name": name, "num_classes": classes, "multilabel": False, "directed": True}


def _yaml(path: Path) -> dict:
    try:
        import yaml
    except ImportError:
        raise UsageError(
            f"{path}: reading a GraphBolt folder needs PyYAML (pip install pyyaml)."
        ) from None
    try:
        meta = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UsageError(f"{path}: cannot be read ({type(e).__name__}).") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: does not hold a GraphBolt dataset description.")
    return meta


def _npy(folder: Path, rec: Any, where: str, what: str) -> np.ndarray:
    """A ``format: numpy`` array named by ``rec["path"]``, inside ``folder``, never a pickle."""
    if not isinstance(rec, dict) or rec.get("format", "numpy") != "numpy" or "path" not in rec:
        raise UsageError(f"{where}: {what} is not a numpy array (format: numpy, path: ...).")
    path = (folder / str(rec["path"])).resolve()
    if folder.resolve() not in path.parents:
        raise UsageError(f"{where}: {what}'s path {rec['path']} leaves the folder.")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)  # read-only: never written
    except (OSError, ValueError) as e:
        raise UsageError(f"{where}: {what} ({path}) cannot be read: {type(e).__name__}.") from None
