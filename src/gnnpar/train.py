"""One training run, top to bottom: config -> dataset -> strategy -> result.json.

    gnnpar train --dataset cora --model gat                          # 1 process
    gnnpar train --dataset cora --model gat --strategy allreduce \\
        --partitions 8 --workers 2                                   # 2 local ranks
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 \\
        -m gnnpar train --strategy gossip ...                        # 2 machines

``--workers N`` (when not already under torchrun) starts N local ranks through torch's elastic
launcher; each rank then runs :func:`run_rank`, which is also what torchrun's ranks run.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gnnpar import dist
from gnnpar.config import Config
from gnnpar.data.datasets import load_dataset
from gnnpar.metrics import machine, score_name, summarize, versions, write_result
from gnnpar.strategies import STRATEGIES
from gnnpar.strategies.base import Outcome


def run(cfg: Config) -> dict[str, Any] | None:
    """Entry point of ``gnnpar train``: launch local ranks if asked, else train in this process."""
    if cfg.strategy.workers > 1 and not dist.launched_by_torchrun():
        from gnnpar.launch import launch_local

        return launch_local(cfg)
    return run_rank(cfg)


def set_threads(cfg: Config, local_world: int) -> None:
    threads = cfg.run.threads or max(1, (os.cpu_count() or 1) // max(local_world, 1))
    torch.set_num_threads(threads)


def run_rank(cfg: Config) -> dict[str, Any] | None:
    ctx = dist.setup(cfg.strategy.timeout_s)
    try:
        set_threads(cfg, ctx.local_world_size)
        ds = load_dataset(cfg.data.dataset, cfg.data.data_root, cfg.data.scale, cfg.run.seed)
        outcome = STRATEGIES[cfg.strategy.name]().run(cfg, ds, ctx)
        result = build_result(cfg, outcome, ds.multilabel, ctx.world_size)
        if ctx.is_main and cfg.run.out:
            write_result(result, cfg.run.out)
        return result if ctx.is_main else None
    finally:
        dist.teardown()


def build_result(cfg: Config, o: Outcome, multilabel: bool, world_size: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "dataset": cfg.data.dataset,
        "model": cfg.model.name,
        "strategy": cfg.strategy.name,
        "workers": world_size,
        "epochs": cfg.run.epochs,
        "seed": cfg.run.seed,
        "config": cfg.to_dict(),
        "train_time_s": o.train_time_s,
        "partition_time_s": o.partition_time_s,
        "step_time_s": summarize(o.step_times),
        "test_step_time_s": summarize(o.test_step_times),
        "score_name": score_name(multilabel),
        "test_score": o.test_score,
        "val_score": o.val_score,
        "per_worker_batches": o.per_worker_batches,
        "loss_curve": o.loss_curve,
        "versions": versions(),
        "machine": machine(),
    }
    result.update(o.extra)
    return result
