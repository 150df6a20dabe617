"""Heartbeats: a rank that stops answering is found within ``--timeout``, and named.

When a rank stalls (SIGSTOP, a hung driver, a machine that froze), the others wait for it inside
a collective, and the collective's own timeout, when it comes, blames whoever it was talking to,
which is often not the stalled rank. So every rank of a multi-process run runs one small
thread that

* beats: every ``interval`` seconds it writes ``heartbeat/<rank>`` = "<count> <host> <pid>
  <address> <machine>" into the run's key-value store (its own connection, so it never waits
  behind the training thread's store calls); ``address`` is the one this host reaches the store
  from (what the other hosts know it by; hosts may share a hostname), ``machine`` the kernel's
  boot id and the network namespace, which tell whether a peer runs on this very machine;
* watches: it reads every other rank's beat, and notes (on its own clock: no clock agreement
  between machines is needed) when each last changed. A rank whose beat has not changed for
  0.9 x ``--timeout`` seconds stopped answering (a little before any collective's own timeout,
  which would blame its partner): this rank then reports exactly that — "rank R (host
  H at A, pid P) stopped answering: no heartbeat for S s" — through torch's elastic error file
  (so gnnpar's launcher names it as the cause) and, except under gnnpar's own launcher (which
  reports it once), on stderr as one ``gnnpar: error:`` line, and exits with status 1. The main
  thread cannot be woken from inside a blocked collective, hence the exit from here. A store
  that stops answering for as long (the host holding it, or the network to it, is gone) is
  reported the same way, naming the store's address and rank 0's host.

Across hosts a network outage looks like this on both sides: each host's ranks name the other
host's and exit; torchrun (``--max-restarts``) restarts them once the hosts reach each other
again, and they resume from the newest checkpoint every rank holds
(:mod:`gnnpar.training.checkpoint`).

A rank that is done writes ``done`` as its last beat, and is not watched any more. A stalled
rank on the same machine (same boot id and network namespace) is killed before this rank exits
(it would not act on the launcher's SIGTERM while stopped); one on another machine is left to
its own machine's agent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

# Set by gnnpar's own launcher (gnnpar.runtime.launch) for the ranks it starts: they report a
# failure through it, not on stderr, as torchrun's ranks do
OWN_LAUNCHER_ENV = "GNNPAR_OWN_LAUNCHER"


class PeerStalledError(RuntimeError):
    """Another rank stopped answering (no heartbeat for --timeout seconds)."""


def machine_id() -> str:
    """This machine and network namespace: the kernel's boot id and the namespace's inode
    (two hosts that are network namespaces of one machine differ in the second)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        net = os.readlink("/proc/self/ns/net")
    except OSError:
        return ""
    return f"{boot}/{net.removeprefix('net:').strip('[]')}"


def local_address() -> str:
    """The address this host reaches the run's store from (MASTER_ADDR): what the other hosts
    know it by. No packet is sent (a UDP socket's connect only picks the route); "" if unknown.
    """
    return _route()[0]


