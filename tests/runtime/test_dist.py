"""dist.setup: one process needs no group; torchrun's and srun's environments are recognised;
a store nobody answers ends with a message naming the settings that decide it."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from gnnpar import UsageError
from gnnpar.runtime import dist, slurm


def test_single_process_context_without_torchrun(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert not dist.launched_by_torchrun()
    ctx = dist.setup(5)
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.backend is None
    assert not torch.distributed.is_initialized()
    dist.teardown()


def test_world_of_one_under_torchrun_needs_no_group(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert dist.launched_by_torchrun()
    ctx = dist.setup(5)
    assert ctx.world_size == 1 and not torch.distributed.is_initialized()


def test_device_falls_back_to_cpu_without_cuda():
    if not torch.cuda.is_available():
        assert dist.pick_device(3) == torch.device("cpu")
    else:
        assert dist.pick_device(0).type == "cuda"


@pytest.mark.parametrize(
    ("gpus", "local_rank", "local_world", "want"),
    [
        (2, 1, 2, "cuda:1"),
        (4, 0, 1, "cuda:0"),
        (1, 0, 2, "cpu"),
        (1, 1, 2, "cpu"),
        (0, 0, 1, "cpu"),
    ],
)
def test_a_gpu_per_rank_or_every_rank_on_the_cpu(
    monkeypatch, capsys, gpus, local_rank, local_world, want
):
    """NCCL refuses two ranks on one GPU: with fewer GPUs than ranks on a host, all of them
    train on the CPU, and rank 0 says why once."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert dist.pick_device(local_rank, local_world) == torch.device(want)
    said = capsys.readouterr().err
    if want == "cpu" and gpus and local_rank == 0:
        assert "2 ranks on this host and 1 GPU" in said and "at most 1 rank per host" in said
    else:
        assert said == ""


def test_relative_distance_is_the_norm_of_the_difference_over_the_norm_of_the_reference():
    from gnnpar.training.final_model import relative_distance

    ref = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]  # ||ref|| = 5
    moved = [torch.tensor([3.0, 1.0]), torch.tensor([[4.0]])]  # one entry off by 1
    assert relative_distance(moved, ref) == 0.2
    assert relative_distance(ref, ref) == 0.0
    assert relative_distance(ref, [torch.zeros(2), torch.zeros(1, 1)]) == 0.0  # no reference norm


def test_waiting_for_a_key_nobody_sets_ends_in_a_clear_timeout_error():
    import time

    import pytest
    import torch.distributed as tdist

    from gnnpar.runtime.store import PeerTimeoutError, wait_for_key

    store = tdist.HashStore()
    store.set("ready", "1")
    wait_for_key(store, "ready", 1.0, "rank 0 scoring")  # set: returns at once
    t0 = time.perf_counter()
    with pytest.raises(PeerTimeoutError, match=r"rank 0 scoring rank 1's model did not happen"):
        wait_for_key(store, "never", 0.5, "rank 0 scoring rank 1's model")
    assert time.perf_counter() - t0 < 10


