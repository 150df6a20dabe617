"""The vig-pipeline suite (study 000): full size vs --quick, and tables 1-3 beside tables 4-9."""

from __future__ import annotations

import importlib
import json

import torch

from gnnpar.bench.report import fmt
from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.models import build_model

# the package re-exports the suite function under the module's name, so import the module itself
vp = importlib.import_module("gnnpar.bench.vig_pipeline")


def test_full_size_is_the_studys_batch_of_1000_with_recompute_and_quick_stays_small():
    full, quick = vp.runs(False, None), vp.runs(True, None)
    assert [n for n, _ in full] == [n for n, _ in quick]
    for _, flags in full:
        assert flags["batch-size"] == 1000 and flags["max-steps"] == 100
        assert flags["recompute"] is True and flags["threads"] == 1
    for _, flags in quick:
        assert flags["batch-size"] == 20 and flags["max-steps"] == 3
        assert "recompute" not in flags


def test_block_times_counts_every_block_of_every_mini_batch():
    cfg = Config()
    cfg.data.dataset, cfg.model.name, cfg.model.hidden, cfg.model.layers = (
        "synthetic-cifar10",
        "vig",
        8,
        3,
    )
    resolve(cfg)
    model = build_model(cfg.model, 3, 10)
    x, y = torch.randn(10, 3, 8, 8), torch.randint(0, 10, (10,))
    threads = torch.get_num_threads()
    times = vp.block_times(model, (x, y), torch.randn(7, 3, 8, 8), 4, 2, 3)
    assert torch.get_num_threads() == threads  # restored
    assert times["block"]["fwd"]["count"] == 2 * 3 and times["block"]["test"]["count"] == 2 * 3
    assert times["readout"]["fwd_bwd"]["count"] == 2 and times["readout"]["test"]["count"] == 2
    for module in times.values():
        for s in module.values():
            assert 0 < s["min"] <= s["mean"] <= s["max"]
        assert module["fwd"]["mean"] < module["fwd_bwd"]["mean"]
    assert all(p.grad is None for p in model.parameters()) and model.training


def test_quick_suite_report_has_tables_1_to_3_beside_table_4_9(tmp_path, monkeypatch):
    """The suite end to end with one tiny sequential run in place of its plan (the pipeline
    runs are what tests/parallel/test_pipeline.py covers); tables 2 and 3 time the run's model."""
    tiny = {
        "dataset": "synthetic-cifar10",
        "scale": 0.002,
        "model": "vig",
        "hidden": 8,
        "layers": 2,
        "epochs": 1,
        "seed": 0,
        "batch-size": 4,
        "max-steps": 2,
        "threads": 1,
        "strategy": "sequential",
    }
    monkeypatch.setattr(vp, "runs", lambda quick, data_root: [("sequential", tiny)])
    out = tmp_path / "out"
    out.mkdir()
    vp.vig_pipeline(quick=True, out=out, data_root=str(tmp_path / "data"), quiet=True)
    report = (out / "report.md").read_text()
    order = [report.index(f"## Table {i}") for i in (1, 2, 3)]
    assert order == sorted(order) and order[-1] < report.index("## Tables 1, 4-9 shape")
    for phase in ("Training (forward)", "Training (forward + backward)", "Test (forward)"):
        assert report.count(f"| {phase} |") == 2  # tables 2 and 3
    seq = json.loads((out / "results.json").read_text())[0]
    table1 = report[order[0] : order[1]]
    assert f"| Training | {fmt(seq['step_time_s']['mean'])} |" in table1
    assert f"| Test | {fmt(seq['test_step_time_s']['mean'])} |" in table1
    times = json.loads((out / "block_times.json").read_text())
    assert times["block"]["fwd"]["count"] == 2 * 2 and times["block"]["test"]["count"] == 3 * 2
