"""Two hosts on one machine: torchrun --nnodes 2 across two network namespaces joined by a veth.

Host A and host B are network namespaces (``ip netns``) with one veth pair between them,
10.213.0.1/30 on A and .2 on B, and their own loopback; nothing else connects them. Each host
runs ``gnnpar torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 10.213.0.1:PORT`` (A with
``--rdzv-conf is_host=true``), ``--local-addr`` its veth address and ``GLOO_SOCKET_IFNAME`` its
veth, exactly the README's "Two hosts" commands (``gnnpar torchrun``: torchrun's agent; the run
without ``--local-addr`` uses plain ``torchrun ... -m gnnpar train``, which works the same).
Both namespaces share the machine's hostname, which is what makes ``--local-addr`` necessary
(without it host B's ranks look for the store at their own address).

Specification (issue 12): allreduce's final weights equal the single-host run with the same
ranks and seed, bit for bit (gloo's reductions depend on ranks, not on where they live, and
``--threads 1`` gives every rank the same intra-op threading on both sides); gossip trains every
subgraph exactly once per epoch; a two-stage pipeline whose stages sit on different hosts ends
with the single-host run's weights and score. All of it at 2 hosts x 1 rank and 2 x 2, and all
traffic stays inside the namespaces. Every run is started at once (they wait on each other's
start-up, not on the two cores) and each has a deadline; on failure every process is killed.

Needs root and ``ip``; skipped with the reason otherwise, and a failure instead of a skip when
``GNNPAR_REQUIRE_NETNS=1`` (CI sets it: there the machine can). The namespaces are made by
tests/e2e/netns.py (fixture ``hosts``, tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from helpers import ROOT
from tests.e2e.netns import Hosts, ip
from tests.strategies.test_gossip import check_pool

pytestmark = pytest.mark.slow

ADDR_A, ADDR_B = "10.213.0.1", "10.213.0.2"  # the fixture ``hosts``'s private /30
DEADLINE_S = 420  # for all the runs together; they usually take well under a minute each
COMMON = ["--dataset", "cora", "--model", "gcn", "--epochs", "2", "--seed", "5"]
COMMON += ["--threads", "1", "--timeout", "90", "--eval-every", "0", "--quiet"]


# ---------------------------------------------------------------------------------- the runs
@dataclass
class Run:
    """One launch: a two-host pair of torchrun agents, or one single-host --workers N run."""

    name: str
    procs: list[subprocess.Popen]
    outs: list[Path]
    logs: list[Path]
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    must_fail: bool = False

    def result_dir(self) -> Path:
        """The --out of the host that got global rank 0 (the only one with result.json)."""
        found = [o for o in self.outs if (o / "result.json").exists()]
        assert len(found) == 1, f"{self.name}: result.json in {found}"
        return found[0]

    def result(self) -> dict:
        return json.loads((self.result_dir() / "result.json").read_text())

    def weights(self) -> dict[str, torch.Tensor]:
        return torch.load(self.result_dir() / "model.pt", weights_only=True)["state_dict"]

    def tail(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text()[-2500:]}" for p in self.logs if p.exists())


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GLOO_SOCKET_IFNAME"):
        env.pop(k, None)
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip


def two_hosts(
    h: Hosts,
    tmp: Path,
    name: str,
    nproc: int,
    port: int,
    args: list[str],
    local_addr: bool = True,
    plain: bool = False,
    args_b: tuple[str, ...] = (),
) -> Run:
    """The README's two commands (``gnnpar torchrun``; ``plain``: torchrun itself, ``-m gnnpar
    train``), host A (rendezvous host) and host B, started together; ``args_b``: more flags
    for host B's ranks only."""
    procs, outs, logs = [], [], []
    for ns, ifname, addr, conf, more in (
        (h.a, h.if_a, ADDR_A, "is_host=true,join_timeout=120", ()),
        (h.b, h.if_b, ADDR_B, "join_timeout=120", args_b),
    ):
        out, log = tmp / f"{name}-{ns[-1]}", tmp / f"{name}-{ns[-1]}.log"
        launcher = ["torch.distributed.run"] if plain else ["gnnpar", "torchrun"]
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", *launcher]
        cmd += ["--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"{ADDR_A}:{port}", "--rdzv-id", name, "--rdzv-conf", conf]
        cmd += ["--local-addr", addr] if local_addr else []
        cmd += ["-m", "gnnpar"] if plain else []
        cmd += ["train", *COMMON, *args, *more, "--out", str(out)]
        procs.append(_start(cmd, log, _env(GLOO_SOCKET_IFNAME=ifname)))
        outs.append(out)
        logs.append(log)
    return Run(name, procs, outs, logs)


def one_host(tmp: Path, name: str, workers: int, args: list[str]) -> Run:
    out, log = tmp / name, tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "gnnpar", "train", *COMMON, *args, "--workers", str(workers)]
    return Run(name, [_start([*cmd, "--out", str(out)], log, _env())], [out], [log])


