"""The final model of a run whose ranks end with different models (gossip, allreduce K > 1).

Study 003 takes the best local model by validation; the average of the local models is the
other natural candidate. :func:`choose_final_model` scores both and keeps the better one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from gnnpar.parallel import collectives
from gnnpar.runtime.store import wait_for_key
from gnnpar.training.evaluation import EvalGraphCache, evaluate_graph


@dataclass
class FinalChoice:
    name: str  # "average" or "best-local:rank<N>"
    scores: dict[str, float]  # the chosen model's scores (train/val/test)
    candidates: dict[str, dict[str, Any]]  # both candidates' val/test scores (and the best rank)
    local_scores: list[dict[str, float]]  # every rank's own model
    divergence: list[float]  # per rank: ||its model - average|| / ||average||
    eval_times: list[float] = field(default_factory=list)


def relative_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all tensors together: how far a rank's model is from another
    (e.g. from the average of all ranks' models: 0 when the ranks agree)."""
    diff = sum(
        float((x.detach().double() - y.detach().double()).pow(2).sum()) for x, y in zip(a, b)
    )
    norm = sum(float(y.detach().double().pow(2).sum()) for y in b)
    return (diff / norm) ** 0.5 if norm > 0 else 0.0


def pick_final(scores: list[dict], flats: list, average: torch.Tensor, times: list) -> FinalChoice:
    """The choice from every rank's model's scores and, last in ``scores``, the average's: the
    average unless one rank's model scores higher on validation (the lowest such rank on ties).
    Used by :func:`choose_final_model` and across shards (``training.cluster_parts``)."""
    avg = scores.pop()
    divergence = [relative_distance([f], [average]) for f in flats]
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
    return choice


def choose_final_model(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    ds,
    store: dist.Store,
    timeout_s: float,
) -> FinalChoice:
    """Score every rank's model and the average of all of them on validation; keep the better.

    Ties go to the average. The models (small next to the graph) are gathered, and rank 0
    scores all of them over one full-graph structure it builds once (an
    :class:`~gnnpar.training.evaluation.EvalGraphCache`), with every core of its machine: so a machine
    never holds more than one evaluation copy of a large graph, however many ranks it runs
    (scoring on every rank at once would build one ~4.9 GiB adjacency per rank on full-size
    Reddit). Rank 0 publishes each model's scoring in ``store`` and the others wait for each
    with ``timeout_s``. Every rank ends holding the chosen parameters. Collective.
    """

    def load(flat: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(flat, params)

    flats = collectives.all_gather_flat(parameters_to_vector(params).detach())
    average = torch.stack(flats).mean(0)
    prefix = "final-model/"
    models = [*flats, average]
    choice = None
    if not collectives.active() or dist.get_rank() == 0:
        scores, times = [], []
        threads = torch.get_num_threads()
        torch.set_num_threads(max(threads, os.cpu_count() or 1))  # the other ranks only wait
        try:
            cache = EvalGraphCache()
            for i, flat in enumerate(models):
                load(flat)
                s, t = evaluate_graph(model, ds, cache)
                scores.append(s)
                times.append(t)
                store.set(f"{prefix}{i}", "scored")
            del cache
        finally:
            torch.set_num_threads(threads)
        choice = pick_final(scores, flats, average, times)
    else:
        for i in range(len(models)):  # one --timeout per model scored, not one for all
            what = "average of all models" if i == len(flats) else f"rank {i}'s model"
            wait_for_key(store, f"{prefix}{i}", timeout_s, f"rank 0 scoring the {what}")
    choice = collectives.broadcast_object(choice)
    best = choice.candidates["best_local"]["rank"]
    load(average if choice.name == "average" else flats[best])
    return choice
