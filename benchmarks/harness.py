"""What every benchmark script shares: the machine header, alternating timing, the result writer.

A benchmark script is ``benchmarks/<topic>/<what_it_measures>.py``, run from the repository
root as a module (``python -m benchmarks.kernels.csr_mm_vs_torch_sparse``), with a
``main(argv=None)`` built on :func:`parser` (which adds ``--smoke``: the smallest setting, a few
seconds, that ``tests/benchmark_scripts/test_smoke.py`` runs so no script rots). Files whose name
starts with ``_`` are not scripts: they are the other side of one (a peer library's process).

* :func:`machine` / :func:`header`: CPU model, cores, load average, torch version, git commit and
  date, to print before the figures and to store beside them (every figure names its machine).
* :func:`set_threads`: torch's intra-op threads (and OpenMP's, for processes started after).
* :func:`parser` and :func:`start`: a script's preamble: its options (``--smoke`` and, where
  asked, ``--reps``, ``--threads``, ``--data-root``, ``--out``), its smallest setting under
  ``--smoke``, its threads set and the machine's line printed before the figures.
* :func:`rank_pids` / :func:`wait_for_steps`: a run's ranks, and waiting until it trains (the
  benchmarks and the tests use these same two: tests/helpers.py imports them from here).
* :func:`alternate`: time several sides in turn, the order reversed every other repetition, so
  that a shared machine's drifting load hits every side alike; :func:`median_ratio` is the median
  of per-repetition ratios (steadier than the ratio of medians when the load moves).
* :func:`write_json`: written to a temporary name and renamed, so a reader never sees half.
* :func:`bench_lock`: hold a flock(1) lock file around a timed run (one timed run at a time on a
  shared machine).

``python -m benchmarks.harness --smoke MODULE [MODULE ...]`` runs the named scripts' ``main`` with
``--smoke`` in this one process (the smoke test's driver: one interpreter start, not one each).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOPICS = ("frameworks", "kernels", "comm", "advise", "memory", "robustness", "datasets")
# The peer libraries' interpreters (plain PyG, plain DGL: environments of their own, so gnnpar
# never imports them); GNNPAR_PEER_PYG / GNNPAR_PEER_DGL point elsewhere. A script skips a peer
# whose interpreter is missing, with a message.
PEERS = {
    name: os.environ.get(f"GNNPAR_PEER_{name.upper()}", f"/work/peers/{name}/bin/python")
    for name in ("pyg", "dgl")
}


# ------------------------------------------------------------------------------- the machine
def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (``/proc/cpuinfo``'s ``model name``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (0s where the OS has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def git_commit() -> str:
    """The repository's commit (short), with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            timeout=10,
        )  # fmt: skip
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True, timeout=10
        ).returncode
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine(threads: int | None = None) -> dict[str, Any]:
    """What every figure is stored with: date (UTC), CPU model, cores, load, versions, commit."""
    import torch  # here: a peer's side or a torch-free script need not import it

    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load": list(load_average()),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    if threads is not None:
        info["threads"] = threads
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def header(threads: int | None = None) -> str:
    """One line naming the machine, to print before the figures."""
    m = machine(threads)
    load = " ".join(f"{x:.2f}" for x in m["load"])
    parts = [m["cpu"], f"{m['cores']} cores"]
    if "gpu" in m:
        parts.append(m["gpu"])
    if threads is not None:
        parts.append(f"{threads} thread(s)")
    parts += [f"load {load}", f"torch {m['torch']}", f"commit {m['commit']}", m["date"]]
    return ", ".join(parts)


def print_header(threads: int | None = None) -> None:
    print(header(threads), flush=True)


def set_threads(n: int) -> int:
    """torch's intra-op threads for this process, and OpenMP's for the processes it starts."""
    import torch

    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    return n


