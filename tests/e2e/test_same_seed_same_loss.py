"""Same seed, same loss: pins fixed-seed loss curves of every training loop, bit for bit, on
every x86-64 CPU.

Each case in ``tests/fixtures/golden_loss_curves.json`` is a ``gnnpar train`` command line (seed 3,
one thread per process, every model, optimiser and strategy setting spelled out so that a change
of defaults cannot change what runs) and the ``loss_curve`` that command wrote to result.json.
The cases: sequential full batch (GAT), sequential Cluster-GCN (random GCN, metis SAGE),
sequential ViG on images; allreduce on 2 ranks with K=1 and K=2 averaging gradients, K=2
averaging parameters, and K=1 over 7 partitions (uneven shares); pipeline on 2 stages with exact
and index graph micro-batches, and with ViG; hybrid with 2 replicas x 2 stages (a dict of
curves, one per replica); neighbour-sampled SAGE on one rank. The comparison is exact, with no
tolerance: a refactor that reorders floating-point work or random draws fails it, on purpose.

**The same on every CPU.** float32 reductions take other paths by instruction set: the goldens
first made on an AVX-512 CPU failed on an AVX2 one in the 7th digit of the ViG curve. So every
curve runs with ``conftest.PINNED_ARITHMETIC`` in its environment (ATen's vectorised kernels,
MKL and oneDNN at their lowest x86-64 level), and the goldens were made that way (issue 18,
from commit 922b54a, whose curves were those of commit 3d703a0 on an AVX-512 CPU). Why pinning
rather than a tolerance, measured (2026-11-23, AMD EPYC with AVX-512, 1 thread): between the
machine's own paths (AVX-512), an AVX2 machine's (ATen avx2, MKL AVX2, oneDNN AVX2: exactly the
curve an AVX2-only EPYC printed) and the pinned ones, curves differ by at most 1.1e-7 relative;
a deliberate change of the maths of the same size, lr x (1 + 1e-4), moves them by only 1e-7 to
1.6e-6. No tolerance separates the two; exact pinned curves do (test below). The machine's own
paths are still checked against the pinned curves, at a tolerance (``NATIVE_RTOL``): the pin must
not hide a real difference, and so are an AVX2 CPU's (``AVX2_ARITHMETIC``: ATen, MKL and
oneDNN told to go no higher than AVX2), on any CPU. (Until 2026-11-28 CI ran the one-process
cases a second time in a pytest whose environment held those settings, ``make
test-cpu-levels``; its pinned runs were this file's own again, since the pin overrides them.)

Multi-rank cases (``--workers`` > 1) are marked slow (``-m "not slow"`` skips them); all of them
together take a few minutes on two cores.

To regenerate (only when a change of loss is intended and understood), from the revision whose
curves should be pinned, never from a tree being edited::

    git -C /work/main worktree add /tmp/gnnpar-base HEAD
    cd /work/main && .venv/bin/python tests/fixtures/make_golden_loss_curves.py /tmp/gnnpar-base
    git -C /work/main worktree remove /tmp/gnnpar-base

The script runs each case twice as ``cd /tmp/gnnpar-base && PYTHONPATH=/tmp/gnnpar-base/src
GNNPAR_DATA=/tmp/gnnpar-golden-data python -m gnnpar train ARGS --out DIR`` with the pinned
arithmetic, checks first that gnnpar is imported from that tree, keeps the cases whose two curves
agree and rewrites the JSON; the cases themselves are listed in the script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import AVX2_ARITHMETIC, PINNED_ARITHMETIC, run_cli

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden_loss_curves.json"
CASES = json.loads(GOLDEN.read_text())
BY_NAME = {c["name"]: c for c in CASES}
# The machine's own floating-point paths against the pinned curves: differences seen were at
# most 1.1e-7 relative over these 2-5 step curves (AVX-512, AVX2 and pinned paths); 10x that.
NATIVE_RTOL = 1e-6


# the floating-point paths a run takes: the pinned ones, this CPU's own (whatever the
# environment selects), an AVX2 CPU's
ARITHMETIC = {"pinned": PINNED_ARITHMETIC, "own": {}, "avx2": AVX2_ARITHMETIC}

# (args, arithmetic) -> (the finished process, its --out): the module's runs, made three at a
# time before its tests (prefetched below); a run not found here is made when its test asks
_RUNS: dict[tuple, tuple] = {}


def _train(args: list[str], data_root: Path, out: Path, arithmetic: str):
    env = {"GNNPAR_DATA": str(data_root), **ARITHMETIC[arithmetic]}
    return run_cli("train", *args, "--out", str(out), timeout=600, env=env), out


def _loss_curve(args: list[str], data_root: Path, out: Path, arithmetic: str = "pinned"):
    """``gnnpar train ARGS``'s loss curve, with the pinned arithmetic, the machine's own or an
    AVX2 CPU's."""
    key = (tuple(args), arithmetic)
    proc, out = _RUNS.pop(key, None) or _train(args, data_root, out, arithmetic)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads((out / "result.json").read_text())["loss_curve"]


