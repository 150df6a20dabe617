"""Epoch time of sampled training across shards on 1, 2, 4... hosts, each host holding only its
shard (its own folder: the manifest and ``shard-<h>/``), beside ``gnnpar advise``'s prediction.

``--link netns`` (the default): each host is a network namespace with one veth to a switch (a
Linux bridge in a namespace of its own, :func:`gnnpar.runtime.netns.switched_hosts`), each port
limited to ``--rate`` both ways by tc's token bucket (no delay: this needs netem, and the
emulated link joins two hosts, not a switch). ``--link loopback``: processes of this machine
over loopback. Either way every host shares this machine's cores, so more hosts than cores are
oversubscribed; 1 host is one rank over the unsharded folder. Beside each, the bytes each rank
sent per step and the least it needed (result.json). ``--advise DIR/advice.json`` (a profile of
the same run, from ``gnnpar advise ... --hosts 2``) adds advise's predicted epoch and bytes per
step for every measured host count and for ``--predict`` (16 and 64 by default).

    python -m benchmarks.comm.shard_sampled_scaling --whole /work/data/papers100m-0.02 \\
        --sharded 2=/work/data/p2,4=/work/data/p4 --work /work/data/scaling --fanouts 15,10 \\
        --batch-size 512 --epochs 2 --rate 1gbit --advise A2/advice.json

(each ``--sharded H=FOLDER`` made by ``gnnpar prepare --dataset WHOLE --shards H
--partitioner stream --out FOLDER``.) ``--smoke``: cora on 1 and 2 hosts over loopback, one step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.comm import shard_sampled_two_hosts as two


def run_on_hosts(args, folders: list[Path], work: Path):  # noqa: ANN001, ANN201
    """run_hosts on namespace hosts behind one switch (``--link netns``) or over loopback."""
    if args.link == "loopback":
        return two.run_hosts(args, folders, work)
    from benchmarks.comm.gloo_over_shaped_link import parse_rate
    from gnnpar.runtime import netns

    with netns.switched_hosts(len(folders), rate_bit_s=parse_rate(args.rate)) as hosts:
        return two.run_hosts(args, folders, work, hosts)


def predict(args, hosts: int) -> dict:  # noqa: ANN001
    """advise's predicted epoch and network bytes for ``hosts`` from the profile ``--advise``."""
    out = args.work / f"advise-h{hosts}"
    dataset = json.loads(args.advise.read_text())["profile"]["dataset"]  # advise checks it
    argv = [sys.executable, "-m", "gnnpar", "advise", "--profile", str(args.advise)]
    argv += ["--dataset", dataset, "--model", "sage", "--layers", str(len(args.fanouts.split(",")))]
    argv += ["--hidden", str(args.hidden), "--fanouts", args.fanouts, "--strategies", "sampled"]
    argv += ["--batch-size", str(args.batch_size), "--loader-workers", "0"]
    argv += ["--epochs", str(args.epochs), "--threads", "1", "--seed", "3"]
    argv += ["--hosts", str(hosts), "--ranks-per-host", "1", "--network", f"{args.rate},1ms"]
    argv += ["--out", str(out)]
    proc = subprocess.run(argv, env=harness.module_env(), capture_output=True, text=True)
    if proc.returncode:
        return {"hosts": hosts, "error": proc.stderr.strip()[-500:]}
    p = json.loads((out / "advice.json").read_text())["predictions"][0]
    return {"hosts": hosts, "epoch_s": p["epoch_s"], "bytes_on_network": p["bytes_on_network"]}


def measure(args, whole: Path, sharded: dict[int, Path], work: Path) -> list[dict]:  # noqa: ANN001
    rows = []
    for hosts in args.hosts:
        load = harness.load_average()[0]
        if hosts == 1:
            r, took = two.run_whole(args, whole, work, workers=1)
        else:
            folders = two.host_folders(sharded[hosts], work / f"h{hosts}")
            r, _, took = run_on_hosts(args, folders, work / f"h{hosts}")
        s = two.summary(r)
        rows.append(
            {"hosts": hosts, "wall_s": took, "load_1min": [load, harness.load_average()[0]], **s}
        )
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
    ap.add_argument("--link", choices=("netns", "loopback"), default="netns")
    ap.add_argument("--rate", default="1gbit", help="each host's port (--link netns)")
    ap.add_argument("--advise", type=Path, default=None, help="advice.json: predict from it")
    ap.add_argument("--predict", default="16,64", help="host counts only predicted")
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
    from gnnpar.runtime.netns import NetnsUnavailable

    args.work.mkdir(parents=True, exist_ok=True)
    try:
        rows = measure(args, args.whole, sharded, args.work)
    except NetnsUnavailable as e:
        return harness.no_namespaces(str(e), False)
    predicted = []
    if args.advise is not None:
        counts = args.hosts + [int(h) for h in args.predict.split(",") if h]
        predicted = [predict(args, h) for h in counts]
        for p in predicted:
            print(f"advise, {p['hosts']} host(s): " + (
                f"epoch {p['epoch_s']:.2f} s, {p['bytes_on_network'] / 1e6:.1f} MB on the network"
                if "error" not in p else p["error"]))  # fmt: skip
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": (
                    "loopback (one machine, no shaping)"
                    if args.link == "loopback"
                    else f"namespace hosts on one switch, each port {args.rate} (tbf), no delay"
                ),
                "predicted": predicted,
                "settings": vars(args)
                | {"whole": str(args.whole), "work": str(args.work), "sharded": args.sharded}
                | {"advise": str(args.advise)},
                "rows": rows,
            },
        )
    return 0


def smoke(args) -> int:  # noqa: ANN001
    """Cora whole on 1 host and in two shards on 2 hosts of localhost, one step each."""
    from gnnpar.data.prepare_command import run_prepare

    args.fanouts, args.hidden, args.batch_size, args.epochs, args.max_steps = "5,5", 16, 64, 1, 1
    args.hosts, args.link = [1, 2], "loopback"
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