# -------------------------------------------------------------------------------- the timing
def alternate(
    sides: dict[str, Callable[[], Any]],
    reps: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    after: Callable[[], Any] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each side's call, ``reps`` times, the sides in turn: in the given order on
    even repetitions, reversed on odd ones. ``warmup`` untimed calls of each side first;
    ``after`` (untimed) after every call, e.g. to reset gradients."""
    for fn in sides.values():
        for _ in range(warmup):
            fn()
            if after is not None:
                after()
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = clock()
            sides[name]()
            times[name].append(clock() - t0)
            if after is not None:
                after()
    return times


def rotation(sides: Sequence[str], rep: int) -> list[str]:
    """The sides' order at repetition ``rep``: rotated by one each time, so each goes first."""
    k = rep % len(sides) if sides else 0
    return list(sides[k:]) + list(sides[:k])


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median of per-repetition ratios ``num[i] / den[i]``."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def median_ms(times: Sequence[float]) -> float:
    return statistics.median(times) * 1e3


# ------------------------------------------------------------------------- writing, locking
def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` as indented JSON at ``path``, atomically: a temporary file in the same folder,
    flushed and renamed over the target (a reader sees the old file or the whole new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, default=_jsonable)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _jsonable(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):  # tensors, numpy arrays and scalars
        return o.tolist()
    if isinstance(o, tuple | set):
        return list(o)
    return float(o)


@contextlib.contextmanager
def bench_lock(path: str | os.PathLike | None) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (nothing when ``None``)."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------- runs started as processes
def rank_pids(launcher_pid: int, ranks: int, deadline_s: float = 30) -> list[int]:
    """The pids of the local ranks that ``gnnpar train --workers N`` (process ``launcher_pid``)
    started, in rank order: the children of its fork server (gnnpar's default), or its own
    children when spawned (not multiprocessing's resource tracker), oldest first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        procs = {}  # pid: (parent, start time, cmdline)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            procs[int(entry.name)] = (int(stat[1]), int(stat[19]), cmdline)
        mine = [p for p, (parent, _, _) in procs.items() if parent == launcher_pid]
        servers = {p for p in mine if b"forkserver" in procs[p][2]}
        children = [
            (start, p)
            for p, (parent, start, cmdline) in procs.items()
            if parent in servers
            or (parent == launcher_pid and p not in servers and b"resource_tracker" not in cmdline)
        ]
        if len(children) >= ranks:
            return [pid for _, pid in sorted(children)[:ranks]]
        time.sleep(0.05)
    raise RuntimeError(f"process {launcher_pid} did not start {ranks} ranks in {deadline_s} s")


def wait_for_steps(metrics: Path, steps: int, proc: subprocess.Popen, deadline_s: float) -> None:
    """Until the run's metrics.jsonl holds ``steps`` step records (it is training); an error
    naming the run if it ends first or the deadline passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            err = proc.communicate()[1] or b""
            raise RuntimeError(f"the run ended early: {err[-2000:]!r}")
        if metrics.exists():
            lines = metrics.read_text().splitlines()
            if sum('"event": "step"' in line for line in lines) >= steps:
                return
        time.sleep(0.05)
    raise RuntimeError(f"no {steps} steps in {metrics} within {deadline_s} s")


# ------------------------------------------------------------------------------- the scripts
def parser(
    doc: str | None,
    *,
    reps: int | None = None,
    threads: int | None = None,
    data_root: bool = False,
    out: bool = False,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """An ArgumentParser described by the first line of ``doc``, with ``--smoke``, and the
    options most scripts share where asked for: ``--reps`` (repetitions, default ``reps``),
    ``--threads`` (torch's threads, default ``threads``), ``--data-root`` (default
    $GNNPAR_DATA), ``--out`` (a JSON file for the figures, default none)."""
    first = (doc or "").strip().split("\n\n")[0].replace("\n", " ")
    p = argparse.ArgumentParser(description=first, **kwargs)
    p.add_argument(
        "--smoke", action="store_true", help="the smallest setting (a few seconds): does it run?"
    )
    if reps is not None:
        p.add_argument("--reps", type=int, default=reps, help="repetitions (the median is kept)")
    if threads is not None:
        p.add_argument("--threads", type=int, default=threads, help="torch's threads")
    if data_root:
        p.add_argument("--data-root", default=os.environ.get("GNNPAR_DATA"))
    if out:
        p.add_argument("--out", default=None, help="write the figures as JSON here")
    return p


def start(
    p: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    smoke: dict[str, Any] | None = None,
    header: bool = True,
    rank_threads: int | None = None,
) -> argparse.Namespace:
    """A script's arguments, parsed, and what every script does before it measures: with
    ``--smoke`` the settings ``smoke`` names are set (and ``--data-root``, where the parser has
    it and none was given, is :func:`smoke_root`); ``--threads``, where the parser has it, is
    set (:func:`set_threads`); the machine's line is printed (:func:`print_header`) unless
    ``header`` is False, naming ``--threads`` or else ``rank_threads`` (the threads of each rank
    a script starts, which set their own)."""
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in (smoke or {}).items():
            setattr(args, key, value)
        if hasattr(args, "data_root") and not args.data_root:
            args.data_root = str(smoke_root())
    threads = getattr(args, "threads", None)  # a script's own list of thread counts: not set here
    threads = threads if isinstance(threads, int) else None
    if threads is not None:
        set_threads(threads)
    if header:
        print_header(threads if threads is not None else rank_threads)
    return args


def smoke_root() -> Path:
    """A data root for --smoke runs: $GNNPAR_DATA if set, else a folder under the temp dir."""
    env = os.environ.get("GNNPAR_DATA")
    root = Path(env) if env else Path(tempfile.gettempdir()) / "gnnpar-bench-smoke"
    root.mkdir(parents=True, exist_ok=True)
    return root


def smoke_prepared(out: Path) -> Path:
    """A tiny prepared folder for --smoke runs (synthetic-papers100m at scale 0.0002, seed 0),
    written to ``out``."""
    from gnnpar.data.prepare_command import run_prepare

    run_prepare(
        "synthetic-papers100m", str(out), 0.0002, 0, None, str(smoke_root()), None, True
    )  # fmt: skip
    return out


def module_env() -> dict[str, str]:
    """The environment for a child that runs ``python -m benchmarks...`` or ``-m gnnpar``: the
    repository root and its src/ first on PYTHONPATH."""
    path = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def no_namespaces(reason: str, smoke: bool) -> int:
    """A script that needs two network namespaces (root, iproute2) where none can be made: a
    --smoke run says so and passes (unless GNNPAR_REQUIRE_NETNS=1, as CI sets where it can make
    them); a measuring run stops with the reason (exit status 2)."""
    if smoke and os.environ.get("GNNPAR_REQUIRE_NETNS") != "1":
        print(f"smoke: skipped, two network namespaces cannot be made here: {reason}")
        return 0
    print(f"error: two network namespaces cannot be made here: {reason}", file=sys.stderr)
    return 2


def scripts() -> list[str]:
    """Every benchmark script, as a module name (``benchmarks.<topic>.<name>``)."""
    found = []
    for topic in sorted((ROOT / "benchmarks").iterdir()):
        if not topic.is_dir() or not (topic / "__init__.py").exists():
            continue
        for f in sorted(topic.glob("*.py")):
            if not f.name.startswith("_"):
                found.append(f"benchmarks.{topic.name}.{f.stem}")
    return found


def _call_main(main: Callable[..., Any]) -> Any:
    """``main(["--smoke"])``, or for a ``main()`` that reads sys.argv, with sys.argv so set."""
    import inspect

    if inspect.signature(main).parameters:
        return main(["--smoke"])
    saved = sys.argv
    sys.argv = [main.__module__, "--smoke"]
    try:
        return main()
    finally:
        sys.argv = saved


def _smoke(modules: list[str]) -> int:
    import importlib

    failed = []
    for name in modules:
        t0 = time.perf_counter()
        print(f"== {name} --smoke", flush=True)
        try:
            rc = _call_main(importlib.import_module(name).main)
        except SystemExit as e:
            rc = e.code
        except Exception as e:  # reported with the script's name, the others still run
            import traceback

            traceback.print_exc()
            rc = f"{type(e).__name__}: {e}"
        if rc not in (None, 0):
            failed.append(f"{name}: {rc}")
        print(f"== {name}: {time.perf_counter() - t0:.1f} s, exit {rc or 0}", flush=True)
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="run benchmark scripts' --smoke in one process")
    ap.add_argument("--smoke", nargs="*", default=None, help="modules (default: every script)")
    ap.add_argument("--list", action="store_true", help="print every script's module name")
    a = ap.parse_args()
    if a.list:
        print("\n".join(scripts()))
    elif a.smoke is not None:
        sys.exit(_smoke(a.smoke or scripts()))
    else:
        print_header()
