"""Your own graph in (data/user.py): a .pt file, an OGB-layout folder and module:function each
train; bad data ends with exit 2 and one message naming the file; the stratified split; the
content-keyed, memory-mapped cache."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from gnnpar import UsageError
from gnnpar.cli import main
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.data.user import stratified_split
from helpers import tiny_graph


# ----------------------------------------------------------------------------------- fixtures
def graph(n: int = 40, classes: int = 4, masks: bool = False) -> Data:
    """A ring of ``n`` nodes plus chords, both directions; class = node % classes."""
    src = torch.arange(n)
    ring = torch.stack([src, (src + 1) % n])
    chords = torch.stack([src, (src + 7) % n])
    edge_index = torch.cat([ring, ring.flip(0), chords, chords.flip(0)], dim=1)
    y = src % classes
    x = torch.nn.functional.one_hot(y, classes).float() + 0.1 * torch.randn(
        n, classes, generator=torch.Generator().manual_seed(0)
    )
    data = Data(x=x, edge_index=edge_index, y=y)
    if masks:
        data.train_mask = src < n // 2
        data.val_mask = (src >= n // 2) & (src < 3 * n // 4)
        data.test_mask = src >= 3 * n // 4
    return data


def save(path: Path, obj) -> Path:
    torch.save(obj, path)
    return path


def write_csv_gz(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        np.savetxt(fh, rows, fmt=fmt, delimiter=",")


def ogb_folder(folder: Path, data: Data, split: str | None = "mine") -> Path:
    """``data`` written in OGB's raw node-property layout (edges listed as given)."""
    write_csv_gz(folder / "raw/edge.csv.gz", data.edge_index.t().numpy(), "%d")
    write_csv_gz(folder / "raw/node-feat.csv.gz", data.x.numpy(), "%.8f")
    write_csv_gz(folder / "raw/node-label.csv.gz", data.y.view(-1, 1).numpy(), "%d")
    if split:
        n = data.num_nodes
        parts = {"train": range(0, n // 2), "valid": range(n // 2, 3 * n // 4)}
        parts["test"] = range(3 * n // 4, n)
        for name, idx in parts.items():
            write_csv_gz(folder / f"split/{split}/{name}.csv.gz", np.array(list(idx)), "%d")
    return folder


def write_module(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(body)
    return name


MODULE = """
import torch
from torch_geometric.data import Data

def build():
    n = 30
    src = torch.arange(n)
    ei = torch.cat([torch.stack([src, (src + 1) % n]), torch.stack([(src + 1) % n, src])], 1)
    y = src % 3
    return Data(x=torch.nn.functional.one_hot(y, 3).float(), edge_index=ei, y=y)
"""


def train(capsys, dataset: str, out: Path, *extra: str) -> tuple[int, str, str]:
    code = main(
        ["train", "--dataset", dataset, "--model", "gcn", "--epochs", "2", "--quiet"]
        + ["--strategy", "sequential", "--out", str(out), *extra]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -------------------------------------------------------------------- the three forms train
def test_pt_file_trains(tmp_path, capsys):
    path = save(tmp_path / "my_graph.pt", graph())
    code, _, err = train(capsys, str(path), tmp_path / "run")
    assert code == 0, err
    result = json.loads((tmp_path / "run/result.json").read_text())
    assert 0 <= result["test_score"] <= 1


def test_ogb_folder_trains(tmp_path, capsys):
    folder = ogb_folder(tmp_path / "whatever-name", graph())
    code, _, err = train(capsys, str(folder), tmp_path / "run")
    assert code == 0, err
    assert (tmp_path / "run/result.json").exists()


def test_module_function_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the current folder is searched first
    write_module(tmp_path, "mygraphs_train", MODULE)
    code, _, err = train(capsys, "mygraphs_train:build", tmp_path / "run")
    assert code == 0, err
    assert (tmp_path / "run/result.json").exists()
    ds = load_dataset("mygraphs_train:build", tmp_path / "data")
    assert ds.name == "build" and ds.info["source"] == "mygraphs_train:build"
    assert ds.num_nodes == 30 and ds.num_classes == 3 and not ds.info["directed"]


RANDOM_MODULE = """
import torch
from torch_geometric.data import Data

def build():
    n = 30
    x = torch.randn(n, 4, requires_grad=True) * 2  # global RNG, autograd: both handled
    return Data(x=x, edge_index=torch.randint(0, n, (2, 90)), y=torch.randint(0, 3, (n,)))
"""


def test_random_builder_runs_seeded_so_every_rank_builds_the_same_graph(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_module(tmp_path, "randomgraphs", RANDOM_MODULE)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = load_dataset("randomgraphs:build", tmp_path / "data", seed=0)
    assert torch.equal(torch.rand(3), expected)  # the caller's generator state is left alone
    b = load_dataset("randomgraphs:build", tmp_path / "data", seed=0)
    c = load_dataset("randomgraphs:build", tmp_path / "data", seed=1)
    assert a.info["fingerprint"] == b.info["fingerprint"] != c.info["fingerprint"]
    assert torch.equal(a.data.x, b.data.x) and not a.data.x.requires_grad


def test_inmemory_dataset_list_and_dict_load(tmp_path):
    from torch_geometric.datasets import FakeDataset

    fake = FakeDataset(num_graphs=1, avg_num_nodes=40, num_channels=4, num_classes=3, task="node")
    g = graph()
    for name, obj in (
        ("fake", fake),
        ("as_list", [g]),
        ("as_tuple", (g,)),
        ("as_dict", {"x": g.x, "edge_index": g.edge_index, "y": g.y}),
    ):
        ds = load_dataset(str(save(tmp_path / f"{name}.pt", obj)), tmp_path / "data")
        assert ds.name == name and ds.num_nodes == (fake[0].num_nodes if name == "fake" else 40)


def test_saved_pyg_dataset_with_transform_and_numpy_dict_load_without_unpickling_code(tmp_path):
    """Read with weights_only=True plus an allowlist: PyG's own dataset classes and transforms
    (the transform applied as the dataset would), numpy arrays; the process-wide allowlist is
    left as it was (torch's safe_globals context would drop PyG's own registrations)."""
    import torch_geometric.transforms as T
    from torch_geometric.datasets import FakeDataset

    before = set(torch.serialization.get_safe_globals())
    fake = FakeDataset(1, avg_num_nodes=40, num_channels=4, num_classes=3, task="node")
    fake.transform = T.Compose([T.NormalizeFeatures()])
    g = graph()
    arrays = {"x": g.x.numpy(), "edge_index": g.edge_index.numpy(), "y": g.y.numpy()}
    ds = load_dataset(str(save(tmp_path / "fake_t.pt", fake)), tmp_path / "data")
    assert torch.allclose(ds.data.x, fake[0].x) and torch.allclose(ds.data.x.sum(1), torch.ones(1))
    ds = load_dataset(str(save(tmp_path / "arrays.pt", arrays)), tmp_path / "data")
    assert torch.equal(ds.data.x, g.x) and torch.equal(ds.data.edge_index, g.edge_index)
    assert set(torch.serialization.get_safe_globals()) == before


class MyGraphs(Data):  # the user's own class: loading would import and build it
    pass


def test_a_pt_holding_other_classes_is_refused_with_how_to_convert_it(tmp_path):
    path = save(tmp_path / "mine.pt", MyGraphs(x=torch.ones(3, 2), edge_index=torch.zeros(2, 0)))
    with pytest.raises(UsageError) as e:
        load_dataset(str(path), tmp_path / "data")
    msg = str(e.value)
    assert f"holds {__name__}.MyGraphs, which loading would have to execute" in msg
    assert "gnnpar.fit(data" in msg and "torch.save(Data(x=" in msg


# --------------------------------------------------------------------- what is kept, recorded
def test_given_masks_and_info(tmp_path):
    g = graph(masks=True)
    path = save(tmp_path / "masked.pt", g)
    ds = load_dataset(str(path), tmp_path / "data", seed=5)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(ds.data[m], g[m])
    assert torch.equal(ds.data.x, g.x) and torch.equal(ds.data.y, g.y)
    info = ds.info
    assert info["source"] == str(path.resolve()) and info["split"] == "given"
    assert info["split_counts"] == {"train": 20, "val": 10, "test": 10}
    assert len(info["fingerprint"]) == 64 and info["directed"] is False
    assert (info["num_nodes"], info["num_edges"]) == (40, 160)


def test_directed_edges_kept_as_given(tmp_path):
    g = graph()
    g.edge_index = torch.tensor([[0, 1, 2, 2, 5], [1, 2, 3, 3, 5]])  # one way, a duplicate, a loop
    ds = load_dataset(str(save(tmp_path / "directed.pt", g)), tmp_path / "data")
    assert torch.equal(ds.data.edge_index, g.edge_index) and ds.info["directed"] is True
    # the OGB layout too: not made symmetric (the named ogbn-* datasets are)
    folder = ogb_folder(tmp_path / "ogb", g)
    ds = load_dataset(str(folder), tmp_path / "data")
    assert torch.equal(ds.data.edge_index, g.edge_index) and ds.info["directed"] is True
    assert ds.name == "ogb" and ds.info["split"] == "given"


def test_conversions_multilabel_and_column_labels(tmp_path):
    g = graph()
    g.x = g.x.double()
    g.edge_index = g.edge_index.int()
    g.y = g.y.view(-1, 1).float()  # OGB-style [N, 1] labels, integral floats
    ds = load_dataset(str(save(tmp_path / "col.pt", g)), tmp_path / "data")
    assert ds.data.x.dtype == torch.float32 and ds.data.edge_index.dtype == torch.long
    assert ds.data.y.dtype == torch.long and ds.data.y.shape == (40,) and not ds.multilabel
    multi = graph()
    multi.y = torch.stack([multi.y % 2, (multi.y + 1) % 2, multi.y // 2], 1).float()
    ds = load_dataset(str(save(tmp_path / "multi.pt", multi)), tmp_path / "data")
    assert ds.multilabel and ds.num_classes == 3 and ds.data.y.dtype == torch.uint8
    assert torch.equal(ds.data.y, multi.y.to(torch.uint8))


# ------------------------------------------------------------------------------------ split
def test_stratified_split_counts_disjoint_deterministic():
    y = torch.cat([torch.zeros(10), torch.ones(20), torch.full((5,), 2)]).long()
    y = y[torch.randperm(35, generator=torch.Generator().manual_seed(1))]
    s = stratified_split(y, multilabel=False, seed=7)
    tr, va, te = s["train_mask"], s["val_mask"], s["test_mask"]
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert bool((tr | va | te).all())
    # per class: 60 % train, 20 % val, the rest test
    assert torch.bincount(y[tr], minlength=3).tolist() == [6, 12, 3]
    assert torch.bincount(y[va], minlength=3).tolist() == [2, 4, 1]
    assert torch.bincount(y[te], minlength=3).tolist() == [2, 4, 1]
    again = stratified_split(y, multilabel=False, seed=7)
    assert all(torch.equal(s[m], again[m]) for m in s)
    other = stratified_split(y, multilabel=False, seed=8)
    assert not torch.equal(s["train_mask"], other["train_mask"])


def test_missing_masks_are_drawn_from_the_rest_like_karate_club():
    """KarateClub gives train_mask only: validation and test split the other nodes in half."""
    y = torch.arange(40) % 2
    train = torch.zeros(40, dtype=torch.bool)
    train[:4] = True
    s = stratified_split(y, multilabel=False, seed=3, given={"train_mask": train})
    assert torch.equal(s["train_mask"], train)
    assert int(s["val_mask"].sum()) == int(s["test_mask"].sum()) == 18
    assert not (s["val_mask"] & s["test_mask"]).any() and not (s["val_mask"] & train).any()
    assert int(s["val_mask"][y == 0].sum()) == 9  # stratified: half of each class's rest


def _ten_nodes(**given: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Ten nodes, classes 0 (nodes 0-4) and 1 (nodes 5-9); ``given``: mask name -> node ids."""
    y = torch.tensor([0] * 5 + [1] * 5)
    masks = {}
    for name, ids in given.items():
        masks[f"{name}_mask"] = torch.zeros(10, dtype=torch.bool)
        masks[f"{name}_mask"][ids] = True
    return y, masks


# (given masks) -> per class of the rest, (train, val, test) counts drawn, worked by hand: the
# shares 6/2/2 renormalised over the missing masks, round(share * n) each but the last, which
# takes what is left
PARTIAL = {
    "none": ({}, (3, 1, 1)),  # 5 per class: round(0.6*5)=3 train, round(0.2*5)=1 val, 1 test
    "train": ({"train": [0, 5]}, (0, 2, 2)),  # 4 left per class: val 2/4 -> 2, test the rest
    "val": ({"val": [0, 5]}, (3, 0, 1)),  # 4 left: train round(6/8*4)=3, test 1
    "test": ({"test": [0, 5]}, (3, 1, 0)),  # 4 left: train 3, val 1
    "train+val": ({"train": [0, 1, 5, 6], "val": [2, 7]}, (0, 0, 2)),  # the rest is test
    "val+test": ({"val": [0, 5], "test": [1, 6]}, (3, 0, 0)),  # the rest trains
    "train+test": ({"train": [0, 5], "test": [1, 6]}, (0, 3, 0)),  # the rest validates
}


@pytest.mark.parametrize("case", list(PARTIAL))
def test_each_partial_set_of_masks_is_completed_from_the_rest(case):
    given_ids, drawn = PARTIAL[case]
    y, given = _ten_nodes(**given_ids)
    s = stratified_split(y, multilabel=False, seed=11, given=given)
    for m, ids in given.items():
        assert torch.equal(s[m], ids)  # a given mask is kept exactly
    rest = ~torch.stack([*given.values(), torch.zeros(10, dtype=torch.bool)]).any(0)
    for m, count in zip(("train_mask", "val_mask", "test_mask"), drawn):
        if m in given:
            continue
        assert not (s[m] & ~rest).any()  # drawn only from nodes in no given mask
        assert [int(s[m][y == c].sum()) for c in (0, 1)] == [count, count]
    assert int(sum(s[m].long() for m in s).max()) == 1  # disjoint
    assert bool(sum(s[m].long() for m in s).bool().all())  # and every node is in one


def test_a_graph_with_all_three_masks_is_not_split_again():
    y, given = _ten_nodes(train=[0, 5], val=[1, 6], test=[2, 7])
    s = stratified_split(y, multilabel=False, seed=0, given=given)
    assert all(torch.equal(s[m], given[m]) for m in given)
    assert int(sum(s[m].long() for m in s).sum()) == 6  # nodes in no mask stay out


def test_partial_masks_recorded_in_dataset_info(tmp_path):
    g = graph(n=20, classes=2)
    g.train_mask = torch.zeros(20, dtype=torch.bool)
    g.train_mask[:2] = True
    ds = load_dataset(str(save(tmp_path / "k.pt", g)), tmp_path / "data", seed=4)
    assert ds.info["split"] == "given train; val, test stratified from the rest, seed 4"
    # 9 left per class: val round(9/2) = 5 (halves round up), test the other 4
    assert ds.info["split_counts"] == {"train": 2, "val": 10, "test": 8}


def test_stratified_split_puts_every_class_in_train():
    y = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 3, 3] + [4] * 10)
    s = stratified_split(y, multilabel=False, seed=0)
    assert set(y[s["train_mask"]].tolist()) == {0, 1, 2, 3, 4}


def test_stratified_split_multilabel_by_first_label():
    y = torch.zeros(20, 3, dtype=torch.uint8)
    y[:10, 0] = 1
    y[:10, 2] = 1  # first label 0
    y[10:15, 1] = 1  # first label 1
    # nodes 15..19: no label, a group of their own
    s = stratified_split(y, multilabel=True, seed=0)
    assert int(s["train_mask"][:10].sum()) == 6 and int(s["train_mask"][10:15].sum()) == 3
    assert int(s["train_mask"][15:].sum()) == 3
    assert sum(int(m.sum()) for m in s.values()) == 20


def test_split_follows_run_seed_and_is_recorded(tmp_path):
    path = save(tmp_path / "g.pt", graph())
    a = load_dataset(str(path), tmp_path / "data", seed=1)
    b = load_dataset(str(path), tmp_path / "data", seed=1)
    c = load_dataset(str(path), tmp_path / "data", seed=2)
    assert torch.equal(a.data.train_mask, b.data.train_mask)
    assert not torch.equal(a.data.train_mask, c.data.train_mask)
    assert a.info["split"] == "stratified-60/20/20-seed1"
    assert a.info["split_counts"] == {"train": 24, "val": 8, "test": 8}
    # one cache entry for every seed: the split is drawn after loading
    assert len(list((tmp_path / "data/cache").glob("user-*/meta.json"))) == 1


# ------------------------------------------------------------------------------------ cache
def test_same_content_shares_one_cache_entry(tmp_path):
    root = tmp_path / "data"
    first = save(tmp_path / "a.pt", graph())
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    renamed = other_dir / "renamed.pt"
    renamed.write_bytes(first.read_bytes())
    d1 = load_dataset(str(first), root)
    d2 = load_dataset(str(first), root)
    d3 = load_dataset(str(renamed), root)
    entries = sorted(p.name for p in (root / "cache").glob("user-*") if p.is_dir())
    assert entries == [f"user-{d1.info['fingerprint'][:20]}"]
    assert d1.info["fingerprint"] == d2.info["fingerprint"] == d3.info["fingerprint"]
    assert (d1.name, d3.name) == ("a", "renamed")
    # new content, new entry
    changed = graph()
    changed.x = changed.x + 1
    load_dataset(str(save(tmp_path / "a.pt", changed)), root)
    assert len([p for p in (root / "cache").glob("user-*") if p.is_dir()]) == 2


def test_one_cache_entry_per_content_whatever_the_form(tmp_path, capsys):
    """A Data file, a dict file, an OGB folder and gnnpar.fit's saved copy of one graph: one
    entry; every form is read once (then its alias says which entry it holds)."""
    from gnnpar.data.user import plain_graph

    root = tmp_path / "data"
    g = graph(masks=True)
    as_data = save(tmp_path / "data.pt", g)
    as_dict = save(tmp_path / "dict.pt", plain_graph(g, "g"))
    assert as_data.read_bytes() != as_dict.read_bytes()
    a = load_dataset(str(as_data), root)
    first = capsys.readouterr().out
    assert first.startswith(f"gnnpar: converting {as_data} into {root / 'cache'}/ ...")
    assert "KiB on disk" in first and "later runs reuse it" in first
    b = load_dataset(str(as_dict), root)
    assert "the same graph as" in capsys.readouterr().out
    load_dataset(str(as_dict), root)
    assert capsys.readouterr().out == ""  # known now: neither converted nor announced
    entries = [p.name for p in (root / "cache").glob("user-*") if p.is_dir()]
    assert entries == [f"user-{a.info['fingerprint'][:20]}"]
    assert a.info["fingerprint"] == b.info["fingerprint"]
    assert len(list((root / "cache").glob("user-source-*.json"))) == 2


def test_the_copy_fit_saved_is_announced_as_fits_graph(tmp_path, capsys):
    from gnnpar.api import _save_input

    root = tmp_path / "data"
    path = _save_input(graph(), str(root))  # what gnnpar.fit(data) hands the ranks
    load_dataset(str(path), root)
    out = capsys.readouterr().out
    assert out.startswith("gnnpar: converting the graph given to gnnpar.fit into ")


def test_without_a_lock_on_its_source_a_graph_still_loads_by_content(tmp_path, monkeypatch):
    """A data root where no lock file can be made (read-only): the file is read in memory,
    keyed by content all the same, and no alias is written."""
    from gnnpar.data import user

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    root = tmp_path / "data"
    path = save(tmp_path / "g.pt", graph())
    monkeypatch.setattr(user, "exclusive_lock", refused)
    a = load_dataset(str(path), root)
    monkeypatch.undo()
    b = load_dataset(str(path), tmp_path / "other")
    assert a.info["fingerprint"] == b.info["fingerprint"] and torch.equal(a.data.x, b.data.x)
    assert not list((root / "cache").glob("user-source-*.json"))


def test_a_known_file_whose_entry_was_deleted_is_converted_again(tmp_path):
    import shutil

    root = tmp_path / "data"
    path = save(tmp_path / "g.pt", graph())
    a = load_dataset(str(path), root)
    shutil.rmtree(root / "cache" / f"user-{a.info['fingerprint'][:20]}")
    b = load_dataset(str(path), root)
    assert torch.equal(a.data.x, b.data.x) and a.info["fingerprint"] == b.info["fingerprint"]


def test_an_alias_of_another_version_or_garbled_is_ignored(tmp_path):
    root = tmp_path / "data"
    path = save(tmp_path / "g.pt", graph())
    a = load_dataset(str(path), root)
    (alias,) = (root / "cache").glob("user-source-*.json")
    for text in ("not json", "[]", json.dumps({"version": "user-0"}), '{"content_sha256": 3}'):
        alias.write_text(text)
        b = load_dataset(str(path), root)
        assert b.info["fingerprint"] == a.info["fingerprint"]
    record = json.loads(alias.read_text())  # rewritten whole by the last read
    assert record["content_sha256"] == a.info["fingerprint"]


def test_renamed_ogb_folder_hits_the_same_entry(tmp_path):
    root = tmp_path / "data"
    a = load_dataset(str(ogb_folder(tmp_path / "one", graph())), root)
    b = load_dataset(str(ogb_folder(tmp_path / "two", graph())), root)
    assert a.info["fingerprint"] == b.info["fingerprint"] and (a.name, b.name) == ("one", "two")
    assert len([p for p in (root / "cache").glob("user-*") if p.is_dir()]) == 1


def test_loaded_tensors_are_memory_mapped(tmp_path):
    root = tmp_path / "data"
    ds = load_dataset(str(save(tmp_path / "g.pt", graph(masks=True))), root)
    (entry,) = [p for p in (root / "cache").glob("user-*") if p.is_dir()]
    path = str(entry / "tensors.pt")
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(path):
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            spans.append((lo, hi))
    assert spans, "the cache file is not mapped into this process"
    for key in ("x", "edge_index", "y", "train_mask"):
        ptr = ds.data[key].data_ptr()
        assert any(lo <= ptr < hi for lo, hi in spans), f"{key} is a private copy"


# ------------------------------------------------------------------------------- bad data
def _pt(obj):
    def make(tmp_path: Path) -> tuple[str, str]:
        path = save(tmp_path / "bad_graph.pt", obj() if callable(obj) else obj)
        return str(path), str(path)

    return make


def _g(**change):
    def build():
        g = graph()
        for k, v in change.items():
            if v is None:
                del g[k]
            else:
                g[k] = v
        return g

    return build


def _masked(**change):
    def build():
        g = graph(masks=True)
        for k, v in change.items():
            g[k] = v
        return g

    return build


def _bytes(content: bytes | None):
    def make(tmp_path: Path) -> tuple[str, str]:
        path = tmp_path / "bad_graph.pt"
        if content is None:  # truncated: the first half of a good file
            save(path, graph())
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            path.write_bytes(content)
        return str(path), str(path)

    return make


def _missing(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "nope.pt"), "nope.pt"


def _not_pt(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "graph.txt"
    path.write_text("0 1\n")
    return str(path), "graph.txt"


def _ogb(change):
    def make(tmp_path: Path) -> tuple[str, str]:
        folder = ogb_folder(tmp_path / "myogb", graph())
        return str(folder), str(change(folder))

    return make


def _drop_label(folder: Path) -> Path:
    (folder / "raw/node-label.csv.gz").unlink()
    return folder


def _ragged_csv(folder: Path) -> Path:
    path = folder / "raw/node-feat.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("0.1,0.2,0.3,0.4\n0.5,zero,0.1\n")
    return path


def _truncated_gz(folder: Path) -> Path:
    path = folder / "raw/edge.csv.gz"
    path.write_bytes(path.read_bytes()[:-12])
    return path


def _two_splits(folder: Path) -> Path:
    ogb_folder(folder, graph(), split="other")
    return folder / "split"


def _split_out_of_range(folder: Path) -> Path:
    path = folder / "split/mine/valid.csv.gz"
    write_csv_gz(path, np.array([3, 99]), "%d")
    return path


def _empty_split(folder: Path) -> Path:
    path = folder / "split/mine/test.csv.gz"
    write_csv_gz(path, np.zeros((0,), dtype=np.int64), "%d")
    return path


def _module(body: str, func: str = "build"):
    def make(tmp_path: Path) -> tuple[str, str]:
        name = f"graphs_{zlib.crc32(body.encode())}"  # one module name per body
        write_module(tmp_path, name, body)
        return f"{name}:{func}", f"{name}:{func}"

    return make


BAD = {
    "missing file": (_missing, "no such file"),
    "not a .pt file": (_not_pt, "not a .pt file"),
    "0-byte file": (_bytes(b""), "empty (0 bytes)"),
    "garbage bytes": (_bytes(b"\x00garbage\xff" * 40), "not a file torch.load can read"),
    "truncated file": (_bytes(None), "not a file torch.load can read"),
    "a tensor": (_pt(torch.zeros(3, 3)), "a tensor of shape [3, 3], not a PyG Data"),
    "a string": (_pt("hello"), "a str, not a PyG Data"),
    "two graphs": (_pt([graph(), graph()]), "holds 2 graphs"),
    "no x": (_pt(_g(x=None)), "no 'x'"),
    "no edge_index": (_pt(_g(edge_index=None)), "no 'edge_index'"),
    "no y": (_pt(_g(y=None)), "no 'y'"),
    "y length": (_pt(_g(y=torch.zeros(39, dtype=torch.long))), "while x has 40 nodes"),
    "x not 2-D": (_pt(_g(x=torch.zeros(40))), "x must be 2-D"),
    "edge_index shape": (_pt(_g(edge_index=torch.zeros(3, 5, dtype=torch.long))), "[2, edges]"),
    "edge_index transposed": (
        _pt(_g(edge_index=torch.zeros(5, 2, dtype=torch.long))),
        "looks transposed",
    ),
    "edge_index floats": (_pt(_g(edge_index=torch.zeros(2, 5))), "must hold integers"),
    "edge out of range": (
        _pt(_g(edge_index=torch.tensor([[0, 1, 40], [1, 0, 2]]))),
        "column 2 is [40, 2], out of range",
    ),
    "negative edge": (_pt(_g(edge_index=torch.tensor([[0, -1], [1, 0]]))), "out of range"),
    "NaN feature": (
        _pt(_g(x=torch.ones(40, 3).index_put_((torch.tensor([5]),), torch.tensor(float("nan"))))),
        "nan (not a finite number) at node 5",
    ),
    "inf feature": (_pt(_g(x=torch.full((40, 2), float("inf")))), "not a finite number"),
    "non-integer labels": (_pt(_g(y=torch.full((40,), 0.5))), "integer class indices"),
    "negative labels": (_pt(_g(y=torch.full((40,), -1))), "class indices >= 0"),
    "multi-label not 0/1": (_pt(_g(y=torch.full((40, 3), 2))), "multi-label 0/1"),
    "empty split mask": (_pt(_masked(train_mask=torch.zeros(40, dtype=torch.bool))), "is empty"),
    "mask wrong length": (_pt(_masked(val_mask=torch.ones(39, dtype=torch.bool))), "length 40"),
    "mask not bool": (
        _pt(_masked(test_mask=torch.ones(40, dtype=torch.long))),
        "must be a bool tensor",
    ),
    "given masks leave nothing to draw": (
        _pt(_g(train_mask=torch.ones(40, dtype=torch.bool))),
        "leaves val_mask, test_mask empty",
    ),
    "too small to split": (_pt(_g(y=torch.arange(40))), "too few nodes"),
    "OGB missing file": (_ogb(_drop_label), "missing raw/node-label.csv.gz"),
    "OGB malformed CSV": (_ogb(_ragged_csv), "malformed CSV"),
    "OGB truncated gzip": (_ogb(_truncated_gz), "truncated"),
    "OGB two split folders": (_ogb(_two_splits), "2 split folders (mine, other)"),
    "OGB split out of range": (_ogb(_split_out_of_range), "node index 99 is out of range"),
    "OGB empty split": (_ogb(_empty_split), "test_mask is empty"),
    "module not found": (lambda p: ("nomod_xyz:build",) * 2, "no module named 'nomod_xyz'"),
    "function missing": (_module("def other():\n    return 1\n"), "has no function build"),
    "function raising": (
        _module("def build():\n    raise ValueError('no graph today')\n"),
        "build() raised ValueError: no graph today",
    ),
    "function returns no Data": (
        _module("def build():\n    return 'x'\n"),
        "build() returned a str, not a PyG Data",
    ),
    "module fails to import": (_module("import no_such_dependency_q\n"), "importing"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_user_data_exits_2_naming_the_file(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make, phrase = BAD[case]
    dataset, named = make(tmp_path)
    code, out, err = train(capsys, dataset, tmp_path / "run", "--data-root", str(tmp_path / "d"))
    assert code == 2, (out, err)
    assert named in err and phrase in err, err
    assert "Traceback" not in err + out and err.count("\n") == 1, err  # one message


# ---------------------------------------------------------------------------- config checks
def test_config_treats_user_graphs_as_graphs(tmp_path):
    path = str(save(tmp_path / "g.pt", graph()))
    base = {"dataset": path, "model": "gat", "strategy": "pipeline"}
    assert build_config(None, {**base, "microbatch": "index"}).strategy.microbatch == "index"
    with pytest.raises(UsageError, match="--scale is used by synthetic-\\* datasets only"):
        build_config(None, {**base, "scale": "0.5"})
    with pytest.raises(UsageError, match="--model vig needs an image dataset"):
        build_config(None, {"dataset": path, "model": "vig"})
    with pytest.raises(UsageError, match="Unknown --dataset 'imagenet'.*module:function"):
        build_config(None, {"dataset": "imagenet"})
    with pytest.raises(UsageError, match="no such file"):
        build_config(None, {"dataset": str(tmp_path / "absent/graph")})


def test_datasets_listing_explains_your_own_graph(tmp_path, capsys):
    assert main(["datasets", "--data-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Your own graph" in out and "module:function" in out and "split/<name>/" in out
    assert "gnnpar train --dataset my.pt" in out


def test_small_graph_from_conftest_with_given_masks(tmp_path):
    ds = load_dataset(str(save(tmp_path / "six.pt", tiny_graph())), tmp_path / "data")
    assert ds.num_nodes == 6 and ds.info["split"] == "given" and not ds.info["directed"]
