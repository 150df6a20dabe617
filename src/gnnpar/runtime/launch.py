"""Start N local ranks with torch's elastic launcher (what ``torchrun`` runs underneath).

    gnnpar train --strategy allreduce --partitions 8 --workers 2      # this module
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m gnnpar train --strategy allreduce --partitions 64           # not this module

``gnnpar train --workers N`` calls :func:`launch` with :func:`gnnpar.run.run_rank`'s wrapper:
one elastic agent in this process (``torch.distributed.launcher.api.elastic_launch``, c10d
rendezvous on a free localhost port, restarts only with --max-restarts) starts the ranks, which run exactly what a
torchrun rank runs, so ranks coordinate only through torch.distributed (process group and its
TCP store): nothing here is shared between ranks but the environment torch's launcher sets.
The ranks are forks of a fork server that imported torch, PyG and gnnpar once
(:func:`start_method`), so those pages sit in memory once per machine, not once per rank.

Failures: the first rank to fail ends the run; the agent stops the others. Of the ranks that
failed, the one that explains the run is reported (torch's agent reports the first it saw exit,
often one that died of another's failure), from every rank's error file. A
:class:`gnnpar.UsageError` raised in a rank (bad input found only once data is loaded) is raised
again here, so the CLI exits 2 with its message; any other failure becomes
:class:`gnnpar.RankFailedError` ("rank R failed: <cause>", CLI exit 1), with the full traceback left
in a per-rank log file named in the message (that log folder is kept then; on every other exit,
success, Ctrl-C or a failure whose message does not point there, it is removed). Every wait inside a rank has a timeout
(``--timeout``), so a stuck collective turns into a failure instead of a hang.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gnnpar import omp
from gnnpar.errors import RankFailedError, UsageError
from gnnpar.runtime import resources

_USAGE_PREFIX = "UsageError: "
_COLLECTIVE_PREFIX = "CollectiveFailedError: "  # dist.CollectiveFailedError, as @record writes it

# What one rank holds before it loads any data: Python, torch, PyG. Measured 2026-11-22 on the CI
# box (torch 2.13 CPU): ~235 MiB anonymous memory (smaps_rollup) per spawned rank; 200 MiB
# keeps the figure a lower bound.
RANK_BASELINE_BYTES = 200 * 2**20
# A rank forked from the fork server (start_method's default) shares those pages with the server
# and holds ~7 MiB of its own before it does anything (measured likewise); 4 MiB, a lower bound.
FORKED_RANK_BYTES = 4 * 2**20
GIB = 2**30
# The modules the fork server imports after torch and PyG (comma-separated; read, and taken out
# of the server's environment, by gnnpar.runtime.preload, which names the variable itself)
PRELOAD_MODULES_ENV = "GNNPAR_PRELOAD_MODULES"
# What ``gnnpar train``'s ranks import later than gnnpar.run (where their function is): what the
# strategies' builds import when a rank runs one (strategies/*.py import them inside build(), so
# that the specs stay torch-free). The fork server imports them before it forks the ranks, which
# then share their pages (runtime/preload.py).
TRAIN_RANK_MODULES = (
    "gnnpar.data.partition",
    "gnnpar.data.sampling.loader",
    "gnnpar.training.evaluation",
    "gnnpar.training.final_model",
    "gnnpar.training.gossip_sync",
    "gnnpar.training.pipeline_step",
    "gnnpar.training.sources",
    "gnnpar.training.sync",
)


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
    if message.startswith(_COLLECTIVE_PREFIX):
        return 2  # dist.peer_failure's message for the same, in gnnpar's words
    if message.startswith("Signal ") or "To enable traceback" in message:
        return 3  # stopped by the agent (or killed): no exception of its own
    return 1


_ELASTIC_ENV = (  # what torch's agent sets for each rank (local_elastic_agent, _wrap)
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
)  # fmt: skip


def start_method() -> str:
    """``forkserver`` (the default), or ``spawn`` when ``GNNPAR_START_METHOD=spawn`` asks for it.

    With ``forkserver`` a fresh, single-threaded interpreter imports torch, PyG and gnnpar once
    (:mod:`gnnpar.runtime.preload`) and every local rank is a fork of it: the ranks share those
    pages (~0.2 GiB of private memory per spawned process) copy-on-write, so 4 ranks of a
    1M-edge user graph use 1.2x one rank's memory instead of 1.7x (BENCHMARKS.md), and a rank
    starts without importing torch. The server is a child of no thread-running process, so a
    rank cannot inherit a lock held by one of this process's threads (torch's elastic agent runs
    several), which is why ranks are not forked from this process itself. The server is started
    by the first launch and serves every later one from this process (a notebook's), until this
    process ends. ``spawn`` starts each rank as a fresh interpreter.

    With CUDA, ``spawn``: the fork server's imports ask the CUDA driver how many GPUs there are
    (``torch.cuda.is_available``), and a process forked from one that did gets "CUDA error:
    initialization error" at its first CUDA call (seen on an H200 with torch 2.11, every rank,
    also those training on the CPU)."""
    asked = os.environ.get("GNNPAR_START_METHOD", "")
    if asked not in ("", "forkserver", "spawn"):
        raise UsageError(
            f"GNNPAR_START_METHOD={asked!r}: use forkserver (the default) or spawn, or leave it unset."
        )
    if asked:
        return asked
    return "spawn" if cuda_machine() else "forkserver"


def cuda_machine() -> bool:
    """Whether ranks started from here may use a GPU: torch's answer where this process has
    imported torch; else, without importing it (the fork server is started before this process
    imports torch, so that the two import at once), whether an NVIDIA (or ROCm) driver is
    loaded. A machine with the driver and a CPU-only torch then spawns its ranks too: more
    memory, the same results."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.cuda.is_available())
    return any(os.path.exists(p) for p in GPU_DRIVER_NODES)


GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")


def check_ranks(nprocs: int) -> None:
    """UsageError when ``nprocs`` local ranks could not even start in the available memory
    (:func:`gnnpar.runtime.footprint.available_bytes`): spawned, each is a whole interpreter with
    torch and PyG (:data:`RANK_BASELINE_BYTES`); forked from the fork server, they share one (the
    server's) and add little each (:data:`FORKED_RANK_BYTES`)."""
    import torch

    from gnnpar.runtime import footprint

    budget = footprint.memory_budget(torch.device("cpu"))
    free = None if budget is None else budget.free
    if start_method() == "forkserver":
        need = RANK_BASELINE_BYTES + nprocs * FORKED_RANK_BYTES
        what = (
            f"a fork server of at least {RANK_BASELINE_BYTES / 2**20:.0f} MiB and {nprocs} "
            f"ranks forked from it ({need / GIB:.1f} GiB before any data)"
        )
    else:
        need = nprocs * RANK_BASELINE_BYTES
        what = (
            f"{nprocs} processes of at least {RANK_BASELINE_BYTES / 2**20:.0f} MiB each "
            f"({need / GIB:.1f} GiB before any data)"
        )
    if free is not None and need > free:
        raise UsageError(
            f"--workers {nprocs} starts {what}, but "
            f"{footprint.where_available(budget, torch.device('cpu'))}. Use fewer --workers, "
            "or torchrun across several machines."
        )


def started_as_rank() -> bool:
    """This process is one rank of many, started by torchrun or srun (whose variables
    :func:`gnnpar.runtime.slurm.adopt` turns into torchrun's later): it launches no ranks."""
    return ("RANK" in os.environ and "WORLD_SIZE" in os.environ) or "SLURM_PROCID" in os.environ


