"""The two-rank gloo probes: gnnpar's launcher starts two ranks (:func:`comm_rank`) that time
all-reduce, point-to-point and store round trips against size, and run the co-run probes of
:mod:`~gnnpar.advise.profile.corun`; :func:`profile_comm` fits them into the profile."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from gnnpar.advise.profile.core import (
    COMM_REPEATS,
    COMM_SIZES,
    REPEATS,
    Need,
    Profile,
    flags_for,
    interleaved_calls,
    reference,
)
from gnnpar.advise.profile.corun import _corun_factor, _probe_dataset, _sampled_corun_factor, wake_s
from gnnpar.advise.profile.sampled import sampled_batch_costs, sampled_key
from gnnpar.configure import build_config
from gnnpar.parallel import collectives
from gnnpar.runtime import dist as gdist
from gnnpar.runtime.launch import launch
from gnnpar.strategies import registry


# ---------------------------------------------------------------- gloo between two ranks
def comm_rank(
    sizes: tuple[int, ...],
    repeats: int,
    timeout_s: float,
    pipelines: list[tuple[str, dict]],
    corun: tuple[dict, dict | None, dict | None] | None,
    sampled: tuple[dict, float, dict | None] | None,
    rounds: int,
    log_dir: str,
) -> dict | None:
    """One of two ranks started by gnnpar's launcher: all-reduce and pairwise exchange
    (``isend`` + ``irecv``, as gossip's) of each size, store round trips, and one real step of
    each two-stage pipeline in ``pipelines`` (``(key, train flags)``)."""
    import datetime

    import torch.distributed as dist

    ctx = gdist.setup(timeout_s)
    timeout = datetime.timedelta(seconds=timeout_s)
    out: dict[str, list] = {"allreduce": [], "p2p": []}
    try:
        other = 1 - ctx.rank
        calls: dict[tuple[str, int], Callable[[], None]] = {}
        for n in sizes:
            t = torch.ones(max(1, n // 4))
            got = torch.empty_like(t)

            def allreduce(t=t):
                dist.all_reduce(t)

            def exchange(t=t, got=got):
                sent, recv = dist.isend(t, other), dist.irecv(got, other)
                recv.wait(timeout=timeout)
                sent.wait(timeout=timeout)

            calls[("allreduce", n)], calls[("p2p", n)] = allreduce, exchange
        times = interleaved_calls(calls, 3 * repeats)
        for (name, n), seconds in times.items():
            out[name].append([n, seconds])
        dist.barrier()
        key = "advise/rtt"
        # the median of many calls: a round trip is ~50 us here, and one descheduled call of
        # 10 ms in 36 made the mean 0.5 ms (gossip pays it several times a step)
        calls = []
        for _ in range(repeats * 16):
            t0 = time.perf_counter()
            ctx.store.add(key, 1)
            calls.append(time.perf_counter() - t0)
        rtt = statistics.median(calls)
        got = [None, None]
        dist.all_gather_object(got, rtt)
        out["store_rtt_s"] = max(got)
        steps = {key: _pipeline_step_s(flags, ctx) for key, flags in pipelines}
        out["pipeline_step_s"] = {key: t for key, (t, _) in steps.items()}
        out["pipeline_first_s"] = {key: first for key, (_, first) in steps.items()}
        if corun is not None:
            flags, straggle, gossip = corun
            corun_out = _corun_factor(flags, ctx, rounds, straggle=straggle, gossip=gossip)
            out["corun_factor"], out["sync_runs"] = corun_out[:2]
            out["after_pause_parts"], out["beside_straggler"] = corun_out[2:]
        if sampled is not None:
            flags, alone_s, straggle = sampled
            out["sampled_corun_factor"], out["after_pause"] = _sampled_corun_factor(
                flags, alone_s, ctx, rounds, straggle=straggle
            )
        return out if ctx.rank == 0 else None
    finally:
        gdist.teardown()


def _pipeline_step_s(flags: dict, ctx) -> tuple[float, float]:
    """Median seconds of a real step (schedule and optimizer) of pipeline's own plan, and what
    its first step took beyond that (torch.distributed.pipelining's set-up on first use: up
    to ~0.8 s on a 24K-node graph, which a 10-epoch run of one step an epoch pays once)."""
    import torch.distributed as dist

    cfg = build_config(None, flags)
    ds = _probe_dataset(cfg)
    spec = registry.get(cfg.strategy.name)
    plan = spec.build(cfg, ds, ctx, spec.parallel_dims(cfg, ctx.world_size))
    batch = plan.source.batch

    def step() -> None:
        plan.optimizer.zero_grad(set_to_none=True)
        plan.step(batch)
        plan.optimizer.step()

    dist.barrier()
    t0 = time.perf_counter()
    step()  # warm-up
    # the median of up to 30 steps (~2 s): the step is mostly torch.distributed.pipelining's
    # own work per micro-batch (~5-10 ms a forward or backward on Cora against ~1 ms of
    # compute), which a descheduled moment stretches; a mean of 7 was off by up to 30%.
    # Every step is point-to-point between the ranks, so both take the same count.
    warm = max(collectives.gather_to_all(time.perf_counter() - t0))
    times = []
    for _ in range(max(REPEATS + 2, min(30, int(2.0 / max(warm, 1e-3))))):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    step_s = max(collectives.gather_to_all(statistics.median(times)))
    return step_s, max(0.0, warm - step_s)


def _sampled_probe(
    base: dict, needs: list[Need], prof: Profile, straggle: dict[str, Any] | None = None
) -> tuple[dict, float, dict | None] | None:
    """sampled's flags for the co-run probe on two ranks (the smallest batch size asked, made in
    the rank), what such a rank's batch costs alone (making and step, as profiled), and the
    stragglers' flags for its after-pause probe (None: no straggler), as given."""
    sizes = sorted(n.batch_size for n in needs if n.kind == "sampled")
    if not sizes:
        return None
    b, _ = sampled_batch_costs(prof, sizes[0], 2)
    strategy = reference("sampled")  # the ranks know the built-in strategies only
    flags = {**flags_for(base, strategy, batch_size=sizes[0], loader_workers=0), "workers": 2}
    return flags, b["compute_s"] + b["main_sample_s"], straggle


