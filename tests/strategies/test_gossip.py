"""strategies/gossip.py: GossipGCN and gossip-bipartite with real ranks (gloo) through the CLI.

Specification (issue 3, study 003 chapter 4): every subgraph is trained exactly once per epoch
across all ranks; exchanges are symmetric (both sides log the same exchange id with each other
as partner), never with oneself; uneven speeds all terminate; bipartite pairs only active with
passive ranks; a partner that vanishes ends the run with a clear error, not a hang.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from gnnpar import UsageError
from gnnpar.configure import build_config
from gnnpar.run import prepare
from helpers import rank_pids, start_cli, wait_for_steps

BASE = ["train", "--dataset", "karate", "--model", "gcn", "--partitions", "4", "--quiet"]


def train(cli, tmp_path, *args: str, timeout: float = 150):
    out = tmp_path / "run"
    proc = cli(*BASE, "--out", str(out), *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def check_pool(result: dict, partitions: int, epochs: int) -> None:
    """Nothing lost, nothing twice: the union of the ranks' taken indices, per epoch."""
    taken = Counter((e, i) for rank in result["pool_log"] for e, i in rank)
    assert taken == Counter({(e, i): 1 for e in range(epochs) for i in range(partitions)})
    assert result["per_worker_batches"] == [len(rank) for rank in result["pool_log"]]


def check_exchanges(result: dict) -> list[tuple[int, int]]:
    """Each exchange appears on exactly two ranks, each naming the other, one as its claimer."""
    sides: dict[str, list[tuple[int, int, bool]]] = {}
    for rank, log in enumerate(result["exchange_log"]):
        steps = [step for step, _, _, _ in log]
        assert steps == sorted(steps)  # one exchange at a time per rank
        for _, partner, xid, initiated in log:
            assert partner != rank
            sides.setdefault(xid, []).append((rank, partner, initiated))
    pairs = []
    for xid, s in sides.items():
        assert len(s) == 2, (xid, s)
        (a, pa, ia), (b, pb, ib) = s
        assert (pa, pb) == (b, a) and ia != ib
        claimer = int(xid.split(".")[0])
        assert claimer == (a if ia else b)
        pairs.append((a, b))
    assert result["per_worker_exchanges"] == [len(log) for log in result["exchange_log"]]
    return pairs


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_two_ranks_with_a_straggler_train_each_subgraph_once_per_epoch(cli, tmp_path):
    args = "--strategy gossip --workers 2 --epochs 6 --slowdown 1=3 --jitter 0.5 --average grads"
    args = args.split()
    r = train(cli, tmp_path, *args)
    check_pool(r, 4, 6)
    assert check_exchanges(r)  # with K=1 and two ranks they must have met
    assert r["workers"] == 2 and r["slowdown"] == {"1": 3.0} and r["jitter"] == 0.5
    assert len(r["per_worker_wait_s"]) == 2 and all(w >= 0 for w in r["per_worker_wait_s"])
    cands = r["candidates"]
    assert r["final_model"] in ("average", f"best-local:rank{cands['best_local']['rank']}")
    chosen = cands["average"] if r["final_model"] == "average" else cands["best_local"]
    assert (r["val_score"], r["test_score"]) == (chosen["val_score"], chosen["test_score"])
    assert chosen["val_score"] == max(
        cands["average"]["val_score"], cands["best_local"]["val_score"]
    )
    assert cands["best_local"]["val_score"] == max(s["val"] for s in r["local_scores"])
    # gradient averaging with a straggler leaves the two models apart, by a small relative amount
    assert len(r["per_worker_divergence"]) == 2
    assert all(0 < d < 1 for d in r["per_worker_divergence"])


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_four_ranks_with_uneven_speeds_terminate_with_symmetric_exchanges(cli, tmp_path):
    args = "--average params --sync-every 2 --slowdown 1=3,2=2".split()
    r = train(cli, tmp_path, "--strategy", "gossip", "--workers", "4", "--epochs", "8", *args)
    check_pool(r, 4, 8)
    pairs = check_exchanges(r)
    assert len({frozenset(p) for p in pairs}) > 1  # partners are picked, not fixed


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_bipartite_pairs_only_the_active_rank_with_passive_ones(cli, tmp_path):
    args = "--strategy gossip-bipartite --workers 3 --epochs 8 --slowdown 2=3".split()
    r = train(cli, tmp_path, *args)  # rank 0 active; ranks 1 and 2 passive
    check_pool(r, 4, 8)
    pairs = check_exchanges(r)
    assert pairs and all(min(a, b) == 0 and max(a, b) in (1, 2) for a, b in pairs)
    claimers = {int(xid.split(".")[0]) for log in r["exchange_log"] for _, _, xid, _ in log}
    assert claimers == {0}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_partner_that_vanishes_mid_run_fails_the_run_with_a_clear_error(tmp_path):
    """The fault comes from outside, as in life: rank 1 is SIGKILLed once rank 0 has trained a
    few subgraphs (read from metrics.jsonl); the run must end, naming rank 1, not hang."""
    out = tmp_path / "run"
    args = [*BASE, "--out", str(out), "--strategy", "gossip", "--workers", "2"]
    proc = start_cli(*args, "--epochs", "5000", "--timeout", "5")
    t0 = time.perf_counter()
    try:
        wait_for_steps(out / "metrics.jsonl", 3, proc, deadline_s=60)
        os.kill(rank_pids(proc.pid, 2)[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "rank 1" in err and "Traceback" not in err.split("Traceback:")[0], err[-2000:]
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize(
    "args,needle",
    [
        ({"strategy": "gossip", "workers": 2}, "--partitions"),
        ({"strategy": "gossip", "workers": 3, "partitions": 2}, "fewer than"),
        ({"strategy": "gossip-bipartite", "partitions": 4}, "at least 2 ranks"),
        ({"strategy": "gossip", "partitions": 4, "average": "weights"}, "--average"),
        ({"strategy": "gossip", "partitions": 4, "sync-every": 0}, "--sync-every"),
    ],
)
def test_bad_gossip_settings_are_usage_errors(args, needle):
    with pytest.raises(UsageError, match=needle):
        prepare(build_config(None, {"dataset": "karate", "model": "gcn", **args}))


def test_bad_gossip_settings_exit_2_from_the_command_line(capsys):
    from gnnpar.cli import main

    code = main(["train", "--dataset", "karate", "--model", "gcn", "--strategy", "gossip"])
    err = capsys.readouterr().err
    assert code == 2 and "--partitions" in err, err
