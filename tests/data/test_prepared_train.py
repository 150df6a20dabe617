"""Training from a prepared folder does the in-memory run's arithmetic: same seed, the same loss
curve bit for bit, for the sequential, allreduce and sampled strategies (1 and 2 ranks, with
loader workers), with the features and the CSR read from the memory-mapped folder."""

from __future__ import annotations

import json

import pytest

from gnnpar.configure import build_config
from gnnpar.data.prepare_command import run_prepare
from gnnpar.run import prepare, run_rank
from helpers import run_cli

MODEL = {"model": "sage", "hidden": "32", "layers": "2", "dropout": "0.5", "lr": "0.01"}
MODEL |= {"weight-decay": "0.0005", "threads": "1", "seed": "3", "quiet": True}


def _folder(tmp_path, dataset, scale=None, seed=None):
    out = tmp_path / "prepared"
    run_prepare(dataset, str(out), scale, seed, None, str(tmp_path / "root"), None, True)
    return out


def _curve(tmp_path, dataset, name, **flags):
    out = tmp_path / name
    cfg = build_config(
        None,
        {
            **MODEL,
            "dataset": dataset,
            "data-root": str(tmp_path / "root"),
            **flags,
            "out": str(out),
        },  # fmt: skip
    )
    return _result(cfg)["loss_curve"]


def _result(cfg) -> dict:
    return run_rank(cfg, prepare(cfg))


def test_sequential_full_batch_same_curve_from_disk(tmp_path):
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sequential", "epochs": "4"}
    mem = _curve(tmp_path, "cora", "mem", **flags)
    disk = _curve(tmp_path, str(folder), "disk", **flags)
    assert len(mem) == 4 and mem == disk


def test_sampled_one_rank_same_curve_and_scores_from_disk(tmp_path, monkeypatch):
    """The same loss curve, and the same final layer-wise scores: evaluation reads the
    folder's CSR in row blocks (a message limit that takes the large-graph path on Cora)."""
    from gnnpar.training import evaluation as ev

    monkeypatch.setattr(ev, "MESSAGE_BYTES_LIMIT", 4096)
    blocks = []
    real = ev.CSRRows.rows
    monkeypatch.setattr(ev.CSRRows, "rows", lambda self, ids: blocks.append(1) or real(self, ids))
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sampled", "epochs": "2", "batch-size": "32", "fanouts": "5,5"}
    flags |= {"eval-mode": "layerwise"}
    results = []
    for name, dataset in (("mem", "cora"), ("disk", str(folder))):
        cfg = build_config(None, {**MODEL, "dataset": dataset, **flags, "out": str(tmp_path / name),
                                  "data-root": str(tmp_path / "root")})  # fmt: skip
        results.append(_result(cfg))
    mem, disk = results
    assert len(mem["loss_curve"]) == 2 and mem["loss_curve"] == disk["loss_curve"]
    assert (mem["val_score"], mem["test_score"]) == (disk["val_score"], disk["test_score"])
    assert blocks  # the folder's run read its CSR in row blocks


