"""The strategy registry: a strategy is one spec, and who reads a setting comes from the specs.

A toy strategy from the test folder (tests/toy_strategy.py) is registered and trained through
the CLI in this process; each built-in strategy is built in this process with its config
watched, and the settings it reads are the ones its spec declares (what makes
``used_by()``, the "is used by ... only" errors and ``gnnpar train --help`` right).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest
import torch
import torch.distributed as dist

import toy_strategy
from gnnpar import UsageError
from gnnpar.cli import flag_help, main
from gnnpar.config.parse import KEYS
from gnnpar.configure import STRATEGY_KEYS, build_config, describe_uses, used_by
from gnnpar.data.datasets import load_dataset
from gnnpar.run import prepare, train_rank
from gnnpar.runtime.dist import DistContext
from gnnpar.strategies import registry


@pytest.fixture
def toy():
    registry.register(toy_strategy.SPEC)
    try:
        yield toy_strategy.SPEC
    finally:
        registry.unregister("toy")


def test_a_registered_strategy_trains_through_the_cli(toy, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--dataset", "karate", "--model", "gcn", "--epochs", "3", "--quiet"]
    assert main(["train", "--strategy", "toy", *args, "--jitter", "0.5", "--out", str(out)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["strategy"] == "toy" and result["toy"] is True and result["jitter"] == 0.5
    assert len(result["loss_curve"]) == 3 and result["workers"] == 1
    assert (out / "model.pt").exists()


def test_a_registered_strategy_is_known_to_the_checks_and_the_help(toy, capsys):
    assert "toy" in registry.names()
    # its spec's reads join the derived readers of a setting, in help texts and errors
    assert describe_uses("jitter") == (
        "--strategy allreduce, gossip, gossip-bipartite, sampled, and by --strategy toy with a "
        "graph dataset"
    )
    with pytest.raises(UsageError, match="--sync-every is used by --strategy allreduce"):
        build_config(None, {"strategy": "toy", "model": "gcn", "sync-every": "2"})
    with pytest.raises(UsageError, match="--jitter is used by .* and by --strategy toy with a"):
        build_config(None, {"strategy": "sequential", "model": "gcn", "jitter": "0.5"})
    with pytest.raises(UsageError, match="toy trains graph models only"):  # its own check
        prepare(
            build_config(None, {"strategy": "toy", "dataset": "synthetic-cifar10", "model": "vig"})
        )
    with pytest.raises(UsageError, match="trains in one process, but --workers asks for 2"):
        prepare(build_config(None, {"strategy": "toy", "model": "gcn", "workers": "2"}))
    assert "toy: a test's one-process full-batch strategy" in flag_help("strategy")
    assert flag_help("jitter").endswith("and by --strategy toy with a graph dataset only]")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(dataclasses.replace(toy, help="another"))


def test_a_registered_strategy_has_its_memory_estimate_from_its_spec(toy, monkeypatch):
    """The memory check before a model is allocated (run.train_rank -> footprint.check_memory)
    and advise's estimate take a strategy's facts from its spec (``StrategySpec.memory``,
    ``step_rows``), never from its name: the toy (no ``step_rows``, no --batch-size) is counted
    as the whole graph and refused without a --batch-size hint; the same spec declaring a step
    of its own is counted as that step, with no edit outside the test folder."""
    from gnnpar.advise.profile.memory import rank_estimate
    from gnnpar.models.memory import FLOAT_BYTES, estimate_bytes, parameter_count
    from gnnpar.runtime import footprint

    flags = {"strategy": "toy", "dataset": "karate", "model": "gcn", "hidden": "8"}
    cfg = build_config(None, {**flags, "layers": "3"})
    dims = prepare(cfg)
    ds = load_dataset("karate", cfg.data.data_root, 1.0, 0, 60)
    assert toy.memory(ds.kind) == registry.get("sequential").memory(ds.kind)
    assert (
        not toy.memory(ds.kind).batch_sized and registry.get("sampled").memory("graph").batch_sized
    )
    # the whole graph: every node's and every edge's 8 floats in each of the 2 hidden blocks
    rows, edges = ds.num_nodes, int(ds.data.edge_index.size(1))
    params = parameter_count(cfg, ds.num_features, ds.num_classes, ds.multilabel)
    whole = {"state": params * 4 * 4, "activations": (rows + edges) * 8 * 2 * FLOAT_BYTES}
    assert rank_estimate(cfg, ds) == whole
    # refused through the run's own path (train_rank), in its words: no --batch-size to shrink
    small = footprint.MemoryBudget(sum(whole.values()) - 1, None)
    monkeypatch.setattr(footprint, "memory_budget", lambda device: small)
    with pytest.raises(UsageError, match=r"--model gcn --hidden 8 --layers 3 on 'karate'") as e:
        train_rank(cfg, ds, DistContext(), dims)
    assert "--batch-size" not in str(e.value) and "--partitions" not in str(e.value)
    # the same strategy declaring a step of its own (its first 4 nodes and their 6 messages)
    seeds = dataclasses.replace(toy, name="toy-seeds", step_rows=lambda cfg, ds: (4, 6))
    registry.register(seeds)
    try:
        cfg4 = build_config(None, {**flags, "strategy": "toy-seeds", "layers": "3"})
        step = rank_estimate(cfg4, ds)
        assert step == {"state": whole["state"], "activations": (4 + 6) * 8 * 2 * FLOAT_BYTES}
        assert estimate_bytes(cfg4, ds, 1) == whole  # without the spec's facts: the whole graph
        big = footprint.MemoryBudget(sum(step.values()), None)
        monkeypatch.setattr(footprint, "memory_budget", lambda device: big)
        dims4 = prepare(cfg4)
        cfg4.run.epochs = 1
        assert train_rank(cfg4, ds, DistContext(), dims4).model is not None  # fits: it trains
    finally:
        registry.unregister("toy-seeds")


def test_unregistered_the_toy_is_unknown():
    with pytest.raises(UsageError, match="Unknown --strategy 'toy'. Choose one of: sequential,"):
        build_config(None, {"strategy": "toy"})
    assert "toy" not in describe_uses("jitter")


def test_the_strategy_keys_are_exactly_the_settings_some_spec_reads():
    declared = {key for spec in registry.specs() for key in spec.reads}
    assert declared == set(STRATEGY_KEYS) and set(STRATEGY_KEYS) <= set(KEYS)
    uses = used_by()
    for key in STRATEGY_KEYS:  # every one is read by some strategies only
        assert all(u.strategies for u in uses[key]), key
        readers = {name for u in uses[key] for name in u.strategies}
        assert readers == {s.name for s in registry.specs() if key in s.reads}


# ---------------------------------------------------------------- what each build really reads
FIELD_KEYS = {(k.section, k.name): key for key, k in KEYS.items()}


class Watched:
    """A config section whose reads of its fields are noted in ``log`` (as flag names)."""

    def __init__(self, section: str, target, log: set[str]) -> None:
        object.__setattr__(self, "_where", (section, target, log))

    def __getattr__(self, name: str):
        section, target, log = object.__getattribute__(self, "_where")
        key = FIELD_KEYS.get((section, name))
        if key is not None:
            log.add(key)
        return getattr(target, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(object.__getattribute__(self, "_where")[1], name, value)


def watching(spec, log: set[str]):
    """``spec`` whose degrees, check and build see a config that notes what they read."""

    def watched_cfg(cfg):
        cfg = copy.copy(cfg)
        cfg.strategy = Watched("strategy", cfg.strategy, log)
        cfg.data = Watched("data", cfg.data, log)
        return cfg

    return dataclasses.replace(
        spec,
        degrees=lambda s, world: spec.degrees(Watched("strategy", s, log), world),
        check=lambda cfg, dims: spec.check(watched_cfg(cfg), dims),
        build=lambda cfg, *rest: spec.build(watched_cfg(cfg), *rest),
    )


GRAPH = {"dataset": "karate", "model": "gcn"}
IMAGES = {"dataset": "synthetic-cifar10", "scale": "0.002", "model": "vig", "hidden": "8"}
IMAGES.update({"layers": "2", "batch-size": "4"})
RUNS = {  # strategy -> settings of a run that reaches every setting its spec declares
    "sequential": {**GRAPH, "partitions": "2"},
    "sequential-images": {**IMAGES, "strategy": "sequential"},
    "allreduce": {**GRAPH, "partitions": "2", "slowdown": "0=1", "jitter": "0.1"},
    "gossip": {**GRAPH, "partitions": "2", "jitter": "0.1"},
    "pipeline": {**GRAPH, "stages": "1", "chunks": "2"},
    "pipeline-images": {**IMAGES, "strategy": "pipeline", "stages": "1", "chunks": "2"},
    "hybrid": {**GRAPH, "stages": "1", "chunks": "2", "replicas": "1"},
    "sampled": {**GRAPH, "fanouts": "5,5", "batch-size": "8"},
}
NOT_BY_BUILD = {"checkpoint-every-steps"}  # read by the loop for any strategy whose spec has it


@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", list(RUNS))
def test_a_strategy_reads_the_strategy_settings_its_spec_declares_and_no_other(
    run, tmp_path, monkeypatch
):
    flags = {"strategy": run.split("-")[0], **RUNS[run]}
    flags.update({"epochs": "1", "max-steps": "1", "quiet": True, "threads": "1"})
    flags.update({"data-root": str(tmp_path), "eval-every": "0"})
    cfg = build_config(None, flags)
    spec = registry.get(cfg.strategy.name)
    log: set[str] = set()
    monkeypatch.setitem(registry._SPECS, spec.name, watching(spec, log))
    dims = prepare(cfg)
    ds = load_dataset(cfg.data.dataset, cfg.data.data_root, cfg.data.scale, 0, 60)
    kind = "image" if cfg.model.name == "vig" else "graph"
    threads = torch.get_num_threads()
    group = dims.pipelined or spec.name in ("pipeline", "hybrid")
    if group:  # the pipeline builds a device mesh over the world group: one of one rank
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        train_rank(cfg, ds, DistContext(), dims)
    finally:
        torch.set_num_threads(threads)
        if group:
            dist.destroy_process_group()
    declared = {k for k, kinds in spec.reads.items() if kind in kinds} - NOT_BY_BUILD
    assert log & set(STRATEGY_KEYS) == declared
