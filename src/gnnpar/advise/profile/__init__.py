"""The short profile ``gnnpar advise`` simulates from, taken here with gnnpar's own code paths.

Every batch is the one the strategy would train, built by the strategy's own parts: the full
graph and the Cluster-GCN subgraphs through ``sequential``'s plan (``SPEC.build``: the real
model, loss, optimizer and partitions), neighbour-sampled batches through ``sampled``'s plan
(its :class:`~gnnpar.data.sampling.loader.SampledBatches` over the shared graph file), pipeline
micro-batches through :class:`~gnnpar.training.pipeline_batches.GraphMicroBatches` and the
stage split of :func:`~gnnpar.parallel.pipeline.stages.choose_balance`. What is measured:

* one training step (forward, backward, optimizer step) of each batch kind at ``--threads``:
  the full graph, every subgraph of each ``--partitions`` in the grid, a few sampled batches per
  ``--batch-size``, and each pipeline stage's forward and backward per micro-batch;
* making a sampled batch (sampling and feature gather) in one thread, as a loader worker does;
* bytes per exchange: the gradients or parameters (all-reduce, gossip), each stage's
  activations (pipeline);
* gloo on this machine between two ranks started by gnnpar's launcher: all-reduce and a
  point-to-point exchange against size (the median of calls made in turns,
  :func:`interleaved_calls`), and a store round trip (the gossip pool and pairing); fitted to
  ``latency + bytes / bandwidth``;
* how late a rank that waited at an all-reduce resumes (:func:`wake_s`): blocked in gloo's
  wait it slept, and is woken late (1.3-2.1 ms on a 2-vCPU VM, against ~0.2 ms for the fitted
  exchange), from allreduce trained with K = 1 by the real loop on two ranks;
* with ``--slowdown`` or ``--jitter``: how much longer a straggler's step (a subgraph's, a
  sampled batch's making and training) takes right after its emulated sleep, in a real two-rank
  run with the stragglers, than alone (:func:`_straggled_step_ratio`), and gossip's rank beside
  the straggler (:func:`_beside_straggler_ratio`);
* memory: the bare rank's resident memory here, and this process's peak.

ViG on images (study 000) is profiled per block instead (:func:`profile_images`): each block's
forward and backward on a few images, scaled per image, compose the sequential step and every
pipeline stage per micro-batch; gloo's costs as above.

Each timing is the mean of several repetitions after one warm-up, the repetitions of a set of
batches taken round-robin: an epoch's time is a sum of step times, whose expectation is the sum
of their means, and on a shared machine a step's time has a long tail (another process takes
the core for a while) that a median or a minimum would leave out; measured on Cora's 8
subgraphs, the median step was 1.6-1.9 ms both here and in ``gnnpar train``, whose epochs
nevertheless averaged 2.7-2.9 ms per step.

Where one round of them takes at most 10 s, every batch kind's timings are taken in 3 rounds
(``--profile-rounds``, ``Profile.rounds``) and each is the median of its rounds
(:func:`_measure_in_rounds`). The two ratios the profile takes (a step in the real loop against
alone, :func:`real_loop_factor`; a step with two ranks training at once against alone,
:func:`_corun_factor`) are taken in as many rounds, each timing both sides back to back, and the
median of the rounds' ratios is kept (their values are in ``Profile.probe_rounds``). Timed once
each, minutes
apart, on a VM whose speed drifts (a fixed 11 ms piece of work took 11-79 ms within one minute
on the model-207 Xeon, 2026-11-27), one slow moment on one side made a co-run factor of 2.06
where the runs themselves showed 1.1-1.35, and a grid's predictions 65-99% too slow.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import torch

from gnnpar.advise.profile.comm import _line, _sampled_probe, profile_comm
from gnnpar.advise.profile.core import (
    PROBE_ROUNDS,
    Need,
    Profile,
    _measure_in_rounds,
    _median_of,
    cpu_model,
    flags_for,
    interleaved_calls,
    plan_of,
    reference,
    reference_of,
)
from gnnpar.advise.profile.corun import _corun_factor, wake_s
from gnnpar.advise.profile.memory import current_rss
from gnnpar.advise.profile.pipeline import (
    image_pipeline,
    image_step_s,
    profile_images,
    profile_pipeline,
)
from gnnpar.advise.profile.sampled import (
    _loader_costs,
    profile_sampled,
    sampled_batch_costs,
    sampled_key,
    seed_batch_sizes,
)
from gnnpar.advise.profile.seed_deals import add_shard_record
from gnnpar.advise.profile.steps import loop_overhead_s, profile_graph_batches, real_loop_factor
from gnnpar.advise.speed import reference_s
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.models.memory import FLOAT_BYTES, parameter_count
from gnnpar.runtime.launch import start_fork_server_for_ranks
from gnnpar.strategies.spec import SIM_GOSSIP, SIM_LOCKSTEP, SIM_PIPELINE
from gnnpar.training.metrics import peak_memory

__all__ = [
    "Need",
    "PROBE_ROUNDS",
    "Profile",
    "_corun_factor",
    "_line",
    "_loader_costs",
    "_measure_in_rounds",
    "_median_of",
    "_sampled_probe",
    "cpu_model",
    "current_rss",
    "flags_for",
    "image_pipeline",
    "image_step_s",
    "interleaved_calls",
    "loop_overhead_s",
    "profile_comm",
    "profile_graph_batches",
    "profile_images",
    "profile_pipeline",
    "profile_sampled",
    "real_loop_factor",
    "reference",
    "reference_of",
    "sampled_batch_costs",
    "sampled_key",
    "seed_batch_sizes",
    "take_profile",
    "wake_s",
]


def take_profile(
    base: dict[str, Any],
    needs: Iterable[Need],
    threads: int,
    comm: bool,
    timeout_s: float,
    loader_workers: bool = False,
    rounds: int = PROBE_ROUNDS,
    straggle: dict[str, Any] | None = None,
    ds=None,
    corun_partitions: int | None = 8,
) -> Profile:
    """Measure what ``needs`` lists; ``comm``: also gloo between two ranks (starts them);
    ``loader_workers``: also a loader worker's start-up (starts one); ``rounds``: of every
    timing and ratio probe (``--profile-rounds``), the median of each kept; ``straggle``: the
    ``--slowdown``/``--jitter`` flags of the grid's stragglers on the probe's two ranks (rank 1
    the slowest), for the after-pause probes (:func:`_straggled_step_ratio`,
    :func:`_beside_straggler_ratio`); ``ds``: the dataset, where the caller loaded it already;
    ``corun_partitions``: the subgraphs of the co-run probe where ``needs`` has no count of 2 or
    more (None: no co-run probe then).

    The reference work of :mod:`gnnpar.advise.speed` is timed at the profile's start, after its
    timings, after the real loop's probe and at its end (``speed_ref_s``): whether the
    machine's speed changed while it was profiled."""

    t_start = time.perf_counter()
    needs = list(needs)
    if comm:  # before the loader workers below start it for themselves (see there)
        start_fork_server_for_ranks(2, threads, (__name__,))
    cfg = build_config(None, flags_for(base, reference("full")))  # the common settings
    d = cfg.data
    if ds is None:
        ds = load_dataset(d.dataset, d.data_root, d.scale, cfg.run.seed, timeout_s)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prof = _new_profile(cfg, ds, threads, rounds)
        prof.speed_ref_s.append(reference_s())
        with tempfile.TemporaryDirectory(prefix="gnnpar-advise-loop-") as tmp:
            prof.loop_step_s = loop_overhead_s(base, ds, tmp)
        shapes = _measure_steps(base, cfg, ds, needs, prof, comm, loader_workers)
    finally:
        torch.set_num_threads(before)
    if comm and ds.kind == "image":  # gloo's costs only: a real image pipeline step is long
        profile_comm(timeout_s, prof, threads)
    elif comm:
        probe = (straggle, corun_partitions)
        _two_rank_probes(base, needs, shapes, prof, probe, timeout_s, threads)
    if prof.shards and prof.sampled:  # --seeds local: each host's own seeds, from its shard
        add_shard_record(prof, ds.info["source"])
    prof.speed_ref_s.append(reference_s())
    prof.peak_rss_bytes = peak_memory(None)["peak_rss_bytes"]
    prof.profile_s = time.perf_counter() - t_start
    return prof


