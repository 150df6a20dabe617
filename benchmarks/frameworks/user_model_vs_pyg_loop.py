"""A user's model trained through gnnpar against the same model in a plain PyG loop (issue 20).

Both sides train the same model on the same graph (Cora, full batch, one process, Adam
lr 0.01, the training nodes' cross-entropy) for ``--epochs`` steps, each in a fresh interpreter:

* ``gnnpar``: ``python -m gnnpar train --dataset cora --model MODEL --epochs E --eval-every 0``;
  its step times are result.json's ``step_times_s`` (the loop's: fetch the batch, zero_grad,
  forward, loss, backward, optimizer step, the loss as a float);
* ``pyg``: the loop a PyG user writes, timed around the same things: ``opt.zero_grad();
  out = model(x, edge_index); loss = F.cross_entropy(out[mask], y[mask]); loss.backward();
  opt.step(); float(loss)``. The graph is gnnpar's Cora (the same tensors), loaded untimed.

Models: ``pyg:GIN`` (64 hidden, 2 layers, dropout 0.5: ``GIN(1433, 64, 2, 7, dropout=0.5)``
on the PyG side) and ``appnp``, the factory :func:`build` below (two linear layers around an
APPNP propagation, K = 10), given to gnnpar as ``--model benchmarks.frameworks.user_model_vs_pyg_loop:build``.

The sides alternate (which goes first alternates too), ``--reps`` pairs; the first ``--skip``
steps of every run are warm-up and dropped. Reported per model: each side's median step (the
median over reps of each run's median) and the median of the per-pair ratios gnnpar / pyg.

``--in-process``: the model path alone, in one process, where other jobs on a shared machine
cannot favour one side: the same step (the PyG loop above) on gnnpar's model (``build_model``:
the user's module wrapped by ``adapt.to_block_model``, what every strategy trains), on the
user's module inside it, and on PyG's class built directly, in chunks of ``--epochs`` steps
that rotate (the order rotates too), ``--reps`` rounds; wall and this thread's CPU time.

    python -m benchmarks.frameworks.user_model_vs_pyg_loop --reps 5 --epochs 40 --threads 1
    python -m benchmarks.frameworks.user_model_vs_pyg_loop --out benchmarks/results/user_model.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks import harness

MODELS = {  # id -> gnnpar's flags
    "pyg:GIN": ["--model", "pyg:GIN", "--hidden", "64", "--layers", "2", "--dropout", "0.5"],
    "appnp": [
        "--model",
        "benchmarks.frameworks.user_model_vs_pyg_loop:build",
        "--model-args",
        '{"hidden": 64}',
    ],  # fmt: skip
}


class LinearAPPNP(nn.Module):
    def __init__(self, in_dim: int, num_classes: int, hidden: int = 64) -> None:
        from torch_geometric.nn import APPNP

        super().__init__()
        self.lin1, self.lin2 = nn.Linear(in_dim, hidden), nn.Linear(hidden, num_classes)
        self.prop = APPNP(K=10, alpha=0.1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.prop(torch.relu(self.lin1(x)), edge_index))


def build(in_dim: int, num_classes: int, hidden: int = 64) -> nn.Module:
    return LinearAPPNP(in_dim, num_classes, hidden)


def plain_model(name: str, in_dim: int, classes: int) -> nn.Module:
    from torch_geometric.nn.models import GIN

    if name == "pyg:GIN":
        return GIN(in_dim, 64, 2, classes, dropout=0.5)
    return build(in_dim, classes, 64)


def plain_loop(name: str, epochs: int, threads: int, data_root: str) -> list[float]:
    """The PyG side, in this (fresh) process: every step's seconds."""
    from gnnpar.data.datasets import load_dataset

    torch.set_num_threads(threads)
    ds = load_dataset("cora", data_root, 1.0, 0)
    data = ds.data
    torch.manual_seed(0)
    model = plain_model(name, ds.num_features, ds.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0)
    model.train()
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(data.x, data.edge_index)
        loss = torch.nn.functional.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        float(loss)
        times.append(time.perf_counter() - t0)
    return times