def _descendants(pids: set[int]) -> set[int]:
    """``pids`` and every process below them (torchrun's ranks run in sessions of their own)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                pass
    found, grew = set(pids), True
    while grew:
        new = {p for p, pp in parents.items() if pp in found and p not in found}
        found |= new
        grew = bool(new)
    return found


def _net_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _tcp_sockets(pid: int | str) -> list[tuple[str, str, str]]:
    """(local address, remote address, state) of the TCP sockets of ``pid``'s namespace."""
    rows = []
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return rows

    def addr(hex_addr: str) -> str:
        return socket.inet_ntoa(bytes.fromhex(hex_addr.split(":")[0])[::-1])

    for line in lines:
        parts = line.split()
        rows.append((addr(parts[1]), addr(parts[2]), parts[3]))  # state 0A: listening
    return rows


@dataclass
class Watch:
    """What the namespaces' processes did while the runs went on."""

    stray: set[tuple[int, str]] = field(default_factory=set)  # (pid, namespace) outside A/B
    addresses: set[str] = field(default_factory=set)  # every socket address inside A and B
    cross: int = 0  # samples with an established connection between the two veth addresses


def _kill(runs: list[Run]) -> None:
    pids = _descendants({p.pid for r in runs for p in r.procs})
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_all(h: Hosts, runs: list[Run]) -> Watch:
    """Wait for every run (deadline for all), sampling where the two-host processes live and
    which addresses their sockets use; on failure or timeout kill every process and fail."""
    ns_ids = {_net_ns(p.pid) for r in runs if len(r.procs) == 2 for p in r.procs}
    watch, t0 = Watch(), time.monotonic()
    try:
        while any(r.ended is None for r in runs):
            if time.monotonic() - t0 > DEADLINE_S:
                late = [r.name for r in runs if r.ended is None]
                pytest.fail(f"runs {late} did not end within {DEADLINE_S} s")
            for r in runs:
                codes = [p.poll() for p in r.procs]
                if r.must_fail and 0 in codes or not r.must_fail and set(codes) - {None, 0}:
                    pytest.fail(f"{r.name}: exit {codes}:\n{r.tail()}")
                if r.ended is None and None not in codes:
                    r.ended = time.monotonic()
            two = [p.pid for r in runs if len(r.procs) == 2 and r.ended is None for p in r.procs]
            for pid in _descendants(set(two)):
                ns = _net_ns(pid)
                if ns is not None and ns not in ns_ids:
                    watch.stray.add((pid, ns))
            for ns in (h.a, h.b):  # one process per namespace shows that namespace's table
                pids = ip("netns", "pids", ns).stdout.split()
                rows = _tcp_sockets(pids[0]) if pids else []
                watch.addresses |= {a for row in rows for a in row[:2]}
                if any({lo, rem} == {ADDR_A, ADDR_B} and st == "01" for lo, rem, st in rows):
                    watch.cross += 1
            time.sleep(0.5)
    except BaseException:
        _kill(runs)
        raise
    return watch


PAIRS = {  # name: (ranks per host, strategy flags)
    "allreduce-2x1": (1, ["--strategy", "allreduce", "--partitions", "4"]),
    "allreduce-2x2": (2, ["--strategy", "allreduce", "--partitions", "8"]),
    "gossip-2x1": (1, ["--strategy", "gossip", "--partitions", "4"]),
    "gossip-2x2": (2, ["--strategy", "gossip", "--partitions", "8"]),
    "pipeline-2x1": (1, ["--strategy", "pipeline", "--stages", "2", "--chunks", "2"]),
}
SINGLE = ["allreduce-2x1", "allreduce-2x2", "pipeline-2x1"]  # with a one-host reference


