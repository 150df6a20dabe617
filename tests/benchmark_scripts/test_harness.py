"""benchmarks/harness.py: the timing order, the ratios and the result writer every script uses."""

from __future__ import annotations

import json
import os

import pytest
from benchmarks import harness


def test_alternate_reverses_the_sides_every_other_repetition():
    calls: list[str] = []
    sides = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    ticks = iter(range(1000))
    times = harness.alternate(sides, reps=3, warmup=1, clock=lambda: float(next(ticks)))
    assert calls == list("abc") + list("abc") + list("cba") + list("abc")  # warm-up, then 3 reps
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t == 1.0 for v in times.values() for t in v)  # one tick per timed call


def test_alternate_runs_after_untimed_after_every_call():
    seen: list[str] = []
    ticks = iter(range(1000))
    harness.alternate(
        {"x": lambda: seen.append("x")}, reps=2, warmup=1,
        clock=lambda: float(next(ticks)), after=lambda: seen.append("reset"),
    )  # fmt: skip
    assert seen == ["x", "reset"] * 3


def test_rotation_puts_each_side_first_in_turn():
    assert [harness.rotation(["p", "q", "r"], rep) for rep in range(4)] == [
        ["p", "q", "r"], ["q", "r", "p"], ["r", "p", "q"], ["p", "q", "r"],
    ]  # fmt: skip
    assert harness.rotation([], 3) == []


def test_median_ratio_is_the_median_of_per_repetition_ratios():
    # per repetition 1/4, 2/2, 3/1 -> median 1.0
    assert harness.median_ratio([1, 2, 3], [4, 2, 1]) == 1.0
    # per repetition 2, 2, 0.25 -> 2.0, where the ratio of the medians (2 / 2) would be 1.0
    assert harness.median_ratio([2, 4, 2], [1, 2, 8]) == 2.0
    with pytest.raises(ValueError):
        harness.median_ratio([1, 2], [1])


def test_write_json_is_whole_or_old(tmp_path):
    path = tmp_path / "deeper" / "r.json"
    harness.write_json(path, {"a": 1, "p": tmp_path, "t": (1, 2)})
    assert json.loads(path.read_text()) == {"a": 1, "p": str(tmp_path), "t": [1, 2]}
    with pytest.raises(TypeError):  # not serialisable: the old file stays, no temporary left
        harness.write_json(path, {"bad": object()})
    assert json.loads(path.read_text())["a"] == 1
    assert os.listdir(path.parent) == ["r.json"]


def test_no_namespaces_passes_a_smoke_run_and_stops_a_measurement(monkeypatch, capsys):
    monkeypatch.delenv("GNNPAR_REQUIRE_NETNS", raising=False)
    assert harness.no_namespaces("not root", smoke=True) == 0
    assert harness.no_namespaces("not root", smoke=False) == 2
    monkeypatch.setenv("GNNPAR_REQUIRE_NETNS", "1")
    assert harness.no_namespaces("not root", smoke=True) == 2
    assert "not root" in capsys.readouterr().err


def test_scripts_lists_every_topic_script_and_no_side_file():
    names = harness.scripts()
    assert "benchmarks.kernels.dropout_masks" in names
    assert not any(n.rsplit(".", 1)[1].startswith("_") for n in names)
    assert {n.split(".")[1] for n in names} <= set(harness.TOPICS) | {"pending"}
