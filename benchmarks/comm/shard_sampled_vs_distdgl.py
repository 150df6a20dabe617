"""Sampled GraphSAGE across two hosts against DistDGL on the same two hosts, link and graph.

Two network namespaces joined by a link of ``--rate`` and one-way ``--delay``
(:func:`gnnpar.runtime.netns.shaped_hosts`: tc netem on a veth pair, or the link emulated in
user space where the kernel has no netem), one trainer per host, one thread each; the sides
alternate (in the given order, reversed every other repetition), ``--reps`` times; the median
of each side's epoch time (its training time over its epochs, evaluation excluded) and of each
gnnpar side's per-repetition ratio to DistDGL are reported.

* gnnpar: ``gnnpar train --strategy sampled`` on each host over a folder holding only the
  manifest and its ``shard-<h>/`` (:mod:`benchmarks.comm.shard_sampled_two_hosts`, no cgroup);
  one side per ``--sharded NAME=FOLDER`` (e.g. METIS and stream shards), ``@CACHE`` adding
  ``--feature-cache CACHE`` to that side, ``+local`` at the end ``--seeds local`` (each host's
  seeds from its own shard, as DistDGL's ``node_split`` deals them).
* DistDGL (DGL 2.1, ``/work/peers/dgl/bin/python``): the graph partitioned by its
  ``partition_graph`` (METIS, 2 parts; ``_distdgl_side.py partition``), launched as DGL's
  examples do: ``tools/launch.py`` (``--launch``: DGL v2.1.0's own file, unchanged) started on
  host A, which starts one server and one trainer per host over ``ssh``. The hosts run no sshd:
  an ``ssh`` first on launch.py's PATH (written to ``WORK/bin/ssh``) runs the remote command
  the way sshd would (``bash -c``, a login's bare environment) inside the namespace that holds
  the address, with that host's ``GLOO_SOCKET_IFNAME`` (the only interface to the other host,
  as a host's profile would set it), and with a ``/dev/shm`` of that host's own (DGL's server
  and trainer share the partition through shared memory by fixed names; namespaces of one
  machine would share one /dev/shm). The trainer is ``_distdgl_side.py train`` (the example's).

    python -m benchmarks.comm.shard_sampled_vs_distdgl \\
        --sharded metis=/work/data/p0.02-s2-metis,stream=/work/data/p0.02-s2 \\
        --dgl-parts /work/data/p0.02-metis2 --launch /work/data/launch.py --work /work/data/bench \\
        --rate 1gbit --delay 1ms --fanouts 15,10 --hidden 256 --batch-size 512 --epochs 2

(``--dgl-parts`` is made by ``/work/peers/dgl/bin/python benchmarks/comm/_distdgl_side.py
partition PREPARED OUT 2``; ``--launch`` by ``git show v2.1.0:tools/launch.py`` in DGL's
repository.) ``--smoke``: checks the arguments launch.py gives the ssh shim on a dry run of
launch.py's command format (no peer, no namespaces needed).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.comm import shard_sampled_two_hosts as two

HERE = Path(__file__).resolve().parent
DGL_PYTHON = "/work/peers/dgl/bin/python"
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# `ssh [-o OPT] [-p PORT] [user@]HOST CMD...` as launch.py calls it, run in HOST's namespace.
SSH_SHIM = """#!/bin/bash
# ssh for namespace hosts: the remote command runs as sshd would run it (bash -c, a login's
# environment) inside the network namespace that holds HOST's address (file `hosts` beside this)
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-l|-i) shift 2;; -*) shift;; *) break;; esac
done
host="${1#*@}"; shift
line=$(grep -m1 "^$host " "$(dirname "$0")/hosts") || { echo "ssh: $host: unknown" >&2; exit 255; }
read -r _ ns dev <<<"$line"
# the host's own /dev/shm (a folder of this machine's, bound over /dev/shm in the mount
# namespace `ip netns exec` makes): DGL's server and trainer of one host share their partition
# through shared memory by fixed names, which two hosts on one machine must not share
shm=/dev/shm/%s$ns; mkdir -p "$shm"
exec ip netns exec "$ns" sh -c 'mount --bind "$0" /dev/shm && exec "$@"' "$shm" \\
  env -i HOME=/root PATH=%s LANG=C.UTF-8 GLOO_SOCKET_IFNAME="$dev" bash -c "$*"
