"""Start N local ranks with torch's elastic launcher (what ``torchrun`` runs underneath).

    gnnpar train --strategy allreduce --partitions 8 --workers 2      # this module
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m gnnpar train --strategy allreduce --partitions 64           # not this module

``gnnpar train --workers N`` calls :func:`launch` with :func:`gnnpar.train.run_rank`'s wrapper:
one elastic agent in this process (``torch.distributed.launcher.api.elastic_launch``, c10d
rendezvous on a free localhost port, restarts only with --max-restarts) starts the ranks, which run exactly what a
torchrun rank runs, so ranks coordinate only through torch.distributed (process group and its
TCP store): nothing here is shared between ranks but the environment torch's launcher sets.

Failures: the first rank to fail ends the run; the agent stops the others. A
:class:`gnnpar.UsageError` raised in a rank (bad input found only once data is loaded) is raised
again here, so the CLI exits 2 with its message; any other failure becomes
:class:`gnnpar.RankFailedError` ("rank R failed: <cause>", CLI exit 1), with the full traceback left
in a per-rank log file named in the message (that log folder is kept then; on every other exit,
success, Ctrl-C or a failure whose message does not point there, it is removed). Every wait inside a rank has a timeout
(``--timeout``), so a stuck collective turns into a failure instead of a hang.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gnnpar import RankFailedError, UsageError

_USAGE_PREFIX = "UsageError: "


def free_port() -> int:
    """A TCP port on localhost that nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collateral(message: str) -> int:
    """Order failures so that the cause is reported, not the ranks that died because of it."""
    if message.startswith(_USAGE_PREFIX):
        return 0
    if message.startswith(("DistBackendError", "DistNetworkError", "DistStoreError")):
        return 2
    if "Connection closed by peer" in message or "Connection reset by peer" in message:
        return 2  # gloo's RuntimeError when the peer it talked to died (the peer is the cause)  # a peer vanished or timed out: usually the consequence of another failure
    if message.startswith("StoreUnreachableError"):
        return 2  # dist.setup's message for the same, when the group is being formed
    if message.startswith("Signal ") or "To enable traceback" in message:
        return 3  # stopped by the agent (or killed): no exception of its own
    return 1


_threads_when_clean: int | None = None  # set by allow_fork(): the command line's own process


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1


def allow_fork() -> None:
    """Let :func:`launch` fork: called by the command line once torch is imported and before
    anything computes. It records the process's thread count; a later launch forks only while
    the count is unchanged, i.e. no OpenMP pool (or other thread) was started since: a forked
    child that uses an OpenMP pool its parent had running hangs (seen with torch 2.13's libgomp:
    a matmul on 4 threads in the parent, then in a forked child, never returns)."""
    global _threads_when_clean
    _threads_when_clean = _native_threads()


def _default_signals_in_forked_rank() -> None:
    """A forked rank inherits this process's Python signal handlers, among them torch's agent's
    SIGTERM handler (which raises, with a traceback, where a fresh interpreter just ends):
    back to the defaults a spawned rank starts with. SIGINT stays as the launch set it."""
    if _launching:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)


_launching = False  # True while launch() starts ranks: forks then are ranks
os.register_at_fork(after_in_child=_default_signals_in_forked_rank)


def start_method() -> str:
    """``spawn``, unless ``GNNPAR_START_METHOD=fork`` asks for ``fork`` and it is safe here.

    Forked ranks share this process's pages copy-on-write: the interpreter with torch, PyG and
    gnnpar imported (~0.2 GiB of private memory per process) sits in RAM once, not once per rank
    (BENCHMARKS.md, memory of a user graph: 1.72x -> 1.26-1.29x one rank). It is not the
    default: the ranks are forked while torch's elastic agent runs threads (its rendezvous
    store), and a child can inherit a lock one of them held; in one CI run a forked 2-rank
    pipeline never formed its gloo group. Safe means: the command line's own process
    (:func:`allow_fork`) with no thread started since, and CUDA not initialised."""
    import torch

    asked = os.environ.get("GNNPAR_START_METHOD", "")
    if asked not in ("", "fork", "spawn"):
        raise UsageError(f"GNNPAR_START_METHOD={asked!r}: use fork or spawn (or leave it unset).")
    if asked != "fork" or torch.cuda.is_initialized():
        return "spawn"
    clean = _threads_when_clean is not None and _native_threads() <= _threads_when_clean
    return "fork" if clean else "spawn"


