"""The prepared graph format (gnnpar.data.prepared): what prepare writes is the in-memory graph,
array for array; a damaged folder is named when opened (sizes, ends checksums) and any flipped
byte by --verify; a killed prepare leaves nothing that loads; bad input is one message, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from gnnpar import UsageError
from gnnpar.cli import main
from gnnpar.data import prepared
from gnnpar.data.datasets import load_dataset
from gnnpar.data.prepare_command import run_prepare
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from helpers import ROOT

KEYS = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")


def _prepare(tmp_path, dataset, name="g", **flags):
    out = tmp_path / name
    args = dict(scale=None, seed=None, feature_dtype=None, data_root=str(tmp_path / "root"))
    args.update(flags)
    run_prepare(dataset, str(out), verify=None, quiet=True, **args)
    return out


def _same_graph(a: Data, b: Data) -> None:
    for k in KEYS:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def test_cora_prepared_is_the_in_memory_graph_and_numpy_reads_it(tmp_path):
    out = _prepare(tmp_path, "cora")
    ds = load_dataset("cora", tmp_path / "root")
    back = load_dataset(str(out), tmp_path / "root")
    _same_graph(ds.data, back.data)
    assert (back.name, back.num_classes, back.num_features) == ("cora", 7, 1433)
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "gnnpar-prepared" and m["format_version"] == 1
    assert m["num_nodes"] == 2708 and m["num_edges"] == 10556 and m["shards"] == []
    assert m["made"]["source"] == "cora" and m["made"]["gnnpar_version"]
    # anyone reads it with numpy alone, never a pickle; in-edges CSR as the sampler's
    ptr = np.load(out / "indptr.npy", mmap_mode="r", allow_pickle=False)
    idx = np.load(out / "indices.npy", mmap_mode="r", allow_pickle=False)
    assert ptr.dtype == np.int64 and idx.dtype == np.int32
    csr = CSRGraph.from_edge_index(ds.data.edge_index, ds.num_nodes)
    assert torch.equal(csr.rowptr, torch.from_numpy(np.array(ptr)))
    assert torch.equal(csr.col, torch.from_numpy(np.array(idx)).long())
    train = np.load(out / "train.npy", allow_pickle=False)
    assert torch.equal(torch.from_numpy(train), ds.data.train_mask.nonzero().view(-1))
    for rec in m["arrays"].values():
        assert rec["bytes"] == (out / rec["file"]).stat().st_size


@pytest.mark.parametrize("order", ["target", "source", "permuted"])
def test_every_edge_order_comes_back_column_for_column(tmp_path, order):
    n = 6
    src = torch.tensor([0, 1, 1, 2, 3, 4, 5, 2, 0])
    dst = torch.tensor([1, 0, 2, 1, 4, 3, 0, 5, 3])
    ei = torch.stack([src, dst])
    if order == "target":
        ei = ei[:, torch.sort(dst, stable=True).indices]
    elif order == "source":  # symmetric, sorted by (source, target)
        sym = torch.cat([ei, ei.flip(0)], 1)
        key = torch.unique(sym[0] * n + sym[1])
        ei = torch.stack([key // n, key % n])
    t = {
        "x": torch.randn(n, 3),
        "edge_index": ei,
        "y": torch.tensor([0, 1, 0, 1, 0, 1]),
        "train_mask": torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
        "val_mask": torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
        "test_mask": torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool),
    }
    made = prepared.made_record("hand", None, 0, "given")
    out = prepared.write_graph(t, {"name": "hand", "num_classes": 2}, tmp_path / "h", "fp32", made)
    assert prepared.read_manifest(out)["edge_index_order"] == order
    back = prepared.load_graph(out)
    assert torch.equal(back.data.edge_index, ei)
    assert torch.equal(back.data.x, t["x"])


def test_half_features_and_multilabel(tmp_path):
    ds = load_dataset("synthetic-amazon", tmp_path / "root", 0.001, 2)
    for dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        out = _prepare(tmp_path, "synthetic-amazon", dtype, scale="0.001", seed="2",
                       feature_dtype=dtype)  # fmt: skip
        back = load_dataset(str(out), tmp_path / "root")
        assert torch.equal(back.data.x, ds.data.x.to(torch_dtype).float())
        assert back.multilabel and back.data.y.dtype == torch.uint8
        assert torch.equal(back.data.y, ds.data.y)
        assert torch.equal(back.data.edge_index, ds.data.edge_index)
        assert back.num_features == 200
        raw = np.load(out / "features.npy", mmap_mode="r")
        assert raw.dtype == (np.float16 if dtype == "fp16" else np.uint16)


def test_user_pt_without_masks_keeps_the_split_of_its_seed(tmp_path):
    g = torch.Generator().manual_seed(0)
    n = 40
    ei = torch.randint(0, n, (2, 160), generator=g)  # directed, duplicates kept: "permuted"
    path = tmp_path / "g.pt"
    torch.save(Data(x=torch.randn(n, 5, generator=g), edge_index=ei, y=torch.arange(n) % 3), path)
    out = _prepare(tmp_path, str(path), seed="5")
    mem = load_dataset(str(path), tmp_path / "root", seed=5)
    back = load_dataset(str(out), tmp_path / "root", seed=9)  # the stored split, any seed
    _same_graph(mem.data, back.data)
    assert back.info["prepared"] == str(out)


def test_graphbolt_ondisk_folder(tmp_path):
    pytest.importorskip("yaml")
    ds = load_dataset("cora", tmp_path / "root")
    d = ds.data
    gb = tmp_path / "gb"
    (gb / "data").mkdir(parents=True)
    np.save(gb / "data/edges.npy", d.edge_index.numpy())
    np.save(gb / "data/feat.npy", d.x.numpy())
    np.save(gb / "data/label.npy", d.y.numpy())
    for s in ("train", "val", "test"):
        np.save(gb / f"data/{s}.npy", d[f"{s}_mask"].nonzero().view(-1).numpy())
    (gb / "metadata.yaml").write_text(
        "dataset_name: cora-gb\n"
        "graph:\n  nodes:\n    - num: 2708\n  edges:\n    - format: numpy\n"
        "      path: data/edges.npy\n"
        "feature_data:\n"
        "  - domain: node\n    name: feat\n    format: numpy\n    in_memory: false\n"
        "    path: data/feat.npy\n"
        "  - domain: node\n    name: label\n    format: numpy\n    path: data/label.npy\n"
        "tasks:\n  - name: node_classification\n    num_classes: 7\n"
        + "".join(
            f"    {key}:\n      - data:\n          - name: seeds\n            format: numpy\n"
            f"            path: data/{s}.npy\n"
            for key, s in (("train_set", "train"), ("validation_set", "val"), ("test_set", "test"))
        )
    )
    out = _prepare(tmp_path, str(gb))
    back = load_dataset(str(out), tmp_path / "root")
    _same_graph(d, back.data)
    assert back.name == "cora-gb"
    (gb / "metadata.yaml").write_text(
        (gb / "metadata.yaml").read_text().replace("data/feat.npy", "../../etc/passwd")
    )
    with pytest.raises(UsageError, match="leaves the folder"):
        _prepare(tmp_path, str(gb), name="g2")


def test_sampler_reads_int32_indices_in_place_with_the_same_batches(tmp_path):
    out = _prepare(tmp_path, "cora")
    p = prepared.open_prepared(out)
    col32 = p.tensor("indices")
    assert col32.dtype == torch.int32
    mem = CSRGraph(p.tensor("indptr"), col32.long())
    disk = NeighborSampler(CSRGraph(p.tensor("indptr"), col32), [5, 3])
    assert disk._col.data_ptr() == col32.data_ptr()  # no int64 copy
    for backend_sampler in (NeighborSampler(mem, [5, 3]),):
        seeds = torch.arange(0, 2708, 97)
        a = backend_sampler.sample(seeds, torch.Generator().manual_seed(1))
        b = disk.sample(seeds, torch.Generator().manual_seed(1))
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


# ------------------------------------------------------------------------ damage and atomicity
@pytest.fixture(scope="module")
def cora_folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prepared")
    return _prepare(tmp, "cora", "cora")


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_truncated_or_overwritten_array_is_named_when_opened(tmp_path, cora_folder):
    bad = _copy(cora_folder, tmp_path / "cut")
    with open(bad / "indices.npy", "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(UsageError, match=r"indices\.npy has 1000 bytes"):
        load_dataset(str(bad), tmp_path)
    bad = _copy(cora_folder, tmp_path / "end")
    size = (bad / "features.npy").stat().st_size
    with open(bad / "features.npy", "r+b") as fh:
        fh.seek(size - 3)
        fh.write(b"\x01\x02\x03")
    with pytest.raises(UsageError, match=r"features\.npy differs .*checksum of its ends"):
        load_dataset(str(bad), tmp_path)
    bad = _copy(cora_folder, tmp_path / "gone")
    (bad / "labels.npy").unlink()
    with pytest.raises(UsageError, match=r"labels\.npy is missing"):
        load_dataset(str(bad), tmp_path)
    bad = _copy(cora_folder, tmp_path / "manifest")
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(UsageError, match="manifest.json cannot be read"):
        load_dataset(str(bad), tmp_path)


def test_verify_finds_a_flipped_byte_in_the_middle(tmp_path, cora_folder, capsys):
    assert main(["prepare", "--verify", str(cora_folder)]) == 0
    assert "intact" in capsys.readouterr().out
    bad = _copy(cora_folder, tmp_path / "flip")
    path = bad / "features.npy"
    size = path.stat().st_size
    assert size > 4 * prepared.ENDS  # the byte lies where the open check does not look
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        b = fh.read(1)
        fh.seek(size // 2)
        fh.write(bytes([b[0] ^ 0x10]))
    load_dataset(str(bad), tmp_path)  # the cheap check on open cannot see it
    assert main(["prepare", "--verify", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "features.npy differs from what was written (SHA-256)" in err
    assert "Traceback" not in err


def test_a_prepare_that_fails_midway_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def fail(self, chunk):
        calls.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepared.Array, "write", fail)
    with pytest.raises(UsageError, match="disk filled up"):
        _prepare(tmp_path, "cora", "c")
    assert calls and not [e for e in os.listdir(tmp_path) if e.startswith("c")]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_prepare_leaves_nothing_that_loads(tmp_path):
    """SIGKILL while the features are written: the leftover has no manifest, does not load,
    and the next prepare into the same place removes it. SIGTERM at the same point (``kill``,
    a batch job's time limit): one line, exit 143, and nothing left behind at all."""
    out = tmp_path / "g"

    def killed_at_features(sig: int) -> subprocess.CompletedProcess:
        code = (
            "import os, signal, sys\n"
            "from gnnpar.data import prepared\n"
            "real = prepared.Array.write\n"
            "def write(self, chunk):\n"
            "    real(self, chunk)\n"
            "    if self.name == 'features':\n"
            f"        os.kill(os.getpid(), {int(sig)})\n"
            "prepared.Array.write = write\n"
            "from gnnpar.cli import main\n"
            f"sys.exit(main(['prepare', '--dataset', 'cora', '--out', {str(out)!r}, '--quiet']))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        return subprocess.run(
            [sys.executable, "-c", code], env=env, timeout=100, cwd=tmp_path,
            capture_output=True, text=True,
        )  # fmt: skip

    p = killed_at_features(signal.SIGKILL)
    assert p.returncode == -signal.SIGKILL
    assert not out.exists()
    (left,) = [e for e in tmp_path.iterdir() if e.name.startswith("g.tmp-")]
    assert not prepared.is_prepared(left)
    assert main(["prepare", "--dataset", "cora", "--out", str(out), "--quiet"]) == 0
    assert not left.exists() and prepared.is_prepared(out)
    shutil.rmtree(out)
    p = killed_at_features(signal.SIGTERM)
    assert p.returncode == 143, p.stderr
    assert p.stderr.strip() == "gnnpar: stopped by SIGTERM; nothing half-written is left"
    assert sorted(e.name for e in tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_bad_input_is_one_message_exit_2(tmp_path, cora_folder, capsys):
    cases = [
        (["--dataset", "cora", "--out", str(cora_folder)], "already exists"),
        (["--dataset", "cora", "--out", str(tmp_path / "no/such/g")], "does not exist"),
        (["--dataset", "cora", "--out", str(tmp_path / "a"), "--scale", "0.5"], "generated"),
        (["--dataset", "synthetic-reddit", "--out", str(tmp_path / "b"), "--scale", "2"], "(0, 1]"),
        (["--dataset", "cora", "--out", str(tmp_path / "c"), "--feature-dtype", "fp8"], "fp8"),
        (["--dataset", "cora", "--out", str(tmp_path / "d"), "--seed", "x"], "integer"),
        (["--dataset", "synthetic-cifar10", "--out", str(tmp_path / "e")], "images"),
        (["--dataset", "cora"], "--out"),
        (["--verify", str(tmp_path)], "not a prepared graph"),
        (["--verify", str(cora_folder), "--dataset", "cora"], "alone"),
    ]
    for args, words in cases:
        assert main(["prepare", *args, "--quiet"]) == 2, args
        err = capsys.readouterr().err
        assert words in err and err.count("gnnpar: error:") == 1, (args, err)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not os.access(ro, os.W_OK):  # root writes anywhere
            assert main(["prepare", "--dataset", "cora", "--out", str(ro / "g")]) == 2
            assert "permission denied" in capsys.readouterr().err
    finally:
        ro.chmod(0o755)


def test_a_folder_of_another_format_version_or_sharded_is_refused(tmp_path, cora_folder):
    for change, words in (
        ({"format_version": 99}, "format version 99"),
        ({"shards": [{}]}, "list of shards is damaged"),
    ):
        bad = _copy(cora_folder, tmp_path / words.replace(" ", "-"))
        m = json.loads((bad / "manifest.json").read_text())
        (bad / "manifest.json").write_text(json.dumps({**m, **change}))
        with pytest.raises(UsageError, match=words):
            load_dataset(str(bad), tmp_path)


def test_streamed_generator_prepares_the_in_memory_graph(tmp_path):
    """synthetic-papers100m is generated straight into the folder, chunk by chunk; training by
    name reads the same stream back into memory."""
    out = _prepare(tmp_path, "synthetic-papers100m", scale="0.0005", seed="4")
    mem = load_dataset("synthetic-papers100m", tmp_path / "root", 0.0005, 4)
    back = load_dataset(str(out), tmp_path / "root")
    _same_graph(mem.data, back.data)
    m = prepared.read_manifest(out)
    assert m["made"]["generator"] == "sbm-stream-1" and m["edge_index_order"] == "source"
    assert prepared.verify(out).num_nodes == mem.num_nodes


@pytest.mark.parametrize("feature_dtype", ["fp32", "bf16"])
def test_synthetic_reddit_streams_the_in_memory_generators_arrays(
    tmp_path, monkeypatch, feature_dtype
):
    """synthetic-reddit is written chunk by chunk, its draws in blocks (here of 1,000), its
    pairs in many bucket files, its surplus found without holding the randperm: every array
    is the one its in-memory generator's tensors prepare to, bit for bit."""
    from gnnpar.data import synthetic

    monkeypatch.setattr(synthetic, "DRAWS", 1000)
    monkeypatch.setattr(synthetic, "BUCKET_BYTES", 4096)
    tails = []
    real_tail = synthetic.randperm_tail

    def spy(k, m, seed, scratch):
        tails.append((k, m))
        return real_tail(k, m, seed, scratch)

    monkeypatch.setattr(synthetic, "randperm_tail", spy)
    out = _prepare(
        tmp_path, "synthetic-reddit", scale="0.002", seed="3", feature_dtype=feature_dtype
    )
    assert tails and tails[0][0] > tails[0][1]  # a surplus was dropped
    t, meta = synthetic.generate_reddit(synthetic.REDDIT, 0.002, 3)
    made = prepared.made_record("synthetic-reddit", 0.002, 3, "generated")
    ref = prepared.write_graph(t, meta, tmp_path / "ref", feature_dtype, made)
    got, want = prepared.read_manifest(out), prepared.read_manifest(ref)
    assert got["arrays"].keys() == want["arrays"].keys()
    for name, rec in want["arrays"].items():
        assert got["arrays"][name]["sha256"] == rec["sha256"], name
    assert got["made"]["generator"] == synthetic.VERSION and got["edge_index_order"] == "source"
    back = load_dataset(str(out), tmp_path / "root")
    assert torch.equal(back.data["edge_index"], t["edge_index"])


@pytest.mark.parametrize("k,m", [(2, 1), (10, 7), (5000, 4990), (40_000, 30_000)])
def test_randperm_tail_is_torch_randperms_tail(tmp_path, monkeypatch, k, m):
    """torch.randperm(k)[m:] as a set, from steps held on disk, in blocks of 1,000 steps."""
    from gnnpar.data import synthetic

    monkeypatch.setattr(synthetic, "DRAWS", 1000)
    for seed in (0, 7, 2**62 + 5):
        want = torch.randperm(k, generator=torch.Generator().manual_seed(seed))[m:]
        got = synthetic.randperm_tail(k, m, seed, tmp_path)
        assert np.array_equal(got, want.sort().values.numpy()), seed
    assert list(tmp_path.iterdir()) == []  # its file of steps is gone


def test_train_on_a_damaged_folder_is_refused_before_any_rank(tmp_path, cora_folder, capsys):
    bad = _copy(cora_folder, tmp_path / "bad")
    with open(bad / "indptr.npy", "r+b") as fh:
        fh.truncate(64)
    args = ["train", "--dataset", str(bad), "--strategy", "allreduce", "--workers", "2"]
    assert main([*args, "--model", "sage", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "indptr.npy has 64 bytes" in err and "Prepare it again" in err


def test_module_function_and_ogb_folder_prepare_to_the_in_memory_graph(tmp_path, monkeypatch):
    import gzip

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mygraphs_prep.py").write_text(
        "import torch\nfrom torch_geometric.data import Data\n"
        "def build():\n"
        "    g = torch.Generator().manual_seed(1)\n"
        "    return Data(x=torch.randn(30, 4, generator=g),\n"
        "                edge_index=torch.randint(0, 30, (2, 90), generator=g),\n"
        "                y=torch.arange(30) % 3)\n"
    )
    ogb = tmp_path / "ogbish"
    (ogb / "raw").mkdir(parents=True)
    edges = "".join(f"{i},{(i * 7 + 1) % 20}\n" for i in range(20))
    feats = "".join(f"{i * 0.1},{1 - i * 0.05}\n" for i in range(20))
    for name, text in (("edge", edges), ("node-feat", feats)):
        (ogb / f"raw/{name}.csv.gz").write_bytes(gzip.compress(text.encode()))
    labels = "".join(f"{i % 2}\n" for i in range(20))
    (ogb / "raw/node-label.csv.gz").write_bytes(gzip.compress(labels.encode()))
    for i, source in enumerate(("mygraphs_prep:build", str(ogb))):
        out = _prepare(tmp_path, source, f"p{i}", seed="2")
        mem = load_dataset(source, tmp_path / "root", seed=2)
        _same_graph(mem.data, load_dataset(str(out), tmp_path / "root").data)


def test_the_streams_sorted_lookup_is_searchsorted():
    import numpy as np

    from gnnpar.data.synthetic import _search

    g = np.random.default_rng(3)
    cdf = np.repeat(np.cumsum(g.random(500)), 3)  # ties: every value three times
    q = np.concatenate([g.random(2000) * cdf[-1], cdf[::7], [0.0, cdf[-1], cdf[-1] + 1]])
    assert np.array_equal(_search(cdf, q), np.searchsorted(cdf, q))


def test_arrays_are_mapped_read_only_and_tensors_made_without_a_warning(cora_folder):
    """Shared read-only maps, not copy-on-write: a private writable map of a file larger than
    RAM + swap is refused (ENOMEM) by the kernel's default overcommit heuristic."""
    import warnings

    from gnnpar.data.prepared import Prepared

    p = Prepared(cora_folder)
    for name in ("features", "indices", "indptr", "labels"):
        assert not p.array(name).flags.writeable, name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = p.tensor("features")
    assert t.shape == (2708, 1433)
