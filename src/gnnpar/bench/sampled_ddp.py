"""`gnnpar bench sampled-ddp`: study 002's table 2 and figure 1 on synthetic-reddit.

Neighbour-sampled DDP (``--strategy sampled``) for GraphSAGE and GAT (table 1) over ranks 1, 2, 4,
per-rank batch sizes 512, 1024, 2048 and 0, 1, 2 loader workers per rank. As in the study, the
figure of merit is the longest training time of any rank (``max_rank_train_time_s``), here per
epoch. Table 2 runs every rank count with 2 loader workers (the study could not: 4 GPUs x 2
workers deadlocked); a second table varies the loader workers at batch 1024 and shows where a
step's time goes (data wait, compute, exposed gradient sync). By default a rank gets
cores / ranks threads, so on a small machine more ranks split the same cores; the ``-t1`` runs
give every rank one thread instead (more ranks, more cores: the study's one GPU per rank).

    gnnpar bench sampled-ddp --quick     # scale 0.02, batch 1024, ranks 1-2, 7 runs: minutes
    gnnpar bench sampled-ddp             # scale 0.02, 2 epochs, the whole grid (36 runs)

Targets checked in the report: with 2 loader workers, data wait <= 20% of step time; 2 ranks
train an epoch faster than 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gnnpar.bench.report import markdown_table, print_table, run_plan, write_report

MODELS = ("sage", "gat3")
RUN_COLS = [
    "run",
    "model",
    "ranks",
    "batch",
    "loader_workers",
    "threads",
    "epoch_s",
    "data_wait_%",
    "steady_wait_%",
    "compute_s",
    "sync_s",
    "steps_per_rank",
    "test_acc",
]


def grid(quick: bool) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(common flags, [(run name, flags)]): table 2's grid, or its quick corner."""
    base = {"dataset": "synthetic-reddit", "strategy": "sampled", "seed": 0}
    if quick:
        base.update(scale=0.02, epochs=1)
        cells = [(m, r, 1024, 2, None) for m in MODELS for r in (1, 2)]
        cells += [("sage", r, 1024, 0, None) for r in (1, 2)]
        cells += [("sage", 1, 1024, 2, 1)]  # 2 ranks on 2 cores already get 1 thread each
    else:
        base.update(scale=0.02, epochs=2)
        cells = [(m, r, b, 2, None) for m in MODELS for r in (1, 2, 4) for b in (512, 1024, 2048)]
        cells += [(m, r, 1024, w, None) for m in MODELS for r in (1, 2, 4) for w in (0, 1)]
        cells += [(m, r, 2048, 2, 1) for m in MODELS for r in (1, 2, 4)]
    runs = []
    for model, ranks, batch, workers, threads in cells:
        name = f"{model}-r{ranks}-b{batch}-w{workers}" + (f"-t{threads}" if threads else "")
        flags = {
            **base,
            "model": model,
            "workers": ranks,
            "batch-size": batch,
            "loader-workers": workers,
        }
        if threads:  # a fixed share per rank: more ranks, more cores (one GPU per rank)
            flags["threads"] = threads
        runs.append((name, flags))
    return base, runs


def row(r: dict[str, Any]) -> dict[str, Any]:
    s = r["config"]["strategy"]
    bd = r["time_breakdown_s"]
    ranks = len(bd)
    wait = sum(b["data_wait"] for b in bd)
    total = sum(sum(b.values()) for b in bd)
    first = sum(r["first_batch_wait_s"])
    return {
        "run": r["run_name"],
        "model": r["model"],
        "ranks": ranks,
        "batch": s["batch_size"],
        "loader_workers": s["loader_workers"],
        "threads": r["config"]["run"]["threads"] or "auto",
        "epoch_s": r["max_rank_train_time_s"] / r["epochs"],
        "data_wait_%": 100 * r["data_wait_share"],
        # without each rank's first batch, which no prefetching can hide (pipeline fill)
        "steady_wait_%": 100 * (wait - first) / (total - first) if total > first else 0.0,
        "compute_s": sum(b["compute"] for b in bd) / ranks,  # mean over ranks
        "sync_s": sum(b["sync"] for b in bd) / ranks,
        "steps_per_rank": r["per_worker_batches"][0],
        "test_acc": r["test_score"],
    }