def rank_threads(nprocs: int, threads: int | None) -> int:
    """OpenMP threads per local rank: ``threads``, or the host's cores shared out between
    ``nprocs`` ranks (what :func:`launch` puts in ``OMP_NUM_THREADS`` for them)."""
    return threads or max(1, (os.cpu_count() or 1) // nprocs)


def start_fork_server_early(workers: int, threads: int | None, warm: tuple[str, ...]) -> bool:
    """Start the fork server now, for a launch of ``workers`` local ranks that this process
    will make once it has imported torch itself (the CLI, before it imports :mod:`gnnpar.run`):
    the server's imports (~2 s: torch, PyG, gnnpar's rank modules ``warm``) then overlap this
    process's own instead of following them. The server is started as :func:`launch` starts it:
    SIGINT ignored, ``OMP_NUM_THREADS`` the cores shared out between the ranks. Nothing is
    started for one rank, under torchrun or srun (this process is a rank), or with ``spawn``.
    Returns whether it started one."""
    if workers <= 1 or started_as_rank() or start_method() != "forkserver":
        return False
    if "OMP_NUM_THREADS" not in os.environ:  # what launch() sets: the ranks inherit it
        os.environ["OMP_NUM_THREADS"] = str(rank_threads(workers, threads))
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _start_fork_server(",".join(warm))
    finally:
        signal.signal(signal.SIGINT, old)
    return True


def start_fork_server_for_ranks(nprocs: int, threads: int | None, warm: tuple[str, ...]) -> bool:
    """Start the fork server now as :func:`launch` of ``nprocs`` ranks would (the ranks'
    OpenMP wait policy and thread count in its environment, SIGINT ignored, ``warm`` imported),
    for a process that starts other processes from it first (``gnnpar advise``'s profile
    starts sampled's loader workers before its two ranks). The server is started once per
    process: one started for loader workers would fork the ranks too, with a 1-process
    environment (on a 2-vCPU AMD EPYC its ranks' co-run came out 1.0x instead of the 1.15-1.2x
    a ``gnnpar train`` of two ranks has). Changes nothing in this process's environment.
    Nothing is started with ``spawn``; returns whether it started one."""
    if start_method() != "forkserver":
        return False
    old = os.environ.get("OMP_NUM_THREADS")
    if old is None:  # what launch() sets
        os.environ["OMP_NUM_THREADS"] = str(rank_threads(nprocs, threads))
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with omp.ranks_sleep_at_once():
            _start_fork_server(",".join(warm))
    finally:
        signal.signal(signal.SIGINT, sigint)
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return True


def _start_fork_server(warm: str) -> None:
    """Start multiprocessing's fork server (once per process) with the ranks' imports: torch and
    PyG (:mod:`gnnpar.runtime.preload`), then the modules ``warm`` (comma-separated: the rank
    function's, for ``gnnpar train`` :mod:`gnnpar.run`, and what its ranks import later), named in
    :data:`PRELOAD_MODULES_ENV` for the server alone (this process does not import the preload
    module: it freezes the collector). Called while SIGINT is ignored
    (:func:`_ranks_ignore_ctrl_c`): the server inherits that, and so do the ranks forked from it."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["gnnpar.runtime.preload"])
    os.environ[PRELOAD_MODULES_ENV] = warm
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.pop(PRELOAD_MODULES_ENV, None)


def _end_with_launcher(pid: int) -> None:
    """SIGTERM this rank when the launcher ``pid`` ends, however it ended: a launcher killed
    with SIGKILL (by a user, the OOM killer, a scheduler) must not leave ranks training on
    their own. A spawned rank could ask the kernel for that (PR_SET_PDEATHSIG), but a forked
    rank's parent is the fork server, which outlives the launcher while its children run; so a
    daemon thread waits on a pidfd of the launcher (Linux 5.3+; elsewhere the ranks end at
    their next collective's timeout instead)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # it is gone already
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (AttributeError, OSError):
        return

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="gnnpar-launcher-watch", daemon=True).start()


def _rank_entry(fn: Callable[..., Any], launcher: int, env: dict[str, str], *args: Any) -> Any:
    """A rank forked from the fork server: give it the environment a spawned rank would have,
    and end it with its launcher (:func:`_end_with_launcher`).

    The server was started by an earlier launch, maybe with another environment (a notebook
    that calls :func:`gnnpar.fit` twice, a test that changed ``GNNPAR_DATA``): the rank takes
    ``env``, this launch's environment, plus what torch's agent set for this rank (the variables
    that differ from the server's own, and the agent's names in :data:`_ELASTIC_ENV`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the run on Ctrl-C
    _end_with_launcher(launcher)
    from gnnpar.runtime import preload

    set_here = {
        k: v
        for k, v in os.environ.items()
        if preload.SERVER_ENV.get(k) != v or k in _ELASTIC_ENV or k.startswith("TORCHELASTIC_")
    }
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(set_here)
    return fn(*args)


def launch_settings(settings: dict) -> dict:
    """The LaunchConfig settings this torch knows. torch >= 2.4 is supported and LaunchConfig
    gained fields since (2.11 has no ``shutdown_timeout`` nor ``signals_to_handle``): an older
    torch keeps its defaults for those (a hung rank is killed after 30 s, not 2 s)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return {k: v for k, v in settings.items() if k in known}


def launch(
    fn: Callable[..., Any],
    args: tuple,
    nprocs: int,
    timeout_s: float,
    threads: int | None = None,
    max_restarts: int = 0,
    warm: tuple[str, ...] = (),
) -> dict[int, Any]:
    """Run ``fn(*args, log_dir)`` on ``nprocs`` local ranks; return {rank: return value}.

    ``fn`` must be importable by name (module level): ranks are started with :func:`start_method`.
    The fork server imports ``fn``'s module and the modules named in ``warm`` (what the ranks
    import later, e.g. inside a function) before any rank is forked from it, so the ranks share
    their pages (and those of everything they import) instead of importing them each.

    Why one function: the fork server, the ranks' log files and torch's agent are started and
    watched inside one ``try``/``finally`` that stops them on every way out (success, a failed
    rank, Ctrl-C, a timeout).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gnnpar.runtime.heartbeat import OWN_LAUNCHER_ENV  # set for the ranks started here

    timeout = max(1, int(timeout_s))
    method = start_method()
    log_dir = tempfile.mkdtemp(prefix="gnnpar-ranks-")
    settings = dict(
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
        start_method=method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",  # not SIGINT: _ranks_ignore_ctrl_c
    )
    launch_cfg = LaunchConfig(**launch_settings(settings))
    # OMP reads its thread count at start-up, so it is set before spawning (children inherit
    # it): the cores shared out between local ranks. run_rank sets torch's count again per rank.
    old_omp = os.environ.get("OMP_NUM_THREADS")
    if old_omp is None:
        os.environ["OMP_NUM_THREADS"] = str(rank_threads(nprocs, threads))
    # the ranks' own failure reports (heartbeat.py) come back through this launcher, not stderr
    old_own = os.environ.get(OWN_LAUNCHER_ENV)
    os.environ[OWN_LAUNCHER_ENV] = "1"
    # The agent's own chatter (and "Terminating process" notices when it stops the survivors of
    # a failure) would bury the one line that matters; failures are reported by _describe.
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    # the agent's own logger has a level of its own (torch's LOGLEVEL, WARNING by default): its
    # "will restart" record is INFO
    agent_log = logging.getLogger("torch.distributed.elastic.agent.server.api")
    old_agent_level = agent_log.level
    if max_restarts:
        agent_log.setLevel(logging.INFO)
    old_levels = [lg.level for lg in loggers]
    old_propagate = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO if max_restarts else logging.CRITICAL)
        lg.propagate = False  # their records reach _RestartNotes only, never the screen
    keep_logs = False  # the rank logs go, whatever the exit, unless the error names them
    notes = _RestartNotes(max_restarts, log_dir, nprocs)
    for lg in loggers:  # the agent's records of a failed rank and of a restart, told in one line
        lg.addHandler(notes)
    entry, entry_args = fn, (*args, log_dir)
    oom_before = resources.oom_kills()  # a rank killed by SIGKILL: was it the OOM killer?
    try:
        # several ranks share this host's cores: their idle OpenMP threads sleep at once
        with _ranks_ignore_ctrl_c(nprocs), omp.ranks_sleep_at_once():
            if method == "forkserver":
                entry, entry_args = _rank_entry, (fn, os.getpid(), dict(os.environ), *args, log_dir)
                _start_fork_server(",".join((fn.__module__, *warm)))
            outputs = elastic_launch(launch_cfg, entry)(*entry_args)
    except ChildFailedError as e:
        oom = _killed_for_memory(e, oom_before)
        if oom is not None:
            raise oom from None
        error = _describe(e, log_dir)
        keep_logs = log_dir in str(error)  # "Traceback: <log_dir>/rank1.traceback.txt"
        raise error from None
    except SignalException:  # Ctrl-C or SIGTERM reached the agent; it has stopped the ranks
        raise KeyboardInterrupt from None
    finally:
        agent_log.setLevel(old_agent_level)
        for lg, level, propagate in zip(loggers, old_levels, old_propagate):
            lg.removeHandler(notes)
            lg.setLevel(level)
            lg.propagate = propagate
        if old_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        if old_own is None:
            os.environ.pop(OWN_LAUNCHER_ENV, None)
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    return outputs


class _RestartNotes(logging.Handler):
    """Under ``--max-restarts``: a restart of the ranks is told on stderr, in one line naming the
    rank that failed, of what, and which restart this is, e.g. ``gnnpar: rank 1 (pid 4242) died
    of SIGKILL; restart 1 of 2: every rank starts again and resumes from the newest
    checkpoint``. The ranks' own ``resuming from ...`` line follows.

    torch's elastic agent restarts the ranks inside ``elastic_launch`` and tells it only in its
    log: a record ``failed (exitcode: C) local_rank: R (pid: P) ...`` from its process context
    when a rank exits non-zero (C < 0: killed by signal -C) and ``... attempts left; will
    restart worker group`` from the agent. This handler reads those two records (their
    arguments, not their text) and drops every other. A rank that raised left its error in
    its error file; the line carries its first line. Where the rank the agent saw first only
    failed because a peer died (its error is about the lost peer) and a peer left no report,
    that peer is named first: it was killed."""

    def __init__(self, max_restarts: int, log_dir: str, nprocs: int = 1) -> None:
        super().__init__(logging.INFO)
        self.max_restarts, self.log_dir, self.nprocs = max_restarts, log_dir, nprocs
        self.restarts = 0
        self.failed: tuple[int, int, int] | None = None  # (local rank, pid, exit code)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text, args = str(record.msg), record.args
            if text.startswith("failed (exitcode") and isinstance(args, tuple) and len(args) >= 3:
                self.failed = (int(args[1]), int(args[2]), int(args[0]))
            elif "will restart worker group" in text and "attempts left" in text:
                self.restarts += 1
                print(self.line(), file=sys.stderr, flush=True)
                self.failed = None
        except Exception:  # a record of another shape (another torch): never break the run
            self.handleError(record)

    def line(self) -> str:
        what = "a rank failed"
        if self.failed is not None:
            rank, pid, code = self.failed
            what = f"rank {rank} (pid {pid}) {self.cause(rank, code)}"
            said = self.errors().get(rank, "")
            silent = sorted(set(range(self.nprocs)) - set(self.errors()) - {rank})
            if code > 0 and _collateral(said) == 2 and silent:
                # the agent saw first a rank that failed because a peer had died: the peer that
                # left no error report was killed (a signal, the out-of-memory killer)
                who = ", ".join(map(str, silent))
                what = f"rank {who} died without an error report (killed?), then {what}"
        return (
            f"gnnpar: {what}; restart {self.restarts} of {self.max_restarts}: every rank starts "
            "again and resumes from the newest checkpoint"
        )

    def cause(self, rank: int, code: int) -> str:
        if code < 0:
            try:
                return f"died of {signal.Signals(-code).name}"
            except ValueError:
                return f"died of signal {-code}"
        first = self.errors().get(rank, "").split("\n")[0][:300]
        return f"exited with code {code}" + (f": {first}" if first else "")

    def errors(self) -> dict[int, str]:
        """{local rank: its error message} of the attempt that failed (torch's @record files)."""
        found = {}
        for path in Path(self.log_dir).glob(f"*/attempt_{self.restarts - 1}/*/error.json"):
            try:
                message = json.loads(path.read_text())["message"]["message"]
                found[int(path.parent.name)] = str(message).strip()
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a rank killed while writing it
        return found


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


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _spawned_children() -> list[int]:
    """Pids of the ranks, from /proc: this process's children (spawned ranks) but not
    multiprocessing's resource tracker and fork server, and the fork server's children (ranks
    forked from it, whose command line is the server's)."""
    pids = []
    for pid in _children(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"forkserver" in cmdline:
            pids += _children(pid)
        elif b"resource_tracker" not in cmdline:
            pids.append(pid)
    return pids


def _killed_for_memory(e: Any, before: dict) -> Exception | None:
    """A :class:`~gnnpar.UsageError` (exit 2) naming the rank that the kernel's OOM
    killer killed (SIGKILL, while its count of kills in this process's memory cgroups, or the
    machine's, went up since ``before``: :func:`gnnpar.runtime.resources.oom_kills`) and the
    limit it enforced; None when no rank died of SIGKILL or the OOM killer killed nobody."""
    killed = sorted(
        (f.timestamp, rank)
        for rank, f in e.failures.items()
        if getattr(f, "exitcode", None) == -signal.SIGKILL
    )
    if not killed:
        return None
    words = resources.killed_by_memory_limit(before, resources.oom_kills())
    if words is None:
        return None
    rank = killed[0][1]
    return UsageError(
        f"rank {rank} was killed by {words}: it needed more memory than that. Use a smaller "
        "--batch-size or --hidden, fewer --workers, or run where the limit is higher."
    )


def _error_files(log_dir: str) -> dict[int, tuple[int, Any]]:
    """{local rank: (timestamp, message)} from the error files of the newest attempt that torch's
    @record wrote under ``log_dir`` (``<run>/attempt_<n>/<local rank>/error.json``)."""
    newest: dict[int, tuple[int, int, Any]] = {}
    for path in Path(log_dir).glob("*/attempt_*/*/error.json"):
        try:
            attempt = int(path.parent.parent.name.removeprefix("attempt_"))
            rank = int(path.parent.name)
            message = json.loads(path.read_text())["message"]
            timestamp = int(message.get("extraInfo", {}).get("timestamp", 0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a rank killed while writing it: the others explain the run
        if rank not in newest or attempt > newest[rank][0]:
            newest[rank] = (attempt, timestamp, message)
    return {rank: (t, m) for rank, (_, t, m) in newest.items()}


def _describe(e: Any, log_dir: str) -> Exception:
    """The exception that explains a failed launch: the root-cause rank and its message."""
    reports = {rank: (f.timestamp, f.message, True) for rank, f in e.failures.items()}
    # torch's agent reports the first rank it saw exit, which may be one that died of another
    # rank's failure: every rank that raised left an error file, so all of them are read
    for rank, (timestamp, message) in _error_files(log_dir).items():
        reports.setdefault(rank, (timestamp, message, False))
    failures = []
    for rank, (timestamp, raw, first_exit) in reports.items():
        data = raw if isinstance(raw, dict) else {"message": str(raw)}
        message = str(data.get("message", "")).strip()
        stack = data.get("extraInfo", {}).get("py_callstack")
        if stack:
            Path(log_dir, f"rank{rank}.traceback.txt").write_text(stack)
        kind = _collateral(message)
        if first_exit and kind == 3:
            # killed (or ended without an error file) before any other rank exited: a cause,
            # not one of the survivors the agent stopped after a failure (they are not reported)
            kind = 1
        failures.append((timestamp, kind, rank, message))
    if not failures:
        return RankFailedError(f"the ranks failed without a report (logs in {log_dir}).")
    # A UsageError anywhere wins (it explains the run). A rank's report that a peer stalled
    # comes next (the stalled rank itself is killed, which the agent sees first). Then the least
    # collateral kind, then the earliest (error files count whole seconds).
    stalled = "PeerStalledError"
    failures.sort(key=lambda t: (t[1] != 0, not t[3].startswith(stalled), t[1], t[0], t[2]))
    _, _, rank, message = failures[0]
    if message.startswith(_USAGE_PREFIX):
        return UsageError(message[len(_USAGE_PREFIX) :])
    head = f"rank {rank} failed: "
    if message.startswith(_COLLECTIVE_PREFIX):  # it names the rank itself
        message, head = message[len(_COLLECTIVE_PREFIX) :], ""
    others = sorted(r for _, _, r, _ in failures[1:])
    also = f" (then also rank {', '.join(map(str, others))})" if others else ""
    tb = Path(log_dir, f"rank{rank}.traceback.txt")
    where = f" Traceback: {tb}" if tb.exists() else f" Logs: {log_dir}"
    return RankFailedError(f"{head}{message.rstrip('.')}{also}.{where}")
