"""`gnnpar bench gossip-vs-allreduce`: study 003's comparison of AllReduce-GCN and GossipGCN.

The grid of study 003 section 4.4 on 2 ranks (one core each, as the study gives each worker one
GPU): the sequential Cluster-GCN baseline (1 rank), ``allreduce`` and ``gossip`` at averaging
intervals K = 1, 20, 100, and ``gossip-bipartite`` (algorithm 5) at K = 20, each once on equal
ranks and once with rank 1 slowed 3x (``--slowdown 1=3``, the study's non-dedicated GPUs).
``allreduce`` and ``gossip`` run with both averaging modes: ``--average grads`` (the study's) and
``--average params`` (model averaging: local SGD for allreduce, gossip of models). The second is
there because gradient averaging never pulls two models that have drifted apart back together:
with a straggler, or any K > 1, the ranks' models diverge and each is updated with gradients
taken at the other's parameters; averaging the models keeps them close (BENCHMARKS.md has the
numbers). Datasets: synthetic-reddit and synthetic-amazon, scaled to this machine (``--quick``:
synthetic-reddit only, smaller, K = 1 and 20, one repetition).

Output (in ``--out``): report.md with tables in the shape of study tables 4.6/4.7 (speed-up over
the sequential baseline, per interval) and 4.8/4.9 (time, score and mini-batches per rank), the
gossip / allreduce time ratio and test-score difference at equal K and mode (target: <= 0.6 with
the straggler, test score within one point), speedup_<dataset>.png (figures 4.6-4.8) and
results.json. Times are the median over repetitions, test scores their mean.

    gnnpar bench gossip-vs-allreduce --quick
    gnnpar bench gossip-vs-allreduce --out runs/gossip-vs-allreduce
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gnnpar.bench.report import fmt, markdown_table, print_table, run_config, write_report

STRAGGLER = "1=3"
MODES = ("grads", "params")  # --average: the study's gradient averaging, and model averaging
ALGORITHMS = [(s, m) for s in ("allreduce", "gossip") for m in MODES] + [
    ("gossip-bipartite", "grads")
]


def grid(quick: bool) -> tuple[list[dict[str, Any]], list[int], int]:
    """(datasets with their settings, intervals, repetitions)."""
    if quick:
        data = [dict(dataset="synthetic-reddit", scale=0.02, partitions=40, epochs=4)]
        return data, [1, 20], 1
    data = [
        dict(dataset="synthetic-reddit", scale=0.05, partitions=40, epochs=10),
        # ~800 nodes per subgraph. Much smaller subgraphs (e.g. scale 0.005 in 32 parts, 250
        # nodes) keep under one edge per node: the models fit near-edgeless subgraphs and score
        # badly on the full graph (sequential micro-F1 0.47 after 60 epochs, against 0.86 here).
        dict(dataset="synthetic-amazon", scale=0.01, partitions=20, epochs=20),
    ]
    return data, [1, 20, 100], 2


def runs_for(data: dict[str, Any], intervals: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """The sequential baseline, then every algorithm and averaging mode at every K, equal ranks
    first and then with the straggler. gossip-bipartite runs at K = 20 only (table 4.1's middle)."""
    base = {**data, "model": "sage", "seed": 0, "eval-every": 0, "threads": 1}
    runs = [("sequential", {**base, "strategy": "sequential"})]
    for slow in (None, STRAGGLER):
        par = {**base, "workers": 2, **({"slowdown": slow} if slow else {})}
        tag = "-slow" if slow else ""
        for strategy, mode in ALGORITHMS:
            for k in intervals if strategy != "gossip-bipartite" else [20]:
                flags = {**par, "strategy": strategy, "average": mode, "sync-every": k}
                runs.append((f"{strategy}-{mode}-k{k}{tag}", flags))
    return runs


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the repetitions: median train time, mean test score, and the per-rank counts
    of the repetition whose time is the lower median."""
    ordered = sorted(results, key=lambda r: r["train_time_s"])
    pick = dict(ordered[(len(ordered) - 1) // 2])
    pick["train_times"] = [r["train_time_s"] for r in results]
    pick["test_scores"] = [r["test_score"] for r in results]
    pick["train_time_s"] = statistics.median(pick["train_times"])
    pick["test_score"] = statistics.fmean(pick["test_scores"])
    return pick


def _row(name: str, r: dict[str, Any], seq_time: float) -> dict[str, Any]:
    cfg = r["config"]["strategy"]
    seq = r["strategy"] == "sequential"
    return {
        "run": name,
        "strategy": r["strategy"],
        "average": "-" if seq else cfg["average"],
        "K": "-" if seq else cfg["sync_every"],
        "straggler": "rank1 x3" if cfg["slowdown"] else "-",
        "train_s": r["train_time_s"],
        "reps_s": " ".join(fmt(t) for t in r.get("train_times", [r["train_time_s"]])),
        "speedup": seq_time / r["train_time_s"],
        "test": r["test_score"],
        "reps_test": " ".join(fmt(t) for t in r.get("test_scores", [r["test_score"]])),
        "final": r.get("final_model", "-"),
        "batches/rank": " ".join(str(b) for b in r["per_worker_batches"]),
        "exchanges/rank": " ".join(str(e) for e in r.get("per_worker_exchanges", [])) or "-",
        "wait_s/rank": " ".join(fmt(w) for w in r.get("per_worker_wait_s", [])) or "-",
    }


def _index(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {(r["strategy"], r["average"], r["K"], r["straggler"]): r for r in rows}


def speedup_table(rows: list[dict[str, Any]], intervals: list[int]) -> list[dict[str, Any]]:
    """Study tables 4.6/4.7: speed-up over the sequential baseline, one row per (algorithm, K)."""
    by = _index(rows)
    out = []
    for strategy, mode in ALGORITHMS:
        for k in intervals:
            cells = [by.get((strategy, mode, k, s)) for s in ("-", "rank1 x3")]
            if not any(cells):
                continue
            out.append(
                {
                    "algorithm": strategy,
                    "average": mode,
                    "K": k,
                    "speed-up (2 ranks)": cells[0]["speedup"] if cells[0] else "",
                    "speed-up (rank 1 slowed 3x)": cells[1]["speedup"] if cells[1] else "",
                }
            )
    return out


def target_table(rows: list[dict[str, Any]], intervals: list[int]) -> list[dict[str, Any]]:
    """Gossip against allreduce at the same K and averaging mode: time ratio and test-score
    difference (points); also the difference to plain synchronous training (allreduce, grads,
    K = 1: DDP) under the same straggler."""
    by = _index(rows)
    out = []
    for s in ("-", "rank1 x3"):
        ddp = by.get(("allreduce", "grads", 1, s))
        for mode in MODES:
            for k in intervals:
                a, g = by.get(("allreduce", mode, k, s)), by.get(("gossip", mode, k, s))
                if not (a and g):
                    continue
                ratio = g["train_s"] / a["train_s"]
                delta = 100 * (g["test"] - a["test"])
                out.append(
                    {
                        "straggler": s,
                        "average": mode,
                        "K": k,
                        "gossip/allreduce time": ratio,
                        "test delta (points)": delta,
                        "test delta vs DDP (points)": 100 * (g["test"] - ddp["test"])
                        if ddp
                        else "",
                        "target met": (ratio <= 0.6 and delta >= -1) if s != "-" else "",
                    }
                )
    return out


def speedup_plot(path: Path, rows: list[dict[str, Any]], intervals: list[int], title: str) -> None:
    """Figures 4.6-4.8: speed-up per averaging interval, allreduce against gossip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["strategy"], r["average"], r["K"], r["straggler"]): r["speedup"] for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    width = 0.8 / len(ALGORITHMS)
    for ax, (s, label) in zip(axes, (("-", "2 equal ranks"), ("rank1 x3", "rank 1 slowed 3x"))):
        for j, (strategy, mode) in enumerate(ALGORITHMS):
            offset = (j - (len(ALGORITHMS) - 1) / 2) * width
            keys = [(i, (strategy, mode, k, s)) for i, k in enumerate(intervals)]
            xs = [i + offset for i, key in keys if key in by]
            ys = [by[key] for _, key in keys if key in by]
            ax.bar(xs, ys, width, label=f"{strategy} ({mode})")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(intervals)), [f"K={k}" for k in intervals])
        ax.set_title(label)
    axes[0].set_ylabel("speed-up over sequential")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps the legend outside the axes
    plt.close(fig)


