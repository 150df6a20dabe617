"""On-disk cache of prepared datasets, shared by every rank on a machine through the page cache.

Generated datasets (and user datasets once converted from their raw files) are written once to
``<data_root>/cache/<key>/`` as ``tensors.pt`` (``torch.save`` of a dict of tensors) plus
``meta.json``, and read back with ``torch.load(..., mmap=True)``. Memory-mapped tensors are backed
by the file, so four local ranks that load the same graph share one physical copy of it instead
of holding four (the data-parallel memory target: summed peak RSS of 4 ranks <= 1.5x one rank).

Two ranks that start at once must neither corrupt the cache nor both generate a 2 GB graph: the
builder takes an exclusive ``fcntl.flock`` on ``<key>.lock`` (released by the kernel if the
process dies; filelock.py), re-checks the cache, builds into a temporary folder and renames it
into place, so a reader sees either no folder or a complete one.

Crash safety:

* Waits on a lock are bounded by the run's ``--timeout`` *of silence* (the lock and its
  heartbeat: :mod:`gnnpar.data.filelock`).
* Every entry records its size and checksums in ``meta.json`` (``integrity``): the size and the
  SHA-256 of the first and last MiB are checked on every open (a truncated or overwritten file
  is caught for the cost of a ``stat`` and a 2 MiB read, whatever the file's size; the zip index
  ``torch.load`` needs sits in the last MiB), and ``torch.load`` failing counts as damage too.
  The SHA-256 of the whole file, computed while it is written, is kept for a full check
  (:func:`check_file` with ``full=True``): hashing a multi-GB file on every open of every rank
  would cost seconds per run. A damaged entry is rebuilt, with one warning naming it.
* A build killed with SIGKILL leaves its hidden ``.<key>.tmp-*`` folder behind; whoever next holds
  a lock in that cache folder removes such leftovers whose own lock is free (so a live builder's
  folder is never touched).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnpar.data.filelock import DEFAULT_LOCK_TIMEOUT_S, exclusive_lock

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]
Builder = Callable[[], tuple[Tensors, dict[str, Any]]]

ENDS = 1 << 20  # bytes hashed at each end of a file on every open
TMP_MARK, OLD_MARK = ".tmp-", ".old-"  # hidden leftovers: .<name>.tmp-XXXX, .<name>.old-XXXX
INTEGRITY = "integrity"  # the meta.json key holding {file: {size, sha256_ends, sha256}}


def remove_stale_temporaries(folder: Path, own: str | None = None) -> list[Path]:
    """Remove ``.<name>.tmp-*`` / ``.<name>.old-*`` leftovers of dead builds in ``folder``.

    Call it holding the lock ``<own>.lock``: leftovers of ``own`` are removed outright (nobody
    else can be building it); those of another name only if its lock ``<name>.lock`` is free
    right now (taken without waiting while removing), so a live builder's folder is never
    touched. Returns what was removed.
    """
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith("."):
            continue
        cut = max(name.rfind(TMP_MARK), name.rfind(OLD_MARK))
        if cut <= 1:
            continue
        base = name[1:cut]
        if base == own:
            _remove(entry, removed)
            continue
        try:
            fd = os.open(folder / f"{base}.lock", os.O_RDONLY)
        except FileNotFoundError:
            _remove(entry, removed)  # no lock file: no builder could be holding it
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # someone is building it now
        try:
            _remove(entry, removed)
        finally:
            os.close(fd)  # closing releases the lock
    return removed


def _remove(path: Path, removed: list[Path]) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            return
    removed.append(path)


# --------------------------------------------------------------------------------- integrity
class _HashingWriter:
    """A file wrapper that hashes what ``torch.save`` writes through it (no second read)."""

    def __init__(self, fh) -> None:  # noqa: ANN001
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data) -> int:  # noqa: ANN001
        self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _ends_digest(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(ENDS))
        fh.seek(max(0, size - ENDS))
        h.update(fh.read(ENDS))
    return h.hexdigest()


def save_tensors(obj: Any, path: str | Path) -> dict[str, Any]:
    """``torch.save(obj, path)``; returns the integrity record ``{size, sha256_ends, sha256}``."""
    import torch

    path = Path(path)
    with open(path, "wb") as fh:
        writer = _HashingWriter(fh)
        torch.save(obj, writer)
    return {
        "size": writer.size,
        "sha256_ends": _ends_digest(path, writer.size),
        "sha256": writer.sha.hexdigest(),
    }


def check_file(path: str | Path, record: dict[str, Any] | None, full: bool = False) -> str | None:
    """What is wrong with ``path`` against its integrity record (None: nothing found).

    Always checks the size and the SHA-256 of the first and last MiB; ``full=True`` also hashes
    the whole file. A missing record (an entry written before records existed) checks nothing.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as e:
        return f"{path.name} cannot be read ({e})"
    if not record:
        return None
    if size != record.get("size"):
        return f"{path.name} has {size} bytes, {record.get('size')} were written (truncated?)"
    try:
        if _ends_digest(path, size) != record.get("sha256_ends"):
            return f"{path.name} differs from what was written (checksum of its ends)"
        if full:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    h.update(chunk)
            if h.hexdigest() != record.get("sha256"):
                return f"{path.name} differs from what was written (SHA-256)"
    except OSError as e:
        return f"{path.name} cannot be read ({e})"
    return None