def _values(curve) -> list[float]:
    """A curve's losses in order (hybrid: one curve per replica, by replica)."""
    if isinstance(curve, dict):
        return [v for key in sorted(curve) for v in curve[key]]
    return list(curve)


def _largest_relative_difference(a, b) -> float:
    va, vb = _values(a), _values(b)
    assert len(va) == len(vb), (a, b)
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(va, vb))


# Cases whose pinned curve a CPU vendor does not reproduce exactly, found and not yet explained:
# they are still checked at NATIVE_RTOL there and reported as xfail, never silently passed.
KNOWN_CPU_DIVERGENCE = {
    "allreduce-2-k2-grads": (
        "GenuineIntel",
        "the third loss differs by 2.3e-8 relative (one float32 rounding) on an Intel Xeon, "
        "family 6 model 167, with or without the CSR GCN path and at every MKL instruction "
        "level; pinned on AMD EPYC, where it passes (2026-11-24; cause not found)",
    )
}


def _cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _workers(args: list[str]) -> int:
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


# every case is `gnnpar train` in a fresh process (the pinned arithmetic is read when torch
# starts): the slow lane
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """One dataset folder for the module, so synthetic data and partitions are built once."""
    return tmp_path_factory.mktemp("gnnpar-data")


def _run_of(item) -> tuple[list[str], str] | None:
    """The run (args, arithmetic) a selected test of this module asks for."""
    params = getattr(item, "callspec", None) and item.callspec.params
    if not params:
        return None
    name = item.originalname
    if name == "test_same_seed_same_loss":
        return params["case"]["args"], "pinned"
    if name == "test_recompute_gives_the_same_loss":
        return [*params["case"]["args"], "--recompute"], "pinned"
    if name == "test_this_cpus_own_arithmetic_agrees_with_the_pinned_curve":
        return params["case"]["args"], "own"
    if name == "test_an_avx2_cpus_arithmetic_agrees_with_the_pinned_curve":
        return params["case"]["args"], "avx2"
    if name == "test_a_small_change_of_the_maths_fails_the_pinned_curve":
        return _with(BY_NAME[params["name"]]["args"], params["flag"], params["value"]), "pinned"
    return None


