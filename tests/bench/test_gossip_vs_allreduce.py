"""The gossip-vs-allreduce suite: its grid, its tables, and one tiny real run of the whole suite."""

from __future__ import annotations

import importlib
import json

import pytest

# the package re-exports the suite function under the module's name, so import the module itself
gva = importlib.import_module("gnnpar.bench.gossip_vs_allreduce")


def _row(strategy, mode, k, straggler, train_s, test, seq=10.0):
    return {
        "strategy": strategy,
        "average": mode,
        "K": k,
        "straggler": straggler,
        "train_s": train_s,
        "speedup": seq / train_s,
        "test": test,
    }


def test_grid_runs_every_algorithm_mode_and_interval_with_and_without_straggler():
    data, intervals, reps = gva.grid(quick=False)
    assert intervals == [1, 20, 100] and reps == 2
    for d in data:
        runs = dict(gva.runs_for(d, intervals))
        assert len(runs) == len(set(runs))
        assert (
            runs["sequential"]["strategy"] == "sequential" and "workers" not in runs["sequential"]
        )
        for tag, slow in (("", None), ("-slow", "1=3")):
            for strategy in ("allreduce", "gossip"):
                for mode in ("grads", "params"):
                    for k in intervals:
                        f = runs[f"{strategy}-{mode}-k{k}{tag}"]
                        assert (f["strategy"], f["average"], f["sync-every"]) == (strategy, mode, k)
                        assert f["workers"] == 2 and f.get("slowdown") == slow
                        assert f["dataset"] == d["dataset"] and f["threads"] == 1
            assert runs[f"gossip-bipartite-grads-k20{tag}"]["strategy"] == "gossip-bipartite"
        # 1 baseline + 2 straggler settings x (2 algorithms x 2 modes x 3 K + bipartite)
        assert len(runs) == 1 + 2 * (2 * 2 * 3 + 1)


def test_target_table_compares_gossip_with_allreduce_at_the_same_k_and_mode():
    rows = [
        _row("allreduce", "grads", 1, "rank1 x3", 20.0, 0.85),
        _row("gossip", "grads", 1, "rank1 x3", 10.0, 0.80),  # fast enough, 5 points worse
        _row("allreduce", "params", 1, "rank1 x3", 20.0, 0.85),
        _row("gossip", "params", 1, "rank1 x3", 11.0, 0.86),  # both halves met
        _row("allreduce", "params", 20, "rank1 x3", 10.0, 0.70),
        _row("gossip", "params", 20, "rank1 x3", 7.0, 0.75),  # too slow: 0.7x
        _row("allreduce", "grads", 1, "-", 10.0, 0.85),
        _row("gossip", "grads", 1, "-", 9.0, 0.85),
    ]
    table = {(t["straggler"], t["average"], t["K"]): t for t in gva.target_table(rows, [1, 20])}
    assert set(table) == {
        ("rank1 x3", "grads", 1),
        ("rank1 x3", "params", 1),
        ("rank1 x3", "params", 20),
        ("-", "grads", 1),
    }
    g1 = table[("rank1 x3", "grads", 1)]
    assert g1["gossip/allreduce time"] == pytest.approx(0.5)
    assert g1["test delta (points)"] == pytest.approx(-5.0) and g1["target met"] is False
    p1 = table[("rank1 x3", "params", 1)]
    assert p1["target met"] is True and p1["test delta vs DDP (points)"] == pytest.approx(1.0)
    p20 = table[("rank1 x3", "params", 20)]
    assert p20["gossip/allreduce time"] == pytest.approx(0.7) and p20["target met"] is False
    assert p20["test delta vs DDP (points)"] == pytest.approx(-10.0)
    assert table[("-", "grads", 1)]["target met"] == ""  # the target is about the straggler


def test_speedup_table_has_one_row_per_algorithm_mode_and_interval():
    rows = [
        _row("allreduce", "grads", 1, "-", 5.0, 0.8),
        _row("allreduce", "grads", 1, "rank1 x3", 20.0, 0.8),
        _row("gossip", "params", 1, "rank1 x3", 8.0, 0.8),
    ]
    table = gva.speedup_table(rows, [1])
    assert [(t["algorithm"], t["average"]) for t in table] == [
        ("allreduce", "grads"),
        ("gossip", "params"),
    ]
    assert table[0]["speed-up (2 ranks)"] == pytest.approx(2.0)
    assert table[0]["speed-up (rank 1 slowed 3x)"] == pytest.approx(0.5)
    assert table[1]["speed-up (2 ranks)"] == "" and table[1]["speed-up (rank 1 slowed 3x)"] == 1.25


def test_repetitions_combine_to_median_time_and_mean_score():
    reps = [
        {"train_time_s": t, "test_score": s, "per_worker_batches": [b, 1]}
        for t, s, b in ((3.0, 0.5, 7), (1.0, 0.7, 8), (2.0, 0.9, 9))
    ]
    r = gva._combine(reps)
    assert r["train_time_s"] == 2.0 and r["test_score"] == pytest.approx(0.7)
    assert r["train_times"] == [3.0, 1.0, 2.0] and r["per_worker_batches"] == [9, 1]


@pytest.mark.slow
def test_the_whole_suite_runs_on_a_tiny_grid(monkeypatch, tmp_path):
    """Every run of the grid really trains (2 real ranks each), and the report holds it all."""
    tiny = [dict(dataset="cora", partitions=4, epochs=1)]
    monkeypatch.setattr(gva, "grid", lambda quick: (tiny, [1], 1))
    results = gva.gossip_vs_allreduce(False, tmp_path, str(tmp_path / "data"), quiet=True)
    names = [r["bench"]["name"] for r in results]
    assert names == [n for n, _ in gva.runs_for(tiny[0], [1])] and len(names) == 11
    for r in results:
        assert 0 <= r["test_score"] <= 1 and sum(r["per_worker_batches"]) == 4  # 4 parts, 1 epoch
        seq_time = results[0]["train_time_s"]
        assert r["speedup_vs_sequential"] == pytest.approx(seq_time / r["train_time_s"])
        if r["strategy"] != "sequential":
            assert r["config"]["strategy"]["average"] in ("grads", "params")
    report = (tmp_path / "report.md").read_text()
    assert "gossip against allreduce at equal K and averaging mode" in report
    assert "| rank1 x3 | params | 1 |" in report and (tmp_path / "speedup_cora.png").stat().st_size
    assert len(json.loads((tmp_path / "results.json").read_text())) == 11