"""
SHM_PREFIX = "gnnpar-host-"


def write_shim(bindir: Path, hosts: list[tuple[str, str, str]]) -> Path:
    """``bindir/ssh`` and ``bindir/hosts`` (address, namespace, interface per line)."""
    bindir.mkdir(parents=True, exist_ok=True)
    ssh = bindir / "ssh"
    ssh.write_text(SSH_SHIM % (SHM_PREFIX, LOGIN_PATH))
    ssh.chmod(0o755)
    (bindir / "hosts").write_text("".join(f"{a} {ns} {dev}\n" for a, ns, dev in hosts))
    return ssh


def dgl_command(args, ws: Path, part_config: Path, result: Path, classes: int) -> list[str]:  # noqa: ANN001
    """launch.py's command line, as DGL's distributed GraphSAGE README gives it."""
    trainer = [DGL_PYTHON, str(HERE / "_distdgl_side.py"), "--graph_name", "papers"]
    trainer += ["--ip_config", "ip_config.txt", "--part_config", str(part_config)]
    trainer += ["--classes", str(classes), "--fanouts", args.fanouts, "--hidden", str(args.hidden)]
    trainer += ["--batch_size", str(args.batch_size), "--epochs", str(args.epochs)]
    trainer += ["--threads", "1", "--result", str(result)]
    cmd = [DGL_PYTHON, str(args.launch), "--workspace", str(ws), "--num_trainers", "1"]
    cmd += ["--num_samplers", "0", "--num_servers", "1", "--num_omp_threads", "1"]
    cmd += ["--part_config", str(part_config), "--ip_config", "ip_config.txt"]
    return [*cmd, shlex.join(trainer)]


def run_dgl(args, hosts, work: Path, classes: int) -> tuple[dict, float]:  # noqa: ANN001
    ws = work / "dgl"
    ws.mkdir(parents=True, exist_ok=True)
    port = 30050 + os.getpid() % 100
    (ws / "ip_config.txt").write_text(f"{hosts.addr_a} {port}\n{hosts.addr_b} {port}\n")
    result = ws / "result.json"
    result.unlink(missing_ok=True)
    part_config = args.dgl_parts / "papers.json"
    env = {"PATH": f"{work / 'bin'}:{LOGIN_PATH}", "HOME": "/root", "LANG": "C.UTF-8"}
    env["OMP_NUM_THREADS"] = "1"
    argv = ["ip", "netns", "exec", hosts.a, *dgl_command(args, ws, part_config, result, classes)]
    t0 = time.perf_counter()
    try:
        with open(work / "dgl.log", "w") as log:
            proc = subprocess.run(argv, env=env, cwd=ws, stdout=log, stderr=log, timeout=3600)
    finally:
        for ns in (hosts.a, hosts.b):
            shutil.rmtree(f"/dev/shm/{SHM_PREFIX}{ns}", ignore_errors=True)
    took = time.perf_counter() - t0
    if proc.returncode or not result.exists():
        tail = (work / "dgl.log").read_text()[-3000:]
        raise RuntimeError(f"DistDGL failed (exit {proc.returncode}):\n{tail}")
    return json.loads(result.read_text()), took


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, reps=2)
    ap.add_argument(
        "--sharded",
        help="gnnpar's graph in 2 shards: FOLDER or NAME=FOLDER[@CACHE][+local][,...], one side "
        "each (@CACHE: that side trains with --feature-cache CACHE; +local: with --seeds local)",
    )
    ap.add_argument("--dgl-parts", type=Path, help="DistDGL's 2 METIS parts (papers.json)")
    ap.add_argument("--launch", type=Path, help="DGL v2.1.0's tools/launch.py")
    two.add_run_flags(ap, "15,10", 512)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    harness.print_header(1)
    if args.smoke:
        return smoke()
    for name in ("sharded", "dgl_parts", "launch", "work"):
        if getattr(args, name) is None:
            print(f"error: --{name.replace('_', '-')} is required", file=sys.stderr)
            return 2
    if not Path(DGL_PYTHON).exists() or not args.launch.exists():
        print(f"error: no {DGL_PYTHON} or no {args.launch}", file=sys.stderr)
        return 2
    from benchmarks.comm.gloo_over_shaped_link import parse_delay, parse_rate
    from gnnpar.runtime import netns

    sharded = dict((p.split("=", 1) if "=" in p else ("", p)) for p in args.sharded.split(",") if p)
    deals = {name: "local" if f.endswith("+local") else None for name, f in sharded.items()}
    sharded = {name: f.removesuffix("+local") for name, f in sharded.items()}
    caches = {name: f.partition("@")[2] or None for name, f in sharded.items()}
    sharded = {name: f.partition("@")[0] for name, f in sharded.items()}
    first = Path(next(iter(sharded.values())))
    classes = json.loads((first / "manifest.json").read_text())["num_classes"]
    args.work.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[Path]] = {}  # one copy of each folder's hosts, whatever the sides
    for f in sharded.values():
        if f not in made:
            made[f] = two.host_folders(Path(f), args.work / f"shards-{len(made)}")
    folders = {name: made[f] for name, f in sharded.items()}
    rate, delay = parse_rate(args.rate), parse_delay(args.delay)
    names = [f"gnnpar-{n}" if n else "gnnpar" for n in folders] + ["distdgl"]
    rows: dict[str, list[dict]] = {n: [] for n in names}
    loads = []
    try:
        with netns.shaped_hosts("d", "e", "10.213.0.45", "10.213.0.46", rate, delay) as (h, how):
            print(f"link: {rate / 1e6:g} Mbit/s, {delay * 1e3:g} ms one way ({how})")
            write_shim(args.work / "bin", [(h.addr_a, h.a, h.if_a), (h.addr_b, h.b, h.if_b)])
            sides = {
                name: (lambda f=f, c=c, d=d: gnnpar_side(args, f, h, c, d))
                for name, f, c, d in zip(
                    names, folders.values(), caches.values(), deals.values(), strict=False
                )
            }
            sides["distdgl"] = lambda: dgl_side(args, h, classes)
            for rep in range(args.reps):
                for name in list(sides) if rep % 2 == 0 else list(sides)[::-1]:
                    before = harness.load_average()[0]
                    row = sides[name]()
                    row["load_1min"] = [before, harness.load_average()[0]]
                    loads += row["load_1min"]
                    rows[name].append(row)
                    print(f"rep {rep} {name}: epoch {row['epoch_s']:.2f} s "
                          f"(wall {row['wall_s']:.0f} s, load {row['load_1min']})")  # fmt: skip
    except netns.NetnsUnavailable as e:
        return harness.no_namespaces(str(e), False)
    med = {k: statistics.median(r["epoch_s"] for r in v) for k, v in rows.items()}
    dgl = [r["epoch_s"] for r in rows["distdgl"]]
    ratio = {n: harness.median_ratio([r["epoch_s"] for r in rows[n]], dgl) for n in names[:-1]}
    for n in names[:-1]:
        print(f"median epoch: {n} {med[n]:.2f} s, DistDGL {med['distdgl']:.2f} s; "
              f"{n} / DistDGL {ratio[n]:.3f} (median of per-repetition ratios)")  # fmt: skip
    if args.out:
        harness.write_json(
            args.out,
            {
                "machine": harness.machine(1),
                "link": {"rate_bit_s": rate, "delay_s": delay, "how": how},
                "settings": {k: str(v) for k, v in vars(args).items()},
                "rows": rows,
                "median_epoch_s": med,
                "gnnpar_over_distdgl": ratio,
                "load_1min_range": [min(loads), max(loads)],
            },
        )
    return 0


def gnnpar_side(args, folders: list[Path], hosts, cache: str | None, seeds: str | None) -> dict:  # noqa: ANN001
    args.feature_cache, args.seeds = cache, seeds
    r, _, took = two.run_hosts(args, folders, args.work, hosts, None)
    s = two.summary(r)
    extra = {"feature_cache": cache, "seeds": seeds or "global"}
    return {**s, "epoch_s": s["epoch_time_s"], "wall_s": took, **extra}


def dgl_side(args, hosts, classes: int) -> dict:  # noqa: ANN001
    r, took = run_dgl(args, hosts, args.work, classes)
    r["epoch_s_per_rank"] = r.pop("epoch_s")  # rank 0's, per epoch
    return {**r, "epoch_s": statistics.mean(r["epoch_s_slowest"]), "wall_s": took}


def smoke() -> int:
    """The shim parses launch.py's ssh command line and runs the command with the host's
    variables (here in this namespace: ``ip`` is replaced by a stand-in that drops its
    ``netns exec NS`` words)."""
    with tempfile.TemporaryDirectory(prefix="gnnpar-distdgl-smoke-") as tmp:
        bindir = Path(tmp) / "bin"
        write_shim(bindir, [("10.0.0.1", "nsA", "devA")])
        (bindir / "ip").write_text(
            '#!/bin/bash\nwhile [ "$1" != env ]; do shift; done\nexec "$@"\n'
        )
        (bindir / "ip").chmod(0o755)
        cmd = "cd /; (export X=1; echo $X $GLOO_SOCKET_IFNAME $(pwd))"
        line = f"ssh -o StrictHostKeyChecking=no -p 22 10.0.0.1 '{cmd}'"
        env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
        out = subprocess.run(line, shell=True, env=env, capture_output=True, text=True, timeout=30)
        ok = out.stdout.strip() == "1 devA /"
        print(f"smoke: ssh shim ran launch.py's command: {out.stdout.strip()!r} ({ok})")
        shutil.rmtree(bindir)
        shutil.rmtree(f"/dev/shm/{SHM_PREFIX}nsA", ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
