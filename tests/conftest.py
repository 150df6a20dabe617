"""Fixtures for every test folder; the helpers they use live in tests/helpers.py."""

from __future__ import annotations

import atexit
import multiprocessing.process
import os
import platform
import shutil
import subprocess
import tempfile

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
