"""Feature rows of a prepared folder read from a cold page cache: through the memory map against
the threaded reads of ``FileRows`` (the sampler kernel's ``gnnpar_pread_rows``), through the
page cache and around it (O_DIRECT, aligned to the device's logical block size and to a page:
the bytes each reads from the device are counted too).

What one sampled step does with the rows its feature cache misses: ``--rows`` distinct rows,
drawn at random (seeded) and sorted, gathered from ``features.npy``. Before every call the
file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``), so each side reads
the disk. Sides alternate (harness.alternate); medians, rows per second and the megabytes a
second of row bytes delivered. Both sides must return the same bytes (checked).

    python -m benchmarks.memory.feature_reads --folder /work/data/shared/papers100m-0.1 \\
        --rows 250000 --reps 5
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import harness


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=5, out=True)
    ap.add_argument("--folder", type=Path, help="a gnnpar prepared folder")
    ap.add_argument("--rows", type=int, default=250_000, help="rows gathered per call")
    ap.add_argument("--threads-list", default="64", help="FileRows threads to try, e.g. 16,64")
    a = harness.start(ap, argv, smoke={"reps": 1, "rows": 500})
    import torch

    from gnnpar.data.prepared import FileRows, direct_align, open_prepared
    from gnnpar.data.sampling import kernel
    from gnnpar.data.sampling.loader import open_graph_folder

    with tempfile.TemporaryDirectory(prefix="gnnpar-reads-") as tmp:
        if a.smoke:
            a.folder = harness.smoke_prepared(Path(tmp) / "graph")
        if a.folder is None:
            ap.error("--folder is required (a gnnpar prepared folder)")
        if not kernel.kernel_available():
            print(f"error: the compiled kernel is not built ({kernel.HINT})", file=sys.stderr)
            return 2
        p = open_prepared(a.folder)
        g = open_graph_folder(str(a.folder))
        x, path = g["x"], g["x_file"][0]
        n = min(a.rows, p.num_nodes)
        rng = np.random.default_rng(0)
        rows = torch.from_numpy(np.sort(rng.choice(p.num_nodes, n, replace=False)))
        want = torch.index_select(x, 0, rows)

        def through_map() -> None:
            xm = open_graph_folder(str(a.folder))["x"]  # a fresh map: no pages mapped yet
            assert torch.equal(torch.index_select(xm, 0, rows), want)

        sides = {"map": through_map}
        for t in (int(v) for v in a.threads_list.split(",")):

            def threaded(t: int = t) -> None:
                reader = FileRows.open(g)
                reader.THREADS = t
                out = torch.empty_like(want)
                reader.read(rows, out)
                reader.close()
                assert torch.equal(out, want)

            sides[f"FileRows {t} threads"] = threaded

        read_mb: dict[str, list[float]] = {}

        def io_read_bytes() -> int:  # this process's bytes read from the device
            with open("/proc/self/io") as fh:
                return next(int(ln.split()[1]) for ln in fh if ln.startswith("read_bytes:"))

        # around the page cache (O_DIRECT), as inside a tight limit: aligned to the device's
        # logical block size (gnnpar's choice) and to a page (before)
        for align in sorted({direct_align(path), FileRows.DIRECT_ALIGN}):

            def direct(align: int = align) -> None:
                reader = FileRows(path, g["x_file"][1], x.size(1) * x.element_size(), True, align)
                out = torch.empty_like(want)
                before = io_read_bytes()
                reader.read(rows, out)
                read_mb.setdefault(align, []).append((io_read_bytes() - before) / 1e6)
                reader.close()
                assert torch.equal(out, want)

            sides[f"FileRows 64 threads, O_DIRECT, {align} B aligned"] = direct
        drop(path)
        times = harness.alternate(sides, a.reps, warmup=0, after=lambda: drop(path))
        file_bytes = os.path.getsize(path)
    row_bytes = x.size(1) * x.element_size()
    report = {"rows": n, "row_bytes": row_bytes, "file_bytes": file_bytes, "sides": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        report["sides"][name] = {
            "median_s": med,
            "rows_per_s": n / med,
            "row_mb_per_s": n * row_bytes / med / 1e6,
            "times_s": ts,
        }
        print(f"{name:22s} {med:8.3f} s  {n / med / 1e3:9.1f} K rows/s  "
              f"{n * row_bytes / med / 1e6:8.1f} MB/s of rows")  # fmt: skip
    for align, mbs in read_mb.items():
        key = f"FileRows 64 threads, O_DIRECT, {align} B aligned"
        report["sides"][key]["read_mb"] = statistics.median(mbs)
        print(f"{key}: {statistics.median(mbs):.0f} MB read from the device a call")
    report["load_after"] = list(harness.load_average())
    report["machine"] = harness.machine()
    if a.out:
        harness.write_json(a.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
