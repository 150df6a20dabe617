"""What every strategy returns, and the shared pieces of a training step.

A strategy is a class with

* ``validate_config(cfg)`` (static, optional): checks that need no data, run before any process
  is launched; raise :class:`gnnpar.UsageError`.
* ``run(cfg, dataset, ctx) -> Outcome``: trains on every rank; each rank returns its Outcome and
  rank 0's is written to result.json (so per-rank lists must already be gathered on rank 0).
"""

from __future__ import annotations

import os
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


def choose_final_model(
    model: torch.nn.Module, params: list[torch.nn.Parameter], ds, timeout_s: float
) -> FinalChoice:
    """Score every rank's model and the average of all of them on validation; keep the better.

    Study 003 takes the best local model by validation; the average of the local models is the
    other natural candidate. Ties go to the average. The models (small next to the graph) are
    gathered, and rank 0 scores all of them on the one full-graph structure it builds once
    (:func:`gnnpar.engine.reuse_eval_graph`), with every core of its machine: so a machine never
    holds more than one evaluation copy of a large graph, however many ranks it runs (scoring
    on every rank at once would build one ~4.9 GiB adjacency per rank on full-size Reddit).
    Rank 0 publishes each model's scoring in the key-value store and the others wait for each
    with ``timeout_s``. Every rank ends holding the chosen parameters. Collective.
    """
    import torch.distributed as dist
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from gnnpar import comm
    from gnnpar.engine import evaluate_graph, reuse_eval_graph

    def load(flat: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(flat, params)

    flats = comm.all_gather_flat(parameters_to_vector(params).detach())
    average = torch.stack(flats).mean(0)
    store, prefix = comm.default_store(), "gnnpar/final-model/"
    models = [*flats, average]
    choice = None
    if not comm.active() or dist.get_rank() == 0:
        scores, times = [], []
        threads = torch.get_num_threads()
        torch.set_num_threads(max(threads, os.cpu_count() or 1))  # the other ranks only wait
        try:
            with reuse_eval_graph():
                for i, flat in enumerate(models):
                    load(flat)
                    s, t = evaluate_graph(model, ds)
                    scores.append(s)
                    times.append(t)
                    store.set(f"{prefix}{i}", "scored")
        finally:
            torch.set_num_threads(threads)
        avg = scores.pop()
        divergence = [comm.relative_distance([f], [average]) for f in flats]
        best = max(range(len(scores)), key=lambda i: (scores[i]["val"], -i))
        candidates = {
            "best_local": {
                "rank": best,
                "val_score": scores[best]["val"],
                "test_score": scores[best]["test"],
            },
            "average": {"val_score": avg["val"], "test_score": avg["test"]},
        }
        choice = FinalChoice("average", avg, candidates, scores, divergence, times)
        if avg["val"] < scores[best]["val"]:
            choice.name, choice.scores = f"best-local:rank{best}", scores[best]
    else:
        for i in range(len(models)):  # one --timeout per model scored, not one for all
            what = "average of all models" if i == len(flats) else f"rank {i}'s model"
            comm.wait_for_key(store, f"{prefix}{i}", timeout_s, f"rank 0 scoring the {what}")
    choice = comm.broadcast_object(choice)
    best = choice.candidates["best_local"]["rank"]
    load(average if choice.name == "average" else flats[best])
    return choice