@pytest.fixture(scope="module")
def runs(hosts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-hosts")
    started = time.monotonic()
    pairs = {
        name: two_hosts(hosts, tmp, name, nproc, 29400 + i, args)
        for i, (name, (nproc, args)) in enumerate(PAIRS.items())
    }
    refs = {
        name: one_host(tmp, f"{name}-one-host", 2 * PAIRS[name][0], PAIRS[name][1])
        for name in SINGLE
    }
    # the mistake the README warns of: no --local-addr on hosts that share a hostname
    # (the last --timeout wins). Host B's ranks give up sooner than host A's store: once A's
    # ranks end, A's torchrun ends and takes the rendezvous with it, and B's agent then ends its
    # ranks (torch's own traceback) before they could say why, if they started later than A's
    # (a client's TCPStore retries for up to about twice its timeout: B's 2 x 6 s < A's 30 s)
    args = [*PAIRS["allreduce-2x1"][1], "--timeout", "30"]
    pairs["no-local-addr"] = two_hosts(
        hosts, tmp, "no-local-addr", 1, 29399, args, False, plain=True, args_b=("--timeout", "6")
    )
    pairs["no-local-addr"].must_fail = True
    watch = run_all(hosts, [*pairs.values(), *refs.values()])
    times = {r.name: round(r.ended - r.started, 1) for r in [*pairs.values(), *refs.values()]}
    print(f"two-host runs: {times}, all {time.monotonic() - started:.1f} s")
    return pairs, refs, watch


def _same_weights(a: Run, b: Run) -> None:
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{a.name} vs {b.name}: {key} differs"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["allreduce-2x1", "allreduce-2x2"])
def test_allreduce_across_two_hosts_ends_with_the_single_host_weights(runs, name):
    pairs, refs, _ = runs
    two, one = pairs[name], refs[name]
    _same_weights(two, one)
    r, ref = two.result(), one.result()
    assert r["workers"] == ref["workers"] == 2 * PAIRS[name][0]
    assert r["loss_curve"] == ref["loss_curve"]
    assert r["per_worker_batches"] == ref["per_worker_batches"]
    assert r["test_score"] == ref["test_score"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, parts", [("gossip-2x1", 4), ("gossip-2x2", 8)])
def test_gossip_across_two_hosts_trains_every_subgraph_exactly_once(runs, name, parts):
    r = runs[0][name].result()
    assert r["workers"] == 2 * PAIRS[name][0]
    check_pool(r, parts, 2)


@pytest.mark.timeout(600)
def test_pipeline_with_one_stage_per_host_matches_the_single_host_run(runs):
    pairs, refs, _ = runs
    two, one = pairs["pipeline-2x1"], refs["pipeline-2x1"]
    r, ref = two.result(), one.result()
    assert r["workers"] == 2 and r["strategy"] == "pipeline"
    assert (r["test_score"], r["val_score"]) == (ref["test_score"], ref["val_score"])
    assert r["loss_curve"] == ref["loss_curve"]
    _same_weights(two, one)


@pytest.mark.timeout(600)
def test_without_local_addr_the_ranks_fail_naming_the_settings_that_decide_it(runs):
    """Both hosts share a hostname: the store's host advertises it, the other host's ranks
    resolve it to themselves. Every rank ends with gnnpar's message (exit 1), none with a
    traceback from gnnpar's code (torchrun's agent still prints its own summary)."""
    run = runs[0]["no-local-addr"]
    assert all(p.returncode == 1 for p in run.procs), run.tail()
    logs = [log.read_text() for log in run.logs]
    errors = [line for log in logs for line in log.splitlines() if "gnnpar: error: " in line]
    assert len(errors) == 2, run.tail()
    assert any("could not reach the store at MASTER_ADDR:MASTER_PORT" in e for e in errors)
    for e in errors:
        assert "--local-addr" in e and "GLOO_SOCKET_IFNAME" in e and "NCCL_SOCKET_IFNAME" in e
    assert not any("gnnpar/runtime/dist.py" in log for log in logs), run.tail()


@pytest.mark.timeout(600)
def test_traffic_stays_inside_the_two_namespaces(runs, hosts):
    _, _, watch = runs
    assert not watch.stray, f"processes outside the two namespaces: {watch.stray}"
    # the ranks met over the veth, and used no address but the veths' and their own loopback
    assert watch.cross > 0
    assert watch.addresses <= {ADDR_A, ADDR_B, "127.0.0.1", "0.0.0.0"}, watch.addresses
    # the root namespace has neither address, and no socket of its own used them
    assert not {ADDR_A, ADDR_B} & set(re.findall(r"inet ([\d.]+)", ip("-o", "addr").stdout))
    root = {a for row in _tcp_sockets("self") for a in row[:2]}
    assert not root & {ADDR_A, ADDR_B}
