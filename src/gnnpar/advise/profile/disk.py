"""Training from disk (a prepared folder, :mod:`gnnpar.data.prepared`): what a step reads, and
how fast the folder serves it.

A run's batches from a prepared folder gather their feature rows through the feature cache the
run gets (its size from the memory the run may use: a cgroup's limit where there is one, so
``gnnpar advise`` inside the run's limit profiles the run's cache), and count the rows the cache
served and the bytes read from the folder (:class:`gnnpar.data.sampling.loader.SampledBatches`).
The profile keeps those counts per batch size (:func:`batch_io`: hit rate, bytes read per step)
and, once, how fast the folder serves such reads when they miss the page cache
(:func:`read_rate`: one batch made with its feature pages dropped from the page cache, and made
again warm; the difference over its bytes read).

The prediction (:func:`io_per_step`) adds to each batch's making the time its reads take from
the disk: its bytes read x the share of them the page cache cannot hold (the folder's
features beyond the cache and its CSR, against the memory the limit leaves to the page cache
beside a process holding what a rank holds) / the read rate. A loader worker makes the batch, so the simulation overlaps that time with
the rank's compute as it does the making; without workers the rank waits for it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

# batches made cold to measure the read rate (each after its pages were dropped)
READ_PROBES = 3


def batch_io(batches, n: int) -> dict[str, float]:
    """The mean rows, cache hits and bytes read from the folder of the batches ``0..n-1`` of
    ``batches`` (made already: their counts are the batches' own), and the hit rate."""
    rows, hits, read = [], [], []
    for i in range(n):
        b = batches[i]
        rows.append(int(b.n_id.numel()))
        hits.append(int(b.cache_hits))
        read.append(int(b.bytes_read))
    total = sum(rows)
    return {
        "rows_per_step": statistics.fmean(rows),
        "hit_rate": sum(hits) / total if total else 0.0,
        "bytes_read_per_step": statistics.fmean(read),
    }


def drop_pages(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (clean pages no process maps; others' files
    untouched)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_rate(batches, folder: str, first: int) -> float | None:
    """Bytes per second the folder serves a batch's feature reads from the disk: batches
    ``first``, ``first + 1``, ... (not made before in this process, whose mapped pages would
    stay cached) each made right after the features' pages were dropped, then again warm; the
    median over :data:`READ_PROBES` of (bytes read / (cold - warm)). Pages the batch shares
    with batches made before stay cached, so this is an upper bound on the rate; None where
    the batches read nothing (every row cached)."""
    features = Path(folder) / "features.npy"
    rates = []
    for k in range(READ_PROBES):
        i = first + k
        drop_pages(features)
        t0 = time.perf_counter()
        b = batches[i]
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        batches[i]
        warm = time.perf_counter() - t0
        if b.bytes_read:
            rates.append(b.bytes_read / max(cold - warm, 1e-6))
    return statistics.median(rates) if rates else None


def disk_record(ds, source, batches, first: int) -> dict[str, Any]:
    """The profile's record of the prepared folder ``ds`` trains from (``source``: the run's
    sampled source, whose feature cache the run would get): its features' bytes, the cache's,
    the memory left to the page cache (the cgroup's headroom, else the machine's available
    memory, after the profile's batches), and the folder's read rate (:func:`read_rate`)."""
    from gnnpar.data.prepared import open_prepared
    from gnnpar.runtime import resources

    p = open_prepared(ds.info["prepared"])
    budget = resources.available_memory()
    limited = budget is not None and budget.limit is not None
    # what is left to the page cache now, in a process that holds what a rank holds (the
    # graph mapped, its feature cache, batches made and trained: charged to the same limit)
    memory = None if budget is None else budget.free
    return {
        "folder": str(p.folder),
        "feature_bytes": int(p.array("features").nbytes),
        "graph_bytes": int(p.array("indptr").nbytes + p.array("indices").nbytes),
        "cache_bytes": int(source.cache_bytes),
        "memory_bytes": None if memory is None else int(memory),
        "limited": limited,
        "read_bytes_s": read_rate(batches, str(p.folder), first),
    }


def disk_share(disk: dict[str, Any]) -> float:
    """The share of a batch's feature reads that the disk serves (the rest: the page cache):
    0 where the folder's features beyond the feature cache fit in the memory left to the page
    cache (``memory_bytes``: measured in the profile's process, which holds the graph mapped,
    the cache and its batches as a rank does), or where that is unknown; else the part of them
    that does not fit (reads spread over the uncached rows). The CSR the sampler reads
    competes for the same page cache, so it counts with them."""
    room = disk.get("memory_bytes")
    uncached = disk["feature_bytes"] - disk["cache_bytes"]
    if room is None or uncached <= 0:
        return 0.0
    return max(0.0, min(1.0, 1.0 - room / (uncached + disk.get("graph_bytes", 0))))


def io_per_step(prof, key: str) -> dict[str, float] | None:
    """The disk's part of a step of profiled batch size ``key`` from a prepared folder:
    ``io_s`` (seconds the reads take from the disk), ``bytes_read_per_step`` (what the cache
    missed: page cache or disk), ``disk_share`` and ``hit_rate``; None where the profile's run
    does not train from a prepared folder (or the profile is from before this record)."""
    disk = getattr(prof, "disk", None) or {}
    io = prof.sampled.get(key, {}).get("io")
    if not disk or io is None:
        return None
    share = disk_share(disk)
    rate = disk.get("read_bytes_s")
    read = io["bytes_read_per_step"]
    return {
        "io_s": read * share / rate if rate else 0.0,
        "bytes_read_per_step": read,
        "disk_share": share,
        "hit_rate": io["hit_rate"],
    }
