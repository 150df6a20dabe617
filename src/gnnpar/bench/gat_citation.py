"""`gnnpar bench gat-citation`: study 001's tables 1-2 and figures 3-4 on the citation graphs.

Study 001 trains a 2-layer GAT (8 heads x 8, dropout 0.6, 300 epochs) on Cora, CiteSeer and
PubMed, then pipelines it with torchgpipe over 4 GPUs: with ``chunks`` > 1 its micro-batches are
contiguous node-index chunks whose induced subgraphs lose the edges between chunks, so training
time grows (figure 3) and accuracy falls (figure 4, table 2). Here, on CPU with gloo:

* table 1 shape: sequential per-epoch time and test accuracy per dataset;
* table 2 shape: sequential vs a 2-stage pipeline with chunks 1-4, ``--microbatch index``
  (study 001's cut) and ``--microbatch exact`` (L-hop micro-batches: full-batch gradients), with
  first-epoch time, later epochs, average epoch, final train loss and train/val/test accuracy,
  the halo overhead and the speed-up over sequential;
* figures: average epoch time vs chunks, test accuracy vs chunks.

Every run uses one thread per process (--threads 1), so the 2-stage pipeline is compared with a
sequential run of the same per-process compute; evaluation runs only after training
(--eval-every 0) so epoch times are training alone. PubMed is included when its files are
present (``gnnpar datasets``).

    gnnpar bench gat-citation [--quick] [--out DIR]
"""

from __future__ import annotations

from pathlib import Path

from gnnpar.bench.report import line_plot, markdown_table, print_table, run_plan, write_report
from gnnpar.config.parse import default_data_root
from gnnpar.data.registry import DATASETS

CHUNKS = (1, 2, 3, 4)
T1_COLS = ["dataset", "epoch_ms", "test_acc"]
T2_COLS = [
    "dataset",
    "run",
    "chunks",
    "epoch1_s",
    "epochs_rest_s",
    "epoch_ms",
    "train_loss",
    "train_acc",
    "val_acc",
    "test_acc",
    "halo",
    "speedup",
]


def datasets(data_root: str | None) -> list[str]:
    root = Path(data_root) if data_root else default_data_root()
    names = ["cora", "citeseer"]
    if not DATASETS["pubmed"].missing_files(root):
        names.append("pubmed")
    return names


def runs(dataset: str, epochs: int) -> list[tuple[str, dict]]:
    base = {"dataset": dataset, "model": "gat", "epochs": epochs, "seed": 0, "threads": 1}
    base["eval-every"] = 0
    out = [(f"{dataset}-sequential", {**base, "strategy": "sequential"})]
    for mode in ("exact", "index"):
        for m in CHUNKS:
            flags = {**base, "strategy": "pipeline", "workers": 2, "chunks": m, "microbatch": mode}
            out.append((f"{dataset}-pipeline-{mode}-c{m}", flags))
    return out


def row(r: dict, seq_epoch: float) -> dict:
    steps = r["step_time_s"]
    epoch = steps["median"]  # per-epoch time; median: robust to the shared machine's noise
    times = r.get("step_times_s") or []  # per-epoch list: pipeline runs record it
    return {
        "dataset": r["dataset"],
        "run": "sequential" if r["strategy"] == "sequential" else f"pipe2 {r['microbatch']}",
        "chunks": r.get("chunks", "-"),
        "epoch1_s": times[0] if times else "-",
        "epochs_rest_s": sum(times[1:]) if times else "-",
        "epoch_ms": epoch * 1e3,
        "train_loss": r["loss_curve"][-1],
        "train_acc": r.get("train_score") or float("nan"),
        "val_acc": r["val_score"],
        "test_acc": r["test_score"],
        "halo": r.get("halo_overhead", 1.0),
        "speedup": seq_epoch / epoch,
    }


def gat_citation(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    epochs = 60 if quick else 300
    results, t1, t2 = [], [], []
    for ds in datasets(data_root):
        plan = runs(ds, epochs)
        done = run_plan(plan, out, data_root, quiet, label=f"{ds} ")
        seq = done[0]
        seq_epoch = seq["step_time_s"]["median"]
        t1.append({"dataset": ds, "epoch_ms": seq_epoch * 1e3, "test_acc": seq["test_score"]})
        t2 += [row(r, seq_epoch) for r in done]
        results += done
        plots(out, ds, t2)
    print_table("Table 1 shape: sequential GAT, 1 thread", t1, T1_COLS)
    print_table("Table 2 shape: sequential vs 2-stage pipeline", t2, T2_COLS)
    note = (
        f"{epochs} epochs, seed 0, one thread per process, evaluation after training only. "
        "epoch_ms: median per-epoch training time; epoch1_s / epochs_rest_s: the first epoch "
        "(includes pipeline warm-up; recorded for pipeline runs) and the sum of the others; speedup: sequential epoch_ms / "
        "this epoch_ms; halo: nodes computed per training epoch / nodes in the graph (exact: "
        "the training nodes' 2-hop subgraphs, duplicated halo included; index: every node once)."
    )
    figs = "\n".join(
        f"![time vs chunks](gat_time_{d}.png) ![accuracy vs chunks](gat_accuracy_{d}.png)"
        for d in datasets(data_root)
    )
    write_report(
        out,
        "GAT on citation graphs: sequential vs GPipe micro-batches (study 001)",
        [
            ("Table 1 shape", markdown_table(t1, T1_COLS)),
            ("Table 2 shape", markdown_table(t2, T2_COLS) + "\n\n" + note),
            ("Figures 3-4 shape", figs),
        ],
        results,
    )
    return results


def plots(out: Path, ds: str, rows: list[dict]) -> None:
    mine = [r for r in rows if r["dataset"] == ds]
    seq = next(r for r in mine if r["run"] == "sequential")
    curves_t, curves_a = {}, {}
    for mode in ("exact", "index"):
        sel = [r for r in mine if r["run"] == f"pipe2 {mode}"]
        curves_t[f"2 stages, {mode}"] = [r["epoch_ms"] for r in sel]
        curves_a[f"2 stages, {mode}"] = [r["test_acc"] for r in sel]
    curves_t["sequential"] = [seq["epoch_ms"]] * len(CHUNKS)
    curves_a["sequential"] = [seq["test_acc"]] * len(CHUNKS)
    line_plot(out / f"gat_time_{ds}.png", curves_t, "chunks", "epoch time (ms)", f"GAT {ds}")
    line_plot(out / f"gat_accuracy_{ds}.png", curves_a, "chunks", "test accuracy", f"GAT {ds}")
