"""What every strategy returns, and the shared pieces of a training step.

A strategy is a class with

* ``validate_config(cfg)`` (static, optional): checks that need no data, run before any process
  is launched; raise :class:`gnnpar.UsageError`.
* ``run(cfg, dataset, ctx) -> Outcome``: trains on every rank; each rank returns its Outcome and
  rank 0's is written to result.json (so per-rank lists must already be gathered on rank 0).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gnnpar.config import Config


@dataclass
class Outcome:
    train_time_s: float
    step_times: list[float]
    test_step_times: list[float]
    loss_curve: list[float] | dict[str, list[float]]
    per_worker_batches: list[int]
    val_score: float
    test_score: float
    partition_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # strategy-specific result.json keys


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)


class Straggler:
    """Emulated heterogeneity (study 003's non-dedicated cluster).

    ``slowdown`` F makes a step take F times as long: after a step of t seconds we sleep (F-1)*t.
    ``jitter`` X adds, with probability 0.1 per step, a transient pause of up to X times the step.
    """

    def __init__(self, factor: float = 1.0, jitter: float = 0.0, seed: int = 0) -> None:
        self.factor = factor
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.delay_s = 0.0

    def after_step(self, step_s: float) -> None:
        pause = (self.factor - 1.0) * step_s
        if self.jitter > 0 and self.rng.random() < 0.1:
            pause += self.rng.uniform(0, self.jitter) * step_s
        if pause > 0:
            time.sleep(pause)
            self.delay_s += pause


@dataclass
class FinalChoice:
    """The final model of a run whose ranks end with different models (gossip, allreduce K > 1)."""

    name: str  # "average" or "best-local:rank<N>"
    scores: dict[str, float]  # the chosen model's scores (train/val/test)
    candidates: dict[str, dict[str, Any]]  # both candidates' val/test scores (and the best rank)
    local_scores: list[dict[str, float]]  # every rank's own model
    divergence: list[float]  # per rank: ||its model - average|| / ||average||
    eval_times: list[float] = field(default_factory=list)


def choose_final_model(model: torch.nn.Module, params: list[torch.nn.Parameter], ds) -> FinalChoice:
    """Score every rank's model and the average of all of them on validation; keep the better.

    Study 003 takes the best local model by validation; the average of the local models (one
    all-reduce) is the other natural candidate. Ties go to the average. Every rank ends holding
    the chosen parameters. Collective: every rank must call it.
    """
    from gnnpar import comm
    from gnnpar.engine import evaluate_graph

    local, t_local = evaluate_graph(model, ds)
    scores = comm.gather_to_all(local)
    best = max(range(len(scores)), key=lambda i: (scores[i]["val"], -i))
    keep = [p.detach().clone() for p in params]
    comm.average_parameters(params, comm.WaitClock())
    divergence = comm.gather_to_all(comm.relative_distance(keep, params))
    avg, t_avg = evaluate_graph(model, ds)  # the same model everywhere: the same scores
    candidates = {
        "best_local": {
            "rank": best,
            "val_score": scores[best]["val"],
            "test_score": scores[best]["test"],
        },
        "average": {"val_score": avg["val"], "test_score": avg["test"]},
    }
    choice = FinalChoice("average", avg, candidates, scores, divergence, [t_local, t_avg])
    if avg["val"] < scores[best]["val"]:
        with torch.no_grad():  # every rank takes the best rank's parameters
            for p, k in zip(params, keep):
                p.copy_(k)
        comm.broadcast_parameters(model, src=best)
        choice.name, choice.scores = f"best-local:rank{best}", scores[best]
    return choice
