"""Local launching through torch's elastic agent: results come back, failures name their rank."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from gnnpar import RankFailedError, UsageError
from gnnpar.runtime.launch import _collateral, launch, launch_settings


def _rank_fn(mode: str, log_dir: str) -> dict:
    """Runs in each spawned rank (module level so that spawn can import it)."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    if rank == 1 and mode == "raise":
        raise ValueError("boom on rank 1")
    if rank == 1 and mode == "usage":
        raise UsageError("bad input found on rank 1")
    if rank == 1 and mode == "hang":
        time.sleep(600)  # never reaches the barrier: rank 0's wait must time out
    dist.barrier()
    world = dist.get_world_size()
    dist.destroy_process_group()
    return {"rank": rank, "world": world}


@pytest.fixture
def log_root(tmp_path, monkeypatch):
    """Where launch() makes its gnnpar-ranks-* log folder (tempfile's folder, redirected)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _log_dirs(root) -> list:  # noqa: ANN001
    return sorted(root.glob("gnnpar-ranks-*"))


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_launch_returns_every_ranks_value(log_root):
    out = launch(_rank_fn, ("ok",), 2, timeout_s=30)
    assert out == {0: {"rank": 0, "world": 2}, 1: {"rank": 1, "world": 2}}
    assert _log_dirs(log_root) == []  # the rank logs go once the run succeeded


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_naming_rank_and_cause(log_root):
    with pytest.raises(RankFailedError) as info:
        launch(_rank_fn, ("raise",), 2, timeout_s=30)
    message = str(info.value)
    assert message.startswith("rank 1 failed: ValueError: boom on rank 1")
    assert "Traceback:" in message and "\n" not in message  # one line, traceback in a file
    traceback = message.split("Traceback: ")[1]
    assert os.path.isfile(traceback) and "boom on rank 1" in open(traceback).read()
    assert [str(d) for d in _log_dirs(log_root)] == [os.path.dirname(traceback)]  # kept: named


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_usage_error_in_a_rank_leaves_no_log_folder(log_root):
    with pytest.raises(UsageError, match="bad input found on rank 1"):
        launch(_rank_fn, ("usage",), 2, timeout_s=30)
    assert _log_dirs(log_root) == []  # the message does not point there: nothing to keep


def _fake_agent(monkeypatch, outcome) -> None:  # noqa: ANN001
    """Replace torch's elastic agent: ``outcome`` is returned, or raised if an exception."""
    import torch.distributed.launcher.api as api

    def elastic_launch(config, fn):  # noqa: ANN001
        def run(*args):  # noqa: ANN002
            assert os.path.isdir(args[-1])  # the ranks' log folder exists while they run
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        return run

    monkeypatch.setattr(api, "elastic_launch", elastic_launch)


def _child_failed(message: str, stack: str | None = None):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    error = ChildFailedError.__new__(ChildFailedError)  # skip reading real error files
    data = {"message": message, "extraInfo": {"py_callstack": stack} if stack else {}}
    error.failures = {1: SimpleNamespace(message=data, timestamp=1)}
    return error


def test_the_log_folder_goes_on_every_exit_unless_the_error_names_it(log_root, monkeypatch):
    from torch.distributed.elastic.multiprocessing import SignalException

    _fake_agent(monkeypatch, {0: "done"})
    assert launch(_rank_fn, (), 2, timeout_s=5) == {0: "done"}
    assert _log_dirs(log_root) == []
    _fake_agent(monkeypatch, SignalException("Ctrl-C", signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        launch(_rank_fn, (), 2, timeout_s=5)
    assert _log_dirs(log_root) == []
    _fake_agent(monkeypatch, _child_failed("UsageError: bad flag"))
    with pytest.raises(UsageError, match="bad flag"):
        launch(_rank_fn, (), 2, timeout_s=5)
    assert _log_dirs(log_root) == []
    _fake_agent(monkeypatch, RuntimeError("rendezvous failed"))
    with pytest.raises(RuntimeError, match="rendezvous failed"):
        launch(_rank_fn, (), 2, timeout_s=5)
    assert _log_dirs(log_root) == []
    _fake_agent(monkeypatch, _child_failed("ValueError: boom", stack="Traceback ...\n"))
    with pytest.raises(RankFailedError, match="Traceback: .*rank1.traceback.txt") as info:
        launch(_rank_fn, (), 2, timeout_s=5)
    (kept,) = _log_dirs(log_root)
    assert str(kept) in str(info.value) and (kept / "rank1.traceback.txt").exists()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_rank_that_never_arrives_times_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 0 failed: .*[Tt]imed out"):
        launch(_rank_fn, ("hang",), 2, timeout_s=30)
    assert time.monotonic() - t0 < 100  # the 5 s collective timeout, not the 600 s sleep


def test_root_cause_ordering_prefers_real_errors_over_their_consequences():
    assert _collateral("UsageError: bad") == 0
    assert _collateral("ValueError: boom") == 1
    assert _collateral("DistBackendError: connection closed by peer") == 2
    assert _collateral("StoreUnreachableError: rank 1 of 2 reached the store but ...") == 2
    assert _collateral("Signal 15 (SIGTERM) received by PID 12") == 3
    assert _collateral("CollectiveFailedError: rank 0 of 2: a collective ...") == 2


def _error_file(log_dir, rank: int, message: str, timestamp: int, attempt: int = 0) -> None:
    """What torch's @record leaves for a rank that raised."""
    import json

    path = log_dir / "run_x" / f"attempt_{attempt}" / str(rank) / "error.json"
    path.parent.mkdir(parents=True)
    extra = {"py_callstack": f"Traceback: {message}", "timestamp": str(timestamp)}
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))