def load_tensors(path: str | Path) -> Any:
    """``torch.load(path, mmap=True, weights_only=True)``."""
    import torch

    return torch.load(path, mmap=True, weights_only=True)


def brief(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


# ------------------------------------------------------------------------------ the cache
def cache_dir(root: Path, key: str) -> Path:
    return Path(root) / "cache" / key


def _open(folder: Path, version: str) -> tuple[tuple[Tensors, dict[str, Any]] | None, str | None]:
    """``((tensors, meta), None)`` for a valid entry; else ``(None, why)``, where ``why`` is None
    if the entry is simply absent or of another version, and says what is damaged otherwise."""
    if not folder.exists():
        return None, None
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        return None, "meta.json is missing"
    except (OSError, ValueError) as e:
        return None, f"meta.json cannot be read ({brief(e)})"
    if not isinstance(meta, dict):
        return None, "meta.json does not hold a record"
    if meta.get("version") != version:
        return None, None
    record = meta.pop(INTEGRITY, {}).get("tensors.pt")
    why = check_file(folder / "tensors.pt", record)
    if why is not None:
        return None, why
    try:
        tensors = load_tensors(folder / "tensors.pt")
    except Exception as e:
        return None, f"torch.load of tensors.pt failed ({brief(e)})"
    return (tensors, meta), None


def cached(
    root: Path,
    key: str,
    version: str,
    build: Builder,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    what: str | None = None,
    announce: bool = True,
) -> tuple[Tensors, dict[str, Any], bool]:
    """Load ``key`` from the cache, building it with ``build()`` first if absent or stale.

    A build is announced on one line of stdout, ``gnnpar: <what> into <folder> ...`` when it
    starts, completed with the entry's size on disk and the time it took once it is written
    (``what``: e.g. "converting my_graph.pt"; default from the key, :func:`describe_key`), so a
    run never spends minutes or writes gigabytes without saying so (``announce=False``: the
    caller says it, :func:`announced`).

    Returns ``(tensors, meta, hit)``; ``hit`` is False when this call built the entry. ``version``
    is stored in meta.json: an entry with another version (older generator) is rebuilt, and so
    is a damaged one (with a warning naming it). ``lock_timeout_s`` (the run's ``--timeout``)
    bounds the wait on a lock holder that stopped answering (:func:`exclusive_lock`).
    """
    folder = cache_dir(root, key)
    loaded, why = _open(folder, version)
    if loaded is not None:
        return (*loaded, True)
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=parent)
        probe.close()
    except OSError as e:
        # A read-only data root still works, only without sharing or reuse: say so once.
        damaged = f" (the cached copy {folder} is damaged: {why})" if why else ""
        warnings.warn(
            f"Cannot write the dataset cache {parent} ({e}); building {key} in memory{damaged}. "
            "Point --data-root or $GNNPAR_DATA at a writable folder to cache it.",
            stacklevel=2,
        )
        tensors, meta = build()
        return tensors, {**meta, "version": version}, False
    with exclusive_lock(parent / f"{key}.lock", str(folder), lock_timeout_s):
        remove_stale_temporaries(parent, own=key)
        loaded, why = _open(folder, version)
        if loaded is not None:  # another process built it while we waited
            return (*loaded, True)
        if why is not None:
            warnings.warn(
                f"The dataset cache entry {folder} is damaged ({why}); rebuilding it.",
                stacklevel=2,
            )
        says = (
            announced(what or describe_key(key), folder) if announce else contextlib.nullcontext({})
        )
        with says as done:
            tensors, meta = build()
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}{TMP_MARK}", dir=parent))
            try:
                tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any file
                record = save_tensors(tensors, tmp / "tensors.pt")
                full_meta = {**meta, "version": version, INTEGRITY: {"tensors.pt": record}}
                (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1))
                del tensors
                if folder.exists():  # a stale version: move it aside, then delete it
                    stale = Path(tempfile.mkdtemp(prefix=f".{key}{OLD_MARK}", dir=parent))
                    os.rename(folder, stale / "old")
                    shutil.rmtree(stale, ignore_errors=True)
                os.rename(tmp, folder)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            done["size"] = entry_bytes(folder)
    # Reload memory-mapped, so the freshly built copy is shared with other ranks, not private.
    loaded, why = _open(folder, version)
    if loaded is None:
        raise RuntimeError(f"The cache entry {folder} just written cannot be read back ({why}).")
    return (*loaded, False)