# ------------------------------------------------------------------ a store nobody answers
@pytest.mark.parametrize("agent_store", ["False", "True"])  # rank 0's store; torchrun's agent's
@pytest.mark.slow
def test_a_rank_that_cannot_reach_the_store_names_the_settings_that_decide_it(cli, agent_store):
    """RANK 1 of 2 with nobody at MASTER_ADDR:MASTER_PORT: exit 1 within --timeout, a message
    naming the address and the multi-homed-host settings, no Python traceback."""
    from gnnpar.runtime.launch import free_port

    port = free_port()  # free: nobody listens there
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env["TORCHELASTIC_USE_AGENT_STORE"] = agent_store
    args = ["--dataset", "karate", "--model", "gcn", "--strategy", "allreduce"]
    proc = cli("train", *args, "--partitions", "2", "--timeout", "2", "--quiet", env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("gnnpar: error: rank 1 of 2 could not reach the store")
    for needle in (f"127.0.0.1:{port}", "--local-addr", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        assert needle in line
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------- SLURM
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


@pytest.fixture
def slurm_env(monkeypatch):
    """os.environ without SLURM's or torchrun's variables, restored afterwards (slurm.adopt
    writes torchrun's variables itself)."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in (*TORCHRUN_VARS, "MASTER_PORT"):
            del os.environ[key]
    monkeypatch.setattr(slurm, "_adopted", False)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node[01-03,07]", "node01"),
        ("gpu5,node[1-2]", "gpu5"),
        ("rack[2-3]-n[008-009],x1", "rack2-n008"),
        ("c[7,3-4]", "c7"),
        ("login1", "login1"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert slurm.first_host(nodelist) == first


@pytest.mark.parametrize("nodelist", ["node[01", "", "a]b"])
def test_unreadable_node_list_is_a_usage_error(nodelist):
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        slurm.first_host(nodelist)


def test_srun_tasks_take_rank_world_and_master_from_slurm(slurm_env):
    slurm_env.update(
        SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1", SLURM_NODEID="1",
        SLURM_JOB_ID="123456", SLURM_JOB_NODELIST="node[07-08]", SLURM_TASKS_PER_NODE="2(x2)",
    )  # fmt: skip
    assert not dist.launched_by_torchrun()  # a question: it adopts nothing
    assert slurm.adopt() and slurm.adopted()
    assert dist.launched_by_torchrun() and dist.env_world_size() == 4
    assert not slurm.adopt()  # once
    got = {k: slurm_env[k] for k in (*TORCHRUN_VARS, "MASTER_PORT")}
    assert got == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node07", "MASTER_PORT": str(20000 + 123456 % 10000),
    }  # fmt: skip


def test_master_address_and_port_given_win_over_slurm_defaults(slurm_env):
    slurm_env.update(
        SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_JOB_ID="9",
        SLURM_JOB_NODELIST="node[1-2]", MASTER_ADDR="10.0.0.5", MASTER_PORT="4567",
    )  # fmt: skip
    assert slurm.adopt()
    assert (slurm_env["MASTER_ADDR"], slurm_env["MASTER_PORT"]) == ("10.0.0.5", "4567")
    assert slurm_env["LOCAL_WORLD_SIZE"] == "2"  # no per-node counts: every task


def test_torchrun_variables_win_and_one_task_keeps_workers(slurm_env):
    slurm_env.update(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_LOCALID="1", RANK="0")
    slurm_env["WORLD_SIZE"] = "3"
    assert not slurm.adopt() and slurm_env["RANK"] == "0"
    for key in ("RANK", "WORLD_SIZE"):
        del slurm_env[key]
    slurm_env.update(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0")  # sbatch -n 1
    assert not slurm.adopt() and not dist.launched_by_torchrun() and "RANK" not in slurm_env


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, "SLURM_PROCID='x'"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "two", "SLURM_LOCALID": "0"}, "SLURM_NTASKS"),
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, "SLURM_PROCID=2"),
        ({"SLURM_PROCID": "-1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, "inconsistent"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2"}, "SLURM_LOCALID=2"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, "SLURM_JOB_NODELIST"),
        (
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
             "SLURM_NODELIST": "n1"},
            "SLURM_JOB_ID",
        ),
    ],
)  # fmt: skip
def test_garbage_from_slurm_is_a_usage_error(slurm_env, env, needle):
    slurm_env.update(env)
    with pytest.raises(UsageError, match=re.escape(needle)):
        slurm.adopt()
    assert "RANK" not in slurm_env


def test_a_run_takes_its_rank_from_slurm_at_its_start(slurm_env):
    """gnnpar.run.run adopts SLURM's ranks before anything else (here: bad ones, exit 2)."""
    from gnnpar.configure import build_config
    from gnnpar.run import run

    slurm_env.update(SLURM_PROCID="2", SLURM_NTASKS="2", SLURM_LOCALID="0")
    cfg = build_config(None, {"dataset": "karate", "model": "gcn"})
    with pytest.raises(UsageError, match=re.escape("SLURM_PROCID=2 SLURM_NTASKS=2")):
        run(cfg)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_srun_tasks_train_together_like_two_local_workers(tmp_path):
    """Two processes that only SLURM's variables tell apart (as ``srun -n 2`` starts them)
    train one run, and end with the weights of ``--workers 2`` with the same seed."""
    import subprocess
    import sys

    from gnnpar.runtime.launch import free_port
    from helpers import ROOT

    args = [sys.executable, "-m", "gnnpar", "train", "--dataset", "cora", "--model", "gcn"]
    args += ["--strategy", "allreduce", "--partitions", "4", "--epochs", "2", "--seed", "3"]
    args += ["--threads", "1", "--eval-every", "0", "--timeout", "90", "--quiet"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for key in (*TORCHRUN_VARS, "MASTER_PORT"):
        base.pop(key, None)
    port = free_port()
    procs = []
    for task in (0, 1):
        env = {**base, "SLURM_PROCID": str(task), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(task)}
        env.update(SLURM_JOB_ID="77", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = ["--out", str(tmp_path / f"task{task}")]
        procs.append(subprocess.Popen([*args, *out], env=env, cwd=ROOT, stderr=subprocess.PIPE))
    ref = subprocess.Popen([*args, "--workers", "2", "--out", str(tmp_path / "local")], env=base,
                           cwd=ROOT, stderr=subprocess.PIPE)  # fmt: skip
    try:
        errs = [p.communicate(timeout=240)[1].decode() for p in (*procs, ref)]
    finally:
        for p in (*procs, ref):
            p.kill()
    assert [p.returncode for p in (*procs, ref)] == [0, 0, 0], "\n".join(errs)[-4000:]
    assert not (tmp_path / "task1" / "result.json").exists()  # rank 0 writes the run's files
    got, want = (
        torch.load(tmp_path / d / "model.pt", weights_only=True)["state_dict"]
        for d in ("task0", "local")
    )
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    r = json.loads((tmp_path / "task0" / "result.json").read_text())
    assert r["workers"] == 2 and r["per_worker_batches"] == [4, 4]


def test_a_collective_that_failed_because_a_peer_went_away_gets_one_message_naming_it(
    monkeypatch,
):
    """What a torchrun rank prints (gnnpar.cli) instead of a traceback when its collective
    fails because a peer or the network went away: gloo's plain RuntimeErrors and torch's
    DistErrors, with what the heartbeat watch saw silent by then; other errors are not its."""
    import torch.distributed as tdist

    from gnnpar.runtime import heartbeat
    from gnnpar.runtime.dist import peer_failure

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(
        heartbeat, "silence", "rank 0 (host a at 10.0.0.1, pid 7) had sent no heartbeat for 4.2 s"
    )
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "5000ms for recv operation to complete"
    )
    message = peer_failure(gloo)
    assert message.startswith(
        "rank 1 of 2: a collective or store call with the other ranks "
        "failed ([../third_party/gloo/gloo/transport/tcp/unbound_buffer"
    )
    assert "(by then rank 0 (host a at 10.0.0.1, pid 7) had sent no heartbeat for 4.2 s)" in message
    assert peer_failure(tdist.DistNetworkError("Connection reset by peer")) is not None
    assert peer_failure(RuntimeError("CUDA out of memory")) is None
    assert peer_failure(ValueError("/gloo/ is not a peer")) is None


def test_a_collective_that_timed_out_while_every_peer_beat_names_a_slow_rank(monkeypatch):
    """Every other rank still answered its heartbeat when the collective timed out: none is
    gone, one is slower than --timeout allows (a 300x --slowdown straggler on sampled gave
    gloo's bare "Timed out waiting 5000ms"). Without a watch running, the general message."""
    from gnnpar.runtime import heartbeat
    from gnnpar.runtime.dist import peer_failure

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(heartbeat, "silence", None)
    monkeypatch.setattr(heartbeat, "watched_timeout_s", 5.0)
    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
        "waiting 5000ms for send operation to complete"
    )
    message = peer_failure(gloo)
    assert message.startswith("rank 0 of 2: a collective with the other ranks timed out (")
    assert "still answering its heartbeat" in message and "--timeout 5 s" in message
    assert message.endswith("Raise --timeout.")
    closed = RuntimeError("[/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    assert "a peer stopped answering" in peer_failure(closed)  # gone, not slow
    monkeypatch.setattr(heartbeat, "watched_timeout_s", None)
    assert "a peer stopped answering" in peer_failure(gloo)
