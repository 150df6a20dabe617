"""CPU time of every process of a run over time, from ``/proc/<pid>/stat`` (Linux): a run's
ranks, their fork servers, loader workers and resource trackers, sampled every ``every_s`` by a
thread of the driver, each named by what it is (:func:`kind`). ``lightning_loaders.py --trace``
uses it to say where a first epoch's wall time goes; not a script of its own."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: user + system of the process itself) or None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


class ProcCPU:
    """Samples of every descendant of ``root``: ``samples`` is a list of (time.time(), {pid:
    CPU seconds}); ``procs`` maps each pid seen to its parent, command line and environment's
    LOCAL_RANK (read once, when first seen)."""

    def __init__(self, root: int, every_s: float = 0.025) -> None:
        self.root = root
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.procs: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            parents: dict[int, int] = {}
            cpu: dict[int, float] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    st = _stat(int(entry))
                    if st is not None:
                        parents[int(entry)], cpu[int(entry)] = st
            mine, frontier = {self.root}, [self.root]
            children: dict[int, list[int]] = {}
            for pid, ppid in parents.items():
                children.setdefault(ppid, []).append(pid)
            while frontier:
                for c in children.get(frontier.pop(), []):
                    if c not in mine:
                        mine.add(c)
                        frontier.append(c)
            for pid in mine:
                if pid not in self.procs and pid in parents:
                    env = _read(pid, "environ").split(b"\0")
                    local = [
                        e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LOCAL_RANK=")
                    ]
                    self.procs[pid] = {
                        "ppid": parents[pid],
                        "cmd": _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace"),
                        "local_rank": local[0] if local else None,
                        "seen": time.time(),
                    }
            self.samples.append((time.time(), {p: cpu[p] for p in mine if p in cpu}))
            self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def kinds(self) -> dict[int, str]:
        """Each pid's role: rank0, rank1, ... (a process of the script: the root, or one with
        LOCAL_RANK set by the launcher), forkserverN (multiprocessing's fork server started by
        rank N), workerN (a child of rank N's fork server, or a fork of rank N itself),
        trackerN (multiprocessing's resource tracker), otherwise 'other'."""
        out: dict[int, str] = {self.root: "rank0"}
        # ranks first (a rank's fork server and workers are named after it)
        for pid, p in sorted(self.procs.items(), key=lambda kv: kv[1]["seen"]):
            if pid != self.root and "--side" in p["cmd"] and p["local_rank"] not in (None, "0"):
                if self.procs.get(p["ppid"], {}).get("cmd") != p["cmd"] or p["ppid"] == self.root:
                    out[pid] = f"rank{p['local_rank']}"
        for pid, p in sorted(self.procs.items(), key=lambda kv: (kv[1]["seen"], kv[0])):
            if pid in out:
                continue
            parent = out.get(p["ppid"], "")
            if parent.startswith("forkserver"):
                out[pid] = "worker" + parent.removeprefix("forkserver")
            elif "forkserver" in p["cmd"]:
                out[pid] = "forkserver" + parent.removeprefix("rank")
            elif "resource_tracker" in p["cmd"]:
                out[pid] = "tracker" + parent.removeprefix("rank")
            elif parent.startswith("rank"):
                out[pid] = "worker" + parent.removeprefix("rank")
            else:
                out[pid] = "other"
        return out

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each kind of process used between the wall times ``t0`` and ``t1`` (the
        samples nearest them; a process born inside counts from 0)."""
        kinds = self.kinds()

        def at(t: float) -> dict[int, float]:
            best = min(self.samples, key=lambda s: abs(s[0] - t))
            return best[1]

        a, b = at(t0), at(t1)
        out: dict[str, float] = {}
        for pid, c in b.items():
            k = kinds.get(pid, "other")
            out[k] = out.get(k, 0.0) + c - a.get(pid, 0.0)
        return dict(sorted(out.items()))

    def record(self) -> dict:
        kinds = self.kinds()
        return {
            "procs": {str(p): {**v, "kind": kinds.get(p, "other")} for p, v in self.procs.items()},
            "samples": [[t, {str(p): c for p, c in s.items()}] for t, s in self.samples],
        }
