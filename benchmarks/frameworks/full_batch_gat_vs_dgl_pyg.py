"""Full-batch GAT (study 001): gnnpar against plain PyG and plain DGL, side by side.

Study 001's model: 2 layers, 8 heads x 8 hidden, the output layer 8 heads averaged (PyG's
example; DGL's example uses 1 output head, we use PyG's shape on both peers so the work is
equal), dropout 0.6 on features and attention, Adam 5e-3, weight decay 5e-4, full batch, on
Cora and CiteSeer (the bundled Planetoid files, row-normalised features, the public split).

The graph is exported once (``.npy``: normalised x, y, edge_index without self loops, masks);
each side runs in its own interpreter with ``torch.set_num_threads(--threads)``: gnnpar through
its public ``run`` (``--model gat``), PyG with ``GATConv`` (adds self loops itself), DGL with
``GATConv`` on ``dgl.add_self_loop(graph)`` (DGL's own GAT example). A peer whose interpreter is
missing is skipped with a message. Per repetition the sides run in turn, order rotated.

Reported per side: median training-step time (forward + backward + optimizer step, no
evaluation) over the epochs, test accuracy after the last epoch; medians over repetitions and
the median of per-repetition ratios gnnpar / peer.

    python -m benchmarks.frameworks.full_batch_gat_vs_dgl_pyg --threads 1,2 --epochs 300 --reps 3
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the user's OpenMP policy, read before gnnpar sets its own (gnnpar/__init__.py)
USER_WAIT_POLICY = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

try:  # first, as for the CLI: gnnpar's OpenMP settings apply only before torch loads
    import gnnpar  # noqa: F401
except ImportError:  # a peer's interpreter
    pass

import numpy as np  # noqa: E402
import torch  # noqa: E402

NAMES = {"cora": "Cora", "citeseer": "CiteSeer"}


def export(folder: Path, name: str) -> None:
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    from gnnpar.data.registry import BUNDLED

    root = folder / "raw"
    shutil.copytree(BUNDLED / NAMES[name], root / NAMES[name], dirs_exist_ok=True)
    d = Planetoid(str(root), NAMES[name], transform=T.NormalizeFeatures())[0]
    ei = d.edge_index[:, d.edge_index[0] != d.edge_index[1]]
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    arrays = dict(x=d.x, y=d.y, edge_index=ei, train=d.train_mask, test=d.test_mask)
    for k, v in arrays.items():
        np.save(out / f"{k}.npy", v.contiguous().numpy())


def load(folder: Path) -> dict:
    return {
        k: torch.from_numpy(np.load(folder / f"{k}.npy"))
        for k in ("x", "y", "edge_index", "train", "test")
    }


def loop(model, forward, g, epochs: int, seed: int) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    steps = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        out = forward()
        loss = torch.nn.functional.nll_loss(out[g["train"]], g["y"][g["train"]])
        loss.backward()
        opt.step()
        steps.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        pred = forward().argmax(-1)
    acc = float((pred[g["test"]] == g["y"][g["test"]]).float().mean())
    return {"step_s": statistics.median(steps), "acc": acc}


def side_pyg(g: dict, epochs: int, seed: int) -> dict:
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    class GAT(torch.nn.Module):
        def __init__(self, i, c):
            super().__init__()
            self.conv1 = GATConv(i, 8, heads=8, dropout=0.6)
            self.conv2 = GATConv(64, c, heads=8, concat=False, dropout=0.6)

        def forward(self, x, ei):
            x = F.dropout(x, 0.6, self.training)
            x = F.elu(self.conv1(x, ei))
            x = F.dropout(x, 0.6, self.training)
            return F.log_softmax(self.conv2(x, ei), -1)

    torch.manual_seed(seed)
    m = GAT(g["x"].size(1), int(g["y"].max()) + 1)
    return loop(m, lambda: m(g["x"], g["edge_index"]), g, epochs, seed)


def side_dgl(g: dict, epochs: int, seed: int) -> dict:
    import dgl
    import torch.nn.functional as F
    from dgl.nn import GATConv

    graph = dgl.add_self_loop(
        dgl.graph((g["edge_index"][0], g["edge_index"][1]), num_nodes=g["x"].size(0))
    )

    class GAT(torch.nn.Module):
        def __init__(self, i, c):
            super().__init__()
            self.conv1 = GATConv(i, 8, 8, feat_drop=0.6, attn_drop=0.6, activation=F.elu)
            self.conv2 = GATConv(64, c, 8, feat_drop=0.6, attn_drop=0.6)

        def forward(self, x):
            h = self.conv1(graph, x).flatten(1)
            return F.log_softmax(self.conv2(graph, h).mean(1), -1)

    torch.manual_seed(seed)
    m = GAT(g["x"].size(1), int(g["y"].max()) + 1)
    return loop(m, lambda: m(g["x"]), g, epochs, seed)


def side_gnnpar(name: str, epochs: int, seed: int, threads: int) -> dict:
    from gnnpar.configure import build_config
    from gnnpar.run import run

    flags = {"dataset": name, "model": "gat", "epochs": epochs, "seed": seed}
    flags.update(threads=threads, quiet=True, eval_every=epochs)
    try:
        r = run(build_config(None, flags))
    except Exception:  # older option set: no eval_every
        flags.pop("eval_every")
        r = run(build_config(None, flags))
    return {"step_s": r["step_time_s"]["median"], "acc": r["test_score"]}


def side_main() -> None:
    side, folder, name = sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    threads, epochs, seed = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    torch.set_num_threads(threads)
    if side == "gnnpar":
        out = side_gnnpar(name, epochs, seed, threads)
    else:
        g = load(folder / name)
        out = (side_pyg if side == "pyg" else side_dgl)(g, epochs, seed)
    print(json.dumps(out))


def run_side(side, folder, name, threads, epochs, seed, lock):
    """One side in a fresh interpreter: gnnpar's as this module, a peer's as this file (in
    the peer's interpreter, which has neither gnnpar nor the benchmarks package)."""
    from benchmarks import harness

    if side == "gnnpar":
        cmd = lock + [sys.executable, "-m", __spec__.name, "--side", side]
        env = harness.module_env()
    else:
        cmd = lock + [harness.PEERS[side], __file__, "--side", side]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd += [str(folder), name, str(threads), str(epochs), str(seed)]
    if side != "gnnpar":  # gnnpar's default policy is not the peers': theirs is the user's
        for key, value in USER_WAIT_POLICY.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
    env.update(OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=harness.ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    from benchmarks import harness  # here: a peer's interpreter runs side_main alone

    p = harness.parser(__doc__, reps=3, out=True)
    p.add_argument("--datasets", default="cora,citeseer")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--lock", default=None, help="flock this file around each timed run")
    p.add_argument("--sides", default="gnnpar,pyg,dgl")
    smoke = {"datasets": "cora", "threads": "1", "epochs": 2, "reps": 1}
    a = harness.start(p, argv, smoke, header=False)  # printed once the sides are known
    lock = ["flock", a.lock] if a.lock else []
    wanted = a.sides.split(",")
    peers = harness.PEERS
    sides = ["gnnpar"] + [s for s in ("pyg", "dgl") if s in wanted and Path(peers[s]).exists()]
    for s in ("pyg", "dgl"):
        if s in wanted and s not in sides:
            print(f"skipping {s}: {peers[s]} not found", flush=True)
    harness.print_header()
    folder = Path(tempfile.mkdtemp(prefix="gat-frameworks-"))
    report = {"machine": harness.machine(), "epochs": a.epochs, "rows": {}}
    for name in a.datasets.split(","):
        export(folder, name)
        for t in map(int, a.threads.split(",")):
            reps = []
            for rep in range(a.reps):
                order = harness.rotation(sides, rep)
                row = {s: run_side(s, folder, name, t, a.epochs, rep, lock) for s in order}
                reps.append(row)
                print(name, t, rep, json.dumps(row), flush=True)
            summ = {
                s: {
                    "step_ms": 1e3 * statistics.median(r[s]["step_s"] for r in reps),
                    "acc": statistics.median(r[s]["acc"] for r in reps),
                }
                for s in sides
            }
            for s in sides[1:]:
                summ[f"gnnpar/{s}"] = statistics.median(
                    r["gnnpar"]["step_s"] / r[s]["step_s"] for r in reps
                )
            report["rows"][f"{name}/{t}"] = {"summary": summ, "reps": reps}
            print(name, t, json.dumps(summ), flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    report["load_after"] = harness.load_average()
    if a.out:
        harness.write_json(a.out, report)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--side":
        side_main()
    else:
        main()
