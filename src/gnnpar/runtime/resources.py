"""Resources that run out: the memory a run may use (its cgroup's limit) and a full disk, in words.

A run inside a memory cgroup (a container, SLURM's ``--mem``, systemd's ``MemoryMax``) may use
its cgroup's limit, not the machine's free memory: :func:`memory_limit` reads the limit and
what the cgroup holds now, cgroup v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``)
and v2 (``memory.max``, ``memory.current``), for the cgroup of this process named in
``/proc/self/cgroup`` and every cgroup above it (the smallest headroom binds), found through
``/proc/self/mountinfo``. Page cache that the kernel drops before it kills anyone (the
cgroup's inactive file pages) is not counted as used. :func:`available_memory` is the one
figure every footprint check, cache size and prediction compares against (through
:func:`gnnpar.runtime.footprint.available_bytes`): the smaller of the kernel's
``MemAvailable`` and the cgroup's headroom, with the words that name where it comes from.

When a rank dies of SIGKILL, :func:`oom_kills` (taken before the ranks start and again after)
says whether the kernel's OOM killer did it, and whose limit it enforced: the cgroup's
(v1 ``memory.oom_control``'s ``oom_kill``, or ``memory.failcnt`` where the kernel predates it;
v2 ``memory.events``' ``oom_kill``) or the machine's (``/proc/vmstat``'s ``oom_kill``).

A write that finds the disk full (``ENOSPC``, or ``EDQUOT`` for a quota) becomes one
:class:`~gnnpar.UsageError` naming the path, the bytes needed and the bytes free on its filesystem
(:func:`writing`, :func:`disk_full`), exit 2, instead of a traceback ending in ``OSError``.
:func:`check_space` refuses before writing when the free bytes are known to fall short.

Every reader takes a ``root`` folder (``/`` on a real machine) so that tests read hand-made
cgroup files from a fake root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gnnpar.errors import UsageError

GIB = 2**30
MIB = 2**20
# cgroup v1 writes "no limit" as the largest page-aligned counter (9223372036854771712); any
# figure above 2^60 bytes (an exbibyte) is no limit
UNLIMITED = 1 << 60
# errors that mean the disk (or the user's share of it) is full
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


# A resource of the machine that ran out (a full disk, a memory limit) is reported as a
# UsageError: one message, exit 2. Not a subclass: a rank's error reaches its launcher as
# "<class name>: <message>" (torch's error file), which gnnpar reads as a usage error only
# under that name (runtime/launch.py, runtime/torchrun.py).
ResourceError = UsageError


def size_words(n: int | float) -> str:
    """Bytes in GiB (one decimal) from 1 GiB on, else MiB, KiB, bytes."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:.1f} KiB"
    return f"{int(n)} bytes"


# ------------------------------------------------------------------------------------ memory


@dataclass(frozen=True)
class MemoryLimit:
    """The memory cgroup whose limit binds this process: its folder, cgroup ``version`` (1 or
    2), ``limit`` and ``used`` bytes (charged now, less its inactive page cache)."""

    folder: Path
    version: int
    limit: int
    used: int

    @property
    def headroom(self) -> int:
        """Bytes the cgroup may still take before the kernel reclaims, then kills."""
        return max(0, self.limit - self.used)

    def words(self) -> str:
        """``the memory cgroup's limit of 3.0 GiB``."""
        return f"the memory cgroup's limit of {size_words(self.limit)}"


