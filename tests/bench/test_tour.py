"""The quick tour's table (`gnnpar bench`), from results of runs (not run here)."""

from __future__ import annotations

import importlib
import json

tour_module = importlib.import_module(
    "gnnpar.bench.tour"
)  # the package exports a function of that name


def _result(name, strategy, workers, partitions, device, train_s):
    return {
        "run_name": name,
        "strategy": strategy,
        "model": "gcn",
        "workers": workers,
        "epochs": 10,
        "score_name": "accuracy",
        "test_score": 0.8,
        "train_time_s": train_s,
        "step_time_s": {"median": 0.001},
        "config": {"data": {"partitions": partitions}},
        "machine": {"device": device},
    }


def test_speedup_only_against_a_baseline_on_the_same_device(tmp_path, monkeypatch):
    """On a host with one GPU the sequential runs train on it and 2 ranks on the CPU (NCCL
    needs a GPU per rank): the table names each run's device, and a CPU run is never divided
    by a GPU baseline."""
    results = [
        _result("seq", "sequential", 1, 8, "cuda", 1.0),
        _result("ar-cpu", "allreduce", 2, 8, "cpu", 4.0),
        _result("seq-cpu", "sequential", 1, 8, "cpu", 6.0),
        _result("ar-cpu2", "allreduce", 2, 8, "cpu", 3.0),
    ]
    monkeypatch.setattr(tour_module, "run_plan", lambda *a: results)
    tour_module.tour(True, tmp_path, None, True)
    report = (tmp_path / "report.md").read_text()
    rows = {
        cells[1]: cells
        for line in report.splitlines()
        if line.startswith("| ") and len(cells := [c.strip() for c in line.split("|")]) > 10
    }
    cols = ["", *tour_module.COLS]
    at = {c: i for i, c in enumerate(cols)}
    assert rows["seq"][at["device"]] == "cuda" and rows["ar-cpu"][at["device"]] == "cpu"
    assert float(rows["ar-cpu"][at["speedup"]]) == 1.5  # 6.0 / 4.0: the CPU baseline
    assert float(rows["ar-cpu2"][at["speedup"]]) == 2.0
    assert float(rows["seq"][at["speedup"]]) == 1.0
    json.dumps(results)  # the report's raw results stay plain JSON
