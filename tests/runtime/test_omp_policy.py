"""The OpenMP wait policy gnnpar chooses before torch loads (gnnpar/omp.py, which
gnnpar/__init__.py imports first): a short spin for one process on the cores, sleeping at once for ranks that share a host, the user's choice
always kept; and every rank gnnpar starts (directly or forked from multiprocessing's fork
server, whose libgomp the forked processes inherit) gets the sleeping policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gnnpar import omp

POLICY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@pytest.mark.parametrize(
    "env,shares",
    [
        ({}, False),
        ({"LOCAL_WORLD_SIZE": "1"}, False),
        ({"LOCAL_WORLD_SIZE": "2"}, True),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x2)"}, True),
        ({"SLURM_STEP_TASKS_PER_NODE": "1,2"}, False),  # this node's count comes first
        ({"SLURM_NTASKS_PER_NODE": "8"}, True),
        ({"LOCAL_WORLD_SIZE": "two"}, False),  # garbage says nothing
        ({"LOCAL_WORLD_SIZE": "-3"}, False),
        ({"LOCAL_WORLD_SIZE": ""}, False),
    ],
)
def test_which_launchers_mean_shared_cores(monkeypatch, env, shares):
    for name in ("LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert omp._ranks_share_this_host() is shares


def test_ranks_sleep_at_once_sets_passive_and_restores(monkeypatch):
    monkeypatch.setattr(omp, "OWN_OMP_POLICY", True)
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with omp.ranks_sleep_at_once():
        assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
        assert "GOMP_SPINCOUNT" not in os.environ
    assert os.environ.get("GOMP_SPINCOUNT") == "10000"
    assert "OMP_WAIT_POLICY" not in os.environ


def test_ranks_sleep_at_once_keeps_the_users_choice(monkeypatch):
    monkeypatch.setattr(omp, "OWN_OMP_POLICY", False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with omp.ranks_sleep_at_once():
        assert os.environ.get("GOMP_SPINCOUNT") == "5"
        assert "OMP_WAIT_POLICY" not in os.environ


def _policy_after_import(env: dict[str, str]) -> tuple[str | None, str | None]:
    clean = {k: v for k, v in os.environ.items() if k not in POLICY}
    for name in ("LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        clean.pop(name, None)
    code = "import os, gnnpar; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    a, b = out.stdout.split()
    return (None if a == "None" else a), (None if b == "None" else b)


@pytest.mark.slow
def test_the_policy_chosen_on_import():
    assert _policy_after_import({}) == (None, "10000")
    assert _policy_after_import({"LOCAL_WORLD_SIZE": "2"}) == ("PASSIVE", None)
    assert _policy_after_import({"LOCAL_WORLD_SIZE": "x"}) == (None, "10000")
    assert _policy_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == ("ACTIVE", None)
    assert _policy_after_import({"GOMP_SPINCOUNT": "7"}) == (None, "7")


def _rank_policy(log_dir: str) -> dict:
    """In each rank: the policy in its environment and in the fork server's (which its libgomp
    was initialised with, when forked from the server)."""
    preload = sys.modules.get("gnnpar.runtime.preload")  # imported in the fork server only
    server = getattr(preload, "SERVER_ENV", {})
    return {
        "env": [os.environ.get(k) for k in POLICY],
        "server": [server.get(k) for k in POLICY] if server else None,
    }


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.serial  # the fork server is this process's: one an earlier test started is reused
def test_launched_ranks_sleep_at_once(monkeypatch):
    from gnnpar.runtime.launch import launch

    if not omp.OWN_OMP_POLICY:
        pytest.skip("the user set an OpenMP policy for this test run")
    assert os.environ.get("GOMP_SPINCOUNT") == "10000"  # this process: one on the cores
    out = launch(_rank_policy, (), 2, 60)
    for rank in (0, 1):
        assert out[rank]["env"] == ["PASSIVE", None]
        if out[rank]["server"] is not None:
            assert out[rank]["server"] == ["PASSIVE", None]
    assert os.environ.get("GOMP_SPINCOUNT") == "10000"  # restored here
    assert "OMP_WAIT_POLICY" not in os.environ


RANK_MODULE = """
import os, sys

def policy(log_dir):
    preload = sys.modules.get("gnnpar.runtime.preload")
    server = getattr(preload, "SERVER_ENV", {})
    return [server.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")] if server else None

def idle():
    pass
"""

PARENT = """
import multiprocessing, os, gnnpar
from gnnpar.runtime.launch import launch, start_fork_server_for_ranks
import probe_ranks
before = dict(os.environ)
assert start_fork_server_for_ranks(2, 1, ("probe_ranks",))
assert dict(os.environ) == before, "the environment changed"
worker = multiprocessing.get_context("forkserver").Process(target=probe_ranks.idle)
worker.start(); worker.join()  # as the profile's loader workers, from the same server
out = launch(probe_ranks.policy, (), 2, 60)
print(out[0], out[1])
"""


@pytest.mark.slow
@pytest.mark.multirank
def test_a_fork_server_started_for_ranks_first_serves_them_their_policy(tmp_path):
    """``gnnpar advise`` starts loader workers (its sampled profile) before its two ranks, from
    the same fork server (one per process): started by :func:`start_fork_server_for_ranks`
    first, the server has the ranks' policy, and the parent's environment is left as it was."""
    (tmp_path / "probe_ranks.py").write_text(RANK_MODULE)
    clean = {k: v for k, v in os.environ.items() if k not in POLICY and k != "OMP_NUM_THREADS"}
    path = os.pathsep.join(p for p in (str(tmp_path), clean.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-c", PARENT],
        env={**clean, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['PASSIVE',", "None]"] * 2
