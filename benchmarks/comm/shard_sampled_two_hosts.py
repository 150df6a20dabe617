"""Sampled training across shards on two hosts, each holding only its shard, each in a memory
cgroup of a share of the whole prepared graph, over a shaped link; against one host over the
unsharded graph with the same number of ranks.

Two network namespaces (gnnpar.runtime.netns; root and iproute2) joined by a link of ``--rate``
and one-way ``--delay`` (tc netem on a veth pair, or the link emulated in user space where the
kernel has no netem). Host h gets a folder of its own holding the sharded folder's
``manifest.json`` and ``shard-<h>/`` only (hard links: no copy), and runs one rank of
``gnnpar train --strategy sampled`` inside a new memory cgroup limited to ``--limit-share`` x the
bytes of the whole prepared graph. The reference is ``gnnpar train --workers 2`` over the
unsharded prepared folder on one host (no cgroup, no link). Reported: each side's training time
per epoch, whether the loss curves are equal (bit for bit), the bytes each rank sent per step
beside the least the step needed (result.json's ``exchange_bytes_per_step`` and
``exchange_needed_bytes_per_step``), each host's cgroup peak and its ranks' peak RSS.

    python -m benchmarks.comm.shard_sampled_two_hosts \\
        --whole /work/data/papers100m-0.02 --sharded /work/data/shard-sampled/p2 \\
        --work /work/data/shard-sampled/bench --rate 1gbit --delay 1ms --limit-share 0.6

(``--sharded`` is made by ``gnnpar prepare --dataset WHOLE --shards 2 --partitioner stream
--out SHARDED``.) ``--smoke``: cora in two shards, two hosts on localhost without namespaces or
cgroups, two steps (a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def host_folders(sharded: Path, work: Path) -> list[Path]:
    """work/host-<h>/g: the manifest and shard-<h>/ (hard links where the disk allows)."""
    m = json.loads((sharded / "manifest.json").read_text())
    out = []
    for h, rec in enumerate(m["shards"]):
        g = work / f"host-{h}" / "g"
        if g.exists():
            shutil.rmtree(g)
        g.mkdir(parents=True)
        shutil.copy(sharded / "manifest.json", g / "manifest.json")
        try:
            shutil.copytree(sharded / rec["folder"], g / rec["folder"], copy_function=os.link)
        except OSError:
            shutil.copytree(sharded / rec["folder"], g / rec["folder"])
        out.append(g)
    return out


def evict(folder: Path) -> None:
    """Drop ``folder``'s files from the page cache (posix_fadvise DONTNEED), so each host's
    reads are charged to its own cgroup, not left resident from an earlier run outside it."""
    for f in folder.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def train_args(args, dataset: Path, out: Path) -> list[str]:
    a = [sys.executable, "-m", "gnnpar", "train", "--dataset", str(dataset), "--model", "sage"]
    a += ["--layers", str(len(args.fanouts.split(","))), "--hidden", str(args.hidden)]
    a += ["--fanouts", args.fanouts, "--strategy", "sampled", "--batch-size", str(args.batch_size)]
    a += ["--epochs", str(args.epochs), "--threads", "1", "--seed", "3", "--quiet"]
    a += ["--timeout", "300", "--out", str(out)]
    if args.max_steps:
        a += ["--max-steps", str(args.max_steps)]
    if getattr(args, "feature_cache", None):
        a += ["--feature-cache", str(args.feature_cache)]
    if getattr(args, "seeds", None):
        a += ["--seeds", str(args.seeds)]
    return a


def host_env(h: int, world: int, addr: str, port: int, dev: str | None) -> dict[str, str]:
    env = harness.module_env()
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "GROUP_"))}
    env |= {"RANK": str(h), "WORLD_SIZE": str(world), "LOCAL_RANK": "0"}
    env |= {"LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(h), "GROUP_WORLD_SIZE": str(world)}
    env |= {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    if dev:
        env["GLOO_SOCKET_IFNAME"] = dev
    return env


def run_hosts(args, folders: list[Path], work: Path, hosts=None, limit: int | None = None):  # noqa: ANN001
    """Each host's rank (in its namespace and cgroup when given); (results, cgroup peaks, s)."""
    from gnnpar.runtime import resources

    port = 29700 + os.getpid() % 200
    outs = [work / f"run-{h}" for h in range(len(folders))]
    for o in outs:
        shutil.rmtree(o, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        groups = [
            stack.enter_context(resources.memory_cgroup(limit)) if limit else None for _ in folders
        ]
        procs = []
        for g in folders:
            evict(g)
        t0 = time.perf_counter()
        for h, g in enumerate(folders):
            argv = train_args(args, g, outs[h])
            if hosts is not None:  # netns.Hosts or netns.SwitchedHosts
                ns, dev, _ = hosts.placements()[h]
                argv = ["ip", "netns", "exec", ns, *argv]
                env = host_env(h, len(folders), hosts.placements()[0][2], port, dev)
            else:
                env = host_env(h, len(folders), "127.0.0.1", port, None)
            if groups[h] is not None:  # outside `ip netns exec`, which remounts /sys
                argv = resources.in_cgroup(groups[h], argv)
            log = open(work / f"host-{h}.log", "w")  # noqa: SIM115 (closed below)
            procs.append((subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=log), log))
        codes = []
        for p, log in procs:
            codes.append(p.wait(timeout=3600))
            log.close()
        took = time.perf_counter() - t0
        peaks = []
        for g in groups:
            peak = None
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                if g is not None and (g / name).exists():
                    peak = int((g / name).read_text())
            peaks.append(peak)
    if any(codes):
        tail = (work / f"host-{codes.index(next(c for c in codes if c))}.log").read_text()
        raise RuntimeError(f"a host failed: exit {codes}\n{tail[-3000:]}")
    return json.loads((outs[0] / "result.json").read_text()), peaks, took