DETAIL_COLS = [
    "run",
    "average",
    "K",
    "straggler",
    "train_s",
    "reps_s",
    "speedup",
    "test",
    "reps_test",
    "final",
    "batches/rank",
    "exchanges/rank",
    "wait_s/rank",
]


def gossip_vs_allreduce(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    datasets, intervals, reps = grid(quick)
    results: list[dict[str, Any]] = []
    sections: list[tuple[str, str]] = []
    for data in datasets:
        runs = runs_for(data, intervals)
        rows = []
        seq_time = None
        for i, (name, flags) in enumerate(runs, 1):
            if data_root:
                flags = {**flags, "data-root": data_root}
            n = 1 if name == "sequential" else reps
            tries = []
            for rep in range(n):
                if not quiet:
                    print(
                        f"[{data['dataset']} {i}/{len(runs)}] {name} rep {rep + 1}/{n}", flush=True
                    )
                r = run_config({**flags, "seed": rep}, out, f"{data['dataset']}-{name}-r{rep}")
                r["bench"] = {"name": name, "rep": rep, **data}
                tries.append(r)
            results += tries
            best = _combine(tries)
            seq_time = seq_time or best["train_time_s"]
            for r in tries:  # the per-run speed-up, also in results.json
                r["speedup_vs_sequential"] = seq_time / r["train_time_s"]
            rows.append(_row(name, best, seq_time))
        ds = data["dataset"]
        title = (
            f"{ds} (scale {data.get('scale', 1)}, {data['partitions']} parts, {data['epochs']} ep)"
        )
        speed, target = speedup_table(rows, intervals), target_table(rows, intervals)
        for t, rs in (
            ("speed-up (tables 4.6/4.7)", speed),
            ("gossip vs allreduce", target),
            ("runs (tables 4.8/4.9)", rows),
        ):
            print_table(
                f"{ds}: {t}", rs, list(rs[0]) if t != "runs (tables 4.8/4.9)" else DETAIL_COLS
            )
        png = f"speedup_{ds}.png"
        speedup_plot(out / png, rows, intervals, f"Speed-up on {title}")
        score = results[-1]["score_name"]
        sections += [
            (
                f"{title}: speed-up over sequential (tables 4.6/4.7)",
                markdown_table(speed, list(speed[0])),
            ),
            (
                f"{title}: gossip against allreduce at equal K and averaging mode",
                markdown_table(target, list(target[0]))
                + "\n\nTarget (issue 3): with rank 1 slowed 3x, gossip time <= 0.6x allreduce's and "
                f"test {score} within 1 point. DDP: allreduce, grads, K = 1.",
            ),
            (
                f"{title}: every run (tables 4.8/4.9)",
                markdown_table(rows, DETAIL_COLS)
                + f"\n\ntrain_s: median of {reps} repetition(s) (seeds 0..{reps - 1}; all in reps_s);"
                f" test: mean test {score} of the final models (each in reps_test); speed-up:"
                " sequential train time / this run's. Partitioning is outside train time; counts"
                " per rank are from the repetition with the lower median time.",
            ),
            (f"{title}: plot", f"![speed-up]({png})"),
        ]
    write_report(out, "GossipGCN against AllReduce-GCN (study 003, 2 ranks)", sections, results)
    return results
