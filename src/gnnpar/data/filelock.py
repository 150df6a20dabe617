"""A lock across processes and hosts that says who holds it, and gives up on a holder that died.

:func:`exclusive_lock` holds an exclusive ``fcntl.flock`` on a lock file (the kernel releases it
if the holder dies); what the dataset cache (:mod:`gnnpar.data.cache`) and the partition cache
(:mod:`gnnpar.data.partition`) build under it, each build once for every process of every host
that shares the folder.

Waits are bounded by the run's ``--timeout`` *of silence*: the holder writes its PID, host and a
heartbeat into the lock file; a waiter keeps waiting while the holder is alive and running (a
full-size build may take minutes), and fails with :class:`CacheLockTimeout` (naming the lock,
what is being written, and the holder's PID and host) once the holder has shown no sign of life
for ``--timeout`` seconds: stopped (SIGSTOP, ``kill -STOP``), or, on another host, no heartbeat.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A lock holder that shows no sign of life for this long is reported (the default of --timeout,
# config.StrategyConfig.timeout_s; callers pass the run's own value).
DEFAULT_LOCK_TIMEOUT_S = 120.0
HEARTBEAT_S = 1.0  # how often a lock holder rewrites its record in the lock file


class CacheLockTimeout(RuntimeError):
    """The process holding a cache lock stopped answering (CLI: exit 1, the message says which)."""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a local process from /proc, or None if there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return fields[0], fields[19]  # state (R, S, D, T, t, Z, ...), starttime (clock ticks)


def _holder_record(beat: int) -> bytes:
    stat = _proc_stat(os.getpid())
    return json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "start": stat[1] if stat else None,
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "beat": beat,
        }
    ).encode()


def _write_record(fd: int, record: bytes) -> None:
    try:
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
    except OSError:
        pass  # the record only helps a waiter's message; the lock itself is what matters


def _read_holder(lock_path: Path) -> tuple[bytes, dict[str, Any]]:
    """The raw lock file and its parsed holder record (opened afresh: NFS revalidates on open)."""
    try:
        raw = lock_path.read_bytes()
    except OSError:
        return b"", {}
    try:
        info = json.loads(raw)
    except ValueError:  # empty (an older writer), or caught mid-rewrite
        return raw, {}
    return raw, info if isinstance(info, dict) else {}


def _local_state(info: dict[str, Any]) -> str | None:
    """The holder's process state if it runs on this host (None: elsewhere, or gone)."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    stat = _proc_stat(pid)
    if stat is None or (info.get("start") is not None and stat[1] != info["start"]):
        return None  # not that process (gone; its PID reused)
    return stat[0]


def _holder_text(info: dict[str, Any], state: str | None) -> str:
    if not info.get("pid"):
        return "a process that did not record itself (an older gnnpar, or another program)"
    where = info.get("host", "an unknown host")
    text = f"PID {info['pid']} on host {where} (holding it since {info.get('since', '?')}"
    if state in ("T", "t"):
        text += "; that process is stopped"
    elif state is None and where != socket.gethostname():
        text += "; another host: its heartbeat in the lock file stopped"
    return text + ")"


@contextmanager
def exclusive_lock(
    lock_path: str | Path, what: str, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (the kernel releases it if we die).

    While holding it, this process keeps its PID, host and a heartbeat in the lock file. A waiter
    waits as long as the holder is alive and running (a local process not stopped, or a
    heartbeat that still changes), and raises :class:`CacheLockTimeout` once the holder has shown
    no sign of life for ``timeout_s`` seconds (e.g. stopped with SIGSTOP), naming the lock file,
    ``what`` is being written and the holder. Past ``timeout_s`` of waiting on a live holder it
    says on stderr whom it waits for, so a long wait is never silent.
    """
    lock_path = Path(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        writable = True
    except PermissionError:  # another user's cache: flock works on a read-only descriptor too
        fd, writable = os.open(lock_path, os.O_RDONLY), False
    try:
        _acquire(fd, lock_path, what, timeout_s)
        stop = threading.Event()
        beater = None
        if writable:
            _write_record(fd, _holder_record(0))

            def beat() -> None:
                n = 0
                while not stop.wait(HEARTBEAT_S):
                    n += 1
                    _write_record(fd, _holder_record(n))

            beater = threading.Thread(target=beat, name="gnnpar-cache-lock", daemon=True)
            beater.start()
        try:
            yield
        finally:
            stop.set()
            if beater is not None:
                beater.join()
                _write_record(fd, b"")
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, lock_path: Path, what: str, timeout_s: float) -> None:
    start = last_sign = time.monotonic()
    seen = None
    notice_at, notice_every = start + timeout_s, max(60.0, timeout_s)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        raw, info = _read_holder(lock_path)
        state = _local_state(info)
        if raw != seen or state not in (None, "T", "t", "Z", "X", "x"):
            seen, last_sign = raw, now  # a new heartbeat, or a local holder that runs
        if now - last_sign > timeout_s:
            pid = info.get("pid") if isinstance(info.get("pid"), int) else "PID"
            find = "" if isinstance(pid, int) else f" (find it with: fuser -v {lock_path})"
            busy = (
                "" if state in ("T", "t") else "; or, if it is only busy, give a larger --timeout"
            )
            raise CacheLockTimeout(
                f"Waited {now - start:.0f} s for the lock {lock_path}, held by "
                f"{_holder_text(info, state)} while it writes {what}: it showed no sign of life "
                f"for {timeout_s:g} s (--timeout). Resume that process (kill -CONT {pid}) or end "
                f"it (kill {pid}; the lock is released when it exits){find}, then run again"
                f"{busy}."
            )
        if now >= notice_at:
            print(
                f"gnnpar: waiting {now - start:.0f} s so far for {_holder_text(info, state)}, "
                f"which is writing {what} (lock {lock_path}); it is still alive.",
                file=sys.stderr,
                flush=True,
            )
            notice_at = now + notice_every
        time.sleep(min(0.2, timeout_s / 10))