def _new_profile(cfg, ds, threads: int, rounds: int) -> Profile:
    """The profile's record of this machine, the run and the dataset, before any timing."""
    image = ds.kind == "image"
    d = cfg.data
    params = parameter_count(cfg, ds.num_features, ds.num_classes, ds.multilabel)
    return Profile(
        machine=cpu_model(),
        cores=os.cpu_count() or 1,
        threads=threads,
        dataset=d.dataset,
        model=cfg.model.name,
        epochs=cfg.run.epochs,
        seed=cfg.run.seed,
        num_nodes=int(ds.train_x[0, 0].numel()) if image else ds.num_nodes,
        num_train=int(ds.train_x.size(0)) if image else int(ds.data.train_mask.sum()),
        param_bytes=params * FLOAT_BYTES,
        base_rss_bytes=current_rss(),
        kind=ds.kind,
        batch_size=cfg.strategy.batch_size if image else 0,
        max_steps=cfg.run.max_steps,
        rounds=rounds,
        shards=_shards(ds),
    )


def _shards(ds) -> dict:  # noqa: ANN001
    """A sharded folder's record for the exchange across shards (see Profile.shards)."""
    info = getattr(ds, "info", None) or {}
    if not info.get("sharded"):
        return {}
    cut = (info.get("partition") or {}).get("edge_cut_share")
    return {"hosts": int(info["sharded"]), "edge_cut_share": cut, "row_bytes": 4 * ds.num_features}