def _cli_curve(tmp_path, dataset, name, *args):
    out = tmp_path / name
    flags = [f"--{k}" if v is True else f"--{k}={v}" for k, v in MODEL.items()]
    p = run_cli(
        "train", "--dataset", dataset, "--data-root", str(tmp_path / "root"), *flags, *args,
        "--timeout", "120", "--out", str(out), timeout=280,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads((out / "result.json").read_text())["loss_curve"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "args",
    [
        ("--strategy", "allreduce", "--workers", "2", "--partitions", "4", "--epochs", "2"),
        (
            "--strategy",
            "sampled",
            "--workers",
            "2",
            "--loader-workers",
            "2",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--fanouts",
            "5,5",
        ),  # fmt: skip
    ],
    ids=["allreduce-2-ranks", "sampled-2-ranks-with-loader-workers"],
)
def test_two_ranks_same_curve_from_disk(tmp_path, args):
    folder = _folder(tmp_path, "cora")
    mem = _cli_curve(tmp_path, "cora", "mem", *args)
    disk = _cli_curve(tmp_path, str(folder), "disk", *args)
    assert len(mem) >= 2 and mem == disk


def test_feature_cache_changes_no_bit(tmp_path):
    """All rows cached, a third, none: the same loss curve as in memory."""
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sampled", "epochs": "1", "batch-size": "32", "fanouts": "5,5"}
    mem = _curve(tmp_path, "cora", "mem", **flags)
    for i, size in enumerate(("1.0", "0.33", "0", "100K")):
        disk = _curve(tmp_path, str(folder), f"disk{i}", **flags, **{"feature-cache": size})
        assert disk == mem, size


def test_gather_rows_with_and_without_cache_is_index_select(tmp_path):
    import torch

    from gnnpar.data import prepared
    from gnnpar.data.sampling.loader import gather_rows

    folder = _folder(tmp_path, "cora")
    p = prepared.open_prepared(folder)
    x = p.tensor("features")
    n_id = torch.randperm(2708, generator=torch.Generator().manual_seed(0))[:500]
    want = torch.index_select(x, 0, n_id)
    assert torch.equal(gather_rows(x, n_id), want)
    cache = tmp_path / "cache.bin"
    k = prepared.cache_rows(p, "0.1", None)
    assert k == 270
    prepared.write_feature_cache(p, k, str(cache))
    assert cache.stat().st_size == 4 * 2708 + k * x.size(1) * 4  # slot, then the rows: no more
    c = prepared.open_feature_cache(str(cache), x)
    assert c["rows"].shape == (k, x.size(1))
    held = c["slot"] >= 0
    assert int(held.sum()) == k
    # the held rows are the most frequent sources
    deg = torch.bincount(p.tensor("indices").long(), minlength=2708)
    assert int(deg[held].min()) >= int(deg[~held].max())
    assert torch.equal(gather_rows(x, n_id, c["slot"], c["rows"]), want)
    assert torch.equal(c["rows"], x[held])  # ascending ids, the rows themselves
    assert prepared.cache_rows(p, None, 20 * x.numel()) == 2708  # a quarter of 5x the bytes
    assert prepared.cache_rows(p, None, None) == 0  # memory unknown: no cache


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_gather_rows_in_blocks_is_index_select(tmp_path, monkeypatch, dtype):
    """The batch is filled a few rows at a time (here 3 x 1433 fp32 bytes a block) from the
    cache, the file reader and the map: still index_select of the widened features, repeats
    and all, bit for bit."""
    import torch

    from gnnpar.data import prepared
    from gnnpar.data.sampling import loader

    out = tmp_path / dtype
    run_prepare("cora", str(out), None, None, dtype, str(tmp_path / "root"), None, True)
    p = prepared.open_prepared(out)
    g = loader.open_graph_folder(str(out))
    x = g["x"]
    monkeypatch.setattr(loader, "GATHER_BYTES", 3 * x.size(1) * 4)
    n_id = torch.randint(0, 2708, (700,), generator=torch.Generator().manual_seed(1))
    want = torch.index_select(x, 0, n_id).float()
    prepared.write_feature_cache(p, 300, str(tmp_path / "cache"))
    c = prepared.open_feature_cache(str(tmp_path / "cache"), x)
    reader = prepared.FileRows.open(g)
    for slot, rows in ((None, None), (c["slot"], c["rows"])):
        for r in (None, reader):
            got, hits = loader.gather_rows_counted(x, n_id, slot, rows, r)
            assert torch.equal(got, want)
            assert hits == (0 if slot is None else int((c["slot"][n_id] >= 0).sum()))


def test_bad_feature_cache_is_refused(tmp_path):
    import pytest

    from gnnpar import UsageError

    for bad in ("1.5", "lots", "-3", "0.5x"):
        with pytest.raises(UsageError, match="--feature-cache"):
            build_config(None, {**MODEL, "strategy": "sampled", "feature-cache": bad})
    with pytest.raises(UsageError, match="feature-cache"):  # read by the sampled strategy only
        build_config(None, {**MODEL, "strategy": "sequential", "feature-cache": "1G"})


def _sampled_result(tmp_path, folder, name, cache, epochs="2"):
    flags = {"strategy": "sampled", "epochs": epochs, "batch-size": "32", "fanouts": "5,5"}
    out = tmp_path / name
    cfg = build_config(
        None,
        {
            **MODEL,
            **flags,
            "feature-cache": cache,
            "dataset": str(folder),
            "data-root": str(tmp_path / "root"),
            "out": str(out),
        },  # fmt: skip
    )
    return run_rank(cfg, prepare(cfg))


def _n_ids(folder, steps, epochs):
    """Every batch's n_id, made again without a cache (the same batches: seeded per step)."""
    import torch

    from gnnpar.data import prepared
    from gnnpar.data.sampling.loader import SampledBatches

    train = prepared.open_prepared(folder).tensor("train").long()
    b = SampledBatches(str(folder), train, [5, 5], 32, 0, 1, 3, steps)
    return [[b[e * steps + i].n_id for i in range(steps)] for e in range(epochs)], torch


def test_feature_cache_hit_rate_and_bytes_are_exact(tmp_path):
    """result.json's feature_cache: every row cached -> hit rate 1.0 and nothing read; no
    cache -> 0.0 and every gathered row read; a known hot set (the rows of most expected
    visits at the run's fan-outs) -> the fraction of gathered rows in it, counted again here
    from the same batches, per epoch and in all, above a degree-ranked cache's."""
    from gnnpar.data import prepared

    folder = _folder(tmp_path, "cora")
    p = prepared.open_prepared(folder)
    row = 1433 * 4  # cora: 1433 fp32 features

    full = _sampled_result(tmp_path, folder, "all", "1.0")["feature_cache"][0]
    assert full["bytes"] == 2708 * row
    assert full["hit_rate"] == 1.0 and full["bytes_read"] == 0
    steps = full["per_epoch"][0]["steps"]
    assert steps == 5 and full["steps"] == 2 * steps  # 140 training nodes, 32 a batch

    n_ids, torch = _n_ids(folder, steps, 2)
    gathered = [sum(int(n.numel()) for n in ep) for ep in n_ids]
    assert [e["rows_gathered"] for e in full["per_epoch"]] == gathered
    assert full["rows_gathered"] == sum(gathered)

    none = _sampled_result(tmp_path, folder, "none", "0")["feature_cache"][0]
    assert none["bytes"] == 0 and none["hit_rate"] == 0.0 and none["cache_hits"] == 0
    assert none["bytes_read"] == sum(gathered) * row
    assert none["bytes_read_per_step"] == sum(gathered) * row / (2 * steps)

    k = 300
    hot = torch.zeros(2708, dtype=torch.bool)
    hot[torch.from_numpy(prepared.hot_rows(p, k, [5, 5], 32))] = True  # the run's: by visits
    hits = [sum(int(hot[n].sum()) for n in ep) for ep in n_ids]
    by_degree = torch.zeros(2708, dtype=torch.bool)
    by_degree[torch.from_numpy(prepared.hot_rows(p, k))] = True
    # the 140 training nodes' neighbourhoods, not the highest degrees: more of the rows served
    assert sum(hits) > sum(sum(int(by_degree[n].sum()) for n in ep) for ep in n_ids)
    part = _sampled_result(tmp_path, folder, "part", str(k * row))["feature_cache"][0]
    assert part["bytes"] == k * row
    assert [e["cache_hits"] for e in part["per_epoch"]] == hits
    assert part["hit_rate"] == sum(hits) / sum(gathered)
    assert 0 < part["hit_rate"] < 1
    assert part["bytes_read"] == (sum(gathered) - sum(hits)) * row
    # metrics.jsonl's epoch records carry the same per-epoch figures
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines if '"event": "epoch"' in x]
    want = [{k: v for k, v in e.items() if k != "epoch"} for e in part["per_epoch"]]
    assert [{k: v for k, v in r["feature_cache"].items() if k != "bytes"} for r in records] == want
    assert all(r["feature_cache"]["bytes"] == k * row for r in records)


