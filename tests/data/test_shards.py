"""``gnnpar prepare --shards H``: the graph dealt into per-host shard folders (gnnpar.data.shards).
Each shard owns one contiguous range of renumbered ids; a folder holding every shard is the
unsharded graph again, tensor for tensor, and trains with the same loss curve."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnpar import UsageError
from gnnpar.cli import main
from gnnpar.configure import build_config
from gnnpar.data import prepared, shards
from gnnpar.data.prepare_command import run_prepare
from gnnpar.run import prepare, run_rank

KEYS = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")


def _prepare(tmp_path, dataset, name, **flags):
    out = tmp_path / name
    args = dict(scale=None, seed=None, feature_dtype=None, data_root=str(tmp_path / "root"))
    args.update(flags)
    line = run_prepare(dataset, str(out), verify=None, quiet=True, **args)
    return out, line


def _same(a, b) -> None:
    for k in KEYS:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cora")
    out, _ = _prepare(tmp, "cora", "whole")
    return out


def _hand(tmp_path, order="target"):
    """Two triangles {0, 2, 4} and {1, 3, 5} joined by the edge 4 -> 1."""
    src = torch.tensor([0, 2, 2, 4, 4, 0, 1, 3, 3, 5, 5, 1, 4])
    dst = torch.tensor([2, 0, 4, 2, 0, 4, 3, 1, 5, 3, 1, 5, 1])
    ei = torch.stack([src, dst])
    if order == "target":
        ei = ei[:, torch.sort(dst, stable=True).indices]
    t = {
        "x": torch.arange(18, dtype=torch.float32).view(6, 3),
        "edge_index": ei,
        "y": torch.tensor([0, 1, 0, 1, 0, 1]),
        "train_mask": torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
        "val_mask": torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
        "test_mask": torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool),
    }
    made = prepared.made_record("hand", None, 0, "given")
    meta = {"name": "hand", "num_classes": 2}
    return prepared.write_graph(t, meta, tmp_path / f"hand-{order}", "fp32", made), t


def test_ldg_puts_each_triangle_in_its_shard_with_exact_arrays(tmp_path):
    folder, t = _hand(tmp_path)
    out, line = _prepare(tmp_path, str(folder), "two", shards="2", partitioner="stream")
    m = json.loads((out / "manifest.json").read_text())
    # LDG in id order: 0 -> shard 0 (tie, lower index), 1 -> shard 1 (smaller), 2 -> 0
    # (its in-neighbour 0 is there), 3 -> 1, 4 -> 0, 5 -> 1: the one cut edge is 4 -> 1
    assert m["partition"] == {
        "partitioner": "stream",
        "seed": 0,
        "edge_cut": 1,
        "edge_cut_share": 1 / 13,
        "balance": 1.0,
        "shard_nodes": [3, 3],
    }
    assert "edge cut 1 = 7.7%" in line and "balance 1.000" in line
    assert [s["nodes"] for s in m["shards"]] == [[0, 3], [3, 6]]
    s1 = out / "shard-1"
    ld = lambda name: np.load(s1 / f"{name}.npy", allow_pickle=False)  # noqa: E731
    # shard 1 holds original nodes 1, 3, 5 as global ids 3, 4, 5; original 4 is global 2
    assert ld("orig_ids").tolist() == [1, 3, 5]
    assert ld("indptr").tolist() == [0, 3, 5, 7]
    # in-edges of 1: from 3, 5, 4 (the unsharded row order), renumbered 4, 5, 2
    assert ld("indices").tolist() == [4, 5, 2, 3, 5, 4, 3]
    assert ld("features").tolist() == t["x"][[1, 3, 5]].tolist()
    assert ld("labels").tolist() == [1, 1, 1]
    assert ld("train").tolist() == [3] and ld("val").tolist() == [4] and ld("test").tolist() == [5]
    back = shards.load_sharded(out)
    _same(back.data, prepared.load_graph(folder).data)


@pytest.mark.parametrize("order", ["target", "permuted"])
@pytest.mark.parametrize("method", ["random", "metis"])
def test_hand_graph_comes_back_column_for_column(tmp_path, order, method):
    folder, t = _hand(tmp_path, order)
    assert prepared.read_manifest(folder)["edge_index_order"] == order
    out, _ = _prepare(tmp_path, str(folder), "s", shards="3", partitioner=method)
    back = shards.load_sharded(out).data
    for k in KEYS:
        assert torch.equal(back[k], t[k]), k


@pytest.mark.parametrize("h,method", [(2, "metis"), (3, "stream"), (3, "random")])
def test_cora_shards_are_the_unsharded_graph(tmp_path, cora, h, method):
    out, _ = _prepare(tmp_path, str(cora), "s", shards=str(h), partitioner=method)
    m = prepared.read_manifest(out)
    whole = prepared.open_prepared(cora)
    part = np.empty(whole.num_nodes, dtype=np.int64)
    at = 0
    for i, s in enumerate(shards.open_shards(out)):
        first, end = s.first, s.end
        assert first == at and end > first
        at = end
        part[np.asarray(s.array("orig_ids"))] = i
        idx = np.asarray(s.array("indices"))
        assert idx.dtype == np.int32 and 0 <= idx.min() and idx.max() < whole.num_nodes
        for sp in ("train", "val", "test"):
            ids = np.asarray(s.array(sp))
            assert np.all((ids >= first) & (ids < end)) and np.all(np.diff(ids) > 0)
    assert at == whole.num_nodes
    # the recorded cut is the count of edges whose ends lie in different shards
    ei = whole.edge_index().numpy()
    assert m["partition"]["edge_cut"] == int(np.count_nonzero(part[ei[0]] != part[ei[1]]))
    sizes = np.bincount(part, minlength=h)
    assert m["partition"]["balance"] == pytest.approx(sizes.max() / (len(part) / h))
    if method == "metis":  # METIS' cut is far below a random deal's (about 1 - 1/h of edges)
        assert m["partition"]["edge_cut_share"] < 0.25
    _same(shards.load_sharded(out).data, prepared.load_graph(cora).data)


def test_stream_partitioner_cuts_fewer_edges_than_random(tmp_path, cora):
    got = {}
    for method in ("stream", "random"):
        out, _ = _prepare(tmp_path, str(cora), method, shards="4", partitioner=method)
        got[method] = prepared.read_manifest(out)["partition"]
    assert got["stream"]["edge_cut"] < 0.8 * got["random"]["edge_cut"]
    assert got["stream"]["balance"] <= 1.01  # LDG's capacity keeps shards within one node


def test_prepare_shards_straight_from_a_dataset_and_leaves_no_temporary(tmp_path, cora):
    out, _ = _prepare(tmp_path, "cora", "direct", shards="2", partitioner="random")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "root") == ["direct"]
    _same(shards.load_sharded(out).data, prepared.load_graph(cora).data)


def _curve(tmp_path, dataset, name):
    flags = {"model": "sage", "hidden": "16", "layers": "2", "seed": "3", "threads": "1"}
    flags |= {"strategy": "sampled", "epochs": "2", "batch-size": "64", "fanouts": "5,5"}
    flags |= {"quiet": True, "dataset": dataset, "out": str(tmp_path / name)}
    cfg = build_config(None, flags)
    return run_rank(cfg, prepare(cfg))["loss_curve"]


def test_a_folder_holding_every_shard_trains_as_the_unsharded_folder(tmp_path, cora):
    out, _ = _prepare(tmp_path, str(cora), "s", shards="3", partitioner="stream")
    whole = _curve(tmp_path, str(cora), "whole")
    sharded = _curve(tmp_path, str(out), "sharded")
    assert len(whole) == 2 and whole == sharded


def _damage(out, how):
    if how == "missing":
        import shutil

        shutil.rmtree(out / "shard-1")
        return "shard 1 .* is missing"
    if how == "truncated":
        f = out / "shard-1" / "features.npy"
        f.write_bytes(f.read_bytes()[:-4])
        return "shard 1 .* damaged: features.npy has"
    m = out / "shard-1" / "manifest.json"
    m.write_text(m.read_text().replace('"of": 2', '"of": 3'))
    return "shard 1 .* damaged: its manifest.json differs"


@pytest.mark.parametrize("how", ["missing", "truncated", "manifest"])
def test_a_missing_or_damaged_shard_is_named_exit_2(tmp_path, cora, capsys, how):
    out, _ = _prepare(tmp_path, str(cora), "s", shards="2", partitioner="random")
    words = _damage(out, how)
    with pytest.raises(UsageError, match=words):
        shards.load_sharded(out)
    capsys.readouterr()
    code = main(["train", "--dataset", str(out), "--strategy", "sampled", "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "shard 1" in err and "Traceback" not in err
    assert main(["prepare", "--verify", str(out)]) == 2


def test_verify_hashes_every_byte_of_every_shard(tmp_path, cora, capsys):
    out, _ = _prepare(tmp_path, str(cora), "s", shards="2", partitioner="random")
    assert main(["prepare", "--verify", str(out)]) == 0
    assert "intact (2 shards" in capsys.readouterr().out
    f = out / "shard-0" / "features.npy"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # the middle: the ends checksum does not see it
    f.write_bytes(bytes(raw))
    assert main(["prepare", "--verify", str(out)]) == 2
    assert "shard 0" in capsys.readouterr().err


def test_bad_flags_and_a_lone_shard_folder(tmp_path, cora, capsys):
    for argv, words in (
        (["--shards", "0"], "--shards 0"),
        (["--shards", "x"], "--shards x"),
        (["--shards", "2", "--partitioner", "kl"], "--partitioner kl"),
        (["--partitioner", "metis"], "--partitioner applies"),
        (["--shards", "99999"], "--shards 99999"),
    ):
        code = main(["prepare", "--dataset", str(cora), "--out", str(tmp_path / "o"), *argv])
        err = capsys.readouterr().err
        assert code == 2 and words in err, (argv, err)
        assert not (tmp_path / "o").exists()
    out, _ = _prepare(tmp_path, str(cora), "s", shards="2", partitioner="random")
    with pytest.raises(UsageError, match="one shard of a graph sharded"):
        prepared.load_graph(out / "shard-0")


def test_what_each_host_holds_and_how_the_hosts_judge_it(tmp_path, cora):
    import shutil

    out, _ = _prepare(tmp_path, str(cora), "s", shards="2", partitioner="random")
    every = shards.host_status(out, 1)
    assert every == {"host": 1, "shards": 2, "own": None, "lacks": [], "every": True}
    assert shards.host_status(out, 5)["own"] is None  # a 6th host holding every shard trains
    # every host holds every shard: fine, each trains on the whole graph
    assert shards.agreed([shards.host_status(out, 0), every], across=True) is False
    shutil.rmtree(out / "shard-0")
    lone = shards.host_status(out, 1)
    assert lone["own"] is None and lone["lacks"] == [0] and not lone["every"]
    with pytest.raises(
        UsageError, match="^host 1 lacks shard 0: only --strategy sampled, allreduce, gossip "
    ):
        shards.agreed([every, lone])
    # the sampled strategy trains across shards: one rank per host, each with its own shard
    only_0 = {"host": 0, "shards": 2, "own": None, "lacks": [1], "every": False}
    assert shards.agreed([only_0, lone], across=True) is True
    with pytest.raises(UsageError, match="^no rank runs on host 0, which holds shard 0: "):
        shards.agreed([lone, lone], across=True)
    mine = shards.host_status(out, 0)
    assert "shard 0" in mine["own"] and "is missing" in mine["own"]
    # the first host (in rank order) whose own shard is unusable is named, on every rank alike
    with pytest.raises(UsageError, match=r"^host 0 \(rank 1\) cannot use its shard 0: "):
        shards.agreed([every, mine, lone])
    assert "has none of its own" in shards.host_status(out, 3)["own"]


def test_seeds_local_is_refused_where_there_are_no_shards_to_be_local_to(tmp_path, cora, capsys):
    """--seeds local deals each host its own shard's training nodes: over an unsharded folder,
    or a folder holding every shard (one graph on one host), it means nothing: exit 2."""
    out, _ = _prepare(tmp_path, str(cora), "s", shards="2", partitioner="random")
    base = ["train", "--strategy", "sampled", "--epochs", "1", "--out", str(tmp_path / "r")]
    for dataset in (cora, out):
        capsys.readouterr()
        code = main([*base, "--dataset", str(dataset), "--seeds", "local"])
        err = capsys.readouterr().err
        assert code == 2 and "--seeds local" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    code = main([*base, "--dataset", str(out), "--seeds", "near"])
    err = capsys.readouterr().err
    assert code == 2 and "--seeds" in err and "Traceback" not in err, err
