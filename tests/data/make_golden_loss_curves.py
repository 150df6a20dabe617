"""Regenerate tests/data/golden_loss_curves.json from a given gnnpar source tree.

The goldens pin the fixed-seed loss curves of a known-good revision, so a refactor of the
training loops can show "same seed, same loss". Generate them from a frozen copy of that
revision, never from a working tree being edited:

    git -C /work/main worktree add /tmp/gnnpar-base HEAD
    cd /work/main && .venv/bin/python tests/data/make_golden_loss_curves.py /tmp/gnnpar-base
    git -C /work/main worktree remove /tmp/gnnpar-base

Each case runs ``python -m gnnpar train ARGS --out DIR`` with ``PYTHONPATH=SRC/src`` and
``cwd=SRC`` (the script first checks that this imports gnnpar from SRC, not from the venv's
editable install) and ``GNNPAR_DATA`` set to a scratch folder that is emptied first, so the
first run of a case may build caches and the second reuses them. Every run has
``conftest.PINNED_ARITHMETIC`` in its environment: the same floating-point paths on every x86-64
CPU. A case is kept only when all
its runs (``--repeats``, default 2) give identical loss curves; cases dropped as
non-deterministic are printed and the script exits 1 if any was dropped (the JSON is still
written with the others).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import PINNED_ARITHMETIC  # noqa: E402  (the curves' CPU-independent arithmetic)

DEFAULT_OUT = HERE / "golden_loss_curves.json"

# Every run: one torch thread per process, seed 3, no progress display.
COMMON = "--threads 1 --seed 3 --quiet --eval-every 1"

# Model and optimiser settings spelled out (the values the study defaults resolve to at the
# pinned revision), so a change of defaults cannot change what a case runs. Only settings the
# run reads are given (no --heads for GCN, SAGE or ViG, no --replicas for pipeline): the CLI may
# reject a flag that the run would ignore.
OPTIM = "--optimizer adam --weight-decay"
GAT = f"--model gat --hidden 8 --layers 2 --heads 8 --dropout 0.6 {OPTIM} 0.0005 --lr 0.005"
GCN = f"--model gcn --hidden 16 --layers 2 --dropout 0.5 {OPTIM} 0.0005 --lr 0.01"
SAGE = f"--model sage --hidden 256 --layers 3 --dropout 0.5 {OPTIM} 0.0005 --lr 0.005"
VIG = f"--model vig --hidden 8 --layers 2 --dropout 0.0 {OPTIM} 0.0 --lr 0.001"
CORA = "--dataset cora"
CIFAR = "--dataset synthetic-cifar10 --scale 0.01"
IMAGES = "--batch-size 8 --max-steps 3 --epochs 1"
CLUSTER = "--strategy sequential --workers 1 --partitions 8 --partitioner"
ALLREDUCE = "--strategy allreduce --workers 2 --partitioner random --jitter 0 --epochs 3"
PIPELINE = "--strategy pipeline --workers 2 --stages 2 --schedule gpipe"

# (name, flags of `gnnpar train` without --out)
CASES: list[tuple[str, list[str]]] = [
    (name, f"{flags} {COMMON}".split())
    for name, flags in [
        ("sequential-full-batch-gat", f"{CORA} {GAT} --strategy sequential --epochs 5"),
        ("sequential-cluster-gcn-random", f"{CORA} {GCN} {CLUSTER} random --epochs 3"),
        ("sequential-cluster-sage-metis", f"{CORA} {SAGE} {CLUSTER} metis --epochs 2"),
        ("sequential-vig", f"{CIFAR} {VIG} --strategy sequential --workers 1 {IMAGES}"),
        (
            "allreduce-2-k1-grads",
            f"{CORA} {GCN} {ALLREDUCE} --partitions 8 --sync-every 1 --average grads",
        ),
        (
            "allreduce-2-k2-grads",
            f"{CORA} {GCN} {ALLREDUCE} --partitions 8 --sync-every 2 --average grads",
        ),
        (
            "allreduce-2-k2-params",
            f"{CORA} {GCN} {ALLREDUCE} --partitions 8 --sync-every 2 --average params",
        ),
        (
            "allreduce-2-k1-grads-7-partitions",  # 7 partitions over 2 ranks: uneven shares
            f"{CORA} {GCN} {ALLREDUCE} --partitions 7 --sync-every 1 --average grads",
        ),
        (
            "pipeline-2-gat-exact",
            f"{CORA} {GAT} {PIPELINE} --chunks 4 --microbatch exact --epochs 3",
        ),
        (
            "pipeline-2-gat-index",
            f"{CORA} {GAT} {PIPELINE} --chunks 4 --microbatch index --epochs 3",
        ),
        ("pipeline-2-vig", f"{CIFAR} {VIG} {PIPELINE} --chunks 2 {IMAGES}"),
        (
            "hybrid-2x2-gcn",
            f"{CORA} {GCN} --strategy hybrid --replicas 2 --stages 2 --workers 4 --chunks 2 "
            "--microbatch exact --schedule gpipe --epochs 2",
        ),
        (
            "sampled-1-sage",
            f"{CORA} {SAGE} --strategy sampled --workers 1 --batch-size 256 --fanouts 5,5,5 "
            "--loader-workers 0 --jitter 0 --epochs 2",
        ),
    ]
]


def run_case(
    python: str, src: Path, data: Path, args: list[str], out: Path
) -> tuple[object, float]:
    env = {**os.environ, "PYTHONPATH": str(src / "src"), "GNNPAR_DATA": str(data)}
    env.update(PINNED_ARITHMETIC, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "gnnpar", "train", *args, "--out", str(out)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return json.loads((out / "result.json").read_text())["loss_curve"], took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="gnnpar source tree (its src/ is put on PYTHONPATH)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    ap.add_argument("--data", type=Path, default=Path("/tmp/gnnpar-golden-data"))
    ap.add_argument("--repeats", type=int, default=2, help="runs per case that must agree")
    ap.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    ap.add_argument("--only", nargs="*", help="run just these cases; prints, writes nothing")
    a = ap.parse_args()
    src = a.src.resolve()

    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    # the sampler's compiled kernel, in place (a worktree has only its source): the sampled
    # case pins the kernel's random stream, not the torch fallback's
    subprocess.run(
        [a.python, "setup.py", "-q", "build_ext", "--inplace"], cwd=src, env=env, check=True
    )
    where = subprocess.run(
        [a.python, "-c", "import gnnpar; print(gnnpar.__file__)"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"gnnpar imported from {where}", flush=True)
    if not Path(where).resolve().is_relative_to(src / "src"):
        print(f"error: gnnpar does not come from {src}/src", file=sys.stderr)
        return 2
    kernel = subprocess.run(
        [a.python, "-c", "from gnnpar.data.sampling import kernel; print(kernel.kernel_path())"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not kernel.startswith(str(src)):
        print(f"error: the sampler kernel was not built in {src} ({kernel})", file=sys.stderr)
        return 2

    if a.data.exists():
        shutil.rmtree(a.data)
    golden, dropped = [], []
    with tempfile.TemporaryDirectory(prefix="gnnpar-golden-") as tmp:
        for name, args in CASES:
            if a.only and name not in a.only:
                continue
            curves, times = [], []
            for i in range(a.repeats):
                curve, took = run_case(a.python, src, a.data, args, Path(tmp) / f"{name}-{i}")
                curves.append(curve)
                times.append(took)
            same = all(c == curves[0] for c in curves[1:])
            runs = ", ".join(f"{t:.1f}" for t in times)
            print(f"{name}: {'deterministic' if same else 'NOT deterministic'} ({runs} s)")
            if same:
                golden.append({"name": name, "args": args, "loss_curve": curves[0]})
            else:
                dropped.append(name)
                for c in curves:
                    print(f"  {c}")
    if not a.only:
        a.out.write_text(json.dumps(golden, indent=1) + "\n")
        print(f"wrote {len(golden)} cases to {a.out}")
    if dropped:
        print(f"dropped as non-deterministic: {', '.join(dropped)}")
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
