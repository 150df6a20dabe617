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
    return run_rank(cfg, prepare(cfg))["loss_curve"]


def test_sequential_full_batch_same_curve_from_disk(tmp_path):
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sequential", "epochs": "4"}
    mem = _curve(tmp_path, "cora", "mem", **flags)
    disk = _curve(tmp_path, str(folder), "disk", **flags)
    assert len(mem) == 4 and mem == disk


def test_sampled_one_rank_same_curve_from_disk(tmp_path):
    folder = _folder(tmp_path, "cora")
    flags = {"strategy": "sampled", "epochs": "2", "batch-size": "32", "fanouts": "5,5"}
    mem = _curve(tmp_path, "cora", "mem", **flags)
    disk = _curve(tmp_path, str(folder), "disk", **flags)
    assert len(mem) == 2 and mem == disk


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
    assert prepared.cache_rows(p, None, 16 * x.numel()) == 2708  # a quarter of 4x the bytes
    assert prepared.cache_rows(p, None, None) == 0  # memory unknown: no cache


def test_bad_feature_cache_is_refused(tmp_path):
    import pytest

    from gnnpar import UsageError

    for bad in ("1.5", "lots", "-3", "0.5x"):
        with pytest.raises(UsageError, match="--feature-cache"):
            build_config(None, {**MODEL, "strategy": "sampled", "feature-cache": bad})
    with pytest.raises(UsageError, match="feature-cache"):  # read by the sampled strategy only
        build_config(None, {**MODEL, "strategy": "sequential", "feature-cache": "1G"})