def run_whole(args, whole: Path, work: Path, workers: int = 2) -> tuple[dict, float]:  # noqa: ANN001
    out = work / "run-whole"
    shutil.rmtree(out, ignore_errors=True)
    argv = train_args(args, whole, out) + ["--workers", str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=harness.module_env(), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the one-host run failed: {proc.stderr[-3000:]}")
    return json.loads((out / "result.json").read_text()), time.perf_counter() - t0


def summary(r: dict) -> dict:
    sent = r.get("exchange_bytes_per_step")
    needed = r.get("exchange_needed_bytes_per_step")
    return {
        "loss_curve": r["loss_curve"],
        "train_time_s": r["train_time_s"],
        "epoch_time_s": r["train_time_s"] / max(1, len(r["loss_curve"])),
        "steps_per_epoch": r.get("steps_per_epoch"),
        "val_score": r["val_score"],
        "test_score": r["test_score"],
        "peak_rss_bytes": r.get("peak_rss_bytes"),
        "exchange_bytes_per_step": sent,
        "exchange_needed_bytes_per_step": needed,
        "sent_over_needed": (sum(sent) / sum(needed)) if sent and sum(needed) else None,
    }


def add_run_flags(ap, fanouts: str, batch_size: int) -> None:  # noqa: ANN001 (a parser)
    """The flags every two-host sampled benchmark takes: where the hosts' folders go, the
    emulated link, and the run's model and batches (read by :func:`train_args`)."""
    ap.add_argument("--work", type=Path, help="where the hosts' folders and runs go")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="1ms")
    ap.add_argument("--fanouts", default=fanouts)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--whole", type=Path, help="the unsharded prepared folder")
    ap.add_argument("--sharded", type=Path, help="the same graph in 2 shards")
    ap.add_argument("--limit-share", type=float, default=0.6)
    add_run_flags(ap, "25,10,10", 1024)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    harness.print_header(1)
    if args.smoke:
        return smoke(args)
    from benchmarks.comm.gloo_over_shaped_link import parse_delay, parse_rate
    from gnnpar.runtime import netns

    args.work.mkdir(parents=True, exist_ok=True)
    folders = host_folders(args.sharded, args.work)
    whole_bytes = folder_bytes(args.whole)
    limit = int(args.limit_share * whole_bytes)
    rate, delay = parse_rate(args.rate), parse_delay(args.delay)
    try:
        with netns.shaped_hosts("s", "t", "10.213.0.41", "10.213.0.42", rate, delay) as (h, how):
            print(f"link: {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms one way ({how})")
            print(f"cgroup per host: {limit / 2**30:.2f} GiB ({args.limit_share} x "
                  f"{whole_bytes / 2**30:.2f} GiB, the whole prepared graph)")  # fmt: skip
            across, peaks, took = run_hosts(args, folders, args.work, h, limit)
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), False)
    whole, took_whole = run_whole(args, args.whole, args.work)
    a, w = summary(across), summary(whole)
    same = a["loss_curve"] == w["loss_curve"]
    print(f"two hosts, each its shard: epoch {a['epoch_time_s']:.1f} s ({took:.0f} s in all), "
          f"cgroup peaks {[p and round(p / 2**30, 2) for p in peaks]} GiB")  # fmt: skip
    print(f"one host, unsharded:       epoch {w['epoch_time_s']:.1f} s ({took_whole:.0f} s)")
    print(f"loss curves equal: {same} ({a['loss_curve']} vs {w['loss_curve']})")
    print(f"bytes sent per step per rank: {a['exchange_bytes_per_step']}; the least needed: "
          f"{a['exchange_needed_bytes_per_step']}; sent / needed {a['sent_over_needed']:.3f}")  # fmt: skip
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": {"rate_bit_s": rate, "delay_s": delay, "how": how},
                "graph": str(args.whole),
                "graph_bytes": whole_bytes,
                "cgroup_limit_bytes": limit,
                "cgroup_peak_bytes": peaks,
                "settings": vars(args)
                | {
                    "whole": str(args.whole),
                    "sharded": str(args.sharded),
                    "work": str(args.work),
                },  # fmt: skip
                "two_hosts": a,
                "one_host": w,
                "loss_curves_equal": same,
            },
        )
    return 0 if same else 1


def smoke(args) -> int:  # noqa: ANN001
    """Cora in two shards, two hosts on localhost (no namespaces, no cgroups), two steps."""
    import tempfile

    from gnnpar.data.prepare_command import run_prepare

    args.fanouts, args.hidden, args.batch_size, args.epochs, args.max_steps = "5,5", 16, 64, 1, 2
    with tempfile.TemporaryDirectory(prefix="gnnpar-shard-smoke-") as tmp:
        work = Path(tmp)
        root = str(harness.smoke_root())
        run_prepare("cora", str(work / "s"), None, None, None, root, None, True,
                    shards="2", partitioner="random")  # fmt: skip
        result, _, took = run_hosts(args, host_folders(work / "s", work), work)
        print(f"smoke: two hosts trained {result['loss_curve']} in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
