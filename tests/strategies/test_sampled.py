"""The `sampled` strategy: it learns, runs 2 ranks x 2 loader workers to the end with the time
breakdown in result.json, and rejects bad input with exit status 2."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gnnpar import UsageError
from gnnpar.configure import build_config
from gnnpar.data.datasets import GraphDataset
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.run import prepare, run_rank, train_rank
from gnnpar.runtime.dist import DistContext
from helpers import run_cli, tiny_graph


def test_single_process_learns_cora_and_cleans_up(tmp_path):
    cfg = build_config(
        None,
        {
            "dataset": "cora",
            "model": "sage",
            "strategy": "sampled",
            "epochs": 10,
            "batch-size": 32,
            "hidden": 64,
            "lr": 0.01,
            "threads": 1,
            "quiet": True,
            "out": str(tmp_path),
        },
    )
    assert cfg.strategy.fanouts == [25, 10, 10]
    result = run_rank(cfg, prepare(cfg))
    assert result["test_score"] > 0.6  # 10 epochs of 5 sampled batches (0.79 seen)
    assert result["per_worker_batches"] == [10 * 5]
    assert result["loss_curve"][-1] < result["loss_curve"][0]
    (bd,) = result["time_breakdown_s"]
    assert bd["sync"] == 0.0 and bd["compute"] > 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"gnnpar-sampled-{os.getpid()}")]


def test_study_002_defaults():
    for dataset in ("cora", "synthetic-reddit"):  # big graphs must not get study 003's sage
        cfg = build_config(None, {"dataset": dataset, "model": "sage", "strategy": "sampled"})
        assert (cfg.model.hidden, cfg.model.layers, cfg.model.dropout) == (256, 3, 0.5)
        assert (cfg.optim.lr, cfg.optim.weight_decay) == (5e-3, 5e-4)
    cfg = build_config(None, {"model": "gat3", "strategy": "sampled"})
    assert (cfg.model.hidden, cfg.model.heads, cfg.model.dropout) == (16, 1, 0.6)
    assert cfg.strategy.fanouts == [25, 10, 10]


def test_bad_input_is_a_usage_error():
    with pytest.raises(UsageError, match="3 layers"):
        prepare(build_config(None, {"strategy": "sampled", "model": "sage", "fanouts": "10,10"}))
    with pytest.raises(UsageError, match="batch-size"):
        build_config(None, {"strategy": "sampled", "model": "sage", "batch-size": 0})
    data = tiny_graph()
    data.train_mask = torch.zeros(6, dtype=torch.bool)
    data.train_mask[2] = True
    cfg = build_config(None, {"strategy": "sampled", "model": "sage"})
    dims = ParallelDims(replicas=2, stages=1, world=2)
    with pytest.raises(UsageError, match="fewer than the 2 ranks"):
        train_rank(cfg, GraphDataset("tiny", data, 2), DistContext(world_size=2), dims)


def test_cli_fanout_mismatch_exits_2(capsys):
    from gnnpar.cli import main

    code = main(["train", "--strategy", "sampled", "--model", "gat3", "--fanouts", "5,5"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "gnnpar: error:" in err and "one fan-out per layer" in err
    assert "Traceback" not in err


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_more_ranks_than_training_nodes_exits_2_through_the_launcher():
    # karate has 4 labelled training nodes
    p = run_cli(
        "train", "--dataset", "karate", "--strategy", "sampled", "--model", "sage",
        "--workers", "5", "--quiet", timeout=220,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "4 training nodes, fewer than the 5 ranks" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_ranks_two_loader_workers_run_two_epochs(tmp_path):
    p = run_cli(
        "train", "--dataset", "cora", "--strategy", "sampled", "--model", "sage",
        "--workers", "2", "--loader-workers", "2", "--epochs", "2", "--batch-size", "32",
        "--timeout", "120", "--quiet", "--out", str(tmp_path), timeout=280,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "result.json").read_text())
    # 140 training nodes: 70 per rank, 3 batches of <= 32, 2 epochs
    assert r["workers"] == 2 and r["per_worker_batches"] == [6, 6]
    assert len(r["time_breakdown_s"]) == 2
    for bd in r["time_breakdown_s"]:
        assert set(bd) == {"data_wait", "compute", "sync"} and min(bd.values()) >= 0
    assert r["max_rank_train_time_s"] == max(r["rank_train_time_s"])
    assert r["step_time_s"]["count"] == 6 and 0 <= r["test_score"] <= 1