def _measure_steps(
    base: dict, cfg, ds, needs: list[Need], prof: Profile, comm: bool, loader_workers: bool
) -> list[tuple[int, int, int]]:
    """Every batch kind's step in this process (in rounds), and the real loop's factor, with
    the reference work timed after each; returns the pipeline shapes measured (replicas,
    stages, chunks)."""
    # each pipeline shape through its need's plan (the first need's where several ask for it)
    plans: dict[tuple[int, int, int], str] = {}
    for n in needs:
        if n.kind == "pipeline" and n.plan:
            plans.setdefault((n.replicas, n.stages, n.chunks), n.plan)
    if ds.kind == "image":  # ViG: sequential and every pipeline shape, from one set of blocks
        shapes = [(n.replicas, n.stages, n.chunks) for n in needs if n.kind == "pipeline"]
        profile_images(base, ds, shapes, prof, plans)
        return shapes
    full = any(n.kind == "full" for n in needs)
    parts = [n.partitions for n in needs if n.kind == "parts"]
    full_plan, parts_plan = plan_of(needs, "full"), plan_of(needs, "parts")
    sizes = seed_batch_sizes([n for n in needs if n.kind == "sampled"], prof.num_train)
    shapes = [(n.replicas, n.stages, n.chunks) for n in needs if n.kind == "pipeline"]
    if comm:  # the two-stage shapes whose real step calibrates every pipeline's (below)
        shapes += [(1, 2, m) for _, _, m in shapes if cfg.model.layers >= 2]

    def measure(into: Profile) -> Profile:
        profile_graph_batches(base, ds, parts, full, into, full_plan, parts_plan)
        if sizes:
            profile_sampled(base, ds, sizes, into, loader_workers, plan_of(needs, "sampled"))
        if shapes:
            profile_pipeline(base, ds, shapes, into, plans)
        return into

    _measure_in_rounds(measure, prof)
    prof.speed_ref_s.append(reference_s())
    if parts or full:
        p = min(parts) if parts else None
        step_s = statistics.fmean(prof.parts_step_s[str(p)]) if p else prof.full_step_s
        with tempfile.TemporaryDirectory(prefix="gnnpar-advise-loop-") as tmp:
            rounds, drift = real_loop_factor(
                base, ds, tmp, p, step_s, asked=prof.rounds, plan=parts_plan if p else full_plan
            )
        prof.loop_factor = statistics.median(rounds)
        prof.probe_rounds["loop_factor"] = rounds
        if drift:  # the same steps timed again later, over the profile's timing (1)
            prof.probe_rounds["step_drift"] = [1.0, *drift]
        prof.speed_ref_s.append(reference_s())
    return shapes


def _two_rank_probes(
    base: dict,
    needs: list[Need],
    shapes: list[tuple[int, int, int]],
    prof: Profile,
    probe: tuple[dict[str, Any] | None, int | None],
    timeout_s: float,
    threads: int,
) -> None:
    """Graphs: gloo, the two-stage pipelines' real steps, the co-run and straggler probes, on
    two ranks (:func:`profile_comm`); ``probe``: take_profile's ``straggle`` and
    ``corun_partitions``."""
    straggle, corun_partitions = probe
    chunks = sorted({m for r, s, m in shapes if (r, s) == (1, 2)})
    # the ranks know the built-in strategies only: the two-rank probes train the references
    pipeline, lockstep, gossip = (reference_of(s) for s in (SIM_PIPELINE, SIM_LOCKSTEP, SIM_GOSSIP))
    pipelines = [
        (f"1x2x{m}", {**flags_for(base, pipeline, stages=2, chunks=m), "workers": 2})
        for m in chunks
    ]
    # subgraph steps on two ranks at once: for the subgraph strategies and the pipelines'
    # blocks (predict's _slowdown); a sampled-only grid has its own factor and skips it
    parts = sorted(n.partitions for n in needs if n.kind == "parts" and n.partitions >= 2)
    parts = parts or ([corun_partitions] if corun_partitions else [])
    corun = None
    if parts and any(n.kind in ("parts", "pipeline") for n in needs):
        flags = flags_for(base, lockstep, partitions=parts[0], sync_every=20)
        pool = None
        if straggle:  # and gossip's fast rank beside the straggler (the pool's main worker)
            pool = {**flags_for(base, gossip, partitions=parts[0], sync_every=20), "workers": 2}
        corun = ({**flags, "workers": 2}, straggle, pool)
    sampled = _sampled_probe(base, needs, prof, straggle)
    profile_comm(timeout_s, prof, threads, pipelines, corun, sampled)
