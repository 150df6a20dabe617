"""Every reader on a tiny fixture written in the dataset's real on-disk format, values checked."""

from __future__ import annotations

import gzip
import json
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnpar.data.datasets import load_dataset
from gnnpar.data.readers import (
    read_cifar10,
    read_graphsaint,
    read_ogb,
    read_reddit,
)

# A 5-node directed edge list with one duplicate (2->3 twice): readers must coalesce it away
# where the source format does (Reddit), or keep the graph as given (GraphSAINT).
ROW = np.array([0, 1, 2, 2, 3, 4, 2])
COL = np.array([1, 0, 3, 4, 2, 2, 3])


def test_reddit_reader(tmp_path):
    folder = tmp_path / "reddit"
    folder.mkdir()
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.savez(
        folder / "reddit_data.npz",
        feature=x,
        label=np.array([0, 2, 1, 2, 0]),
        node_types=np.array([1, 1, 2, 3, 3]),
    )
    sp.save_npz(folder / "reddit_graph.npz", sp.coo_matrix((np.ones(7), (ROW, COL)), (5, 5)))
    t, meta = read_reddit(folder)
    assert torch.equal(t["x"], torch.from_numpy(x))
    assert t["y"].tolist() == [0, 2, 1, 2, 0]
    # coalesced: sorted by (row, col), duplicate gone
    assert t["edge_index"].tolist() == [[0, 1, 2, 2, 3, 4], [1, 0, 3, 4, 2, 2]]
    assert t["train_mask"].tolist() == [True, True, False, False, False]
    assert t["val_mask"].tolist() == [False, False, True, False, False]
    assert t["test_mask"].tolist() == [False, False, False, True, True]
    assert meta["num_classes"] == 3 and meta["multilabel"] is False
    # through the registry: cached, memory-mapped, same values
    ds = load_dataset("reddit", tmp_path)
    assert torch.equal(ds.data.edge_index, t["edge_index"]) and ds.num_classes == 3


def test_graphsaint_amazon_reader(tmp_path):
    folder = tmp_path / "amazon"
    folder.mkdir()
    sp.save_npz(folder / "adj_full.npz", sp.csr_matrix((np.ones(6), (ROW[:6], COL[:6])), (5, 5)))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.save(folder / "feats.npy", x)
    labels = [[1, 0, 1], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 0, 0]]
    # GraphSAINT writes class_map keys as strings, in no particular order
    (folder / "class_map.json").write_text(json.dumps({str(i): labels[i] for i in (3, 0, 4, 1, 2)}))
    (folder / "role.json").write_text(json.dumps({"tr": [0, 1, 2], "va": [3], "te": [4]}))
    t, meta = read_graphsaint(folder)
    assert torch.equal(t["x"], torch.from_numpy(x))
    assert t["y"].dtype == torch.uint8 and t["y"].tolist() == labels
    assert t["edge_index"].tolist() == [[0, 1, 2, 2, 3, 4], [1, 0, 3, 4, 2, 2]]
    assert t["train_mask"].tolist() == [True, True, True, False, False]
    assert t["val_mask"].nonzero().view(-1).tolist() == [3]
    assert t["test_mask"].nonzero().view(-1).tolist() == [4]
    assert meta == {**meta, "num_classes": 3, "multilabel": True}
    ds = load_dataset("amazon", tmp_path)
    assert ds.multilabel and ds.data.y.dtype == torch.uint8


def _write_csv_gz(path, rows, fmt):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        np.savetxt(fh, rows, fmt=fmt, delimiter=",")