def test_in_memory_sampled_run_has_no_feature_cache_entry(tmp_path):
    flags = {"strategy": "sampled", "epochs": "1", "batch-size": "32", "fanouts": "5,5"}
    cfg = build_config(
        None,
        {**MODEL, **flags, "dataset": "cora", "data-root": str(tmp_path / "root"),
         "out": str(tmp_path / "mem")},
    )  # fmt: skip
    assert "feature_cache" not in run_rank(cfg, prepare(cfg))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_feature_cache_file_holds_the_stored_rows(tmp_path, dtype):
    """The cache file's rows are the hot rows' stored bits (fp16, bf16), its slots their
    places; gathering through it is index_select of the widened features, bit for bit."""
    import torch

    from gnnpar.data import prepared
    from gnnpar.data.sampling.loader import gather_rows

    out = tmp_path / dtype
    run_prepare("cora", str(out), None, None, dtype, str(tmp_path / "root"), None, True)
    p = prepared.open_prepared(out)
    x = p.tensor("features")
    cache = tmp_path / "cache"
    prepared.write_feature_cache(p, 100, str(cache))
    c = prepared.open_feature_cache(str(cache), x)
    hot = torch.from_numpy(prepared.hot_rows(p, 100))
    assert c["rows"].dtype == x.dtype and torch.equal(c["rows"], x[hot])
    want = torch.full((2708,), -1, dtype=torch.int32)
    want[hot] = torch.arange(100, dtype=torch.int32)
    assert torch.equal(c["slot"], want)
    n_id = torch.randperm(2708, generator=torch.Generator().manual_seed(1))[:400]
    got = gather_rows(x, n_id, c["slot"], c["rows"])
    assert torch.equal(got, torch.index_select(x, 0, n_id).float())


