"""Registry: bundled Planetoid data (checksums, public splits), missing-file errors, listing."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import degree

from gnnpar import UsageError
from gnnpar.data.datasets import load_dataset, loader, verify_bundled_checksums
from gnnpar.data.listing import dataset_rows
from gnnpar.data.registry import DATASETS


def test_bundled_checksums():
    assert verify_bundled_checksums() == []


@pytest.mark.parametrize(
    "name,nodes,edges,classes,split",
    [("cora", 2708, 10556, 7, (140, 500, 1000)), ("citeseer", 3327, 9104, 6, (120, 500, 1000))],
)
def test_planetoid_public_split(tmp_path, name, nodes, edges, classes, split):
    ds = load_dataset(name, tmp_path)
    d = ds.data
    assert (ds.num_nodes, d.edge_index.size(1), ds.num_classes) == (nodes, edges, classes)
    sizes = tuple(int(d[f"{s}_mask"].sum()) for s in ("train", "val", "test"))
    assert sizes == split
    assert not (d.train_mask & d.val_mask).any() and not (d.val_mask & d.test_mask).any()
    # public split: 20 training nodes per class
    assert torch.bincount(d.y[d.train_mask], minlength=classes).tolist() == [20] * classes


def test_citeseer_keeps_isolated_nodes(tmp_path):
    d = load_dataset("citeseer", tmp_path).data
    isolated = degree(d.edge_index[0], d.num_nodes) == 0
    assert int(isolated.sum()) == 48  # PyG pads the test nodes missing from the graph


def test_every_spec_is_complete(tmp_path):
    for name, spec in DATASETS.items():
        assert spec.name == name and spec.kind in ("graph", "image")
        assert spec.source in ("bundled", "user files", "generated")
        assert spec.size and spec.obtain
        if spec.source == "user files":
            assert spec.files and "http" in spec.obtain
        assert callable(loader(spec))  # the reader or generator it names exists


def test_a_loaded_dataset_says_its_kind_as_the_registry_does(tmp_path):
    """Is this an image dataset? One answer: ``ds.kind`` (types.py), in the registry's words."""
    from gnnpar.data.types import ImageDataset

    for name in ("karate", "cora"):
        assert load_dataset(name, tmp_path).kind == DATASETS[name].kind == "graph"
    x, y = torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long)
    assert ImageDataset("tiny", x, y, x, y, x, y).kind == DATASETS["cifar10"].kind == "image"


@pytest.mark.parametrize("name", [n for n, s in DATASETS.items() if s.source == "user files"])
def test_missing_files_name_files_folder_and_source(tmp_path, name):
    spec = DATASETS[name]
    with pytest.raises(UsageError) as err:
        load_dataset(name, tmp_path)
    msg = str(err.value)
    assert str(tmp_path / name) in msg and spec.obtain in msg
    assert all(f in msg for f in spec.files)


def test_missing_files_exit_2_through_cli(tmp_path, capsys):
    from gnnpar.cli import main

    args = ["--dataset", "reddit", "--model", "sage", "--data-root", str(tmp_path)]
    code = main(["train", *args, "--epochs", "1", "--quiet", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "reddit_data.npz" in err and "reddit_graph.npz" in err
    assert str(tmp_path / "reddit") in err and "https://data.dgl.ai" in err
    assert "Traceback" not in err


def test_unknown_dataset():
    with pytest.raises(UsageError, match="Unknown dataset"):
        load_dataset("nope", "/nonexistent")


def test_listing_reports_availability(tmp_path):
    rows = {r["name"]: r for r in dataset_rows(tmp_path)}
    assert set(rows) == set(DATASETS)
    assert rows["cora"]["available"].startswith("yes")
    assert rows["reddit"]["available"].startswith("no")
    assert str(tmp_path / "reddit") in rows["reddit"]["location"]
    load_dataset("synthetic-reddit", tmp_path, scale=0.002, seed=3)
    rows = {r["name"]: r for r in dataset_rows(tmp_path)}
    assert "scale0.002-seed3" in rows["synthetic-reddit"]["available"]


def test_datasets_command(tmp_path, capsys):
    from gnnpar.cli import main

    assert main(["datasets", "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in DATASETS:
        assert name in out
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in out