@dataclass(frozen=True)
class MemoryBudget:
    """What a run may still allocate (``free`` bytes), and where that figure comes from:
    ``limit`` is the binding cgroup, or None when it is the machine's ``MemAvailable``."""

    free: int
    limit: MemoryLimit | None

    def words(self) -> str:
        """Where the figure comes from and what it is, for a message:
        ``the memory cgroup's limit of 3.0 GiB (2.7 GiB of it free)`` or
        ``this machine's available memory (20.1 GiB)``."""
        if self.limit is not None:
            return f"{self.limit.words()} ({size_words(self.free)} of it free)"
        return f"this machine's available memory ({size_words(self.free)})"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat_field(path: Path, name: str) -> int:
    """One ``name value`` line of a ``memory.stat``/``memory.events``/``oom_control`` file (0 if
    absent)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value.strip())
    except (OSError, ValueError):
        pass
    return 0


def _mounts(root: Path) -> list[tuple[str, str, Path, set[str]]]:
    """(fstype, root inside the hierarchy, mount point under ``root``, super options) of every
    cgroup file system in ``root/proc/self/mountinfo``; the usual places where that file is
    missing."""
    out = []
    try:
        lines = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        point = root / fields[4].lstrip("/")
        out.append((tail[0], fields[3], point, set(tail[2].split(","))))
    if not lines:
        base = root / "sys/fs/cgroup"
        out = [
            ("cgroup", "/", base / "memory", {"memory"}),
            ("cgroup2", "/", base / "unified", set()),
            ("cgroup2", "/", base, set()),
        ]
    return out


def _memory_folders(root: Path) -> list[tuple[int, Path, Path]]:
    """(version, this process's memory cgroup folder, its hierarchy's mount point): v1's memory
    controller first, then v2 (a hybrid machine may mount both; v1's memory controller is
    then the one that limits)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    found = []
    for fstype, mroot, point, opts in _mounts(root):
        if fstype == "cgroup" and "memory" in opts and v1 is not None:
            version, path = 1, v1
        elif fstype == "cgroup2" and v2 is not None:
            version, path = 2, v2
        else:
            continue
        if not (
            point / ("memory.limit_in_bytes" if version == 1 else "cgroup.controllers")
        ).exists():
            continue  # not mounted here (a fallback guess, or a hierarchy hidden from us)
        rel = path
        if mroot != "/" and (path == mroot or path.startswith(mroot.rstrip("/") + "/")):
            rel = path[len(mroot.rstrip("/")) :]
        folder = point / rel.lstrip("/")
        if not folder.is_dir():  # a container whose mount shows its own cgroup at the root
            folder = point
        found.append((version, folder, point))
    found.sort(key=lambda t: t[0])
    return found


def _levels(folder: Path, top: Path) -> Iterator[Path]:
    """``folder`` and every folder above it, up to and including ``top``."""
    f = folder
    while True:
        yield f
        if f == top or top not in f.parents:
            return
        f = f.parent


def _limit_at(version: int, folder: Path) -> MemoryLimit | None:
    if version == 1:
        limit = _read_int(folder / "memory.limit_in_bytes")
        usage = _read_int(folder / "memory.usage_in_bytes")
        inactive = _stat_field(folder / "memory.stat", "total_inactive_file")
    else:
        limit = _read_int(folder / "memory.max")
        usage = _read_int(folder / "memory.current")
        inactive = _stat_field(folder / "memory.stat", "inactive_file")
    if limit is None or limit >= UNLIMITED:
        return None
    used = max(0, (usage or 0) - inactive)
    return MemoryLimit(folder, version, limit, used)


def memory_limit(root: str | os.PathLike = "/") -> MemoryLimit | None:
    """The memory cgroup limit that binds this process (the least headroom among its cgroup and
    those above it, v1 or v2), or None when none is set (or none can be read)."""
    root = Path(root)
    best: MemoryLimit | None = None
    for version, folder, top in _memory_folders(root):
        for level in _levels(folder, top):
            lim = _limit_at(version, level)
            if lim is not None and (best is None or lim.headroom < best.headroom):
                best = lim
    return best


