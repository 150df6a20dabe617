"""Your own graph: ``--dataset FILE.pt``, ``--dataset FOLDER`` (OGB layout), ``--dataset mod:fn``.

Three ways to hand gnnpar a node-classification graph::

    gnnpar train --dataset my_graph.pt --model gcn          # torch.save(data, "my_graph.pt")
    gnnpar train --dataset ./my_ogb_folder --model sage     # OGB node-property layout
    gnnpar train --dataset mygraphs:build --model gat       # build() returns a Data

- ``FILE.pt`` (or ``.pth``): a ``torch.save`` of a PyG ``Data``, of an ``InMemoryDataset`` holding
  one graph, of a list/tuple with one ``Data``, or of a dict with the same keys.
- ``FOLDER``: OGB's raw node-property layout under any folder name, ``raw/edge.csv.gz`` (one
  ``src,dst`` per line), ``raw/node-feat.csv.gz`` (one row of floats per node),
  ``raw/node-label.csv.gz`` (one class index per node, or one 0/1 row per node: multi-label) and
  ``split/<name>/{train,valid,test}.csv.gz`` (node indices, one per line). Exactly one split
  folder is read; several are an error; no ``split/`` at all means the stratified split below.
- ``module:function``: ``module`` is imported with the current folder first on ``sys.path`` and
  ``function()`` is called with no arguments; it returns any of the objects a ``.pt`` may hold.
  Every rank calls it (a multi-rank run builds the graph once per rank, then keeps only the
  shared cached copy), so it must build the same graph each time: it runs with torch's, numpy's
  and ``random``'s global generators seeded by ``--seed``; generators it creates itself it must
  seed itself.

What a graph must hold (anything else is an error, exit 2, naming the file and the problem):
``x`` [N, F] real numbers, finite (stored float32); ``edge_index`` [2, E] integers in [0, N)
(stored int64); ``y`` [N] (or [N, 1]) class indices >= 0, or [N, C] with C >= 2 of 0/1 for
multi-label (stored uint8); optionally all three of ``train_mask``, ``val_mask``, ``test_mask``
(bool [N], none empty). Other attributes (``edge_attr``, ``pos``, ...) are ignored.

Decisions:

- Edges are kept exactly as given, duplicates and self-loops included: a directed graph stays
  directed and messages flow source -> target (``edge_index[0] -> edge_index[1]``, PyG's
  convention). ``info["directed"]`` records whether the graph was not symmetric. (The named
  ``ogbn-arxiv`` / ``ogbn-products`` datasets, by contrast, are made symmetric by readers.py.)
- Without masks: a stratified 60/20/20 split drawn with the run's ``--seed`` after loading (it is
  cheap, so the cache holds the graph once for every seed). Per class, the nodes are shuffled;
  the first ``round(0.6 n)`` (at least 1) train, the next ``round(0.2 n)`` validate, the rest
  test. Multi-label graphs are stratified by each node's first positive label (nodes with none
  form one more group). With only some masks given (PyG's KarateClub has just train_mask), the
  missing ones are drawn the same way from the nodes in no given mask, the shares renormalised
  (there: half validation, half test). result.json's ``dataset_info.split`` says which.
- Cache: every user graph is converted once into ``<data_root>/cache/user-<sha256[:20]>/`` and
  memory-mapped from there (cache.py), so the local ranks of a machine share one copy. The key
  is the content, not the name nor the form: the SHA-256 of the converted tensors (names,
  dtypes, shapes, bytes), whether they came from a ``.pt`` file (a ``Data`` or a dict), an OGB
  folder, a function or ``gnnpar.fit(data)``. A file's bytes are hashed on every run; the first
  run that reads a file records which content they hold (``cache/user-source-<sha256>.json``),
  so later runs do not convert it again. A renamed or re-saved copy hits the same entry; an
  edited graph makes a new one. result.json's ``dataset_info.fingerprint`` is that content
  SHA-256.

Safety: a ``.pt`` file is read with ``torch.load(weights_only=True)`` (:mod:`gnnpar.data.safe_load`),
so reading it runs no code from it. Allowed beyond tensors and containers: PyG's ``Data`` and
the three classes it is made of, numpy arrays (a dict of them), and, for a saved dataset, the
``InMemoryDataset`` classes and transforms of ``torch_geometric.datasets`` /
``torch_geometric.transforms`` (PyG's own code; a dataset class that overrides how a graph is
read is refused). A file naming any other class or function (your own dataset class, or
``os.system``) is refused, exit 2, with how to convert it.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import os
import random
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from gnnpar.data import readers, safe_load
from gnnpar.data.cache import (
    DEFAULT_LOCK_TIMEOUT_S,
    TMP_MARK,
    announced,
    cache_dir,
    cached,
    entry_bytes,
)
from gnnpar.data.filelock import exclusive_lock
from gnnpar.data.registry import OGB_RAW, OGB_SPLIT
from gnnpar.data.types import GraphDataset
from gnnpar.errors import UsageError
from gnnpar.targets import TARGET, check_findable, import_target_module
from gnnpar.targets import brief as _brief
from gnnpar.targets import cwd_on_path as _cwd_on_path
from gnnpar.targets import describe as _what

VERSION = "user-1"  # bump when validation or conversion changes what the cache holds
PT_SUFFIXES = (".pt", ".pth")
MASKS = ("train_mask", "val_mask", "test_mask")
SHARES = {"train_mask": 6, "val_mask": 2, "test_mask": 2}  # of each class, when drawn
FORMS = "a .pt file (a saved PyG Data), an OGB-layout folder, or module:function"


# ------------------------------------------------------------------------ which --dataset forms
def is_user_source(name: str) -> bool:
    """Does ``name`` denote the user's own graph (not a registered name)? Loading says if it is
    usable: a path-like name that does not exist is still ours, to say "no such file"."""
    if TARGET.match(name):
        return True
    if name.lower().endswith(PT_SUFFIXES) or "/" in name or name.startswith((".", "~")):
        return True
    return os.sep in name or Path(name).exists()


def check_source(name: str) -> None:
    """Cheap checks before any process starts: the path exists and has a known form, or the
    module of ``module:function`` can be found. UsageError otherwise."""
    if TARGET.match(name):
        check_findable("--dataset", name)
        return
    _pt_or_folder(name)


def _pt_or_folder(name: str) -> Path:
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if not path.exists():
        raise UsageError(
            f"--dataset {name}: no such file or folder (looked in {Path.cwd()}). Give "
            f"{FORMS}; `gnnpar datasets` lists the named datasets."
        )
    if not name.lower().endswith(PT_SUFFIXES):
        raise UsageError(
            f"--dataset {name}: is a file but not a .pt file. Save your graph with "
            f"torch.save(data, 'NAME.pt'), or give an OGB-layout folder or module:function."
        )
    return path


# ------------------------------------------------------------------------------------ loading
def load_user_graph(name: str, root: Path, seed: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S):
    """The GraphDataset for ``--dataset name`` (one of the three forms), cached by content."""
    build: Callable[[], tuple[dict, dict]]
    if TARGET.match(name) and not Path(name).exists():
        # the function runs every time (its result is what is hashed); the cache then holds
        # the one copy that the local ranks share
        source, label = name, name.split(":")[1]
        built = _check_graph(_call_target(name, seed), lambda key: name)
        digest = _tensor_digest(built[0])
        build = functools.partial(tuple, built)
    else:
        path = _pt_or_folder(name)
        source = str(path.resolve())
        if path.is_dir():
            label = path.resolve().name
            files, split_dir = _ogb_files(path)
            read = functools.partial(_read_ogb, path, split_dir)
            files_digest = _files_digest(path, files)
        else:
            label = path.stem
            read = functools.partial(_read_pt, path)
            files_digest = _files_digest(path.parent, [path.name])
        digest, build = _content_key(root, files_digest, read, timeout_s, _converting(name, root))
    what = _converting(name, root)
    t, meta, _ = cached(root, f"user-{digest[:20]}", VERSION, build, timeout_s, what)
    data = Data(x=t["x"], edge_index=t["edge_index"], y=t["y"])
    given = {m: t[m] for m in meta["masks"]}
    masks = stratified_split(t["y"], bool(meta["multilabel"]), seed, given)
    _require_nonempty_split(masks, source, seed)
    for m in MASKS:
        data[m] = masks[m]
    if len(given) == len(MASKS):
        split = "given"
    elif not given:
        split = f"stratified-60/20/20-seed{seed}"
    else:
        drawn = [m[: -len("_mask")] for m in MASKS if m not in given]
        split = f"given {', '.join(m[: -len('_mask')] for m in given)}; {', '.join(drawn)} stratified from the rest, seed {seed}"
    info = {
        "source": source,
        "fingerprint": digest,
        "directed": bool(meta["directed"]),
        "split": split,
        "split_counts": {m[: -len("_mask")]: int(data[m].sum()) for m in MASKS},
        "num_nodes": int(meta["num_nodes"]),
        "num_edges": int(meta["num_edges"]),
    }
    return GraphDataset(label, data, int(meta["num_classes"]), bool(meta["multilabel"]), info)


def _unpack(obj: Any, where: str, verb: str = "holds") -> dict[str, Any]:
    """The attributes of a Data / one-graph dataset / [Data] / dict, as a dict."""
    from torch_geometric.data import Dataset

    if isinstance(obj, Dataset) or isinstance(obj, (list, tuple)):
        try:
            count = len(obj)
            if count == 1:
                obj = obj[0]
        except Exception as e:
            raise UsageError(f"{where}: cannot read its graph ({_brief(e)}).") from None
        if count != 1:
            raise UsageError(
                f"{where}: {verb} {count} graphs ({type(obj).__name__}); gnnpar trains on one "
                "graph. Save the one graph you mean, e.g. torch.save(dataset[0], 'graph.pt')."
            )
    if isinstance(obj, Data):
        return {k: v for k, v in obj.items()}
    if isinstance(obj, dict):
        return obj
    raise UsageError(
        f"{where}: {verb} {_what(obj)}, not a PyG Data. Give a torch_geometric.data.Data with x, "
        "edge_index and y (or an InMemoryDataset with one graph, [data], or a dict of them)."
    )


def plain_graph(obj: Any, where: str) -> dict[str, Any]:
    """A Data / one-graph dataset / [Data] / dict as a dict of its plain tensors and numpy arrays
    (tensor subclasses as torch.Tensor; other attributes, which gnnpar ignores, dropped): what
    ``gnnpar.fit`` saves for the ranks, so that the safe loader reads back any graph it was given
    (a Data subclass, a dataset of the user's own class, odd extra attributes)."""
    out = {}
    for key, value in _unpack(obj, where).items():
        if isinstance(value, torch.Tensor):
            out[key] = value.detach().cpu().as_subclass(torch.Tensor)
        elif isinstance(value, np.ndarray):
            out[key] = value
    return out


def _read_pt(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return _check_graph(_load_pt(path), lambda key: str(path))


def _load_pt(path: Path) -> dict[str, Any]:
    if path.stat().st_size == 0:
        raise UsageError(f"{path}: the file is empty (0 bytes). Save the graph again.")
    try:
        obj = safe_load.torch_load(path, _pt_allowed(), resolve=_pyg_class)
    except safe_load.Refused as e:
        raise UsageError(
            f"{path}: {e.why()}; gnnpar reads .pt files without running code from them. If you "
            "trust the file, load it yourself in Python (torch.load(path, weights_only=False)) "
            "and pass the graph to gnnpar.fit(data, ...), or re-save it as a PyG Data or a dict "
            "of tensors: torch.save(Data(x=..., edge_index=..., y=...), 'graph.pt')."
        ) from None
    except Exception as e:
        raise UsageError(
            f"{path}: not a file torch.load can read (truncated, or not written by torch.save): "
            f"{_brief(e)}."
        ) from None
    try:
        return _unpack(obj, str(path))
    except UsageError:
        raise
    except Exception as e:  # a Data or dataset whose insides are not what PyG wrote
        raise UsageError(f"{path}: cannot read its graph ({_brief(e)}).") from None


def _pt_allowed() -> list[Any]:
    """What a ``.pt`` graph may hold beyond torch's tensors and containers: a PyG ``Data`` (the
    class and the three it is made of; PyG allows only ``Data`` itself) and numpy arrays."""
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    numpy = safe_load.torch_pairs(safe_load.numpy_arrays())
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, *numpy]


PYG_PACKAGES = ("torch_geometric.datasets.", "torch_geometric.transforms.")
DATASET_ACCESS = ("get", "len", "indices", "__getitem__", "__len__", "__getattr__")


def _pyg_class(name: str) -> type | None:
    """A saved dataset's class or transform, when it is PyG's own: an ``InMemoryDataset`` of
    ``torch_geometric.datasets`` that reads its graphs the base class's way (one that overrides
    it might read other files), or a transform of ``torch_geometric.transforms`` (it is applied
    to the graph, as the dataset would). Only modules already imported (``import
    torch_geometric`` imports them all) are looked in: a file never makes gnnpar import one."""
    from torch_geometric.data import InMemoryDataset
    from torch_geometric.transforms import BaseTransform

    module, _, attr = name.rpartition(".")
    if not module.startswith(PYG_PACKAGES) or module not in sys.modules:
        return None
    cls = getattr(sys.modules[module], attr, None)
    if not isinstance(cls, type) or cls.__module__ != module:
        return None
    if issubclass(cls, BaseTransform):
        return cls
    if issubclass(cls, InMemoryDataset) and all(
        getattr(cls, m, None) is getattr(InMemoryDataset, m, None) for m in DATASET_ACCESS
    ):
        return cls
    return None


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's, numpy's and random's global generators seeded with the run's seed (and restored
    after): a function that draws a random graph from them builds the same graph on every rank
    and in every run with that seed. (Generators it makes itself, np.random.default_rng(), it
    must seed itself.)"""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def _call_target(name: str, seed: int) -> dict[str, Any]:
    module_name, func_name = name.split(":")
    with _cwd_on_path():
        module = import_target_module("--dataset", name, module_name)
        func = getattr(module, func_name, None)
        if not callable(func):
            raise UsageError(
                f"--dataset {name}: module {module_name} has no function {func_name} "
                f"({getattr(module, '__file__', '')})."
            )
        try:
            with _seeded(seed):
                obj = func()
        except Exception as e:
            raise UsageError(f"--dataset {name}: {func_name}() raised {_brief(e)}.") from None
    return _unpack(obj, f"--dataset {name}", f"{func_name}() returned")


# ------------------------------------------------------------------------------- OGB folders
def _ogb_files(folder: Path) -> tuple[list[str], str | None]:
    """The files of an OGB-layout folder that are read (relative paths), and its split folder."""
    split_root = folder / "split"
    split_dir = None
    if split_root.exists():
        names = sorted(p.name for p in split_root.iterdir() if p.is_dir())
        if len(names) > 1:
            raise UsageError(
                f"{split_root}: holds {len(names)} split folders ({', '.join(names)}); keep the "
                "one to train with (gnnpar reads exactly one), or remove split/ for a "
                "stratified 60/20/20 split."
            )
        if not names:
            raise UsageError(
                f"{split_root}: holds no split folder; expected split/<name>/"
                "{train,valid,test}.csv.gz, or no split/ for a stratified 60/20/20 split."
            )
        split_dir = f"split/{names[0]}"
    files = list(OGB_RAW)
    if split_dir:
        files += [f"{split_dir}/{stem}.csv.gz" for _, stem in OGB_SPLIT]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise UsageError(
            f"{folder}: missing {', '.join(missing)}. An OGB node-property folder holds "
            f"{', '.join(OGB_RAW)} and split/<name>/{{train,valid,test}}.csv.gz."
        )
    return files, split_dir


def _read_csv(path: Path, dtype) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's "input contained no data": checked below
            return readers._csv(path, dtype)
    except (EOFError, gzip.BadGzipFile) as e:
        raise UsageError(f"{path}: not a complete gzip file (truncated?): {_brief(e)}.") from None
    except Exception as e:
        raise UsageError(f"{path}: malformed CSV: {_brief(e)}.") from None


def _read_ogb(folder: Path, split_dir: str | None) -> tuple[dict, dict]:
    feat = folder / "raw/node-feat.csv.gz"
    edge = folder / "raw/edge.csv.gz"
    label = folder / "raw/node-label.csv.gz"
    a = readers.read_ogb_arrays(folder, split_dir, _read_csv)
    x = torch.from_numpy(a["x"])
    n = x.size(0)
    edges = a["edges"]
    if edges.size and edges.shape[1] != 2:
        raise UsageError(f"{edge}: has {edges.shape[1]} columns; expected 2 (src,dst).")
    edges = edges.reshape(-1, 2)
    obj: dict[str, Any] = {
        "x": x,
        "edge_index": torch.from_numpy(edges).t().contiguous(),
        "y": torch.from_numpy(a["y"]),
    }
    files = {"x": feat, "edge_index": edge, "y": label}
    if split_dir:
        for mask, stem in OGB_SPLIT:
            path = folder / f"{split_dir}/{stem}.csv.gz"
            idx = a[mask]
            bad = idx[(idx < 0) | (idx >= n)]
            if bad.size:
                raise UsageError(
                    f"{path}: node index {int(bad[0])} is out of range (x has {n} nodes: "
                    f"0..{n - 1})."
                )
            m = torch.zeros(n, dtype=torch.bool)
            m[torch.from_numpy(idx)] = True
            obj[f"{mask}_mask"], files[f"{mask}_mask"] = m, path
    return _check_graph(obj, lambda key: str(files.get(key, folder)))


# ------------------------------------------------------------------------------ validation
def _check_graph(
    obj: dict[str, Any], where: Callable[[str], str]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Validate and convert x, edge_index, y and the masks; returns (tensors, meta) for the cache.

    ``where(key)`` names the file (or function) that holds ``key`` in messages.
    """
    x = _tensor(obj, "x", where)
    if x.dim() != 2:
        raise UsageError(f"{where('x')}: x must be 2-D [nodes, features], got shape {_shape(x)}.")
    if x.dtype.is_complex or x.size(0) == 0 or x.size(1) == 0:
        raise UsageError(
            f"{where('x')}: x must be real numbers with at least one node and one feature, got "
            f"{x.dtype} of shape {_shape(x)}."
        )
    x = x.to(torch.float32).contiguous()
    n = x.size(0)
    _check_finite(x, where("x"))

    ei = _tensor(obj, "edge_index", where)
    if ei.dim() != 2 or ei.size(0) != 2:
        hint = (
            " (it looks transposed: use edge_index.t())"
            if ei.dim() == 2 and ei.size(1) == 2
            else ""
        )
        raise UsageError(
            f"{where('edge_index')}: edge_index must have shape [2, edges], got {_shape(ei)}{hint}."
        )
    if ei.dtype.is_floating_point or ei.dtype.is_complex or ei.dtype == torch.bool:
        raise UsageError(f"{where('edge_index')}: edge_index must hold integers, got {ei.dtype}.")
    ei = ei.to(torch.long).contiguous()
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        col = int(((ei < 0) | (ei >= n)).any(0).nonzero()[0])
        raise UsageError(
            f"{where('edge_index')}: edge_index column {col} is {ei[:, col].tolist()}, out of "
            f"range: node ids must be in 0..{n - 1} (x has {n} rows)."
        )

    y, num_classes, multilabel = _labels(_tensor(obj, "y", where), n, where("y"))

    tensors = {"x": x, "edge_index": ei, "y": y}
    given = [m for m in MASKS if obj.get(m) is not None]
    for m in given:
        tensors[m] = _mask(obj[m], m, n, where(m))

    from torch_geometric.utils import is_undirected

    meta = {
        "kind": "graph",
        "num_classes": num_classes,
        "multilabel": multilabel,
        "num_nodes": n,
        "num_edges": int(ei.size(1)),
        "directed": not is_undirected(ei, num_nodes=n),
        "masks": given,  # the masks the user gave; the others are drawn at load time
    }
    return tensors, meta


def _tensor(obj: dict[str, Any], key: str, where: Callable[[str], str]) -> torch.Tensor:
    v = obj.get(key)
    if v is None:
        have = ", ".join(sorted(str(k) for k in obj)) or "nothing"
        raise UsageError(
            f"{where(key)}: the graph has no '{key}' (it has: {have}). gnnpar needs x, "
            "edge_index and y."
        )
    if isinstance(v, np.ndarray):
        v = torch.from_numpy(v)
    if not isinstance(v, torch.Tensor):
        raise UsageError(f"{where(key)}: '{key}' must be a tensor, got {_what(v)}.")
    if v.layout != torch.strided:
        raise UsageError(f"{where(key)}: '{key}' is a sparse tensor; save {key}.to_dense().")
    return v.detach().cpu()  # a function may build on the GPU or with autograd


def _check_finite(x: torch.Tensor, where: str) -> None:
    rows = max(1, (1 << 22) // x.size(1))  # chunks of ~4M values: no full-size bool copy
    for start in range(0, x.size(0), rows):
        ok = torch.isfinite(x[start : start + rows])
        if not ok.all():
            r, c = (~ok).nonzero()[0].tolist()
            value = float(x[start + r, c])
            raise UsageError(
                f"{where}: x holds {value} (not a finite number) at node {start + r}, feature "
                f"{c}. Replace NaN/inf features, e.g. torch.nan_to_num(x)."
            )


def _labels(y: torch.Tensor, n: int, where: str) -> tuple[torch.Tensor, int, bool]:
    """(y, num_classes, multilabel): [N] long class indices, or [N, C] uint8 0/1."""
    if y.dim() == 2 and y.size(1) == 1:
        y = y.view(-1)  # OGB-style [N, 1] class indices
    if y.dim() not in (1, 2) or y.size(0) != n:
        raise UsageError(
            f"{where}: y must have one entry per node ([{n}] class indices, or [{n}, classes] "
            f"0/1 for multi-label), got shape {_shape(y)} while x has {n} nodes."
        )
    if y.dtype.is_complex:
        raise UsageError(f"{where}: y must hold class indices, got {y.dtype}.")
    if y.dim() == 2:
        bad = ((y != 0) & (y != 1)).any(1).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise UsageError(
                f"{where}: a 2-D y is a multi-label 0/1 matrix, but node {i} has "
                f"{y[i][(y[i] != 0) & (y[i] != 1)][:3].tolist()}. For class indices give a 1-D y."
            )
        return y.to(torch.uint8).contiguous(), int(y.size(1)), True
    if y.dtype.is_floating_point:
        bad = (~torch.isfinite(y)) | (y != y.floor())
        if bad.any():
            i = int(bad.nonzero()[0])
            raise UsageError(
                f"{where}: y must hold integer class indices, but node {i} has {float(y[i])}"
                " (unlabelled nodes are not supported: leave them out of the graph's masks "
                "and give them any class)."
            )
    y = y.to(torch.long).contiguous()
    if int(y.min()) < 0:
        i = int((y < 0).nonzero()[0])
        raise UsageError(f"{where}: y must hold class indices >= 0, but node {i} has {int(y[i])}.")
    return y, int(y.max()) + 1, False


def _mask(m: Any, key: str, n: int, where: str) -> torch.Tensor:
    if isinstance(m, np.ndarray):
        m = torch.from_numpy(m)
    if isinstance(m, torch.Tensor):
        m = m.detach().cpu()
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        got = m.dtype if isinstance(m, torch.Tensor) else _what(m)
        raise UsageError(
            f"{where}: {key} must be a bool tensor of length {n}, got {got}. From node "
            f"indices: mask = torch.zeros({n}, dtype=torch.bool); mask[idx] = True."
        )
    if m.dim() != 1 or m.size(0) != n:
        raise UsageError(
            f"{where}: {key} must have one entry per node (length {n}), got shape {_shape(m)}."
        )
    if not m.any():
        raise UsageError(f"{where}: {key} is empty (selects no node).")
    return m.contiguous()


# ---------------------------------------------------------------------------------- split
def stratified_split(
    y: torch.Tensor, multilabel: bool, seed: int, given: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """train/val/test masks: the ``given`` ones as they are, the missing ones drawn from the
    nodes in no given mask, stratified by class and shuffled with ``seed``, in the shares
    60/20/20 renormalised over the missing masks (KarateClub gives only train_mask: the rest is
    split half validation, half test).

    Per class of ``n`` remaining nodes, each missing mask but the last takes
    ``round(share * n)`` (train at least 1), as far as nodes remain; the last takes the rest.
    Multi-label: classes are the first positive label (nodes with none form one more group).
    """
    given = dict(given or {})
    # given masks stay as they are (memory-mapped from the cache); only missing ones are made
    out = {m: given[m] if m in given else torch.zeros(y.size(0), dtype=torch.bool) for m in MASKS}
    missing = [m for m in MASKS if m not in given]
    if not missing:
        return out
    if multilabel:
        has = y.bool().any(1)
        group = torch.where(
            has, y.argmax(1).long(), torch.full_like(has, y.size(1), dtype=torch.long)
        )
    else:
        group = y.long()
    rest = torch.ones(y.size(0), dtype=torch.bool)
    for m in given.values():
        rest &= ~m
    idx = rest.nonzero().view(-1)
    group = group[idx]
    n = group.numel()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sorted_group, order = torch.sort(group[perm], stable=True)  # classes, shuffled within
    nodes = idx[perm[order]]
    counts = torch.bincount(group, minlength=int(group.max()) + 1 if n else 0)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - starts[sorted_group]  # position within its class
    total = sum(SHARES[m] for m in missing)
    end = torch.zeros_like(counts)
    for i, m in enumerate(missing):
        begin = end
        if i == len(missing) - 1:
            end = counts
        else:
            size = (SHARES[m] * counts + total // 2) // total
            if m == "train_mask":
                size = torch.clamp(size, min=1)
            end = torch.minimum(counts, begin + size)
        pick = (rank >= begin[sorted_group]) & (rank < end[sorted_group])
        out[m][nodes[pick]] = True
    return out


def _require_nonempty_split(masks: dict[str, torch.Tensor], source: str, seed: int) -> None:
    empty = [m for m in MASKS if not masks[m].any()]
    if empty:
        raise UsageError(
            f"{source}: the stratified 60/20/20 split (seed {seed}) leaves {', '.join(empty)} "
            "empty: the classes have too few nodes. Give train_mask, val_mask and test_mask."
        )


# ------------------------------------------------------------------------------ fingerprints
def _content_key(
    root: Path,
    file_digest: str,
    read: Callable[[], tuple[dict, dict]],
    timeout_s: float,
    what: str,
) -> tuple[str, Callable[[], tuple[dict, dict]]]:
    """``(content digest, builder)`` of a graph read from files whose bytes hash to
    ``file_digest``.

    The cache is keyed by the converted tensors (:func:`_tensor_digest`), so a graph saved as a
    ``Data``, as a dict, as an OGB folder or handed to ``gnnpar.fit`` lands in one entry. Which
    content a file holds is known only once it is read: the first read records it in a small
    alias file ``cache/user-source-<sha256 of the files[:20]>.json``, so later runs only hash the
    files (as before) and never convert them again. Readers of one source take its lock in
    turn, so the local ranks of a first run do not each convert a large graph at once."""
    cache = cache_dir(root, "")
    alias = cache / f"user-source-{file_digest[:20]}.json"
    known = _read_alias(alias, file_digest)
    if known is not None:  # built again from the files if its entry went missing
        return known, read
    stack = contextlib.ExitStack()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = cache / f"user-source-{file_digest[:20]}.lock"
        stack.enter_context(exclusive_lock(lock, str(alias), timeout_s))
    except OSError:  # a read-only data root: no alias, no sharing (cached() says so)
        built = read()
        return _tensor_digest(built[0]), functools.partial(tuple, built)
    with stack:
        known = _read_alias(alias, file_digest)  # another rank read the files meanwhile
        if known is not None:
            return known, read
        # the entry's name is known only once the files are read: the line names the folder
        with announced(what, f"{cache}{os.sep}") as done:
            built = read()
            digest = _tensor_digest(built[0])
            # the entry first, then the alias that points at it
            keep = functools.partial(tuple, built)
            entry = cache_dir(root, f"user-{digest[:20]}")
            _, _, hit = cached(root, entry.name, VERSION, keep, timeout_s, announce=False)
            if hit:
                done["same"] = entry
            else:
                done["size"] = entry_bytes(entry)
        tmp = alias.with_name(f".{alias.name}{TMP_MARK}{os.getpid()}")
        record = {"version": VERSION, "files_sha256": file_digest, "content_sha256": digest}
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, alias)
        except OSError:  # no alias: the next run reads the files again, nothing worse
            tmp.unlink(missing_ok=True)
        return digest, read


def _converting(name: str, root: Path) -> str:
    """``converting NAME``; the copy ``gnnpar.fit`` saved of an in-memory graph
    (``<data-root>/inputs/graph-<sha>.pt``, api.py) is named as what the user gave."""
    path = Path(name)
    if path.name.startswith("graph-") and path.parent.name == "inputs":
        if path.parent.resolve() == (Path(root) / "inputs").resolve():
            return "converting the graph given to gnnpar.fit"
    return f"converting {name}"


def _read_alias(alias: Path, file_digest: str) -> str | None:
    """The content digest an alias file records for ``file_digest`` (None: none, or unreadable)."""
    try:
        record = json.loads(alias.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return None  # another conversion: read the files again
    if record.get("files_sha256") != file_digest:
        return None
    digest = record.get("content_sha256")
    return digest if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) else None


def _files_digest(folder: Path, files: list[str]) -> str:
    """SHA-256 over the files (streamed), each preceded by its path inside ``folder``."""
    h = hashlib.sha256()
    for rel in files:
        path = folder / rel
        if len(files) > 1:
            h.update(f"{rel}\0{path.stat().st_size}\0".encode())
        try:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            raise UsageError(f"{path}: cannot be read: {_brief(e)}.") from None
    return h.hexdigest()


def _tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the converted tensors (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(f"{key}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(memoryview(t.view(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


# ------------------------------------------------------------------------------------ helpers
def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))
