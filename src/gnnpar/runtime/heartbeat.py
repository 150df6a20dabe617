"""Heartbeats: a rank that stops answering is found within ``--timeout``, and named.

When a rank stalls (SIGSTOP, a hung driver, a machine that froze), the others wait for it inside
a collective, and the collective's own timeout, when it comes, blames whoever it was talking to,
which is often not the stalled rank. So every rank of a multi-process run runs one small
thread that

* beats: every ``interval`` seconds it writes ``heartbeat/<rank>`` = "<count> <host> <pid>"
  into the run's key-value store (its own connection, so it never waits behind the training
  thread's store calls);
* watches: it reads every other rank's beat, and notes (on its own clock: no clock agreement
  between machines is needed) when each last changed. A rank whose beat has not changed for
  0.9 x ``--timeout`` seconds stopped answering (a little before any collective's own timeout,
  which would blame its partner): this rank then reports exactly that — "rank R (host
  H, pid P) stopped answering: no heartbeat for S s" — through torch's elastic error file (so
  the launcher and torchrun name it as the cause) and on stderr, and exits with status 1. The
  main thread cannot be woken from inside a blocked collective, hence the exit from here.

A rank that is done writes ``done`` as its last beat, and is not watched any more. A stalled
rank on the same machine is killed before this rank exits (it would not act on the launcher's
SIGTERM while stopped); one on another machine is left to its own machine's agent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import torch.distributed as dist


class PeerStalledError(RuntimeError):
    """Another rank stopped answering (no heartbeat for --timeout seconds)."""


class Heartbeat:
    def __init__(self, store: dist.Store, rank: int, world: int, timeout_s: float) -> None:
        self.store, self.rank, self.world, self.timeout_s = store, rank, world, timeout_s
        self.interval = max(0.05, min(1.0, timeout_s / 20))
        # declared stalled a little before any collective's own --timeout fires and blames
        # whoever it was talking to
        self.silence_s = 0.9 * timeout_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gnnpar-heartbeat", daemon=True)
        self.me = f"{socket.gethostname()} {os.getpid()}"

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def stop(self) -> None:
        """This rank is done: say so, so that nobody takes its silence for a stall."""
        self.stop_event.set()
        self.thread.join(timeout=5 * self.interval + 1)
        try:
            self.store.set(self._key(self.rank), "done")
        except Exception:  # the store may already be gone at the very end of a run
            pass

    def _key(self, rank: int) -> str:
        return f"heartbeat/{rank}"

    def _run(self) -> None:
        count = 0
        start = time.monotonic()
        seen: dict[int, tuple[bytes | None, float]] = {}  # rank -> (last value, when it changed)
        peers = [r for r in range(self.world) if r != self.rank]
        while not self.stop_event.wait(self.interval if count else 0):
            count += 1
            now = time.monotonic()
            try:
                self.store.set(self._key(self.rank), f"{count} {self.me}")
                values = [self._get(r) for r in peers]
            except Exception as e:  # the store itself stopped answering
                if now - start > self.silence_s:
                    self._fail(f"the run's key-value store stopped answering ({e})")
                continue
            for r, value in zip(peers, values):
                old, since = seen.get(r, (None, start))
                if value != old:
                    seen[r] = (value, now)
                elif value != b"done" and now - since > self.silence_s:
                    who, host, pid = f"rank {r}", "", 0
                    if value:
                        _, host, pid = value.decode().split(" ", 2)
                        who += f" (host {host}, pid {pid})"
                    self._fail(
                        f"{who} stopped answering: no heartbeat for {now - since:.0f} s "
                        f"(--timeout {self.timeout_s:g}). It is stalled (stopped, hung, or its "
                        "machine froze); check it, or raise --timeout if it is only slow.",
                        host,
                        int(pid),
                    )

    def _end_local(self, host: str, pid: int) -> None:
        """A stalled rank on this machine is killed: the run fails anyway, and a stopped
        process does not act on the launcher's SIGTERM (torch's agent would wait 30 s for it).
        Half a second later, from a detached shell: the launcher must first see this rank's
        report, not the stalled rank's death by signal."""
        if host == socket.gethostname():
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

    def _fail(self, message: str, host: str = "", pid: int = 0) -> None:
        """Report (elastic error file, stderr), end a stalled local peer, exit 1."""
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        error = PeerStalledError(message)
        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(error)
        if not os.environ.get("TORCHELASTIC_ERROR_FILE"):  # else the launcher reports it
            print(f"gnnpar: error: rank {self.rank}: {message}", file=sys.stderr, flush=True)
        if pid:
            self._end_local(host, pid)  # after the report: the launcher must find it first
        os._exit(1)
