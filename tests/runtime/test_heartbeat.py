"""Every wait bounded, the right rank blamed (issue 11): a rank stopped with SIGSTOP under
allreduce, pipeline, sampled or gossip ends the run with exit 1 within 1.2 x --timeout, with a
message that names the stopped rank (its heartbeat went silent: gnnpar.runtime.heartbeat), not the rank
that was waiting for it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from helpers import rank_pids, start_cli, wait_for_steps

TIMEOUT = 15
RUNS = {
    "allreduce": ["--model", "gcn", "--partitions", "8"],
    "pipeline": ["--model", "gat", "--chunks", "2"],
    "sampled": ["--model", "sage", "--batch-size", "16"],
    "gossip": ["--model", "gcn", "--partitions", "8"],
}


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy, stopped", [(s, 1) for s in RUNS] + [("allreduce", 0)])
def test_a_stopped_rank_is_named_within_the_timeout(tmp_path, strategy, stopped):
    out = tmp_path / "run"
    args = ["train", "--dataset", "cora", "--strategy", strategy, "--workers", "2"]
    args += [*RUNS[strategy], "--epochs", "5000", "--threads", "1", "--quiet"]
    proc = start_cli(*args, "--timeout", str(TIMEOUT), "--out", str(out))
    pid = None
    try:
        wait_for_steps(out / "metrics.jsonl", 5, proc, deadline_s=90)
        pid = rank_pids(proc.pid, 2)[stopped]
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=4 * TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        proc.kill()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1, err[-2000:]
    assert f"rank {stopped} (host" in err and "stopped answering" in err, err[-2000:]
    assert elapsed <= 1.2 * TIMEOUT, elapsed