def profile_comm(
    timeout_s: float,
    prof: Profile,
    threads: int,
    pipelines: list[tuple[str, dict]] = (),
    corun: tuple[dict, dict | None, dict | None] | None = None,
    sampled: tuple[dict, float, dict | None] | None = None,
) -> None:

    args = (COMM_SIZES, COMM_REPEATS, timeout_s, list(pipelines), corun, sampled, prof.rounds)
    out = launch(comm_rank, args, 2, timeout_s, threads=threads)[0]
    # a 2-rank ring all-reduce is 2 steps of bytes / 2: t = 2 a + bytes * b
    a, b = _line(out["allreduce"])
    ring = (a / 2, 1.0 / b)
    pa, pb = _line(out["p2p"])
    prof.comm = {
        "allreduce": out["allreduce"],
        "p2p": out["p2p"],
        "ring_step": ring,  # (latency s, bandwidth B/s) of one ring step
        "p2p_link": (pa, 1.0 / pb),
        "store_rtt_s": out["store_rtt_s"],
        "pipeline_step_s": out["pipeline_step_s"],  # "1x2xM" -> a real 2-rank step here
        "pipeline_first_s": out["pipeline_first_s"],  # "1x2xM" -> its first step's extra
        # a step in a real 2-rank run / alone (the median of the probe's rounds); absent where
        # the grid has no subgraph or pipeline configuration (predict then takes 1)
        **(
            {"corun_factor": statistics.median(out["corun_factor"])}
            if "corun_factor" in out
            else {}
        ),
        # the same for sampled's steps (DDP's hooks in the backward); absent: no sampled run
        **(
            {"sampled_corun_factor": statistics.median(out["sampled_corun_factor"])}
            if sampled
            else {}
        ),
    }

    def keep(into: dict[str, float], kind: str, key: str, rounds: list[float]) -> None:
        """A straggler probe's rounds, under the batches its ranks trained; the median kept."""
        into[key] = statistics.median(rounds)
        prof.probe_rounds[f"{kind}_{key}"] = rounds

    if out.get("after_pause"):  # sampled's: a rank's own batches (sampled_key)
        key = f"sampled{sampled_key(prof, sampled[0]['batch-size'], 2)}"
        keep(prof.after_pause, "after_pause", key, out["after_pause"])
    if out.get("after_pause_parts"):  # the subgraph strategies': the co-run probe's subgraphs
        key = f"parts{corun[0]['partitions']}"
        keep(prof.after_pause, "after_pause", key, out["after_pause_parts"])
    if out.get("beside_straggler"):
        key = f"parts{corun[0]['partitions']}"
        keep(prof.beside_straggler, "beside_straggler", key, out["beside_straggler"])
    if "corun_factor" in out:
        prof.probe_rounds["corun_factor"] = out["corun_factor"]
        wakes = [wake_s(run, prof.comm, prof.param_bytes) for run in out["sync_runs"]]
        prof.comm["wake_s"] = statistics.median(wakes)  # simulate.Cluster.wake_s
        prof.comm["wake_rounds_s"] = wakes
    if sampled:
        prof.probe_rounds["sampled_corun_factor"] = out["sampled_corun_factor"]


def _line(points: list[list[float]]) -> tuple[float, float]:
    """``t = a + b * bytes`` fitted to relative error (weights 1 / t^2): an ordinary least
    squares fit is ruled by the largest messages and leaves the latency, which rules the small
    ones (a GCN's gradients are ~100 KB), anywhere, even negative. Both kept positive."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    w = [1.0 / max(y, 1e-9) ** 2 for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx if sxx else 0.0
    b = max(b, 1e-12)
    return max(my - b * mx, 1e-7), b
