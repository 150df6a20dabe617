"""Epoch time of sampled training across shards on 1, 2, 4... hosts of one machine, each host a
process holding only its shard (its own folder: the manifest and ``shard-<h>/``), joined over
loopback (no namespaces, no shaped link: every host shares this machine's cores, so more hosts
than cores are oversubscribed); 1 host is one rank over the unsharded folder. Beside each, the
bytes each rank sent per step and the least it needed (result.json).

    python -m benchmarks.comm.shard_sampled_scaling --whole /work/data/papers100m-0.02 \\
        --sharded 2=/work/data/p2,4=/work/data/p4 --work /work/data/scaling --fanouts 15,10 \\
        --batch-size 512 --epochs 2

(each ``--sharded H=FOLDER`` made by ``gnnpar prepare --dataset WHOLE --shards H
--partitioner stream --out FOLDER``.) ``--smoke``: cora on 1 and 2 hosts, one step.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.comm import shard_sampled_two_hosts as two


def measure(args, whole: Path, sharded: dict[int, Path], work: Path) -> list[dict]:  # noqa: ANN001
    rows = []
    for hosts in args.hosts:
        if hosts == 1:
            r, took = two.run_whole(args, whole, work, workers=1)
        else:
            folders = two.host_folders(sharded[hosts], work / f"h{hosts}")
            r, _, took = two.run_hosts(args, folders, work / f"h{hosts}")
        s = two.summary(r)
        rows.append({"hosts": hosts, "wall_s": took, **s})
        sent = s["exchange_bytes_per_step"]
        print(f"{hosts} host(s): epoch {s['epoch_time_s']:.2f} s, {s['steps_per_epoch']} steps, "
              f"bytes sent per step per rank {sent and [round(b / 1e6, 2) for b in sent]} MB, "
              f"sent / needed {s['sent_over_needed']}")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--whole", type=Path, help="the unsharded prepared folder")
    ap.add_argument("--sharded", default="", help="H=FOLDER[,H=FOLDER]: the graph in H shards")
    ap.add_argument("--work", type=Path, help="where the hosts' folders and runs go")
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--fanouts", default="15,10")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    harness.print_header(1)
    if args.smoke:
        return smoke(args)
    args.hosts = [int(h) for h in args.hosts.split(",")]
    sharded = {int(k): Path(v) for k, v in (p.split("=") for p in args.sharded.split(",") if p)}
    missing = [h for h in args.hosts if h > 1 and h not in sharded]
    if missing:
        print(f"--sharded has no folder for {missing[0]} hosts", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    rows = measure(args, args.whole, sharded, args.work)
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": "loopback (one machine, no shaping)",
                "settings": vars(args)
                | {"whole": str(args.whole), "work": str(args.work), "sharded": args.sharded},
                "rows": rows,
            },
        )
    return 0


def smoke(args) -> int:  # noqa: ANN001
    """Cora whole on 1 host and in two shards on 2 hosts of localhost, one step each."""
    from gnnpar.data.prepare_command import run_prepare

    args.fanouts, args.hidden, args.batch_size, args.epochs, args.max_steps = "5,5", 16, 64, 1, 1
    args.hosts = [1, 2]
    with tempfile.TemporaryDirectory(prefix="gnnpar-shard-scaling-") as tmp:
        work = Path(tmp)
        root = str(harness.smoke_root())
        run_prepare("cora", str(work / "w"), None, None, None, root, None, True)
        run_prepare("cora", str(work / "s"), None, None, None, root, None, True,
                    shards="2", partitioner="random")  # fmt: skip
        measure(args, work / "w", {2: work / "s"}, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
