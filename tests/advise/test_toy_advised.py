"""A strategy is one file, advise included: the toy strategy of the test folder
(tests/toy_strategy.py), registered from here, is profiled and simulated by ``gnnpar advise``
from the facts its spec declares (``advice``), with no edit anywhere else; unregistered, advise
does not know it."""

from __future__ import annotations

import json

import pytest

import toy_strategy
from gnnpar.advise.predict import advised, build_grid, default_strategies, straggles
from gnnpar.cli import main
from gnnpar.strategies import registry


@pytest.fixture
def toy():
    registry.register(toy_strategy.SPEC)
    try:
        yield toy_strategy.SPEC
    finally:
        registry.unregister("toy")


def _advise(tmp_path, *more: str) -> dict:
    out = tmp_path / "advice"
    args = ["advise", "--dataset", "cora", "--model", "gcn", "--epochs", "3", "--threads", "1"]
    args += ["--profile-rounds", "1"]  # one round of each timing: enough to compare
    assert main([*args, "--data-root", str(tmp_path / "d"), "--out", str(out), *more]) == 0
    return json.loads((out / "advice.json").read_text())


def test_a_registered_strategy_is_in_advise_grid_from_its_spec(toy):
    assert "toy" in advised() and "toy" in default_strategies()
    assert straggles("toy") and not straggles("sequential")  # it reads --jitter
    # one rank on the whole graph: it reads no --partitions, so no subgraph configurations
    assert [(c.strategy, c.settings, c.world) for c in build_grid(("toy",), 4, 2, {})] == [
        ("toy", {}, 1)
    ]


def test_advise_times_a_strategy_through_its_own_plan_where_its_spec_says_so(toy, tmp_path):
    """The toy declares ``Advice(own_plan=True)``: its full-graph step is timed through its own
    ``build`` (a copy of the toy registered here records its builds); the data-parallel
    strategies on subgraphs declare none, and are timed through the reference's (sequential's)
    one-rank plan, as before (tests/advise/test_sweep.py times subgraphs through it)."""
    import dataclasses

    from gnnpar.advise.predict import Candidate
    from gnnpar.advise.profile import Profile, flags_for, profile_graph_batches, reference
    from gnnpar.data.datasets import load_dataset

    built = []

    def build(cfg, ds, ctx, dims):
        built.append(cfg.strategy.name)
        return toy.build(cfg, ds, ctx, dims)

    registry.register(dataclasses.replace(toy, name="toy-watched", build=build))
    try:
        need = Candidate("toy-watched", {}, 1).need()
        assert (need.kind, need.plan) == ("full", "toy-watched")
        lockstep = Candidate("allreduce", {"partitions": 4, "sync_every": 1}, 2).need()
        assert (lockstep.kind, lockstep.plan, reference("parts")) == ("parts", "", "sequential")
        base = {"dataset": "karate", "model": "gcn", "threads": 1, "data-root": str(tmp_path)}
        ds = load_dataset("karate", str(tmp_path), 1.0, 0, 60)
        prof = Profile("here", 2, 1, "karate", "gcn", 1, 0, 34, 4, 1, 1)
        profile_graph_batches(flags_for(base, need.plan), ds, [], True, prof, need.plan)
        assert built == ["toy-watched"] and prof.full_step_s > 0
        assert set(prof.memory) == {"full"}
    finally:
        registry.unregister("toy-watched")


def test_a_registered_strategy_is_profiled_and_simulated_by_advise(toy, tmp_path, capsys):
    advice = _advise(tmp_path, "--strategies", "toy,sequential")
    got = {(p["strategy"], json.dumps(p["settings"])): p for p in advice["predictions"]}
    assert set(got) >= {("toy", "{}"), ("sequential", "{}")}
    toy_run, sequential = got[("toy", "{}")], got[("sequential", "{}")]
    # the same simulation of the same profiled full-graph step: the same prediction
    assert toy_run["train_time_s"] == pytest.approx(sequential["train_time_s"])
    # 3 epochs of the profiled step, as the real loop runs it (its factor, the profile's
    # loop_factor, can come out under 1 on a loaded machine: the loop ran faster than alone)
    prof = advice["profile"]
    step_s = prof["full_step_s"] * min(1.0, prof["loop_factor"])
    assert toy_run["train_time_s"] >= 3 * step_s * (1 - 1e-9) > 0
    assert toy_run["speedup"] == pytest.approx(1.0)
    assert toy_run["workers"] == 1


def test_unregistered_advise_does_not_know_the_toy(tmp_path, capsys):
    assert "toy" not in advised()
    code = main(["advise", "--dataset", "karate", "--strategies", "toy", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown toy" in err and "Traceback" not in err