def table2(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Table 2's shape: (model, ranks, workers) x batch size -> epoch time of the slowest rank."""
    batches = sorted({r["batch"] for r in rows})
    cols = ["model", "ranks", "loader_workers"] + [f"batch {b} (s)" for b in batches]
    out = {}
    for r in rows:
        key = (r["model"], r["ranks"], r["loader_workers"])
        out.setdefault(key, dict(zip(cols[:3], key)))[f"batch {r['batch']} (s)"] = r["epoch_s"]
    return [out[k] for k in sorted(out)], cols


def targets(rows: list[dict[str, Any]]) -> str:
    lines = []
    w2 = [r for r in rows if r["loader_workers"] == 2]
    for key, what in (("data_wait_%", "all steps"), ("steady_wait_%", "after the first batch")):
        if not w2:
            break
        worst = max(w2, key=lambda r: r[key])
        met = sum(r[key] <= 20 for r in w2)
        lines.append(
            f"- Data wait with 2 loader workers <= 20% of step time ({what}): {met} of {len(w2)} "
            f"runs (worst {worst[key]:.1f}% in {worst['run']}; median "
            f"{sorted(r[key] for r in w2)[len(w2) // 2]:.1f}%)."
        )

    def key(r: dict[str, Any]) -> tuple:
        return r["model"], r["batch"], r["loader_workers"], r["threads"]

    one = {key(r): r for r in rows if r["ranks"] == 1}
    speedups = []
    for r in rows:
        base = one.get(key(r))
        if r["ranks"] == 2 and base:
            speedups.append((base["epoch_s"] / r["epoch_s"], r["run"]))
    if speedups:
        wins = sum(s > 1 for s, _ in speedups)
        detail = ", ".join(f"{name} x{s:.2f}" for s, name in speedups)
        lines.append(
            f"- 2 ranks faster per epoch than 1 rank: {wins} of {len(speedups)} settings "
            f"(speed-up = 1-rank epoch time / 2-rank epoch time: {detail})."
        )
    return "\n".join(lines)


def ranks_plot(path: Path, rows: list[dict[str, Any]], batch: int) -> Path:
    """Figure 1: epoch time of the slowest rank against the number of ranks, per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for model in MODELS:
        for threads, style in (("auto", "-"), (1, "--")):
            pts = sorted(
                (r["ranks"], r["epoch_s"])
                for r in rows
                if r["model"] == model
                and r["batch"] == batch
                and r["loader_workers"] == 2
                and r["threads"] == threads
            )
            label = model if threads == "auto" else f"{model}, 1 thread per rank"
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=label)
    ax.set_xlabel("ranks")
    ax.set_ylabel("epoch time of the slowest rank (s)")
    ax.set_title(f"Sampled DDP, batch {batch} per rank, 2 loader workers")
    ax.set_xticks(sorted({r["ranks"] for r in rows}))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sampled_ddp(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    _, runs = grid(quick)
    results = run_plan(runs, out, data_root, quiet)
    render(results, out, quick)
    return results


def render(results: list[dict[str, Any]], out: Path, quick: bool) -> Path:
    """report.md, results.json and the figure from finished runs (re-renderable from
    results.json: ``render(json.load(open("results.json")), out, quick)``)."""
    rows = [row(r) for r in results]
    print_table("sampled DDP on synthetic-reddit", rows, RUN_COLS)
    auto = [r for r in rows if r["threads"] == "auto"]
    t2, t2_cols = table2([r for r in auto if r["loader_workers"] == 2])
    sweep = [r for r in auto if r["batch"] == 1024]
    fixed = [r for r in rows if r["threads"] != "auto"]
    fig_batch = 1024 if quick else 2048
    ranks_plot(out / "sampled_ddp_ranks.png", rows, fig_batch)
    r0 = results[0]
    setting = (
        f"synthetic-reddit at scale {r0['config']['data']['scale']}, {r0['epochs']} epoch(s) per "
        f"run, fan-outs {r0['config']['strategy']['fanouts']}, machine: "
        f"{r0['machine']['cpu_count']} CPU cores (shared with other jobs), accelerator "
        f"{r0['machine']['accelerator']}. epoch_s = max_rank_train_time_s / epochs; data_wait_% = "
        "data wait / (data wait + compute + sync), summed over ranks; steady_wait_% leaves out "
        "each rank's first batch; compute_s and sync_s are means over ranks (sync: all-reduce "
        "time not hidden by backward, including waiting for the slower rank); steps_per_rank counts "
        "the whole run."
    )
    return write_report(
        out,
        "Neighbour-sampled DDP (study 002)",
        [
            ("Setting", setting),
            ("Targets", targets(rows)),
            (
                "Table 2: epoch time of the slowest rank, 2 loader workers",
                markdown_table(t2, t2_cols),
            ),
            ("Loader workers at batch 1024", markdown_table(sweep, RUN_COLS)),
            (
                "One thread per rank (adding ranks adds cores, as adding GPUs did in the study)",
                markdown_table(fixed, RUN_COLS),
            ),
            (
                f"Figure 1: runtime against ranks (batch {fig_batch})",
                "![ranks](sampled_ddp_ranks.png)",
            ),
            ("All runs", markdown_table(rows, RUN_COLS)),
        ],
        results,
    )
