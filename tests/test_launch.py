"""Local launching through torch's elastic agent: results come back, failures name their rank."""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch.distributed as dist

from gnnpar import RankFailedError
from gnnpar.launch import _collateral, launch


def _rank_fn(mode: str, log_dir: str) -> dict:
    """Runs in each spawned rank (module level so that spawn can import it)."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    if rank == 1 and mode == "raise":
        raise ValueError("boom on rank 1")
    if rank == 1 and mode == "hang":
        time.sleep(600)  # never reaches the barrier: rank 0's wait must time out
    dist.barrier()
    world = dist.get_world_size()
    dist.destroy_process_group()
    return {"rank": rank, "world": world}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_launch_returns_every_ranks_value():
    out = launch(_rank_fn, ("ok",), 2, timeout_s=30)
    assert out == {0: {"rank": 0, "world": 2}, 1: {"rank": 1, "world": 2}}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_naming_rank_and_cause():
    with pytest.raises(RankFailedError) as info:
        launch(_rank_fn, ("raise",), 2, timeout_s=30)
    message = str(info.value)
    assert message.startswith("rank 1 failed: ValueError: boom on rank 1")
    assert "Traceback:" in message and "\n" not in message  # one line, traceback in a file


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
    assert _collateral("Signal 15 (SIGTERM) received by PID 12") == 3


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
