"""`gnnpar bench vig-pipeline`: study 000's tables 1 and 4-9 and figure 3 in their shape.

Study 000 trains an 8-block ViG on CIFAR-10 with 1000-image mini-batches (100 training and 20
test mini-batches) sequentially, then as a GPipe pipeline of 2 and 4 stages with 5 and 10
micro-batches, then as 2 copies of the 2-stage pipeline (data + pipeline parallelism). Here:
the same configurations on cifar10 when its files are present, else synthetic-cifar10, with much
smaller mini-batches (a 2-core machine; 1000 images per step would take minutes) and fewer steps.

Every process runs one thread (--threads 1), so "2 stages" is compared with a sequential run of
the same per-process compute: the GPipe bound S*M/(M+S-1) is what 2 busy cores can give. With 4
stages (or 2 copies x 2 stages) on 2 cores the ranks oversubscribe the machine: those rows show
what the schedule costs there, not what 4 cores would give. Speed-up = sequential median step /
this median step (the median resists other processes' noise); for the hybrid rows the
throughput speed-up also counts that each step trains R x batch-size images.

    gnnpar bench vig-pipeline [--quick] [--out DIR]
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.bench.report import line_plot, markdown_table, print_table, run_plan, write_report
from gnnpar.config import default_data_root
from gnnpar.data.datasets import REGISTRY

COLS = [
    "run",
    "stages",
    "chunks",
    "replicas",
    "train_mean_s",
    "train_std_s",
    "train_min_s",
    "train_max_s",
    "test_mean_s",
    "test_std_s",
    "test_min_s",
    "test_max_s",
    "speedup",
    "gpipe_bound",
    "of_bound",
    "throughput_speedup",
    "balance",
]


def dataset(data_root: str | None) -> str:
    root = Path(data_root) if data_root else default_data_root()
    return "synthetic-cifar10" if REGISTRY["cifar10"].missing_files(root) else "cifar10"


def runs(quick: bool, data_root: str | None) -> list[tuple[str, dict]]:
    batch, steps = (20, 3) if quick else (40, 8)
    base = {
        "dataset": dataset(data_root),
        "model": "vig",
        "epochs": 1,
        "seed": 0,
        "batch-size": batch,
        "max-steps": steps,
        "threads": 1,
    }
    out = [("sequential", {**base, "strategy": "sequential"})]
    for s in (2, 4):
        for m in (5, 10):
            out.append(
                (
                    f"pipeline-s{s}-m{m}",
                    {**base, "strategy": "pipeline", "stages": s, "chunks": m, "workers": s},
                )
            )
    for m in (5, 10):
        out.append(
            (
                f"hybrid-r2-s2-m{m}",
                {
                    **base,
                    "strategy": "hybrid",
                    "replicas": 2,
                    "stages": 2,
                    "chunks": m,
                    "workers": 4,
                },
            )
        )
    return out


def row(r: dict, seq_median: float) -> dict:
    tr, te = r["step_time_s"], r["test_step_time_s"]
    s, m, rep = r.get("stages", 1), r.get("chunks", 1), r.get("replicas", 1)
    speedup = seq_median / tr["median"]
    bound = r.get("gpipe_bound", 1.0)
    return {
        "run": r["run_name"],
        "stages": s,
        "chunks": m if r["strategy"] != "sequential" else "-",
        "replicas": rep,
        "train_mean_s": tr["mean"],
        "train_std_s": tr["std"],
        "train_min_s": tr["min"],
        "train_max_s": tr["max"],
        "test_mean_s": te["mean"],
        "test_std_s": te["std"],
        "test_min_s": te["min"],
        "test_max_s": te["max"],
        "speedup": speedup,
        "gpipe_bound": bound,
        "of_bound": speedup / bound,
        "throughput_speedup": speedup * rep,
        "balance": ",".join(map(str, r.get("balance", []))) or "-",
    }


def vig_pipeline(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    plan = runs(quick, data_root)
    results = run_plan(plan, out, data_root, quiet)
    seq = results[0]
    rows = [row(r, seq["step_time_s"]["median"]) for r in results]
    print_table("ViG: sequential vs GPipe pipeline vs data + pipeline", rows, COLS)
    curves = {"sequential": seq["loss_curve"]}
    hybrid = next((r for r in results if r["run_name"] == "hybrid-r2-s2-m5"), None)
    if hybrid is not None:
        for copy, losses in hybrid["loss_curve"].items():
            curves[f"data+pipeline, copy {copy.removeprefix('replica')}"] = losses
    line_plot(
        out / "vig_loss.png",
        curves,
        "mini-batch",
        "training loss (cross-entropy)",
        "Sequential vs data + pipeline (5 micro-batches)",
    )
    first = plan[0][1]
    note = (
        f"{first['dataset']}, ViG 8 blocks (C=107), mini-batch {first['batch-size']} images, "
        f"{first['max-steps']} training and up to {first['max-steps']} test mini-batches per "
        "run, one thread per process. Times are seconds per mini-batch (test: forward only). "
        "speedup: sequential median / this median; of_bound: speedup / gpipe_bound; "
        "throughput_speedup: speedup x replicas (each hybrid step trains replicas x batch). "
        "Rows with 4 ranks oversubscribe a 2-core machine."
    )
    write_report(
        out,
        "ViG pipeline and data + pipeline parallelism (study 000)",
        [
            ("Tables 1, 4-9 shape", markdown_table(rows, COLS) + "\n\n" + note),
            ("Figure 3 shape", "![loss curves](vig_loss.png)"),
        ],
        results,
    )
    return results
