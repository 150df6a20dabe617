"""Fixtures for every test folder; the helpers they use live in tests/helpers.py."""

from __future__ import annotations

import atexit
import fcntl
import multiprocessing.process
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from torch_geometric.data import Data

from helpers import run_cli, tiny_graph

# result.json records platform.platform(), which runs `uname -p` once per interpreter (the
# standard library caches it): run it here, before the quick lane's guard below is in place
platform.platform()

# matplotlib's cache in a folder of the session's, not the user's home (subprocesses inherit
# it), built here: its first build asks fontconfig (`fc-list`, a process) where that is installed
if "MPLCONFIGDIR" not in os.environ:
    os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="gnnpar-tests-matplotlib-")
    atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], ignore_errors=True)
import matplotlib.font_manager  # noqa: E402,F401


@pytest.fixture(scope="session", autouse=True)
def private_data_root(tmp_path_factory):
    """$GNNPAR_DATA -> a temporary folder for the whole session: no test reads or writes the
    user's real dataset cache (subprocesses inherit it; a test may still pass --data-root)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNPAR_DATA", str(tmp_path_factory.mktemp("gnnpar-data")))
        yield


@pytest.fixture(scope="session")
def wide_prepared(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared folder, data root) of tests.runtime.wide_graph (1.53 GiB prepared), made once
    for the whole session and shared by every pytest-xdist worker (under a lock in the folder
    the workers' temporary folders share): tests/runtime/test_resources_real.py and
    tests/e2e/test_shard_sampled_cgroup.py train from it and must not write into it. The data
    root holds the graph's in-memory cache, which the prepare made on its way."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, data = root / "wide-prepared", root / "wide-data"
    with open(root / "wide-prepared.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the worker dies)
        if not (folder / "manifest.json").exists():
            source = "tests.runtime.wide_graph:wide"
            p = run_cli("prepare", "--dataset", source, "--out", str(folder),
                        "--data-root", str(data), "--quiet", timeout=600)  # fmt: skip
            assert p.returncode == 0, p.stderr
    return folder, data


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def graph6() -> Data:
    return tiny_graph()


@pytest.fixture(autouse=True)
def no_process_in_the_quick_lane(request, monkeypatch):
    """The quick lane (``-m "not slow"``) starts no process: a test not marked slow that starts
    one (subprocess, multiprocessing, a fork) fails, naming this rule. Code that catches the
    error cannot hide it: any attempt fails the test at teardown too."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    attempts: list[str] = []

    def refuse(what):
        def refused(*args, **kwargs):
            attempts.append(what)
            raise RuntimeError(
                f"{what} in a test not marked slow: the quick lane starts no process; "
                "run it in this process (gnnpar.cli.main) or mark the test @pytest.mark.slow"
            )

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("subprocess.Popen"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("Process.start"))
    monkeypatch.setattr(os, "fork", refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", refuse("os.posix_spawn"))
    yield
    if attempts:
        pytest.fail(f"started a process ({', '.join(attempts)}) in a test not marked slow")


# The files that take longest in `make test` (seconds of one xdist worker on the 2-core CI
# machine, from its --durations), longest first. `make test` hands whole files to its two
# workers in the order of the collection (--dist loadfile --no-loadscope-reorder): these go
# first, so that the run does not end with one worker on a long file while the other idles.
# (xdist's own order, most tests first, put most of them last: they hold few, long tests.)
# A new file that takes more than ~20 s belongs here, at its place.
LONGEST_FILES = {
    "tests/training/test_checkpoint.py": 150,
    "tests/e2e/test_same_seed_same_loss.py": 120,
    "tests/e2e/test_two_hosts_outage.py": 105,
    "tests/benchmark_scripts/test_smoke.py": 100,
    "tests/advise/test_advise.py": 95,
    "tests/e2e/test_user_graphs_train.py": 95,
    "tests/e2e/test_two_hosts.py": 90,
    "tests/data/test_prepared_train.py": 90,
    "tests/e2e/test_hostile_input.py": 80,
    "tests/runtime/test_resources_real.py": 70,
    "tests/strategies/test_gossip.py": 40,
    "tests/e2e/test_shard_sampled_cgroup.py": 37,
    "tests/advise/test_sweep.py": 35,
    "tests/e2e/test_readme_examples.py": 24,
    "tests/lightning/test_lightning_ranks.py": 22,
    "tests/e2e/test_user_models.py": 20,
    "tests/e2e/test_shard_cluster.py": 20,
    "tests/strategies/test_hybrid.py": 18,
}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the files in LONGEST_FILES first (longest first), then the files with
    a test marked slow (processes: seconds each), then the rest (quick: fine-grained work for
    the end of the run); within each group, files with more tests first, as xdist orders them.
    A file's tests keep their order. One process alone (no xdist) keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def key(path: str) -> tuple:
        tests = files[path]
        if path in LONGEST_FILES:
            return (0, -LONGEST_FILES[path])
        slow = any(t.get_closest_marker("slow") for t in tests)
        return (1 if slow else 2, -len(tests))

    items[:] = [item for path in sorted(files, key=key) for item in files[path]]


def pytest_ignore_collect(collection_path, config):
    """`-m serial` alone (make test's second part, 7 of ~1,700 tests): a test file that does not
    mention ``mark.serial`` is not imported (importing every module took ~7 s of the part's
    CPU for nothing). Any other selection collects everything, as pytest does."""
    if config.option.markexpr != "serial":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return "mark.serial" not in collection_path.read_text(encoding="utf-8") or None
    return None