def _route() -> tuple[str, str]:
    """(this host's address towards the run's store, the store's address as resolved), by a
    UDP socket's connect (no packet sent); ("", "") if unknown. MASTER_ADDR may be a name
    ("localhost") where the beats carry addresses ("127.0.0.1"): the resolved one matches."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        return "", ""
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, int(port)))
            return str(s.getsockname()[0]), str(s.getpeername()[0])
    except OSError:
        return "", ""


class Heartbeat:
    def __init__(self, store: dist.Store, rank: int, world: int, timeout_s: float) -> None:
        self.store, self.rank, self.world, self.timeout_s = store, rank, world, timeout_s
        self.interval = max(0.05, min(1.0, timeout_s / 20))
        # declared stalled a little before any collective's own --timeout fires and blames
        # whoever it was talking to
        self.silence_s = 0.9 * timeout_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gnnpar-heartbeat", daemon=True)
        self.io = threading.Thread(target=self._exchange, name="gnnpar-heartbeat-io", daemon=True)
        self.machine = machine_id()
        mine, self.store_addr = _route()
        me = [socket.gethostname(), str(os.getpid()), mine or "-", self.machine or "-"]
        self.me = " ".join(me)

    def start(self) -> Heartbeat:
        global watched_timeout_s
        watched_timeout_s = self.timeout_s
        self.thread.start()
        return self

    def stop(self) -> None:
        """This rank is done: say so, so that nobody takes its silence for a stall."""
        global watched_timeout_s
        watched_timeout_s = None
        self.stop_event.set()
        self.thread.join(timeout=5 * self.interval + 1)
        if self.io.ident is not None:  # its last count must not follow "done"
            self.io.join(timeout=5 * self.interval + 1)
        try:
            self.store.set(self._key(self.rank), "done")
        except Exception:  # the store may already be gone at the very end of a run
            pass

    def _key(self, rank: int) -> str:
        return f"heartbeat/{rank}"

    def _run(self) -> None:
        """Watch: every ``interval``, the newest answer of the store (:meth:`_exchange`) and
        the peers' beats in it. A call to a store across a network that went down does not
        return (TCPStore's timeout does not bound it) until the network is back, so the calls
        run in a thread of their own and the watch reads their newest result."""
        global silence  # what it saw silent last: dist.peer_failure names it
        start = time.monotonic()
        self._answer: tuple[float, list[bytes | None] | None, Exception | None] = (
            start,
            None,
            None,
        )  # (when the store last answered, the peers' beats then, the newest error since)
        self.io.start()
        seen: dict[int, tuple[bytes | None, float]] = {}  # rank -> (last value, when it changed)
        peers = [r for r in range(self.world) if r != self.rank]
        while not self.stop_event.wait(self.interval):
            now = time.monotonic()
            answered, values, error = self._answer
            if now - answered > self.silence_s:  # the store itself stopped answering
                self._fail(self._store_silent(now - answered, error, seen))
                continue
            quiet = 2 * self.interval  # a silence worth naming should a collective fail now
            silence = None
            if now - answered > quiet:
                silence = f"the store had not answered for {now - answered:.1f} s"
            for r, value in zip(peers, values or []):
                old, since = seen.get(r, (None, start))
                if value != old:
                    seen[r] = (value, now)
                    continue
                if value != b"done" and now - since > quiet and silence is None:
                    silence = (
                        f"{describe(r, value)[0]} had sent no heartbeat for {now - since:.1f} s"
                    )
                if value != b"done" and now - since > self.silence_s:
                    who, host, pid, machine = describe(r, value)
                    self._fail(
                        f"{who} stopped answering: no heartbeat for {now - since:.0f} s "
                        f"(--timeout {self.timeout_s:g}). It is stalled (stopped, hung, or its "
                        "machine froze), or the network between its host and this one is "
                        f"down; check it, or raise --timeout if it is only slow.{next_step()}",
                        host,
                        pid,
                        machine=machine,
                    )

    def _exchange(self) -> None:
        """Beat: write this rank's count and read the peers' beats, every ``interval``."""
        count = 0
        peers = [r for r in range(self.world) if r != self.rank]
        while not self.stop_event.is_set():
            count += 1
            try:
                self.store.set(self._key(self.rank), f"{count} {self.me}")
                values = [self._get(r) for r in peers]
            except Exception as e:  # refused, reset, timed out: the watch decides
                self._answer = (*self._answer[:2], e)
            else:
                self._answer = (time.monotonic(), values, None)
            self.stop_event.wait(self.interval)

    def _store_silent(
        self, silent_s: float, e: Exception | None, seen: dict[int, tuple[bytes | None, float]]
    ) -> str:
        """The message for a store that stopped answering: where it is, and which rank's host
        holds it (a rank there beats with the store's address as its own)."""
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        where = f" at {addr}:{port}" if addr and port else ""
        # the store lives on the host whose ranks reach it at its own address (by name or as
        # resolved when this rank started: no name lookup now, the network may be down)
        at = {a for a in (addr, self.store_addr) if a}
        near = sorted(r for r, (value, _) in seen.items() if _field(value, 3) in at)
        holder = f" (on the host of {describe(near[0], seen[near[0]][0])[0]})" if near else ""
        if e is None:
            cause = "a call to it has not returned"
        else:
            cause = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return (
            f"the run's key-value store{where}{holder} stopped answering for {silent_s:.1f} s "
            f"(--timeout {self.timeout_s:g}; {cause}): that host is down, or the network "
            f"between it and this host is.{next_step()}"
        )

    def _end_local(self, host: str, pid: int, machine: str = "") -> None:
        """A stalled rank on this machine is killed: the run fails anyway, and a stopped
        process does not act on the launcher's SIGTERM (torch's agent would wait 30 s for it).
        Half a second later, from a detached shell: the launcher must first see this rank's
        report, not the stalled rank's death by signal. "This machine": the same boot id and
        network namespace (a beat without them: the same hostname)."""
        if (machine == self.machine) if machine and self.machine else host == socket.gethostname():
            subprocess.Popen(
                ["/bin/sh", "-c", f"sleep 0.5; kill -KILL {pid} 2>/dev/null"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def _get(self, rank: int) -> bytes | None:
        key = self._key(rank)
        return self.store.get(key) if self.store.check([key]) else None

    def _fail(self, message: str, host: str = "", pid: int = 0, machine: str = "") -> None:
        """Report (elastic error file, stderr), end a stalled local peer, exit 1."""
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        error = PeerStalledError(message)
        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(error)
        if not os.environ.get(OWN_LAUNCHER_ENV):  # gnnpar's launcher reports it itself
            print(f"gnnpar: error: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        if pid:
            self._end_local(host, pid, machine)  # after the report: the launcher finds it first
        os._exit(1)


# What this rank's heartbeat watch last saw silent, if anything: the store, or the peer silent
# longest (``None`` when all answered). A collective that fails names it (dist.peer_failure).
silence: str | None = None
# The --timeout of this rank's running watch; None when no watch runs (one process alone, or
# stopped). With a watch running and nothing silent, a collective that timed out waited for a
# rank that is alive but slower than --timeout allows (dist.peer_failure says so).
watched_timeout_s: float | None = None


def next_step() -> str:
    """What happens next, under torchrun (gnnpar's launcher says it in its own words)."""
    if os.environ.get(OWN_LAUNCHER_ENV) or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return ""
    return (
        " With --max-restarts, torchrun restarts the ranks once the hosts reach each other "
        "again (within its rendezvous join_timeout) and they resume from the newest checkpoint "
        "that every rank holds."
    )


def describe(rank: int, value: bytes | None) -> tuple[str, str, int, str]:
    """``("rank R (host H at A, pid P)", host, pid, machine)`` from a rank's last beat
    ("<count> <host> <pid>[ <address> <machine>]"; "-" for one it did not know)."""
    if not value:
        return f"rank {rank}", "", 0, ""
    host, pid_text, addr, machine = (_field(value, i) for i in (1, 2, 3, 4))
    pid = int(pid_text) if pid_text.isdigit() else 0
    at = f" at {addr}" if addr else ""
    return f"rank {rank} (host {host}{at}, pid {pid})", host, pid, machine


def _field(value: bytes | None, i: int) -> str:
    """Field ``i`` of a beat ("" where it has none, or "-")."""
    fields = value.decode(errors="replace").split(" ") if value else []
    return fields[i] if len(fields) > i and fields[i] != "-" else ""