def in_process(name: str, reps: int, steps: int, skip: int, threads: int, root: str) -> dict:
    """gnnpar's wrapped model, the user's module in it, PyG's own: one step, rotating chunks."""
    from gnnpar.configure import build_config
    from gnnpar.data.datasets import load_dataset
    from gnnpar.models import build_model

    torch.set_num_threads(threads)
    ds = load_dataset("cora", root, 1.0, 0)
    data = ds.data
    flags = dict(zip(MODELS[name][0::2], MODELS[name][1::2], strict=True))
    flags = {k.lstrip("-").replace("-", "_"): v for k, v in flags.items()}
    cfg = build_config(None, {"dataset": "cora", "data_root": root, **flags})
    torch.manual_seed(0)
    wrapped = build_model(cfg.model, ds.num_features, ds.num_classes, graph=data)
    torch.manual_seed(0)
    models = {
        "gnnpar": wrapped,
        "module": wrapped.user_module,
        "pyg": plain_model(name, ds.num_features, ds.num_classes),
    }
    opts = {k: torch.optim.Adam(m.parameters(), lr=0.01) for k, m in models.items()}
    wall: dict[str, list[float]] = {k: [] for k in models}
    cpu: dict[str, list[float]] = {k: [] for k in models}
    names = list(models)
    for rep in range(reps):
        order = names[rep % 3 :] + names[: rep % 3]
        for k in order:
            model, opt, w, c = models[k], opts[k], [], []
            for _ in range(steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                opt.zero_grad(set_to_none=True)
                out = model(data.x, data.edge_index)
                mask = data.train_mask
                loss = torch.nn.functional.cross_entropy(out[mask], data.y[mask])
                loss.backward()
                opt.step()
                float(loss.detach())
                w.append(time.perf_counter() - t0)
                c.append(time.thread_time() - c0)
            wall[k].append(statistics.median(w[skip:]))
            cpu[k].append(statistics.median(c[skip:]))
    out = {}
    for k in names:
        out[f"{k}_wall_ms"] = 1e3 * statistics.median(wall[k])
        out[f"{k}_cpu_ms"] = 1e3 * statistics.median(cpu[k])
    for k in ("gnnpar", "module"):
        out[f"{k}_over_pyg_cpu"] = statistics.median(
            [a / b for a, b in zip(cpu[k], cpu["pyg"], strict=True)]
        )
        out[f"{k}_over_pyg_wall"] = statistics.median(
            [a / b for a, b in zip(wall[k], wall["pyg"], strict=True)]
        )
    return out


def env() -> dict[str, str]:
    """The repository root on the path (gnnpar imports this module's ``build`` by name)."""
    return harness.module_env()


def run_gnnpar(name: str, epochs: int, threads: int, data_root: str) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "gnnpar", "train", "--dataset", "cora", *MODELS[name]]
        argv += ["--epochs", str(epochs), "--eval-every", "0", "--threads", str(threads)]
        argv += ["--quiet", "--data-root", data_root, "--out", out]
        subprocess.run(argv, check=True, env=env(), cwd=harness.ROOT, capture_output=True)
        return json.loads((Path(out) / "result.json").read_text())["step_times_s"]


def run_pyg(name: str, epochs: int, threads: int, data_root: str) -> list[float]:
    argv = [sys.executable, "-m", __spec__.name, "--plain", name, "--epochs", str(epochs)]
    argv += ["--threads", str(threads), "--data-root", data_root]
    done = subprocess.run(
        argv, check=True, env=env(), cwd=harness.ROOT, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=5, threads=1, out=True)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--data-root", default=None)
    p.add_argument("--in-process", action="store_true", help="the model path alone (see above)")
    p.add_argument("--plain", default=None, help=argparse.SUPPRESS)  # the PyG side's child
    # --smoke: the model path in process (the CLI sides start two interpreters)
    smoke = {"models": "appnp", "reps": 1, "epochs": 3, "skip": 1, "in_process": True}
    a = harness.start(p, argv, smoke, header=False)  # the PyG side's child prints JSON only
    from gnnpar.config.parse import default_data_root

    root = a.data_root or str(default_data_root())
    if a.plain:
        print(json.dumps(plain_loop(a.plain, a.epochs, a.threads, root)))
        return
    report = {
        "machine": harness.machine(a.threads),
        "epochs": a.epochs,
        "skip": a.skip,
        "models": {},
    }
    sides = {"gnnpar": run_gnnpar, "pyg": run_pyg}
    for name in a.models.split(",") if a.in_process else []:
        m = in_process(name, a.reps, a.epochs, a.skip, a.threads, root)
        report["models"][name] = m
        print(
            f"{name} (in process): CPU ms gnnpar {m['gnnpar_cpu_ms']:.2f}, module "
            f"{m['module_cpu_ms']:.2f}, pyg {m['pyg_cpu_ms']:.2f}; gnnpar/pyg "
            f"{m['gnnpar_over_pyg_cpu']:.3f} (wall {m['gnnpar_over_pyg_wall']:.3f})",
            flush=True,
        )
    for name in a.models.split(",") if not a.in_process else []:
        medians: dict[str, list[float]] = {"gnnpar": [], "pyg": []}
        for rep in range(a.reps):
            order = ["gnnpar", "pyg"] if rep % 2 == 0 else ["pyg", "gnnpar"]
            for side in order:
                times = sides[side](name, a.epochs, a.threads, root)[a.skip :]
                medians[side].append(statistics.median(times))
        ratios = [g / q for g, q in zip(medians["gnnpar"], medians["pyg"])]
        report["models"][name] = {
            "gnnpar_step_ms": 1e3 * statistics.median(medians["gnnpar"]),
            "pyg_step_ms": 1e3 * statistics.median(medians["pyg"]),
            "ratio_median": statistics.median(ratios),
            "ratios": ratios,
            "gnnpar_rep_medians_ms": [1e3 * t for t in medians["gnnpar"]],
            "pyg_rep_medians_ms": [1e3 * t for t in medians["pyg"]],
        }
        m = report["models"][name]
        print(
            f"{name}: gnnpar {m['gnnpar_step_ms']:.2f} ms, pyg {m['pyg_step_ms']:.2f} ms, "
            f"ratio {m['ratio_median']:.3f} ({', '.join(f'{r:.3f}' for r in ratios)})",
            flush=True,
        )
    report["load_after"] = harness.load_average()
    print(json.dumps(report, indent=2))
    if a.out:
        harness.write_json(a.out, report)


if __name__ == "__main__":
    main()
