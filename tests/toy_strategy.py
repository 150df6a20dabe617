"""A strategy defined outside gnnpar: what adding one takes (one module like this, one
``registry.register`` line). tests/strategies/test_registry.py registers it and trains it.

"toy": one process, full-batch training of a graph model, scored at the end only. It reads
--jitter (emulated straggler pauses), to show that a setting's readers come from the specs.
Its ``advice`` makes ``gnnpar advise`` consider it: one rank training the whole graph (the
profile's full-graph step, timed through this module's own plan, simulated step by step),
tests/advise/test_toy_advised.py. Its memory estimate is the whole graph's (no ``step_rows``),
tests/strategies/test_registry.py.
"""

from __future__ import annotations

from functools import partial

from gnnpar import UsageError
from gnnpar.config.schema import Config
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies.spec import (
    SIM_ONE_RANK,
    STRAGGLER_KEYS,
    Advice,
    StrategySpec,
    one_process,
    reads,
)


def check(cfg: Config, dims: ParallelDims) -> None:
    if cfg.model.name == "vig":
        raise UsageError("--strategy toy trains graph models only.")


def build(cfg: Config, ds, ctx, dims: ParallelDims):
    from gnnpar.models import build_model
    from gnnpar.training.evaluation import evaluate_graph
    from gnnpar.training.loop import Final, Plan
    from gnnpar.training.losses import LocalStep, graph_loss
    from gnnpar.training.optim import build_optimizer
    from gnnpar.training.seeding import seed_everything
    from gnnpar.training.sources import ShuffledBatches
    from gnnpar.training.straggler import Straggler

    r = cfg.run
    seed_everything(r.seed)
    model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
    opt = build_optimizer(cfg, model.parameters())

    def finish() -> Final:
        scores, t = evaluate_graph(model, ds)
        return Final(scores, [t])

    return Plan(
        f"toy {cfg.model.name}",
        model,
        opt,
        ShuffledBatches([ds.data], r.epochs, r.seed, r.max_steps),
        LocalStep(model, partial(graph_loss, multilabel=ds.multilabel)),
        finish,
        straggler=Straggler.for_rank({}, cfg.strategy.jitter, r.seed, ctx.rank),
        extra={"toy": True, "jitter": cfg.strategy.jitter},
    )


SPEC = StrategySpec(
    name="toy",
    help="a test's one-process full-batch strategy",
    degrees=one_process,
    reads=reads("jitter", kinds=("graph",)),
    build=build,
    check=check,
    result_keys={
        "toy": "always true: the run was the toy strategy's",
        "jitter": STRAGGLER_KEYS["jitter"],
    },
    # gnnpar advise: one rank training the whole graph, timed through this plan
    advice=Advice(SIM_ONE_RANK, own_plan=True),
)
