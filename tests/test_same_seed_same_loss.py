"""Same seed, same loss: pins fixed-seed loss curves of every training loop, bit for bit.

Each case in ``tests/data/golden_loss_curves.json`` is a ``gnnpar train`` command line (seed 3,
one thread per process, every model, optimiser and strategy setting spelled out so that a change
of defaults cannot change what runs) and the ``loss_curve`` that command wrote to result.json at
the revision the goldens were made from (commit 3d703a0, before the training-loop refactor of
``src/gnnpar/strategies/`` and ``src/gnnpar/train.py``). The cases: sequential full batch (GAT),
sequential Cluster-GCN (random GCN, metis SAGE), sequential ViG on images; allreduce on 2 ranks
with K=1 and K=2 averaging gradients, K=2 averaging parameters, and K=1 over 7 partitions (uneven
shares); pipeline on 2 stages with exact and index graph micro-batches, and with ViG; hybrid with
2 replicas x 2 stages (a dict of curves, one per replica); neighbour-sampled SAGE on one rank.
Every case gave identical curves in two runs of the pinned revision (the first building the
dataset caches, the second reusing them). The comparison is exact, with no tolerance: a
refactor that reorders floating-point work or random draws fails it, on purpose.

Multi-rank cases (``--workers`` > 1) are marked slow (``-m "not slow"`` skips them); all of them
together take a few minutes on two cores.

To regenerate (only when a change of loss is intended and understood), from the revision whose
curves should be pinned, never from a tree being edited::

    git -C /work/main worktree add /tmp/gnnpar-base HEAD
    cd /work/main && .venv/bin/python tests/data/make_golden_loss_curves.py /tmp/gnnpar-base
    git -C /work/main worktree remove /tmp/gnnpar-base

The script runs each case twice as ``cd /tmp/gnnpar-base && PYTHONPATH=/tmp/gnnpar-base/src
GNNPAR_DATA=/tmp/gnnpar-golden-data python -m gnnpar train ARGS --out DIR``, checks first that
gnnpar is imported from that tree, keeps the cases whose two curves agree and rewrites the JSON;
the cases themselves are listed in the script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

GOLDEN = Path(__file__).parent / "data" / "golden_loss_curves.json"
CASES = json.loads(GOLDEN.read_text())


def _workers(args: list[str]) -> int:
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """One dataset folder for the module, so synthetic data and partitions are built once."""
    return tmp_path_factory.mktemp("gnnpar-data")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c["name"], marks=[pytest.mark.slow] if _workers(c["args"]) > 1 else [])
        for c in CASES
    ],
)
def test_same_seed_same_loss(case: dict, data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "train", *case["args"], "--out", str(out), timeout=600, env={"GNNPAR_DATA": str(data_root)}
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    curve = json.loads((out / "result.json").read_text())["loss_curve"]
    assert curve == case["loss_curve"], (
        f"{case['name']}: the loss curve differs from the golden one\n"
        f"got:    {curve}\nwanted: {case['loss_curve']}"
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c["name"], marks=[pytest.mark.slow] if _workers(c["args"]) > 1 else [])
        for c in CASES
        if "vig" in c["args"]
    ],
)
def test_recompute_gives_the_same_loss(case: dict, data_root: Path, tmp_path: Path) -> None:
    """--recompute (ViG block re-materialisation) changes memory, not maths: the same curve."""
    out = tmp_path / "out"
    args = [*case["args"], "--recompute", "--out", str(out)]
    proc = run_cli("train", *args, timeout=600, env={"GNNPAR_DATA": str(data_root)})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert json.loads((out / "result.json").read_text())["loss_curve"] == case["loss_curve"]
