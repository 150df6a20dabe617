"""`gnnpar bench vig-pipeline`: study 000's tables 1-9 and figure 3 in their shape.

Study 000 trains an 8-block ViG on CIFAR-10 with 1000-image mini-batches (100 training and 20
test mini-batches) sequentially, then as a GPipe pipeline of 2 and 4 stages with 5 and 10
micro-batches, then as 2 copies of the 2-stage pipeline (data + pipeline parallelism). Here:
the same configurations on cifar10 when its files are present, else synthetic-cifar10.

* Full size (the default): the study's 1000-image mini-batches, 100 training mini-batches and
  up to 100 evaluation mini-batches per split, 20 test mini-batches for tables 2 and 3. Every
  run uses ``--recompute`` (each ViG block keeps only its input for the backward pass): without
  it one process would hold ~54 MB of activations per image, 53 GB at 1000 images (study 000's
  machines had 125 GiB); with it a 1000-image step peaks at 5.8 GiB (benchmarks/memory/vig_step_memory.py). With 1 thread per process a 1000-image
  step takes minutes, so a full-size suite takes days on a 2-core machine.
* ``--quick``: 20-image mini-batches, 3 steps; a look at the shapes in minutes.

Every process runs one thread (--threads 1), so "2 stages" is compared with a sequential run of
the same per-process compute: the GPipe bound S*M/(M+S-1) is what 2 busy cores can give. With 4
stages (or 2 copies x 2 stages) on 2 cores the ranks oversubscribe the machine: those rows show
what the schedule costs there, not what 4 cores would give. Speed-up = sequential median step /
this median step (the median resists other processes' noise); for the hybrid rows the
throughput speed-up also counts that each step trains R x batch-size images.

Tables 2 and 3 (one ViG block, the readout) come from a separate timing pass in this process
(:func:`block_times`, one thread, the sequential model's size, fresh weights): each module is
timed on its own, forward in training mode (autograd recording) and then its backward, and
forward only in evaluation mode (``no_grad``) on test images. The study does not say what its
"training" block time covers; its figures say forward only (8 x 1.95 s per block = 15.6 s of a
37.4 s training step, while 8 x 1.68 s = 13.4 s matches its 13.6 s test step), so its rows
are "training (forward)" here, and forward + backward is shown beside them.

    gnnpar bench vig-pipeline [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gnnpar.bench.report import line_plot, markdown_table, print_table, run_plan, write_report
from gnnpar.config.parse import default_data_root
from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.data.datasets import load_dataset
from gnnpar.data.registry import DATASETS
from gnnpar.models import build_model
from gnnpar.models.base import BlockModel
from gnnpar.training.metrics import summarize
from gnnpar.training.sources import image_batches

# study 000's size; a wait on another rank's 1000-image step can take minutes at 1 thread
FULL = {"batch-size": 1000, "max-steps": 100, "recompute": True, "timeout": 1800}
QUICK = {"batch-size": 20, "max-steps": 3}
FULL_TEST_BATCHES, QUICK_TEST_BATCHES = 20, 3  # tables 2 and 3: the study's 20 test batches
PHASE_COLS = ["phase", "mean_s", "std_s", "min_s", "max_s", "count"]

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
    return "synthetic-cifar10" if DATASETS["cifar10"].missing_files(root) else "cifar10"


def runs(quick: bool, data_root: str | None) -> list[tuple[str, dict]]:
    base = {
        "dataset": dataset(data_root),
        "model": "vig",
        "epochs": 1,
        "seed": 0,
        **(QUICK if quick else FULL),
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


def block_times(
    model: BlockModel,
    train: tuple[torch.Tensor, torch.Tensor],
    test_x: torch.Tensor,
    batch: int,
    train_batches: int,
    test_batches: int,
    seed: int = 0,
) -> dict[str, dict[str, dict[str, float]]]:
    """Study 000 tables 2 and 3: seconds per mini-batch of one ViG block and of the readout.

    Each module runs on its own, on the previous module's (detached) output, so that its
    forward and its backward can be timed apart: training = ``train_batches`` mini-batches of
    ``batch`` shuffled training images, forward with autograd recording, then the backward of
    that module alone (blocks: from a gradient of ones; readout: from the NLL loss, which is
    timed with it); test = ``test_batches`` mini-batches of test images, forward only under
    ``no_grad`` in eval mode. Block statistics pool every block of every mini-batch (the blocks
    are identical in shape). One thread, as the suite's runs. Memory: one block's activations
    at a time (with ``--recompute`` in the model, its input only until its backward).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    samples: dict[str, list[float]] = {
        f"{m}_{p}": [] for m in ("block", "readout") for p in ("fwd", "fwd_bwd", "test")
    }
    try:
        model.train()
        pairs = image_batches(*train, batch, seed)
        for _, (x, y) in zip(range(train_batches), pairs):
            with torch.no_grad():
                h = model.stem(x)
            grad = torch.ones_like(h)
            for block in model.blocks:
                inp = h.requires_grad_(True)
                t0 = time.perf_counter()
                out = block(inp)
                t1 = time.perf_counter()
                out.backward(grad)
                t2 = time.perf_counter()
                samples["block_fwd"].append(t1 - t0)
                samples["block_fwd_bwd"].append(t2 - t0)
                h = out.detach()
            inp = h.requires_grad_(True)
            t0 = time.perf_counter()
            loss = F.nll_loss(model.head(inp), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            samples["readout_fwd"].append(t1 - t0)
            samples["readout_fwd_bwd"].append(t2 - t0)
            model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            for _, x in zip(range(test_batches), test_x.split(batch)):
                h = model.stem(x)
                for block in model.blocks:
                    t0 = time.perf_counter()
                    h = block(h)
                    samples["block_test"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                model.head(h)
                samples["readout_test"].append(time.perf_counter() - t0)
    finally:
        model.train()
        torch.set_num_threads(threads)
    out: dict[str, dict[str, dict[str, float]]] = {"block": {}, "readout": {}}
    for key, xs in samples.items():
        module, phase = key.split("_", 1)
        out[module][phase] = summarize(xs)
    return out


def phase_rows(stats: dict[str, dict[str, float]], names: dict[str, str]) -> list[dict]:
    """Rows of a study-000-shaped table (phase, mean, std, min, max) from summarize() dicts."""
    return [
        {
            "phase": label,
            **{f"{k}_s": stats[key][k] for k in ("mean", "std", "min", "max")},
            "count": stats[key]["count"],
        }
        for key, label in names.items()
    ]


def study_tables(seq: dict, times: dict) -> list[tuple[str, str, list[dict]]]:
    """Tables 1-3: (title, caption, rows) for the whole model (the sequential run's steps), one
    ViG block and the readout (:func:`block_times`)."""
    module_phases = {
        "fwd": "Training (forward)",
        "fwd_bwd": "Training (forward + backward)",
        "test": "Test (forward)",
    }
    whole = {"train": seq["step_time_s"], "test": seq["test_step_time_s"]}
    return [
        (
            "Table 1: whole model (sequential run)",
            "Seconds per mini-batch of the sequential run: a training step (forward, backward, "
            "optimizer) and a test mini-batch (forward).",
            phase_rows(whole, {"train": "Training", "test": "Test"}),
        ),
        (
            "Table 2: a single ViG block",
            "Seconds per mini-batch for one ViG block, pooled over the 8 blocks.",
            phase_rows(times["block"], module_phases),
        ),
        (
            "Table 3: the readout",
            "Seconds per mini-batch for the readout (mean over nodes, 2-layer MLP; its "
            "training rows include the NLL loss).",
            phase_rows(times["readout"], module_phases),
        ),
    ]


def time_modules(first: dict, quick: bool, data_root: str | None) -> dict:
    """:func:`block_times` for the suite's model and data (the first run's settings)."""
    cfg = Config()
    cfg.data.dataset, cfg.model.name = first["dataset"], "vig"
    cfg.model.hidden, cfg.model.layers = first.get("hidden"), first.get("layers")
    resolve(cfg)
    cfg.model.recompute = bool(first.get("recompute", False))
    root = data_root or default_data_root()
    ds = load_dataset(first["dataset"], root, first.get("scale", 1.0), first["seed"])
    torch.manual_seed(first["seed"])
    model = build_model(cfg.model, ds.num_features, ds.num_classes, ds.multilabel)
    test_batches = QUICK_TEST_BATCHES if quick else FULL_TEST_BATCHES
    b = first["batch-size"]
    return block_times(
        model, (ds.train_x, ds.train_y), ds.test_x, b, first["max-steps"], test_batches
    )


def vig_pipeline(quick: bool, out: Path, data_root: str | None, quiet: bool) -> list[dict]:
    plan = runs(quick, data_root)
    results = run_plan(plan, out, data_root, quiet)
    seq = results[0]
    rows = [row(r, seq["step_time_s"]["median"]) for r in results]
    first = plan[0][1]
    if not quiet:
        print("[tables 2-3] timing one ViG block and the readout", flush=True)
    times = time_modules(first, quick, data_root)
    (out / "block_times.json").write_text(json.dumps(times, indent=2))
    tables = study_tables(seq, times)
    for title, _, trows in tables:
        print_table(title, trows, PHASE_COLS)
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
    size = (
        f"{first['dataset']}, ViG 8 blocks (C=107), mini-batch {first['batch-size']} images, "
        f"{first['max-steps']} training and up to {first['max-steps']} test mini-batches per "
        "run, one thread per process"
        + (
            ", --recompute (block re-materialisation) in every run"
            if first.get("recompute")
            else ""
        )
        + "."
    )
    note = (
        f"{size} Times are seconds per mini-batch (test: forward only). "
        "speedup: sequential median / this median; of_bound: speedup / gpipe_bound; "
        "throughput_speedup: speedup x replicas (each hybrid step trains replicas x batch). "
        "Rows with 4 ranks oversubscribe a 2-core machine."
    )
    modules_note = (
        f"Tables 2 and 3: {first['max-steps']} training and "
        f"{QUICK_TEST_BATCHES if quick else FULL_TEST_BATCHES} test mini-batches of "
        f"{first['batch-size']} images, each module timed on its own in this process (one "
        "thread); the study's 'training' block time matches a forward pass (see the suite's "
        "docstring), so forward and forward + backward are both given."
    )
    sections = [
        (title, caption + "\n\n" + markdown_table(trows, PHASE_COLS))
        for title, caption, trows in tables
    ]
    sections[-1] = (sections[-1][0], sections[-1][1] + "\n\n" + modules_note)
    write_report(
        out,
        "ViG pipeline and data + pipeline parallelism (study 000)",
        [
            *sections,
            ("Tables 1, 4-9 shape", markdown_table(rows, COLS) + "\n\n" + note),
            ("Figure 3 shape", "![loss curves](vig_loss.png)"),
        ],
        results,
    )
    return results
