"""On-disk cache of prepared datasets, shared by every rank on a machine through the page cache.

Generated datasets (and user datasets once converted from their raw files) are written once to
``<data_root>/cache/<key>/`` as ``tensors.pt`` (``torch.save`` of a dict of tensors) plus
``meta.json``, and read back with ``torch.load(..., mmap=True)``. Memory-mapped tensors are backed
by the file, so four local ranks that load the same graph share one physical copy of it instead
of holding four (the data-parallel memory target: summed peak RSS of 4 ranks <= 1.5x one rank).

Two ranks that start at once must neither corrupt the cache nor both generate a 2 GB graph: the
builder takes an exclusive ``fcntl.flock`` on ``<key>.lock`` (released by the kernel if the
process dies), re-checks the cache, builds into a temporary folder and renames it into place,
so a reader sees either no folder or a complete one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
Builder = Callable[[], tuple[Tensors, dict[str, Any]]]


@contextmanager
def exclusive_lock(lock_path: str | Path, what: str, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (the kernel releases it if we die).

    Waits at most ``timeout_s`` for another process that holds it, then raises TimeoutError
    naming ``what`` it is writing, so a stuck writer ends in a clear error instead of a hang.
    """
    with open(lock_path, "w") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"Waited {timeout_s:.0f} s for another process to finish writing "
                        f"{what} (it holds {lock_path}). Stop that process or wait for it."
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cache_dir(root: Path, key: str) -> Path:
    return Path(root) / "cache" / key


def _valid(folder: Path, version: str) -> bool:
    meta = folder / "meta.json"
    if not (meta.exists() and (folder / "tensors.pt").exists()):
        return False
    try:
        return json.loads(meta.read_text()).get("version") == version
    except (OSError, json.JSONDecodeError):
        return False


def _load(folder: Path) -> tuple[Tensors, dict[str, Any]]:
    tensors = torch.load(folder / "tensors.pt", mmap=True, weights_only=True)
    return tensors, json.loads((folder / "meta.json").read_text())


def cached(
    root: Path, key: str, version: str, build: Builder, lock_timeout_s: float = 3600.0
) -> tuple[Tensors, dict[str, Any], bool]:
    """Load ``key`` from the cache, building it with ``build()`` first if absent or stale.

    Returns ``(tensors, meta, hit)``; ``hit`` is False when this call built the entry. ``version``
    is stored in meta.json: an entry with another version (older generator) is rebuilt.
    """
    folder = cache_dir(root, key)
    if _valid(folder, version):
        return (*_load(folder), True)
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=parent)
        probe.close()
    except OSError as e:
        # A read-only data root still works, only without sharing or reuse: say so once.
        warnings.warn(
            f"Cannot write the dataset cache {parent} ({e}); building {key} in memory. Point "
            "--data-root or $GNNPAR_DATA at a writable folder to cache it.",
            stacklevel=2,
        )
        tensors, meta = build()
        return tensors, {**meta, "version": version}, False
    with exclusive_lock(parent / f"{key}.lock", str(folder), lock_timeout_s):
        if _valid(folder, version):  # another process built it while we waited
            return (*_load(folder), True)
        tensors, meta = build()
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any file
            torch.save(tensors, tmp / "tensors.pt")
            (tmp / "meta.json").write_text(json.dumps({**meta, "version": version}, indent=1))
            del tensors
            if folder.exists():  # a stale version: move it aside, then delete it
                stale = Path(tempfile.mkdtemp(prefix=f".{key}.old-", dir=parent))
                os.rename(folder, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    # Reload memory-mapped, so the freshly built copy is shared with other ranks, not private.
    return (*_load(folder), False)


def fingerprint(paths: list[Path]) -> str:
    """A cheap identity of source files (name, size, mtime): a changed file invalidates the cache."""
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.name}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)