def _first_exit(rank: int, message: str, timestamp: int):
    """A ChildFailedError as torch's agent raises it: the first rank it saw exit, only."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    error = ChildFailedError.__new__(ChildFailedError)
    error.failures = {rank: SimpleNamespace(message={"message": message}, timestamp=timestamp)}
    return error


@pytest.mark.parametrize("later", [0, 1, 2])
def test_the_cause_is_reported_not_the_rank_the_agent_saw_exit_first(tmp_path, later):
    """The agent reports one rank; the others' error files are read too. Error files count
    whole seconds, so the cause must win by its kind, whatever second each was written in."""
    from gnnpar.runtime.launch import _describe

    reset = "RuntimeError: [pair.cc:537] Read error: Connection reset by peer"
    # rank 1 raised; rank 0 died of it and was seen first
    _error_file(tmp_path / "a", 1, "ValueError: boom on rank 1", 100 + later)
    _error_file(tmp_path / "a", 0, reset, 100)
    message = str(_describe(_first_exit(0, reset, 100), str(tmp_path / "a")))
    assert message.startswith("rank 1 failed: ValueError: boom on rank 1 (then also rank 0)")
    # rank 0 was killed from outside (no error file); rank 1 died of it, in the same second or
    # later, or an earlier one (the agent's time is taken when it notices)
    _error_file(tmp_path / "b", 1, reset, 100 + later - 1)
    message = str(
        _describe(_first_exit(0, "Signal 9 (SIGKILL) received by PID 7", 100), str(tmp_path / "b"))
    )
    assert message.startswith("rank 0 failed: Signal 9 (SIGKILL)")
    # a restarted run: the newest attempt's file counts
    _error_file(tmp_path / "c", 1, "ValueError: old", 50, attempt=0)
    _error_file(tmp_path / "c", 1, "KeyError: new", 60, attempt=1)
    message = str(_describe(_first_exit(0, reset, 60), str(tmp_path / "c")))
    assert message.startswith("rank 1 failed: KeyError: new")


def test_a_collective_failure_in_gnnpars_words_is_reported_as_it_is_unless_a_cause_is_known(
    tmp_path,
):
    """A rank's CollectiveFailedError names the rank itself (no "rank R failed: " before it);
    it is the consequence of another rank's own error where there is one."""
    from gnnpar.runtime.launch import _describe

    slow = "CollectiveFailedError: rank 0 of 2: a collective with the other ranks timed out"
    _error_file(tmp_path / "a", 0, slow, 100)
    message = str(_describe(_first_exit(0, slow, 100), str(tmp_path / "a")))
    assert message.startswith("rank 0 of 2: a collective with the other ranks timed out.")
    _error_file(tmp_path / "b", 0, slow, 100)
    _error_file(tmp_path / "b", 1, "ValueError: boom on rank 1", 101)
    message = str(_describe(_first_exit(0, slow, 100), str(tmp_path / "b")))
    assert message.startswith("rank 1 failed: ValueError: boom on rank 1 (then also rank 0)")


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_cli_usage_error_found_inside_a_rank_exits_2_with_the_message(cli, tmp_path):
    # Karate has 34 nodes: 40 partitions is only found impossible once a rank loads the graph.
    proc = cli(
        "train", "--dataset", "karate", "--model", "gcn", "--strategy", "allreduce",
        "--partitions", "40", "--workers", "2", "--epochs", "1", "--quiet",
        "--data-root", str(tmp_path), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "gnnpar: error: Cannot split a graph of 34 nodes into 40" in proc.stderr
    assert "Traceback" not in proc.stderr


def _env_fn(log_dir: str) -> dict:
    """What a rank sees of its start: environment, parent, SIGINT disposition."""
    from pathlib import Path

    from gnnpar.runtime import preload

    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    return {
        "preloaded": preload.MODULES,  # what the server imported besides torch and PyG
        "preload_env": os.environ.get("GNNPAR_PRELOAD_MODULES"),
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "probe": os.environ.get("GNNPAR_TEST_PROBE"),
        "gone": os.environ.get("GNNPAR_TEST_GONE"),
        "ppid": os.getppid(),
        "parent_is_fork_server": b"forkserver" in parent,
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_ranks_are_forked_from_a_fork_server_with_this_launchs_environment(log_root, monkeypatch):
    """Ranks are forks of one fork server that imported torch/PyG/gnnpar once (BENCHMARKS.md:
    4 ranks of a 1M-edge graph share those pages). A later launch from the same process (a
    notebook calling gnnpar.fit twice) reuses the server, which still holds the environment it
    started with: each rank must see its own launch's environment, as a spawned rank does."""

    monkeypatch.setenv("GNNPAR_START_METHOD", "forkserver")  # the default without CUDA
    monkeypatch.setenv("GNNPAR_TEST_PROBE", "first")
    monkeypatch.setenv("GNNPAR_TEST_GONE", "here")
    first = launch(_env_fn, (), 2, timeout_s=30)
    monkeypatch.setenv("GNNPAR_TEST_PROBE", "second")
    monkeypatch.delenv("GNNPAR_TEST_GONE")
    second = launch(_env_fn, (), 2, timeout_s=30)
    for rank in (0, 1):
        assert first[rank]["rank"] == first[rank]["local_rank"] == rank
        assert (first[rank]["probe"], first[rank]["gone"]) == ("first", "here")
        assert (second[rank]["probe"], second[rank]["gone"]) == ("second", None)
        assert second[rank]["rank"] == rank
        for seen in (first[rank], second[rank]):
            assert seen["parent_is_fork_server"] and seen["ppid"] != os.getpid()
            assert seen["sigint_ignored"]  # a Ctrl-C is the launcher's to act on
            # the server imported the modules of whichever launch started it (this file's rank
            # function's, or an earlier test's: run.RANK_MODULES when that launch was a
            # training run's); its note of that is no rank's environment
            assert seen["preloaded"] and seen["preload_env"] is None
    assert {r["ppid"] for r in (*first.values(), *second.values())} == {first[0]["ppid"]}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_ranks_are_spawned_when_asked(log_root, monkeypatch):
    monkeypatch.setenv("GNNPAR_START_METHOD", "spawn")
    out = launch(_env_fn, (), 2, timeout_s=30)
    assert {r["ppid"] for r in out.values()} == {os.getpid()}
    assert not any(r["parent_is_fork_server"] for r in out.values())


@pytest.mark.slow
def test_the_preload_imports_the_modules_the_launcher_names_and_no_gnnpar_module_itself():
    """The fork server's preload is a leaf: gnnpar's modules come only by name, from the
    launcher (the rank function's module), and the name is not passed on to the ranks."""
    import subprocess
    import sys

    from gnnpar.runtime.launch import PRELOAD_MODULES_ENV

    probe = (
        "import os, sys; import gnnpar.runtime.preload as p; "
        "print(p.MODULES, 'gnnpar.run' in sys.modules, 'json.tool' in sys.modules, "
        f"{PRELOAD_MODULES_ENV!r} in os.environ, {PRELOAD_MODULES_ENV!r} in p.SERVER_ENV)"
    )
    env = {**os.environ, PRELOAD_MODULES_ENV: "json.tool,no_such_module_here"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = out.stdout.split()
    assert got == ["['json.tool',", "'no_such_module_here']", "False", "True", "False", "False"]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_check_ranks_counts_processes_as_they_are_started(monkeypatch, method):
    """check_ranks: refuse --workers N whose bare processes cannot start in the available
    memory, counted as the start method makes them (spawned: whole interpreters; forked: one
    server)."""
    from gnnpar.runtime import footprint
    from gnnpar.runtime import launch as launch_module

    monkeypatch.setenv("GNNPAR_START_METHOD", method)
    base, forked = launch_module.RANK_BASELINE_BYTES, launch_module.FORKED_RANK_BYTES
    need = {"forkserver": base + 8 * forked, "spawn": 8 * base}[method]
    monkeypatch.setattr(
        footprint, "memory_budget", lambda device: footprint.MemoryBudget(need, None)
    )
    launch_module.check_ranks(8)  # exactly enough
    monkeypatch.setattr(
        footprint, "memory_budget", lambda device: footprint.MemoryBudget(need - 1, None)
    )
    with pytest.raises(UsageError, match="--workers 8 starts .* GiB available"):
        launch_module.check_ranks(8)
    monkeypatch.setattr(footprint, "memory_budget", lambda device: None)  # unknown: no check
    launch_module.check_ranks(10**6)


@pytest.mark.parametrize(("cuda", "want"), [(False, "forkserver"), (True, "spawn")])
def test_ranks_start_from_the_fork_server_except_with_cuda(monkeypatch, tmp_path, cuda, want):
    """A process forked after the CUDA driver was asked for its GPUs cannot use CUDA ("CUDA
    error: initialization error" in every rank, on an H200): with CUDA, ranks are spawned."""
    import torch

    from gnnpar.runtime import launch as launch_module

    monkeypatch.delenv("GNNPAR_START_METHOD", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert launch_module.start_method() == want
    # before this process imports torch (the fork server starts first): from the driver
    monkeypatch.delitem(sys.modules, "torch")
    nodes = [tmp_path / "nvidiactl"] if cuda else []
    for n in nodes:
        n.touch()
    monkeypatch.setattr(launch_module, "GPU_DRIVER_NODES", (*map(str, nodes), str(tmp_path / "no")))
    assert launch_module.start_method() == want
    assert "torch" not in sys.modules  # not imported to find out
    for asked in ("spawn", "forkserver"):
        monkeypatch.setenv("GNNPAR_START_METHOD", asked)
        assert launch_module.start_method() == asked


def test_a_bad_start_method_is_a_usage_error(monkeypatch):
    from gnnpar.runtime import launch as launch_module

    for bad in ("fork", "threads", " spawn"):
        monkeypatch.setenv("GNNPAR_START_METHOD", bad)
        with pytest.raises(UsageError, match="GNNPAR_START_METHOD"):
            launch_module.start_method()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps it here)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    """SIGKILL of `gnnpar train --workers 2` (no handler runs): its fork server sees the
    launcher go and ends, and the ranks forked from it get SIGTERM (PR_SET_PDEATHSIG)."""
    from helpers import rank_pids, start_cli, wait_for_steps

    proc = start_cli(
        "train", "--dataset", "karate", "--model", "gcn", "--strategy", "allreduce",
        "--workers", "2", "--partitions", "4", "--epochs", "100000", "--out", str(tmp_path),
    )  # fmt: skip
    try:
        wait_for_steps(tmp_path / "metrics.jsonl", 2, proc, deadline_s=120)
        ranks = rank_pids(proc.pid, 2)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(p) for p in ranks):
            time.sleep(0.1)
        alive = [p for p in ranks if _running(p)]
        for p in alive:
            os.kill(p, signal.SIGKILL)
        assert not alive, f"ranks {alive} kept running after their launcher was killed"
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "workers, env",
    [(1, {}), (2, {"RANK": "0", "WORLD_SIZE": "2"}), (2, {"SLURM_PROCID": "0"})]
    + [(2, {"GNNPAR_START_METHOD": "spawn"})],
)
def test_no_early_fork_server_for_one_rank_a_rank_itself_or_spawn(monkeypatch, workers, env):
    """The CLI starts the ranks' fork server early only where a launch of several local ranks
    will use it: not for one rank, not in a rank of torchrun or srun, not with spawn."""
    from gnnpar.runtime import launch

    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "GNNPAR_START_METHOD"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    started = []
    monkeypatch.setattr(launch, "_start_fork_server", started.append)
    assert launch.start_fork_server_early(workers, 1, ("gnnpar.run",)) is False
    assert started == []


def test_early_fork_server_starts_as_launch_starts_it(monkeypatch):
    """Two ranks: the server starts with SIGINT ignored and the ranks' OpenMP threads set, and
    this process's SIGINT handler is back afterwards. (The fork server is asked for by name: on
    a machine with CUDA the default is ``spawn``, which starts no server; this failed on an H100.)"""
    import signal

    from gnnpar.runtime import launch

    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMP_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GNNPAR_START_METHOD", "forkserver")
    seen = []
    monkeypatch.setattr(
        launch,
        "_start_fork_server",
        lambda warm: seen.append(
            (warm, signal.getsignal(signal.SIGINT), os.environ.get("OMP_NUM_THREADS"))
        ),
    )
    before = signal.getsignal(signal.SIGINT)
    assert launch.start_fork_server_early(2, 3, ("gnnpar.run", "gnnpar.training.sync")) is True
    assert seen == [("gnnpar.run,gnnpar.training.sync", signal.SIG_IGN, "3")]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_rank_of_torchrun_starts_no_fork_server_and_checks_nothing_early(monkeypatch):
    """Under torchrun the run's world is the environment's: a 2-stage pipeline rank started
    without --workers is not refused by the CLI's early start (a regression: it was, exit 2)."""
    from gnnpar import cli
    from gnnpar.configure import build_config
    from gnnpar.runtime import launch

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(launch, "_start_fork_server", lambda warm: pytest.fail("started"))
    cfg = build_config(None, {"dataset": "cora", "model": "gat", "strategy": "pipeline"})
    cli._start_ranks_server(cfg)


def test_launch_settings_keep_what_this_torchs_launch_config_knows():
    """torch 2.11's LaunchConfig has no shutdown_timeout: passing it failed every --workers run
    there (seen on a GPU machine); settings it lacks keep torch's defaults."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    got = launch_settings({"min_nodes": 1, "max_restarts": 0, "no_such_setting": 2})
    assert got == {"min_nodes": 1, "max_restarts": 0}
    newer = {"shutdown_timeout": 2, "signals_to_handle": "SIGTERM"}
    assert launch_settings(newer) == {k: v for k, v in newer.items() if k in known}
    LaunchConfig(**launch_settings({"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 1, **newer}))


def test_a_restart_is_told_naming_the_rank_its_end_and_the_count(tmp_path, capsys):
    """The elastic agent's two records (a rank failed; the group restarts) become one line; a
    rank that raised is quoted from its error file of that attempt."""
    import json
    import logging

    from gnnpar.runtime.launch import _RestartNotes

    notes = _RestartNotes(2, str(tmp_path))

    def record(msg: str, *args) -> logging.LogRecord:
        return logging.LogRecord("torch", logging.INFO, __file__, 1, msg, args, None)

    failed = "failed (exitcode: %s) local_rank: %s (pid: %s) of fn: %s (start_method: %s)"
    restart = "[%s] Worker group %s. %s/%s attempts left; will restart worker group"
    notes.handle(record(failed, -9, 1, 4242, "entry", "forkserver"))
    notes.handle(record("[default] Stopping worker group"))  # chatter: dropped
    notes.handle(record(restart, "default", "FAILED", 2, 2))
    error = tmp_path / "run1/attempt_1/0/error.json"
    error.parent.mkdir(parents=True)
    error.write_text(json.dumps({"message": {"message": "ValueError: bad batch\nmore"}}))
    notes.handle(record(failed, 1, 0, 77, "entry", "forkserver"))
    notes.handle(record(restart, "default", "FAILED", 1, 2))
    _RestartNotes(1, str(tmp_path)).handle(record(restart, "default", "FAILED", 1, 1))  # unseen
    # the agent saw rank 0 first, which failed for its lost peer; rank 1 left no report
    other = _RestartNotes(1, str(tmp_path / "b"), nprocs=2)
    lost = tmp_path / "b/run2/attempt_0/0/error.json"
    lost.parent.mkdir(parents=True)
    lost.write_text(json.dumps({"message": {"message": "CollectiveFailedError: rank 1 gone"}}))
    other.handle(record(failed, 1, 0, 77, "entry", "forkserver"))
    other.handle(record(restart, "default", "FAILED", 1, 1))
    assert capsys.readouterr().err.splitlines() == [
        "gnnpar: rank 1 (pid 4242) died of SIGKILL; restart 1 of 2: every rank starts again "
        "and resumes from the newest checkpoint",
        "gnnpar: rank 0 (pid 77) exited with code 1: ValueError: bad batch; restart 2 of 2: "
        "every rank starts again and resumes from the newest checkpoint",
        "gnnpar: a rank failed; restart 1 of 1: every rank starts again and resumes from the "
        "newest checkpoint",
        "gnnpar: rank 1 died without an error report (killed?), then rank 0 (pid 77) exited "
        "with code 1: CollectiveFailedError: rank 1 gone; restart 1 of 1: every rank starts "
        "again and resumes from the newest checkpoint",
    ]