def meminfo_available(root: str | os.PathLike = "/") -> int | None:
    """The kernel's ``MemAvailable`` in bytes (``root/proc/meminfo``), or None."""
    try:
        for line in (Path(root) / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(root: str | os.PathLike = "/") -> MemoryBudget | None:
    """What this process (and the ranks it starts) may still allocate in host memory: the
    smaller of ``MemAvailable`` and the binding cgroup's headroom; None if neither is known.
    ``GNNPAR_MEMORY_LIMIT`` (bytes, or with a K/M/G suffix) stands for a cgroup limit where
    none can be made (it is read as a limit with nothing used yet)."""
    machine = meminfo_available(root)
    limit = memory_limit(root)
    forced = _forced_limit()
    if forced is not None and (limit is None or forced < limit.headroom):
        limit = MemoryLimit(Path("GNNPAR_MEMORY_LIMIT"), 0, forced, 0)
    if limit is not None and (machine is None or limit.headroom <= machine):
        return MemoryBudget(limit.headroom, limit)
    return None if machine is None else MemoryBudget(machine, None)


FORCED_LIMIT_ENV = "GNNPAR_MEMORY_LIMIT"


def _forced_limit() -> int | None:
    raw = os.environ.get(FORCED_LIMIT_ENV, "").strip()
    if not raw:
        return None
    try:
        return parse_bytes(raw)
    except ValueError:
        raise UsageError(
            f"{FORCED_LIMIT_ENV}={raw!r}: give bytes, or a number with K, M or G (e.g. 3G)."
        ) from None


def parse_bytes(text: str) -> int:
    """``3G``, ``512M``, ``1.5GiB``, ``1000000``: bytes (binary units). ValueError otherwise."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    number = float(t[:-1] if scale > 1 else t)
    if not number > 0 or number != number or number == float("inf"):
        raise ValueError(text)
    return int(number * scale)


def oom_kills(root: str | os.PathLike = "/") -> dict[str, tuple[int, MemoryLimit | None]]:
    """Counts of processes the kernel's OOM killer has killed so far: per memory cgroup of this
    process (and above), ``{folder: (count, its limit)}``, and the machine's under
    ``"machine"``. Compare two of them with :func:`killed_by_memory_limit`."""
    root = Path(root)
    out: dict[str, tuple[int, MemoryLimit | None]] = {}
    for version, folder, top in _memory_folders(root):
        for level in _levels(folder, top):
            if version == 1:
                count = _stat_field(level / "memory.oom_control", "oom_kill")
                if not count:  # kernels before 4.13 count only hits of the limit
                    count = _read_int(level / "memory.failcnt") or 0
            else:
                count = _stat_field(level / "memory.events", "oom_kill")
            out[str(level)] = (count, _limit_at(version, level))
    out["machine"] = (_stat_field(root / "proc/vmstat", "oom_kill"), None)
    return out


def killed_by_memory_limit(
    before: dict[str, tuple[int, MemoryLimit | None]],
    after: dict[str, tuple[int, MemoryLimit | None]],
) -> str | None:
    """Words for what the OOM killer enforced between the snapshots ``before`` and ``after``
    (:func:`oom_kills`): ``the memory limit of 1.5 GiB (the memory cgroup's limit)``, or ``the
    kernel's out-of-memory killer (the machine ran out of memory)``; None if it killed nobody."""
    limited = None
    for key, (count, lim) in after.items():
        if key == "machine" or count <= before.get(key, (0, None))[0]:
            continue
        if lim is not None and (limited is None or lim.limit < limited.limit):
            limited = lim
    if limited is not None:
        return f"the memory limit of {size_words(limited.limit)} (the memory cgroup's limit)"
    grew = [k for k, (c, _) in after.items() if c > before.get(k, (0, None))[0]]
    if grew:
        return "the kernel's out-of-memory killer (the machine ran out of memory)"
    return None


# -------------------------------------------------------------------------------------- disk


def free_disk_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the file system that holds ``path`` (or its nearest existing
    parent), or None."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        try:
            return int(shutil.disk_usage(candidate).free)
        except OSError:
            continue
    return None


def filesystem_type(path: str | os.PathLike, root: str | os.PathLike = "/") -> str | None:
    """The type of the file system that holds ``path`` (``ext4``, ``tmpfs``, ...) from
    ``root/proc/self/mounts`` (the longest mount point above it), or None."""
    p = str(Path(path).absolute())
    best, kind = -1, None
    try:
        lines = (Path(root) / "proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def disk_full(path: str | os.PathLike, need: int | None) -> ResourceError:
    """The error for a write to ``path`` of ``need`` bytes that found its disk full."""
    free = free_disk_bytes(path)
    needed = f"{size_words(need)} needed" if need is not None else "more space needed"
    have = f"{size_words(free)} free" if free is not None else "free space unknown"
    return ResourceError(
        f"the disk is full: writing {path} failed ({needed}, {have} on its file system). "
        "Free some space there, or point --out (or --data-root) at a disk with room."
    )


def check_space(path: str | os.PathLike, need: int) -> None:
    """:class:`~gnnpar.UsageError` (exit 2) when ``path``'s file system has fewer than ``need`` bytes
    free: called before a write whose size is known, so that nothing is half written."""
    free = free_disk_bytes(path)
    if free is not None and need > free:
        raise disk_full(path, need)


def is_disk_full(e: BaseException) -> bool:
    """``e`` (or what it was raised from) says the disk, or the user's quota, is full."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(e, RuntimeError) and "No space left on device" in str(e):
            return True  # torch.save's writer: "...unexpected pos N vs M" or "file write failed"
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


@contextlib.contextmanager
def writing(path: str | os.PathLike, need: int | None = None) -> Iterator[None]:
    """Around a write to ``path`` (``need`` bytes, where known): a full disk becomes one
    :class:`~gnnpar.UsageError` naming the path and the bytes needed and free (exit 2)."""
    try:
        yield
    except Exception as e:
        if isinstance(e, UsageError) or not is_disk_full(e):
            raise
        raise disk_full(path, need) from None


# ------------------------------------------------------------------- a cgroup for tests/benches


class CgroupUnavailable(RuntimeError):
    """A memory cgroup cannot be made here (not root, no writable memory controller)."""


@contextlib.contextmanager
def memory_cgroup(limit: int, root: str | os.PathLike = "/") -> Iterator[Path]:
    """A new memory cgroup limited to ``limit`` bytes (no swap where the kernel counts it),
    made inside this process's own memory cgroup (v1's memory controller, else v2 where this
    process's cgroup may have children with the memory controller), and removed afterwards
    (once the processes put in it have ended). Yields its folder: put a process in it with
    :func:`in_cgroup`. For the tests and benchmarks that run gnnpar under a limit; raises
    :class:`CgroupUnavailable` with the reason where none can be made."""
    import uuid

    if os.geteuid() != 0:
        raise CgroupUnavailable("making a cgroup needs root")
    tried = []
    for version, folder, _top in _memory_folders(Path(root)):
        child = folder / f"gnnpar-{uuid.uuid4().hex[:10]}"
        try:
            if version == 2:
                ctl = (folder / "cgroup.subtree_control").read_text().split()
                if "memory" not in ctl:
                    (folder / "cgroup.subtree_control").write_text("+memory")
            child.mkdir()
        except OSError as e:
            tried.append(f"v{version} {folder}: {e.strerror or e}")
            continue
        try:
            if version == 1:
                (child / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                    (child / "memory.memsw.limit_in_bytes").write_text(str(limit))
            else:
                (child / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (child / "memory.swap.max").write_text("0")
        except OSError as e:
            _remove_cgroup(child)
            tried.append(f"v{version} {child}: {e.strerror or e}")
            continue
        try:
            yield child
        finally:
            _remove_cgroup(child)
        return
    raise CgroupUnavailable("; ".join(tried) or "no memory cgroup controller is mounted")


def in_cgroup(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside the cgroup ``folder`` (a shell puts itself there, then execs)."""
    import shlex

    procs = shlex.quote(str(folder / "cgroup.procs"))
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]


def _remove_cgroup(folder: Path) -> None:
    """rmdir ``folder`` once its processes are gone (a few seconds at most)."""
    import time

    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