@pytest.mark.parametrize("name,split", [("ogbn-arxiv", "time"), ("ogbn-products", "sales_ranking")])
def test_ogb_reader(tmp_path, name, split):
    folder = tmp_path / name
    # OGB raw files: no header; edge.csv.gz holds one "src,dst" per line, listed once.
    _write_csv_gz(folder / "raw/edge.csv.gz", np.array([[0, 1], [1, 2], [3, 2]]), "%d")
    feat = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    _write_csv_gz(folder / "raw/node-feat.csv.gz", feat, "%.8f")
    _write_csv_gz(folder / "raw/node-label.csv.gz", np.array([[2], [0], [1], [2]]), "%d")
    for s, idx in (("train", [0, 1]), ("valid", [2]), ("test", [3])):
        _write_csv_gz(folder / f"split/{split}/{s}.csv.gz", np.array(idx).reshape(-1, 1), "%d")
    t, meta = read_ogb(folder, name)
    assert torch.allclose(t["x"], torch.from_numpy(feat))
    assert t["y"].tolist() == [2, 0, 1, 2]
    # made symmetric, sorted
    assert t["edge_index"].tolist() == [[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]
    assert t["train_mask"].tolist() == [True, True, False, False]
    assert t["val_mask"].tolist() == [False, False, True, False]
    assert t["test_mask"].tolist() == [False, False, False, True]
    assert meta["num_classes"] == 3
    assert load_dataset(name, tmp_path).num_nodes == 4


def _cifar_fixture(folder, per_batch=10):
    """Six pickles in CIFAR-10's layout: dict with b'data' [n, 3072] uint8 and b'labels'."""
    d = folder / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        batches[name] = (data, labels)
        with open(d / name, "wb") as fh:
            pickle.dump(
                {b"batch_label": name.encode(), b"labels": labels, b"data": data},
                fh,
                protocol=2,
            )
    return batches


def test_cifar10_reader(tmp_path):
    batches = _cifar_fixture(tmp_path / "cifar10")
    t, meta = read_cifar10(tmp_path / "cifar10")
    train = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    labels = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    n_val = 5  # fixtures smaller than 50,000 images: a tenth of the training images
    raw = torch.from_numpy(train).view(-1, 3, 32, 32).double() / 255
    fit = raw[:-n_val]
    mean = fit.mean(dim=(0, 2, 3))
    std = fit.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1, unbiased=False)
    expect = ((raw - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)).float()
    assert t["train_x"].shape == (45, 3, 32, 32) and t["train_x"].dtype == torch.float32
    assert torch.allclose(t["train_x"], expect[:-n_val], atol=1e-5)
    assert torch.allclose(t["val_x"], expect[-n_val:], atol=1e-5)
    assert t["train_y"].tolist() == labels[:-n_val] and t["val_y"].tolist() == labels[-n_val:]
    assert t["test_y"].tolist() == batches["test_batch"][1]
    # normalised with training statistics: the training images have mean 0, std 1 per channel
    assert torch.allclose(t["train_x"].mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert meta["num_classes"] == 10
    ds = load_dataset("cifar10", tmp_path)
    assert torch.equal(ds.test_x, t["test_x"]) and ds.num_features == 3


def test_pubmed_planetoid_reader(tmp_path):
    """Planetoid's eight pickles (scipy CSR features, one-hot labels, adjacency dict, test
    index file) for a 508-node graph: 2 labelled, 500 validation (PyG's public split needs them),
    3 test nodes whose index file is unsorted."""
    folder = tmp_path / "pubmed"
    folder.mkdir()
    rng = np.random.default_rng(0)
    n_all, n_test, classes = 505, 3, 3
    allx = (rng.random((n_all, 6)) < 0.3).astype(np.float32) + np.eye(n_all, 6, dtype=np.float32)
    tx = rng.random((n_test, 6)).astype(np.float32) + 0.1
    ally = np.eye(classes)[rng.integers(0, classes, n_all)]
    ty = np.eye(classes)[[2, 0, 1]]
    test_index = [507, 505, 506]  # tx[i] and ty[i] belong to node test_index[i]
    graph = {i: [(i + 1) % 508, (i - 1) % 508] for i in range(508)}  # a ring
    items = {
        "x": sp.csr_matrix(allx[:2]),
        "allx": sp.csr_matrix(allx),
        "tx": sp.csr_matrix(tx),
        "y": ally[:2],
        "ally": ally,
        "ty": ty,
        "graph": graph,
    }
    for name, obj in items.items():
        with open(folder / f"ind.pubmed.{name}", "wb") as fh:
            pickle.dump(obj, fh, protocol=2)
    (folder / "ind.pubmed.test.index").write_text("\n".join(map(str, test_index)) + "\n")
    ds = load_dataset("pubmed", tmp_path)
    d = ds.data
    assert ds.num_nodes == 508 and ds.num_classes == 3
    full = np.concatenate([allx, np.zeros((3, 6), np.float32)])
    full[test_index] = tx
    # the loader row-normalises bag-of-words features (empty rows stay zero)
    full /= np.maximum(full.sum(1, keepdims=True), 1)
    assert torch.allclose(d.x, torch.from_numpy(full))
    y = np.concatenate([ally.argmax(1), np.zeros(3, np.int64)])
    y[test_index] = [2, 0, 1]
    assert d.y.tolist() == y.tolist()
    assert d.train_mask.nonzero().view(-1).tolist() == [0, 1]
    assert d.val_mask.nonzero().view(-1).tolist() == list(range(2, 502))
    assert d.test_mask.nonzero().view(-1).tolist() == [505, 506, 507]
    assert d.edge_index.size(1) == 2 * 508


@pytest.mark.parametrize(
    "name, model",
    [
        ("reddit", "gcn"),
        ("amazon", "gcn"),
        ("ogbn-arxiv", "gcn"),
        ("cifar10", "vig"),
        ("pubmed", "gcn"),
    ],
)
@pytest.mark.parametrize("damage", ["garbage", "empty"])
def test_damaged_raw_files_exit_2_naming_them(tmp_path, capsys, name, model, damage):
    """Every reader: files with the right names but damaged contents are bad input (exit 2),
    never a traceback from zipfile, numpy, gzip or pickle."""
    from gnnpar.cli import main
    from gnnpar.data.registry import DATASETS

    spec = DATASETS[name]
    for rel in spec.files:
        path = tmp_path / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"" if damage == "empty" else b"\x00garbage\xff" * 50)
    args = ["train", "--dataset", name, "--model", model, "--data-root", str(tmp_path)]
    assert main([*args, "--epochs", "1", "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"Dataset '{name}'" in err and "could not be read" in err and str(tmp_path / name) in err
    assert "Traceback" not in err