def test_hot_rows_of_an_undirected_graph_need_only_indptr(tmp_path):
    """An undirected graph's hot rows come from its rows' lengths, without reading indices:
    the same nodes as counting every source (its CSR is symmetric)."""
    import numpy as np

    from gnnpar.data import prepared

    p = prepared.open_prepared(_folder(tmp_path, "cora"))
    assert not p.manifest["directed"]
    deg = np.diff(np.asarray(p.array("indptr")))
    assert np.array_equal(np.bincount(p.array("indices"), minlength=2708), deg)
    by_rows = prepared.hot_rows(p, 300)
    p.manifest["directed"] = True  # the same graph counted source by source
    assert np.array_equal(prepared.hot_rows(p, 300), by_rows)
    assert deg[by_rows].min() >= np.delete(deg, by_rows).max()


@pytest.mark.parametrize(
    ("dtype", "direct"), [("fp32", False), ("fp16", False), ("bf16", False), ("fp32", True)]
)
def test_rows_read_from_the_file_are_the_maps_rows(tmp_path, dtype, direct):
    """FileRows (the compiled kernel's threaded reads, no read-ahead) gathers the rows a map
    would, bit for bit: single rows, runs of neighbours, rows a gap apart, a row twice, the
    first and the last, with and without the feature cache, for any threads and gap, through
    the page cache or around it (O_DIRECT, where the file system has it)."""
    import torch

    from gnnpar.data import prepared
    from gnnpar.data.prepared import FileRows
    from gnnpar.data.sampling import kernel
    from gnnpar.data.sampling.loader import gather_rows, open_graph_folder

    if not kernel.kernel_available():
        pytest.skip(f"the compiled kernel is not built ({kernel.HINT})")
    out = tmp_path / dtype
    run_prepare("cora", str(out), None, None, dtype, str(tmp_path / "root"), None, True)
    g = open_graph_folder(str(out))
    reader = FileRows.open(g, direct)
    assert reader.align == (prepared.direct_align(str(out)) if direct and _has_direct(out) else 1)
    x = g["x"]
    some = torch.randperm(2708, generator=torch.Generator().manual_seed(2))[:600]
    n_id = torch.cat([some, torch.tensor([2707, 0, 1, 2, 3, 5, 9, 40, 41, 1000, 3])])
    want = torch.index_select(x, 0, n_id).float()
    assert torch.equal(gather_rows(x, n_id, reader=reader), want)
    for threads, gap in ((1, 0), (3, 0), (64, 4096), (7, 1 << 20)):
        reader.THREADS, reader.GAP = threads, gap
        assert torch.equal(gather_rows(x, n_id, reader=reader), want), (threads, gap)
    if reader.align > 1:  # direct reads at a page's alignment too, and at a refused finer one
        for align in (FileRows.DIRECT_ALIGN, 1 << 8):
            wide = FileRows(*g["x_file"], x.size(1) * x.element_size(), True, align)
            assert torch.equal(gather_rows(x, n_id, reader=wide), want), align
            assert wide.align in (FileRows.DIRECT_ALIGN, 1 << 8), align
            wide.close()
    cache = tmp_path / "cache"
    prepared.write_feature_cache(prepared.open_prepared(out), 300, str(cache), direct)
    c = prepared.open_feature_cache(str(cache), x)
    assert torch.equal(gather_rows(x, n_id, c["slot"], c["rows"], reader), want)
    empty = torch.empty(0, dtype=torch.int64)
    assert gather_rows(x, empty, reader=reader).shape == (0, x.size(1))
    reader.close()