@contextlib.contextmanager
def announced(what: str, folder: Path | str) -> Iterator[dict[str, Any]]:
    """``gnnpar: <what> into <folder> ...`` on stdout now, ended by ``<size> on disk, <t> s``
    (the size the body puts in the dict it is given as ``size``) when the body is done, by ``the
    same graph as <entry>, cached already`` where it puts ``same``, or by ``stopped`` when it
    raises (so that the error that follows starts a line of its own)."""
    t0 = time.perf_counter()
    print(f"gnnpar: {what} into {folder} ...", end="", flush=True)
    done: dict[str, Any] = {}
    try:
        yield done
    except BaseException:
        print(" stopped", flush=True)
        raise
    if "same" in done:  # what was read turned out to be cached already, under its content
        print(f" the same graph as {done['same']}, cached already", flush=True)
        return
    size = f" {human_bytes(done['size'])} on disk," if "size" in done else ""
    print(f"{size} {time.perf_counter() - t0:.1f} s; later runs reuse it", flush=True)


def entry_bytes(folder: Path) -> int:
    """The bytes a cache entry takes (its files)."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def describe_key(key: str) -> str:
    """What building the entry ``key`` does, in words: ``generating synthetic-cifar10 (--scale
    1, seed 0)`` for a generated dataset's :func:`gnnpar.data.datasets.generated_key`,
    ``converting reddit's files`` otherwise."""
    m = re.fullmatch(r"(synthetic-[\w-]+)-scale([^-]+)-seed(\d+)", key)
    if m:
        return f"generating {m[1]} (--scale {m[2]}, seed {m[3]})"
    return f"converting {key}'s files"


def human_bytes(n: float) -> str:
    """``704 MiB``, ``1.6 GiB``, ``12 KiB`` (binary units, as ``du -h`` counts)."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fingerprint(paths: list[Path]) -> str:
    """A cheap identity of source files (name, size, mtime): a changed file invalidates the cache."""
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.name}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)
