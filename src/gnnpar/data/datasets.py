"""Dataset registry: bundled Planetoid graphs, user-placed real datasets, synthetic generators.

Every dataset known by name is a row of :data:`gnnpar.data.registry.DATASETS` (torch-free: the
config checks read it too); :func:`load_dataset` loads it with the reader the row names. Loading returns a
:class:`~gnnpar.data.types.GraphDataset` (a PyG ``Data`` with ``x, edge_index, y, train_mask, val_mask, test_mask``)
or an :class:`~gnnpar.data.types.ImageDataset`. Missing files raise :class:`gnnpar.UsageError` naming the files,
the folder, and where to obtain them (the CLI exits 2).

- bundled: cora, citeseer (raw Planetoid files in ``planetoid/``, PyG's reader, public split),
  karate (built into PyG).
- user files under ``<data_root>/<name>/`` (``--data-root``, ``$GNNPAR_DATA``, or
  ``$XDG_CACHE_HOME/gnnpar``): pubmed, reddit, amazon, ogbn-arxiv, ogbn-products, cifar10
  (formats in readers.py). Except pubmed (small), they are converted once into
  ``<data_root>/cache/<name>/`` and memory-mapped from there (cache.py).
- generated: synthetic-reddit, synthetic-amazon, synthetic-papers100m, synthetic-cifar10
  (synthetic.py), cached in ``<data_root>/cache/<name>-scale<F>-seed<S>/``.
- a prepared folder (prepared.py, written by ``gnnpar prepare``): memory-mapped from disk.
- your own graph (user.py): ``--dataset FILE.pt``, an OGB-layout folder, or ``module:function``;
  cached by content in ``<data_root>/cache/user-<sha256[:20]>/``. A registered name always wins:
  write ``./cora`` for a folder called cora.

Tensors loaded from the cache are memory-mapped (read-only in spirit, copy-on-write if written):
ranks on one machine share one copy through the page cache. Multi-label ``y`` is uint8 0/1.

Run: ``gnnpar datasets`` lists every dataset, where its files go, and whether it is available.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data

from gnnpar.data import prepared, readers, safe_load, shards, synthetic, user
from gnnpar.data.cache import DEFAULT_LOCK_TIMEOUT_S, cached, fingerprint
from gnnpar.data.registry import BUNDLED, DATASETS, PLANETOID_FILES, DatasetSpec, unknown_dataset
from gnnpar.data.types import GraphDataset, ImageDataset, Loaded
from gnnpar.errors import UsageError


def _require_files(spec: DatasetSpec, root: Path) -> Path:
    missing = spec.missing_files(root)
    if missing:
        folder = spec.folder(root)
        raise UsageError(
            f"Dataset '{spec.name}' is not available offline: missing {', '.join(missing)} in "
            f"{folder}. Obtain them from {spec.obtain} and place them in that folder "
            f"(or point --data-root / $GNNPAR_DATA at a folder holding '{spec.name}/')."
        )
    return spec.folder(root)


# ------------------------------------------------------------------------------------ Planetoid
def _planetoid(spec: DatasetSpec) -> Callable[[Path, float, int, float], Loaded]:
    def load(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
        from torch_geometric.io import read_planetoid_data

        folder = _require_files(spec, root)
        raw = folder / Path(spec.files[0]).parent  # bundled: <Name>/raw inside the package

        def read(f: Path) -> Data:
            if spec.source != "bundled":  # the user's files (bundled ones ship with the code)
                check_planetoid_pickles(f, spec.name)
            return read_planetoid_data(str(f), spec.name)

        data = _read_raw(spec, raw, read)
        # Row-normalise the bag-of-words features, as GAT and GCN do on these datasets.
        data.x = data.x / data.x.sum(dim=1, keepdim=True).clamp(min=1)
        return GraphDataset(spec.name, data, int(data.y.max()) + 1)

    return load


def planetoid_allowed() -> dict[str, Any]:
    """What Planetoid's pickles name: numpy arrays (labels), scipy CSR matrices (features, under
    scipy's old and new module names) and a ``defaultdict(list)`` (the adjacency)."""
    import collections

    import scipy.sparse

    allowed = safe_load.numpy_arrays()
    for module in ("scipy.sparse.csr", "scipy.sparse._csr"):
        allowed[f"{module}.csr_matrix"] = scipy.sparse.csr_matrix
    allowed.update({"collections.defaultdict": collections.defaultdict, "builtins.list": list})
    return allowed