@pytest.fixture(scope="module", autouse=True)
def prefetched(request, data_root, tmp_path_factory):
    """The runs of the tests selected here, three at a time (each is mostly a process starting
    and its ranks waiting for each other; the curves do not depend on the load): the module's
    time nearly halves. Each test then reads its run's curve."""
    from concurrent.futures import ThreadPoolExecutor

    runs = [r for item in request.session.items if item.module is request.module
            if (r := _run_of(item)) is not None]  # fmt: skip
    tmp = tmp_path_factory.mktemp("runs")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            (tuple(args), how): pool.submit(_train, args, data_root, tmp / str(i), how)
            for i, (args, how) in enumerate(runs)
        }
    _RUNS.update({key: f.result() for key, f in futures.items()})
    yield
    _RUNS.clear()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c, id=c["name"], marks=[pytest.mark.multirank] if _workers(c["args"]) > 1 else []
        )
        for c in CASES
    ],
)
def test_same_seed_same_loss(case: dict, data_root: Path, tmp_path: Path) -> None:
    curve = _loss_curve(case["args"], data_root, tmp_path / "out")
    known = KNOWN_CPU_DIVERGENCE.get(case["name"])
    if known and _cpu_vendor() == known[0] and curve != case["loss_curve"]:
        # still held to this CPU's own arithmetic, at NATIVE_RTOL, below
        assert _largest_relative_difference(curve, case["loss_curve"]) <= NATIVE_RTOL
        pytest.xfail(f"{case['name']} on {known[0]}: {known[1]}; got {curve}")
    assert curve == case["loss_curve"], (
        f"{case['name']}: the loss curve differs from the golden one\n"
        f"got:    {curve}\nwanted: {case['loss_curve']}"
    )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c, id=c["name"], marks=[pytest.mark.multirank] if _workers(c["args"]) > 1 else []
        )
        for c in CASES
        if "vig" in c["args"]
    ],
)
def test_recompute_gives_the_same_loss(case: dict, data_root: Path, tmp_path: Path) -> None:
    """--recompute (ViG block re-materialisation) changes memory, not maths: the same curve."""
    curve = _loss_curve([*case["args"], "--recompute"], data_root, tmp_path / "out")
    assert curve == case["loss_curve"]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c["name"]) for c in CASES if _workers(c["args"]) == 1]
)
def test_this_cpus_own_arithmetic_agrees_with_the_pinned_curve(
    case: dict, data_root: Path, tmp_path: Path
) -> None:
    """Without the pin, this CPU's own paths (AVX-512, AVX2, ... or what ``ATEN_CPU_CAPABILITY``
    and friends in the environment select) give the pinned curve to float32 rounding."""
    curve = _loss_curve(case["args"], data_root, tmp_path / "out", "own")
    assert _largest_relative_difference(curve, case["loss_curve"]) <= NATIVE_RTOL, (
        f"{case['name']}: this CPU's curve is not the pinned one to rounding\n"
        f"got:    {curve}\nwanted: {case['loss_curve']}"
    )


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c["name"]) for c in CASES if _workers(c["args"]) == 1]
)
def test_an_avx2_cpus_arithmetic_agrees_with_the_pinned_curve(
    case: dict, data_root: Path, tmp_path: Path
) -> None:
    """As an AVX2 CPU without AVX-512 computes (``AVX2_ARITHMETIC``: ATen, MKL and oneDNN told to
    go no higher; a CPU without AVX2 computes at its own highest level), the pinned curve to
    float32 rounding: a machine with AVX-512 checks an AVX2-only CPU's paths too."""
    curve = _loss_curve(case["args"], data_root, tmp_path / "out", "avx2")
    assert _largest_relative_difference(curve, case["loss_curve"]) <= NATIVE_RTOL, (
        f"{case['name']}: an AVX2 CPU's curve is not the pinned one to rounding\n"
        f"got:    {curve}\nwanted: {case['loss_curve']}"
    )


def _with(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


@pytest.mark.parametrize(
    "name, flag, value",
    [
        ("sequential-full-batch-gat", "--lr", repr(0.005 * (1 + 1e-4))),
        ("sequential-full-batch-gat", "--dropout", "0.6001"),  # other dropout masks
        ("sequential-vig", "--lr", repr(0.001 * (1 + 1e-4))),
    ],
)
def test_a_small_change_of_the_maths_fails_the_pinned_curve(
    name: str, flag: str, value: str, data_root: Path, tmp_path: Path
) -> None:
    """The pinned comparison bites: a learning rate 1e-4 larger (relative), or a dropout
    probability 1e-4 larger, gives another curve."""
    case = BY_NAME[name]
    curve = _loss_curve(_with(case["args"], flag, value), data_root, tmp_path / "out")
    assert curve != case["loss_curve"]
    assert _values(curve)[0] == _values(case["loss_curve"])[0] or flag == "--dropout"
