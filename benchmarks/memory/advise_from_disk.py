"""advise's predicted epoch of sampled training from a prepared folder inside a memory cgroup,
against the epoch gnnpar trains there.

    python -m benchmarks.memory.advise_from_disk --folder FOLDER --limit 1G [--reps 2]
        [--batch-size 1024] [--fanouts 15,10,5] [--hidden 256] [--loader-workers 0]

Each repetition, inside a fresh memory cgroup of ``--limit`` (no swap), the folder's pages
dropped from the page cache first each time: ``gnnpar advise --strategies sampled`` with the
run's settings (its profile sees the limit: the feature cache the run gets, and the share of
the reads the disk serves), and ``gnnpar train`` of one epoch with the same settings (the
order alternates between repetitions). Printed: the predicted epoch, its disk part (``io_s``
per step x steps), the hit rate and bytes read per step it profiled, the measured epoch (the
run's ``train_time_s``) and the prediction's error; the medians over the repetitions.
``--smoke``: a 20,000-node generated graph prepared in a temporary folder, 1 GiB, one
repetition (skipped with the reason where no cgroup can be made).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.memory.disk_vs_peers import drop_pages


def _run(cg: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    from gnnpar.runtime import resources

    argv = resources.in_cgroup(cg, [sys.executable, "-m", "gnnpar", *args])
    env = harness.module_env()
    env.pop("GNNPAR_MEMORY_LIMIT", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def _settings(a) -> list[str]:
    return [
        "--dataset", str(a.folder), "--model", "sage", "--hidden", str(a.hidden),
        "--fanouts", a.fanouts, "--batch-size", str(a.batch_size), "--epochs", "1",
        "--loader-workers", str(a.loader_workers), "--threads", str(a.threads), "--seed", "0",
        "--quiet",
    ]  # fmt: skip


def one(a, side: str, out: Path) -> dict:
    """One side (advise or train) inside a fresh cgroup of ``a.limit`` bytes."""
    from gnnpar.runtime import resources

    drop_pages(sorted(Path(a.folder).glob("*.npy")))
    with resources.memory_cgroup(a.limit) as cg:
        if side == "advise":
            args = ["advise", *_settings(a), "--strategies", "sampled", "--out", str(out)]
            args += ["--profile-rounds", "1"]
        else:
            args = ["train", *_settings(a), "--strategy", "sampled", "--eval-every", "0"]
            args += ["--eval-mode", "sampled", "--out", str(out)]
        done = _run(cg, args, a.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    if side == "advise":
        advice = json.loads((out / "advice.json").read_text())
        p = advice["predictions"][0]
        steps = -(-advice["profile"]["num_train"] // a.batch_size)
        disk = p.get("disk") or {}
        return {
            "predicted_epoch_s": p["epoch_s"],
            "io_s_per_epoch": disk.get("io_s", 0.0) * steps,
            "hit_rate": disk.get("hit_rate"),
            "bytes_read_per_step": disk.get("bytes_read_per_step"),
            "disk_share": disk.get("disk_share"),
            "read_bytes_s": advice["profile"].get("disk", {}).get("read_bytes_s"),
        }
    r = json.loads((out / "result.json").read_text())
    cache = (r.get("feature_cache") or [{}])[0]  # one entry per rank
    return {"measured_epoch_s": r["train_time_s"] / r["epochs"],
            "hit_rate_run": cache.get("hit_rate"),
            "bytes_read_per_step_run": cache.get("bytes_read_per_step")}  # fmt: skip


def _smoke_folder(tmp: Path) -> Path:
    import torch

    from gnnpar.data.prepared import made_record, write_graph

    g = torch.Generator().manual_seed(0)
    n = 20_000
    split = torch.randint(0, 10, (n,), generator=g)
    masks = {f"{s}_mask": split == i for i, s in enumerate(("train", "val", "test"))}
    tensors = {"x": torch.randn(n, 64, generator=g), "y": torch.randint(0, 8, (n,), generator=g),
               "edge_index": torch.randint(0, n, (2, 200_000), generator=g), **masks}  # fmt: skip
    meta = {"name": "smoke", "num_classes": 8, "multilabel": False, "directed": True}
    return write_graph(tensors, meta, tmp / "g", "fp32", made_record("smoke", None, 0, "random"))


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, reps=2, threads=1, out=True)
    p.add_argument("--folder", type=Path, default=None)
    p.add_argument("--limit", default="1G", help="the cgroup's memory limit (bytes, K, M, G)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--loader-workers", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200)
    a = harness.start(p, argv, smoke={"reps": 1, "batch_size": 256, "hidden": 32})
    from gnnpar.runtime import resources

    a.limit = resources.parse_bytes(a.limit)
    try:
        with resources.memory_cgroup(a.limit):
            pass
    except resources.CgroupUnavailable as e:
        if a.smoke:
            print(f"smoke: skipped, a memory cgroup cannot be made here: {e}")
            return 0
        print(f"error: a memory cgroup cannot be made here: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gnnpar-advise-disk-") as tmp:
        tmp = Path(tmp)
        if a.folder is None:
            if not a.smoke:
                p.error("--folder is required (a prepared folder)")
            a.folder = _smoke_folder(tmp)
        print(f"folder {a.folder}, limit {resources.size_words(a.limit)}, batch {a.batch_size}, "
              f"fan-outs {a.fanouts}, loader workers {a.loader_workers}")  # fmt: skip
        runs = []
        for rep in range(a.reps):
            row = {}
            for side in harness.rotation(["advise", "train"], rep):
                row |= one(a, side, tmp / f"{side}-{rep}")
                print(f"  rep {rep} {side}: load {harness.load_average()[0]:.1f}", flush=True)
            row["error"] = row["predicted_epoch_s"] / row["measured_epoch_s"] - 1
            runs.append(row)
            print(json.dumps(row))
    med = {k: statistics.median([r[k] for r in runs]) for k in ("predicted_epoch_s",
           "measured_epoch_s", "io_s_per_epoch", "error")}  # fmt: skip
    print(f"median: predicted {med['predicted_epoch_s']:.2f} s (of it disk "
          f"{med['io_s_per_epoch']:.2f} s), measured {med['measured_epoch_s']:.2f} s, "
          f"error {med['error']:+.0%}")  # fmt: skip
    if a.out:
        harness.write_json(a.out, {"machine": harness.machine(a.threads), "runs": runs, **med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