def launch(
    fn: Callable[..., Any],
    args: tuple,
    nprocs: int,
    timeout_s: float,
    threads: int | None = None,
    max_restarts: int = 0,
) -> dict[int, Any]:
    """Run ``fn(*args, log_dir)`` on ``nprocs`` local ranks; return {rank: return value}.

    ``fn`` must be importable by name (module level): ranks are started with :func:`start_method`.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    timeout = max(1, int(timeout_s))
    log_dir = tempfile.mkdtemp(prefix="gnnpar-ranks-")
    launch_cfg = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"gnnpar-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"timeout": timeout, "join_timeout": timeout},
        # a failed rank fails the run, unless restarts were asked for: then the agent starts
        # every rank again (they resume from the newest checkpoint, train.checkpointer)
        max_restarts=max_restarts,
        # after a failure the survivors get SIGTERM, then SIGKILL after this: a stopped
        # (SIGSTOPped, hung) rank never acts on SIGTERM, and must not hold the run for long
        shutdown_timeout=2,
        monitor_interval=0.1,
        start_method=start_method(),
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",  # not SIGINT: _ranks_ignore_ctrl_c
    )
    # OMP reads its thread count at start-up, so it is set before spawning (children inherit
    # it): the cores shared out between local ranks. run_rank sets torch's count again per rank.
    old_omp = os.environ.get("OMP_NUM_THREADS")
    if old_omp is None:
        os.environ["OMP_NUM_THREADS"] = str(threads or max(1, (os.cpu_count() or 1) // nprocs))
    # The agent's own chatter (and "Terminating process" notices when it stops the survivors of
    # a failure) would bury the one line that matters; failures are reported by _describe.
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    old_levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    keep_logs = False  # the rank logs go, whatever the exit, unless the error names them
    global _launching
    _launching = True
    if launch_cfg.start_method == "fork":
        # objects that exist now move to a generation the collector never visits, so the ranks'
        # collections do not write to (and so copy) the pages they share with this process
        gc.collect()
        gc.freeze()
    try:
        with _ranks_ignore_ctrl_c(nprocs):
            outputs = elastic_launch(launch_cfg, fn)(*args, log_dir)
    except ChildFailedError as e:
        error = _describe(e, log_dir)
        keep_logs = log_dir in str(error)  # "Traceback: <log_dir>/rank1.traceback.txt"
        raise error from None
    except SignalException:  # Ctrl-C or SIGTERM reached the agent; it has stopped the ranks
        raise KeyboardInterrupt from None
    finally:
        _launching = False
        gc.unfreeze()
        for lg, level in zip(loggers, old_levels):
            lg.setLevel(level)
        if old_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    return outputs


@contextlib.contextmanager
def _ranks_ignore_ctrl_c(nprocs: int) -> Iterator[None]:
    """Ranks are born ignoring SIGINT, so that a Ctrl-C (which the terminal sends to every
    process of the group) prints no KeyboardInterrupt traceback from each rank, even while it
    is still importing torch; this process notices it and has the agent stop them (SIGTERM,
    which ends them silently), then exits 130.

    An ignored signal stays ignored through fork and exec (a handler does not), so SIGINT is
    ignored here until the ``nprocs`` ranks exist (torch's agent is told not to install its own
    SIGINT handler: ``LaunchConfig.signals_to_handle``). A helper thread watches for them and
    then signals this process (SIGUSR1), whose handler, run by Python in the main thread,
    installs the SIGINT handler that stops the run. A Ctrl-C in the short time before the
    ranks exist is lost; ranks restarted by ``--max-restarts`` are born with that handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    from torch.distributed.elastic.multiprocessing import SignalException

    def stop_run(signum: int, frame: Any) -> None:
        raise SignalException("Ctrl-C", signal.SIGTERM)  # the agent stops the ranks so

    def listen(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, stop_run)

    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_usr1 = signal.signal(signal.SIGUSR1, listen)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if len(_spawned_children()) >= nprocs:
                os.kill(os.getpid(), signal.SIGUSR1)
                return

    helper = threading.Thread(target=watch, name="gnnpar-ctrl-c", daemon=True)
    helper.start()
    try:
        yield
    finally:
        done.set()
        helper.join()
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGINT, old_int)


def _spawned_children() -> list[int]:
    """Pids of this process's children that are ranks (forked or spawned; not multiprocessing's
    resource tracker or fork server), from /proc."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"resource_tracker" not in cmdline and b"forkserver" not in cmdline:
                    pids.append(int(pid))
            except OSError:
                continue
    return pids


def _describe(e: Any, log_dir: str) -> Exception:
    """The exception that explains a failed launch: the root-cause rank and its message."""
    failures = []
    for rank, f in e.failures.items():
        data = f.message if isinstance(f.message, dict) else {"message": str(f.message)}
        message = str(data.get("message", "")).strip()
        stack = data.get("extraInfo", {}).get("py_callstack")
        if stack:
            Path(log_dir, f"rank{rank}.traceback.txt").write_text(stack)
        failures.append((f.timestamp, _collateral(message), rank, message))
    if not failures:
        return RankFailedError(f"the ranks failed without a report (logs in {log_dir}).")
    # A UsageError anywhere wins (it explains the run); then the earliest, least collateral one.
    # a rank's report that a peer stalled explains the run (the stalled rank itself is killed,
    # which the agent sees first): it comes right after a usage error
    stalled = "PeerStalledError"
    failures.sort(key=lambda t: (t[1] != 0, not t[3].startswith(stalled), t[0], t[1], t[2]))
    _, _, rank, message = failures[0]
    if message.startswith(_USAGE_PREFIX):
        return UsageError(message[len(_USAGE_PREFIX) :])
    others = sorted(r for _, _, r, _ in failures[1:])
    also = f" (then also rank {', '.join(map(str, others))})" if others else ""
    tb = Path(log_dir, f"rank{rank}.traceback.txt")
    where = f" Traceback: {tb}" if tb.exists() else f" Logs: {log_dir}"
    return RankFailedError(f"rank {rank} failed: {message.rstrip('.')}{also}.{where}")
