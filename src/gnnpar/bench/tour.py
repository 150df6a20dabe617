"""The quick tour (`gnnpar bench`): the main strategies on bundled Cora, in one table.

Each entry is (name, flags): sequential (full batch and Cluster-GCN), allreduce, gossip,
pipeline and sampled; gossip-bipartite and hybrid are left to their suites (they need 4 ranks
to show anything, and this table is meant to run in a couple of minutes).
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.bench.report import bar_plot, markdown_table, print_table, run_plan, write_report

COLS = [
    "run", "strategy", "model", "workers", "device", "epochs", "score", "train_s", "epoch_ms",
    "step_ms", "speedup",
]  # fmt: skip


def tour_runs(quick: bool) -> list[tuple[str, dict]]:
    epochs = 30 if quick else 200
    # One intra-op thread per process everywhere, so a speed-up is N ranks against one worker,
    # as in study 003. Cora's subgraphs are tiny: with 2 threads a sequential Cluster-GCN step
    # took 6.8 ms against 1.5 ms with one (2-core machine), which made 2 ranks look 2.9x faster.
    base = {"dataset": "cora", "epochs": epochs, "seed": 0, "threads": 1}
    return [
        ("sequential-gcn", {**base, "model": "gcn", "strategy": "sequential"}),
        ("sequential-gat", {**base, "model": "gat", "strategy": "sequential"}),
        (
            "sequential-gcn-cluster",
            {
                **base,
                "model": "gcn",
                "strategy": "sequential",
                "partitions": 8,
                "partitioner": "metis",
            },
        ),
        (
            "allreduce-gcn-cluster-x2",
            {
                **base,
                "model": "gcn",
                "strategy": "allreduce",
                "partitions": 8,
                "workers": 2,
                "partitioner": "metis",
                "sync-every": 1,
                "average": "grads",
            },
        ),
        (
            "gossip-gcn-cluster-x2",
            {
                **base,
                "model": "gcn",
                "strategy": "gossip",
                "partitions": 8,
                "workers": 2,
                "partitioner": "metis",
                # study 003's averaging, as measured in BENCHMARKS.md's tour (the default is
                # params since gnnpar measured gradient averaging letting gossip ranks drift)
                "sync-every": 1,
                "average": "grads",
            },
        ),
        (
            "pipeline-gat-2stages-x2",
            {**base, "model": "gat", "strategy": "pipeline", "chunks": 4, "workers": 2},
        ),
        (
            "sampled-sage-x2",
            {
                **base,
                "epochs": min(epochs, 50),
                "model": "sage",
                "strategy": "sampled",
                "batch-size": 32,
                "workers": 2,
            },
        ),
    ]


def device(r: dict) -> str:
    return r["machine"].get("device", "cpu")


def tour(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    results, rows = run_plan(tour_runs(quick), out, data_root, quiet), []

    # A parallel run is compared with the sequential run of the same model in the same regime
    # (full batch, or Cluster-GCN partitions) on the same device; runs without such a baseline
    # show "n/a" (on a host with one GPU the sequential runs train on it, 2 ranks on the CPU).
    def regime(r: dict) -> tuple[str, bool, str]:
        return r["model"], r["config"]["data"]["partitions"] is None, device(r)

    baseline = {
        regime(r): r["train_time_s"] / max(r["epochs"], 1)
        for r in results
        if r["strategy"] == "sequential"
    }
    for r in results:
        per_epoch = r["train_time_s"] / max(r["epochs"], 1)
        base_s = baseline.get(regime(r)) if r["strategy"] != "sampled" else None
        rows.append(
            {
                "run": r["run_name"],
                "strategy": r["strategy"],
                "model": r["model"],
                "workers": r["workers"],
                "device": device(r),
                "epochs": r["epochs"],
                "score": f"{r['score_name']} {r['test_score']:.3f}",
                "train_s": r["train_time_s"],
                "epoch_ms": per_epoch * 1e3,
                "step_ms": r["step_time_s"]["median"] * 1e3,
                "speedup": base_s / per_epoch if base_s else "n/a",
            }
        )
    print_table("gnnpar tour on Cora", rows, COLS)
    # per epoch: the runs do not all train the same number of epochs (sampled: at most 50)
    bar_plot(
        out / "tour_train_time.png",
        [r["run"] for r in rows],
        [r["epoch_ms"] for r in rows],
        "train time per epoch (ms)",
        "Training time per epoch on Cora (runs differ in epochs)",
    )
    note = (
        "speedup: per-epoch train time of the sequential run of the same model in the same "
        "regime (full batch, or the same Cluster-GCN partitions) on the same device divided by "
        "this run's; 1.0 for the baseline itself, n/a where the tour has no such baseline "
        "(sampled; and, on a host with fewer GPUs than ranks, the multi-rank runs: they train "
        "on the CPU, the sequential ones on the GPU). The plot "
        "shows train time per epoch (epoch_ms), since the runs differ in epochs (sampled: 50). "
        "Every process runs one intra-op thread (`--threads 1`): N ranks use N cores, the "
        "baseline one."
    )
    write_report(
        out,
        "gnnpar tour (bundled Cora)",
        [
            ("Runs", markdown_table(rows, COLS) + "\n\n" + note),
            ("Plot", "![train time](tour_train_time.png)"),
        ],
        results,
    )
    return results