def check_planetoid_pickles(folder: Path, prefix: str) -> None:
    """PyG's read_planetoid_data unpickles ``ind.<prefix>.*`` with plain ``pickle``: each is
    first unpickled here with :func:`planetoid_allowed` only, so that a file naming anything
    else (an ``os.system`` would run) is refused before PyG reads it (UsageError)."""
    allowed = planetoid_allowed()
    holds = "Planetoid's files hold numpy arrays, scipy CSR matrices and a dict of lists only"
    for part in PLANETOID_FILES:
        if part == "test.index":  # text
            continue
        path = folder / f"ind.{prefix}.{part}"
        with open(path, "rb") as fh:
            readers.read_pickle(fh, path, allowed, holds, encoding="latin1")


def verify_bundled_checksums() -> list[str]:
    """Files whose SHA-256 differs from planetoid/SHA256SUMS (empty list: all good)."""
    bad = []
    for line in (BUNDLED / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split()
        if hashlib.sha256((BUNDLED / rel).read_bytes()).hexdigest() != digest:
            bad.append(rel)
    return bad


def _karate(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    n = data.num_nodes
    # KarateClub has 4 labelled training nodes; use the rest half for validation, half for test.
    rest = (~data.train_mask).nonzero().view(-1)
    perm = rest[torch.randperm(rest.numel(), generator=torch.Generator().manual_seed(seed))]
    data.val_mask = torch.zeros(n, dtype=torch.bool)
    data.test_mask = torch.zeros(n, dtype=torch.bool)
    data.val_mask[perm[: perm.numel() // 2]] = True
    data.test_mask[perm[perm.numel() // 2 :]] = True
    return GraphDataset("karate", data, int(data.y.max()) + 1)


# ---------------------------------------------------------------- user files and generated data
READER_VERSION = "readers-1"


def _graph_from_tensors(name: str, t: dict, meta: dict) -> GraphDataset:
    data = Data(
        x=t["x"],
        edge_index=t["edge_index"],
        y=t["y"],
        train_mask=t["train_mask"],
        val_mask=t["val_mask"],
        test_mask=t["test_mask"],
    )
    return GraphDataset(name, data, int(meta["num_classes"]), bool(meta["multilabel"]))


def _images_from_tensors(name: str, t: dict, meta: dict) -> ImageDataset:
    keys = ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y")
    return ImageDataset(name, *(t[k] for k in keys), num_classes=int(meta["num_classes"]))


def _user_cached(
    name: str, root: Path, read: Callable[[Path], tuple[dict, dict]], timeout_s: float
):
    """Read a user dataset once into the cache (keyed by the source files' size and mtime)."""
    spec = DATASETS[name]
    folder = _require_files(spec, root)
    version = f"{READER_VERSION}|{fingerprint([folder / f for f in spec.files])}"
    tensors, meta, _ = cached(root, name, version, lambda: _read_raw(spec, folder, read), timeout_s)
    return tensors, meta


def _read_raw(spec: DatasetSpec, folder: Path, read: Callable[[Path], tuple[dict, dict]]):
    """A reader's failure on the user's own files is bad input (exit 2) naming them, never a
    traceback from zipfile, numpy, gzip or pickle."""
    try:
        out = read(folder)
        problem = _inconsistency(out)
    except UsageError:
        raise
    except Exception as e:  # BadZipFile, EOFError, UnpicklingError, ValueError, OSError, ...
        cause = str(e).splitlines()[0][:200] if str(e) else ""
        problem = f"could not be read: {type(e).__name__}{': ' + cause if cause else ''}"
    if problem:
        raise UsageError(
            f"Dataset '{spec.name}': the files in {folder} ({', '.join(spec.files)}) {problem}. "
            f"They are damaged or not in the expected format: obtain them again from "
            f"{spec.obtain}."
        )
    return out


def _inconsistency(out) -> str | None:
    """What makes a reader's result unusable although every file parsed (an edge to a node
    that does not exist, a non-finite feature, a label beyond the classes), else None: caught
    here, it is bad input naming the files instead of an index error deep in training."""
    t, meta = (out.to_dict(), {}) if isinstance(out, Data) else out
    if "x" in t:  # a graph
        n = int(t["x"].size(0))
        ei = t["edge_index"]
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
            bad = int(ei.max()) if int(ei.max()) >= n else int(ei.min())
            return f"hold an edge to node {bad}, but the graph has {n} nodes (0..{n - 1})"
        features = [t["x"]]
    else:
        features = [t[f"{s}_x"] for s in ("train", "val", "test")]
        classes = int(meta.get("num_classes", 0))
        for split in ("train", "val", "test"):
            y = t[f"{split}_y"]
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= classes):
                return f"hold a {split} label {int(y.max())} outside the {classes} classes"
    for x in features:
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            return "hold features that are not finite numbers (nan or inf)"
    return None


def _user_graph(name: str, read: Callable[[Path], tuple[dict, dict]]):
    def load(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
        return _graph_from_tensors(name, *_user_cached(name, root, read, timeout_s))

    return load


def _user_images(name: str, read: Callable[[Path], tuple[dict, dict]]):
    def load(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
        return _images_from_tensors(name, *_user_cached(name, root, read, timeout_s))

    return load


def generated_key(name: str, scale: float, seed: int) -> str:
    return f"{name}-scale{scale:g}-seed{seed}"


def _generated_graph(recipe: synthetic.GraphRecipe):
    def load(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
        key = generated_key(recipe.name, scale, seed)
        tensors, meta, _ = cached(
            root,
            key,
            synthetic.version_of(recipe),
            lambda: synthetic.generate_graph(recipe, scale, seed),
            timeout_s,
        )
        return _graph_from_tensors(recipe.name, tensors, meta)

    return load


def _generated_images(root: Path, scale: float, seed: int, timeout_s: float) -> Loaded:
    def build() -> tuple[dict, dict]:
        raw, meta = synthetic.generate_cifar(scale, seed)
        return readers.normalise_images(raw), meta

    key = generated_key("synthetic-cifar10", scale, seed)
    tensors, meta, _ = cached(root, key, synthetic.CIFAR_VERSION, build, timeout_s)
    return _images_from_tensors("synthetic-cifar10", tensors, meta)


def load_dataset(
    name: str,
    root: str | Path,
    scale: float = 1.0,
    seed: int = 0,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
) -> Loaded:
    """A registered dataset by name, or the user's own graph (a .pt file, an OGB-layout folder,
    or module:function; user.py). ``scale`` applies to generated datasets only; ``seed`` to
    generated ones and to the split of a user graph given without masks. ``timeout_s`` (the
    run's ``--timeout``) bounds a wait on the cache lock of a process that stopped answering
    (filelock.exclusive_lock; gnnpar.data.filelock.CacheLockTimeout)."""
    if name in DATASETS:
        return loader(DATASETS[name])(Path(root), scale, seed, timeout_s)
    if prepared.is_sharded(name):  # every shard here: the unsharded graph, in memory
        return shards.load_sharded(name)
    if prepared.is_prepared(name):  # a folder written by `gnnpar prepare`: trained from disk
        return prepared.load_graph(name)
    if user.is_user_source(name):
        return user.load_user_graph(name, Path(root), seed, timeout_s)
    raise UsageError(unknown_dataset(name, "dataset", user.FORMS))


def loader(spec: DatasetSpec) -> Callable[[Path, float, int, float], Loaded]:
    """How the row ``spec`` of :data:`gnnpar.data.registry.DATASETS` is loaded, from the reader
    or generator it names: ``(root, scale, seed, timeout_s) -> GraphDataset | ImageDataset``."""
    if spec.reader == "planetoid":
        return _planetoid(spec)
    if spec.reader == "karate":
        return _karate
    if spec.reader == "generate_graph":
        return _generated_graph(synthetic.RECIPES[spec.name])
    if spec.reader == "generate_cifar":
        return _generated_images
    read = getattr(readers, spec.reader)
    if spec.kind == "image":
        return _user_images(spec.name, read)
    if spec.reader == "read_ogb":  # the split's folder is named per dataset
        return _user_graph(spec.name, functools.partial(read, name=spec.name))
    return _user_graph(spec.name, read)
