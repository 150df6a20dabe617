"""Readers for datasets a user places under ``<data_root>/<name>/``, in each source's own format.

Each ``read_*`` function takes the dataset folder and returns ``(tensors, meta)``: a dict with
``x, edge_index, y, train_mask, val_mask, test_mask`` (graphs) or ``train_x, train_y, val_x,
val_y, test_x, test_y`` (images), plus ``num_classes`` and ``multilabel``. datasets.py caches the
result (cache.py) so later runs, and every local rank, memory-map it instead of re-parsing.

- reddit: PyG's Reddit files (``reddit_data.npz``, ``reddit_graph.npz``, from
  https://data.dgl.ai/dataset/reddit.zip), read the way ``torch_geometric.datasets.Reddit.process``
  reads them (features, labels, node_types 1/2/3 = train/val/test, COO adjacency coalesced), with
  numpy alone and without PyG's download or its ``processed/`` folder.
- amazon: GraphSAINT's AmazonProducts (``adj_full.npz`` CSR, ``feats.npy``, ``class_map.json``,
  ``role.json``), as ``torch_geometric.datasets.AmazonProducts.process`` reads them; 107 classes,
  multi-label, ``y`` kept as uint8 0/1 (loss_fn converts with ``y.float()``).
- ogbn-arxiv, ogbn-products: OGB's raw on-disk format (``raw/edge.csv.gz``, ``raw/node-feat.csv.gz``,
  ``raw/node-label.csv.gz``, ``split/<scheme>/{train,valid,test}.csv.gz``), parsed with numpy.
  We do not use the ``ogb`` package although it installs next to torch 2.13: it pulls pandas and
  scikit-learn, checks PyPI for a newer version on import, asks an interactive question when the
  folder lacks its RELEASE file, and writes a ``processed/`` folder into the user's data. Both
  graphs are made symmetric, as OGB does for products (``add_inverse_edge``) and as the usual
  GNN baselines do for arxiv (``to_undirected``).
- cifar10: the python pickle batches ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``,
  unpickled with only numpy's array globals allowed (:func:`read_pickle`).
  The validation set is a fixed slice, the last 5,000 images of the 50,000 training images (the
  second half of ``data_batch_5``); the other 45,000 train. Every split is normalised per channel
  with the mean and standard deviation of those 45,000 training images.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.utils import coalesce, to_undirected

from gnnpar.data import safe_load
from gnnpar.data.registry import CIFAR_FILES, OGB_SPLIT, OGB_SPLITS
from gnnpar.errors import UsageError

Tensors = dict[str, torch.Tensor]


def _masks(n: int, **index: np.ndarray | torch.Tensor) -> Tensors:
    out = {}
    for name, idx in index.items():
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.as_tensor(np.asarray(idx), dtype=torch.long)] = True
        out[f"{name}_mask"] = mask
    return out


def _graph_meta(tensors: Tensors, num_classes: int, multilabel: bool) -> dict[str, Any]:
    return {
        "kind": "graph",
        "num_classes": num_classes,
        "multilabel": multilabel,
        "num_nodes": int(tensors["x"].size(0)),
        "num_edges": int(tensors["edge_index"].size(1)),
    }


# --------------------------------------------------------------------------------------- reddit


def read_reddit(folder: Path) -> tuple[Tensors, dict[str, Any]]:
    data = np.load(folder / "reddit_data.npz")
    x = torch.from_numpy(data["feature"]).to(torch.float32)
    y = torch.from_numpy(data["label"]).to(torch.long)
    split = torch.from_numpy(data["node_types"])
    adj = np.load(folder / "reddit_graph.npz")  # scipy.sparse.save_npz of a COO matrix
    edge_index = torch.stack(
        [torch.from_numpy(adj["row"]).to(torch.long), torch.from_numpy(adj["col"]).to(torch.long)]
    )
    edge_index = coalesce(edge_index, num_nodes=x.size(0))
    tensors = {
        "x": x,
        "edge_index": edge_index,
        "y": y,
        "train_mask": split == 1,
        "val_mask": split == 2,
        "test_mask": split == 3,
    }
    return tensors, _graph_meta(tensors, int(y.max()) + 1, False)


# ------------------------------------------------------------------------- amazon (GraphSAINT)


def read_graphsaint(folder: Path) -> tuple[Tensors, dict[str, Any]]:
    f = np.load(folder / "adj_full.npz")  # scipy.sparse.save_npz of a CSR matrix
    indptr, indices = f["indptr"], f["indices"]
    n_rows = indptr.size - 1
    row = torch.repeat_interleave(
        torch.arange(n_rows), torch.from_numpy(np.diff(indptr).astype(np.int64))
    )
    edge_index = torch.stack([row, torch.from_numpy(indices).to(torch.long)])
    x = torch.from_numpy(np.load(folder / "feats.npy")).to(torch.float32)
    n = x.size(0)
    class_map = json.loads((folder / "class_map.json").read_text())
    keys = np.fromiter((int(k) for k in class_map), dtype=np.int64, count=len(class_map))
    first = next(iter(class_map.values()))
    if isinstance(first, list):  # multi-label: a 0/1 vector per node
        y_np = np.zeros((n, len(first)), dtype=np.uint8)
        y_np[keys] = np.asarray(list(class_map.values()), dtype=np.uint8)
        y, num_classes, multilabel = torch.from_numpy(y_np), len(first), True
    else:
        y_np = np.full(n, -1, dtype=np.int64)
        y_np[keys] = np.fromiter(class_map.values(), dtype=np.int64, count=len(class_map))
        y, num_classes, multilabel = torch.from_numpy(y_np), int(y_np.max()) + 1, False
    role = json.loads((folder / "role.json").read_text())
    tensors = {
        "x": x,
        "edge_index": edge_index,
        "y": y,
        **_masks(n, train=role["tr"], val=role["va"], test=role["te"]),
    }
    return tensors, _graph_meta(tensors, num_classes, multilabel)


# ---------------------------------------------------------------------------------------- OGB


def _csv(path: Path, dtype) -> np.ndarray:
    with gzip.open(path, "rt") as fh:
        arr = np.loadtxt(fh, delimiter=",", dtype=dtype, ndmin=2)
    return arr


def read_ogb_arrays(
    folder: Path, split_dir: str | None, csv: Callable[[Path, Any], np.ndarray] = _csv
) -> dict[str, np.ndarray]:
    """The OGB node-property layout as its files hold it, the one reader of it (for the named
    OGB datasets, :func:`read_ogb`, and a user's OGB-layout folder, :mod:`gnnpar.data.user`):
    ``x`` [n, f] float32, ``edges`` [E, k] int64 (one "src,dst" per line, as given: not made
    symmetric, k not checked), ``y`` [n, k] float64 (NaN: unlabelled) and, where ``split_dir``
    names a split folder, ``train``, ``val``, ``test``: node indices. ``csv(path, dtype)`` reads
    one file; the caller words what a bad one says."""
    out = {
        "x": csv(folder / "raw/node-feat.csv.gz", np.float32),
        "edges": csv(folder / "raw/edge.csv.gz", np.int64),
        "y": csv(folder / "raw/node-label.csv.gz", np.float64),
    }
    if split_dir:
        for mask, stem in OGB_SPLIT:
            out[mask] = csv(folder / f"{split_dir}/{stem}.csv.gz", np.int64).reshape(-1)
    return out


def read_ogb(folder: Path, name: str) -> tuple[Tensors, dict[str, Any]]:
    """A named OGB node-property dataset (``ogbn-arxiv``, ``ogbn-products``), made symmetric."""
    a = read_ogb_arrays(folder, f"split/{OGB_SPLITS[name]}")
    x = torch.from_numpy(a["x"])
    n = x.size(0)
    y_np = a["y"].reshape(n, -1)[:, 0]
    # ogbn-products leaves no label unset; NaN (unlabelled) would become -1 here.
    y = torch.from_numpy(np.nan_to_num(y_np, nan=-1.0).astype(np.int64))
    edges = torch.from_numpy(a["edges"]).t().contiguous()
    edge_index = to_undirected(edges, num_nodes=n)
    idx = {mask: a[mask] for mask, _ in OGB_SPLIT}
    tensors = {"x": x, "edge_index": edge_index, "y": y, **_masks(n, **idx)}
    return tensors, _graph_meta(tensors, int(y.max()) + 1, False)


# -------------------------------------------------------------------------------------- CIFAR
CIFAR_VAL = 5_000  # the last 5,000 training images
CIFAR_HOLDS = "a CIFAR-10 batch holds a dict of bytes, lists and numpy arrays only"


def _cifar_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with open(path, "rb") as fh:
        d = read_pickle(fh, path, safe_load.numpy_arrays(), CIFAR_HOLDS, encoding="bytes")
    if not isinstance(d, dict):
        raise ValueError(f"{path.name} holds a {type(d).__name__}, not a CIFAR-10 batch's dict")
    x = torch.from_numpy(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
    return x, torch.tensor(d[b"labels"], dtype=torch.long)


def read_pickle(fh, path: Path, allow: dict[str, Any], holds: str, **kwargs: Any) -> Any:
    """A raw dataset's pickle, unpickled with only the ``allow``ed globals
    (:mod:`gnnpar.data.safe_load`), so that reading it runs no code from it; UsageError naming the
    file when it names another global (``holds``: what the format holds instead)."""
    try:
        return safe_load.pickle_load(fh, allow, **kwargs)
    except safe_load.Refused as e:
        raise UsageError(
            f"{path}: {e.why()}, and gnnpar reads dataset files without running code from them "
            f"({holds}). The file is not the dataset's: obtain it again from its source."
        ) from None


def normalise_images(tensors: Tensors) -> Tensors:
    """uint8 train/val/test images -> float32 normalised per channel with training statistics."""
    train = tensors["train_x"]
    mean = torch.zeros(3, dtype=torch.float64)
    sq = torch.zeros(3, dtype=torch.float64)
    for i in range(0, train.size(0), 8192):  # chunked: no float copy of the whole set at once
        chunk = train[i : i + 8192].to(torch.float64) / 255
        mean += chunk.sum(dim=(0, 2, 3))
        sq += (chunk**2).sum(dim=(0, 2, 3))
    count = train.size(0) * 32 * 32
    mean /= count
    std = (sq / count - mean**2).clamp(min=1e-12).sqrt()
    out = {}
    for split in ("train", "val", "test"):
        x = tensors[f"{split}_x"].to(torch.float32) / 255
        x.sub_(mean.float().view(1, 3, 1, 1)).div_(std.float().view(1, 3, 1, 1))
        out[f"{split}_x"] = x
        out[f"{split}_y"] = tensors[f"{split}_y"]
    out["channel_mean"], out["channel_std"] = mean.float(), std.float()
    return out


def read_cifar10(folder: Path) -> tuple[Tensors, dict[str, Any]]:
    parts = [_cifar_batch(folder / f) for f in CIFAR_FILES[:5]]
    x = torch.cat([p[0] for p in parts])
    y = torch.cat([p[1] for p in parts])
    test_x, test_y = _cifar_batch(folder / CIFAR_FILES[5])
    val = min(CIFAR_VAL, x.size(0) // 10)  # tiny fixtures: a tenth
    raw = {
        "train_x": x[:-val],
        "train_y": y[:-val],
        "val_x": x[-val:],
        "val_y": y[-val:],
        "test_x": test_x,
        "test_y": test_y,
    }
    return normalise_images(raw), {"kind": "image", "num_classes": 10}