def _has_direct(folder) -> bool:
    import os

    try:
        os.close(os.open(folder / "features.npy", os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


def test_a_row_past_the_files_end_is_an_error_naming_the_file(tmp_path):
    import numpy as np
    import torch

    from gnnpar.data.prepared import FileRows
    from gnnpar.data.sampling import kernel

    if not kernel.kernel_available():
        pytest.skip(f"the compiled kernel is not built ({kernel.HINT})")
    path = tmp_path / "x.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4))
    x = np.load(path, mmap_mode="r")
    reader = FileRows(str(path), int(x.offset), 16)
    out = torch.empty((2, 4))
    reader.read(torch.tensor([0, 9]), out)
    assert out.tolist() == [[0, 1, 2, 3], [36, 37, 38, 39]]
    with pytest.raises(OSError, match="x.npy"):
        reader.read(torch.tensor([3, 10]), out)
    reader.close()


def test_batches_made_ahead_on_a_thread_are_the_loaders_in_order():
    """Ahead yields the wrapped iterator's items in order, ends where it ends, raises an
    item's error where that item would have come, and stops its thread on close."""
    from gnnpar.data.sampling.loader import Ahead

    assert list(Ahead(iter(range(5)))) == [0, 1, 2, 3, 4]
    assert list(Ahead(iter([]))) == []

    def failing():
        yield 1
        raise OSError("disk gone")

    it = Ahead(failing())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    it = Ahead(iter(range(10)))
    assert next(it) == 0
    it.close()
    with pytest.raises(StopIteration):
        next(it)


def test_collective_batches_made_ahead_start_when_asked_and_finish_before_stopping():
    """With ``collective`` (every rank must make the same items: sampling across shards),
    Ahead makes nothing before the first item is asked for, makes the next while the caller
    works, settles (the item in the making finished and kept) before a checkpoint, raises an
    item's error where that item comes, and on close finishes the item in the making instead
    of cancelling it (a cancel that won on one rank only would leave its peers waiting)."""
    import threading

    from gnnpar.data.sampling.loader import Ahead

    made, gate = [], threading.Event()

    def items():
        for i in range(4):
            if i == 2:
                gate.wait(10)  # item 2 is still in the making when close is called
            made.append(i)
            yield i

    it = Ahead(items(), collective=True)
    assert made == []  # nothing made before asked: a resumed run replaces the iterator
    assert next(it) == 0
    it.settle()
    assert made == [0, 1]  # item 1 made ahead, kept
    assert next(it) == 1
    threading.Timer(0.2, gate.set).start()
    it.close()  # waits for item 2 (the gate opens), drops it
    assert made == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(it)

    def failing():
        yield 1
        raise RuntimeError("/gloo/ peer gone")

    it = Ahead(failing(), collective=True)
    assert next(it) == 1
    it.settle()  # the error is kept for its item's place, not raised here
    with pytest.raises(RuntimeError, match="peer gone"):
        next(it)
    it.close()


def test_loader_workers_that_do_not_fit_a_memory_limit_are_dropped(monkeypatch):
    """Inside a memory limit, a loader worker that needs more than half of what is free is not
    started (one line says why); without a limit the workers are as asked."""
    from gnnpar.runtime import resources
    from gnnpar.training.sources import WORKER_BYTES, loader_workers_that_fit

    monkeypatch.setattr(resources, "memory_limit", lambda root="/": None)
    monkeypatch.setenv(resources.FORCED_LIMIT_ENV, "1G")  # read as a limit with nothing used
    got, why = loader_workers_that_fit(1, 160 << 20)  # papers100m 0.02's batch bound
    assert got == 0
    assert "--loader-workers 1 does not fit in the memory cgroup's limit of 1.0 GiB" in why
    assert "the training process makes the batches" in why
    got, why = loader_workers_that_fit(2, 10 << 20)
    assert got == 1 and "1 worker(s) make the batches" in why
    assert loader_workers_that_fit(1, 1 << 20) == (1, None)
    monkeypatch.setenv(resources.FORCED_LIMIT_ENV, str(8 * WORKER_BYTES))
    assert loader_workers_that_fit(3, 0) == (3, None)
    monkeypatch.delenv(resources.FORCED_LIMIT_ENV)
    assert loader_workers_that_fit(2, 1 << 40) == (2, None)  # no cgroup: as asked


def test_a_batch_is_made_ahead_only_where_the_limit_holds_the_step_and_one_more(monkeypatch):
    """Inside a memory limit the next batch is made on a thread only where what is free holds
    the step (STEP_BATCHES batches' bytes) and that batch too; without a limit, always."""
    from gnnpar.runtime import resources
    from gnnpar.training.sources import STEP_BATCHES, batch_ahead_fits

    monkeypatch.setattr(resources, "memory_limit", lambda root="/": None)
    monkeypatch.setenv(resources.FORCED_LIMIT_ENV, str((STEP_BATCHES + 1) * (100 << 20)))
    assert batch_ahead_fits(100 << 20)
    assert not batch_ahead_fits((100 << 20) + 1)
    monkeypatch.delenv(resources.FORCED_LIMIT_ENV)
    assert batch_ahead_fits(1 << 40)  # no cgroup


def test_the_default_feature_cache_leaves_the_step_its_memory(tmp_path):
    """The default cache (a quarter of the memory the run may use) never takes what the step
    needs (shared memory the kernel cannot reclaim would get the run killed), nor the page
    cache's room for the CSR the sampler reads at every hop."""
    from gnnpar.data import prepared

    p = prepared.open_prepared(_folder(tmp_path, "cora"))
    row = 4 * p.array("features").shape[1]
    csr = 2709 * 8 + 10556 * 4  # int64 indptr, int32 indices
    assert csr == p.array("indptr").nbytes + p.array("indices").nbytes
    slot = 4 * 2708  # the cache's slot array, shared memory too
    free = 100 * row
    assert prepared.cache_rows(p, None, free) == (25 * row - slot) // row == 23
    assert prepared.cache_rows(p, None, free, reserve=70 * row) == (30 * row - csr - slot) // row
    assert prepared.cache_rows(p, None, free, reserve=70 * row) == 16
    assert prepared.cache_rows(p, None, free, reserve=100 * row - csr - slot) == 0  # CSR's room
    assert prepared.cache_rows(p, None, free, reserve=100 * row - csr - slot - 3 * row) == 3
    assert prepared.cache_rows(p, None, free, reserve=200 * row) == 0
    assert prepared.cache_rows(p, "50", free, reserve=200 * row) == 50 // row  # asked: as asked


def test_a_batch_bound_counts_every_hop_and_every_neighbour():
    from types import SimpleNamespace

    from gnnpar.training.sources import batch_bytes

    ds = SimpleNamespace(num_nodes=10**6, num_features=128)
    one = SimpleNamespace(batch_size=512, fanouts=[10, 5, 5])
    assert batch_bytes(ds, one) == 512 * 11 * 6 * 6 * 128 * 4
    assert batch_bytes(ds, SimpleNamespace(batch_size=512, fanouts=[-1, 2])) == 10**6 * 512
    assert batch_bytes(ds, SimpleNamespace(batch_size=10**6, fanouts=[3])) == 10**6 * 512


def test_a_loader_timeout_from_disk_names_the_rank_the_batch_and_the_folder():
    from gnnpar.training.sources import SampledSource

    def stuck():
        raise RuntimeError("DataLoader timed out after 120 seconds")
        yield

    src = SampledSource.__new__(SampledSource)
    src._it, src.on_disk, src.rank, src.position, src.workers = stuck(), True, 1, 7, 1
    src.timeout_s, src.folder = 120.0, "/data/papers"
    with pytest.raises(RuntimeError) as e:
        src._next_batch()
    assert str(e.value).startswith("rank 1 waited --timeout 120 s for batch 7 from its 1 loader")
    assert "/data/papers" in str(e.value) and "raise --timeout" in str(e.value)


def test_what_is_made_ahead_follows_where_the_features_are(monkeypatch):
    """A prepared graph's batches made without loader workers: where every feature row is in
    the cache only the sampling is made ahead (gathering is a copy from memory); else the whole
    batch where the limit holds it, nothing where it does not; never for an in-memory graph
    or with loader workers."""
    from gnnpar.runtime import resources
    from gnnpar.training.sources import STEP_BATCHES, made_ahead

    monkeypatch.setattr(resources, "memory_limit", lambda root="/": None)
    assert made_ahead(True, 0, True, 1 << 40) == "sampling"
    assert made_ahead(True, 0, False, 1 << 40) == "batch"  # no limit
    assert made_ahead(False, 0, True, 1) is None
    assert made_ahead(True, 2, True, 1) is None
    monkeypatch.setenv(resources.FORCED_LIMIT_ENV, str((STEP_BATCHES + 1) * (100 << 20)))
    assert made_ahead(True, 0, False, 100 << 20) == "batch"
    assert made_ahead(True, 0, False, (100 << 20) + 1) is None
    assert made_ahead(True, 0, True, (100 << 20) + 1) == "sampling"


def test_sampled_ahead_or_made_ahead_the_loss_curve_is_the_in_memory_runs(tmp_path):
    """One rank, no loader workers, from a prepared folder: with every feature row cached the
    thread only samples and the step's taker gathers the rows; without a cache the thread
    makes the whole batch. The same loss curve as the in-memory run, bit for bit."""
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sampled", "epochs": "2", "batch-size": "32", "fanouts": "5,5"}
    flags |= {"loader-workers": "0", "eval-mode": "layerwise"}
    runs = {}
    for name, dataset, extra in (
        ("mem", "cora", {}),
        ("sampling", str(folder), {}),  # the default cache holds all of cora
        ("batch", str(folder), {"feature-cache": "0"}),
    ):
        cfg = build_config(None, {**MODEL, "dataset": dataset, **flags, **extra,
                                  "out": str(tmp_path / name),
                                  "data-root": str(tmp_path / "root")})  # fmt: skip
        runs[name] = _result(cfg)
    assert runs["mem"]["made_ahead"] is None
    assert runs["sampling"]["made_ahead"] == "sampling"
    assert runs["batch"]["made_ahead"] == "batch"
    curve = runs["mem"]["loss_curve"]
    assert len(curve) == 2
    assert runs["sampling"]["loss_curve"] == curve == runs["batch"]["loss_curve"]


def test_the_next_batchs_rows_are_gathered_only_once_the_last_ones_are_freed():
    """GatherAfterRelease (on Ahead's thread where every row is in memory): batch i+1's rows
    are gathered only after batch i's features are let go, so two batches' rows are never held
    together; release() lets a waiting gather go on."""
    import threading
    from types import SimpleNamespace

    import torch

    from gnnpar.data.sampling.loader import Ahead, GatherAfterRelease

    log = []

    class Rows:
        def gather(self, b):
            log.append(f"gather {b.i}")
            b.x = torch.full((4, 2), float(b.i))

    gathered = GatherAfterRelease(iter([SimpleNamespace(i=i) for i in range(3)]), Rows())
    it = Ahead(gathered)
    first = next(it)
    assert first.x[0, 0] == 0
    threading.Event().wait(0.2)  # the thread has sampled batch 1 and waits
    assert log == ["gather 0"]
    x = first.x
    first.x = None
    log.append("freed 0")
    del x
    second = next(it)
    assert log == ["gather 0", "freed 0", "gather 1"] and second.x[0, 0] == 1
    gathered.release()  # batch 1 still held: closing lets the thread's gather of 2 go on
    it.close()
    gather = GatherAfterRelease(iter([SimpleNamespace(i=i) for i in range(2)]), Rows())
    held = next(gather)
    gather.release()  # the batch is still held: a closing source lets the next gather go on
    assert next(gather).i == 1 and held.x is not None
