"""gnnpar advise's prediction of a sampled run across two hosts' shards under both deals of seeds
(``--seeds global`` and ``local``), against the runs its ``--validate`` trains on two network
namespace hosts, each holding only its shard: bytes each rank sends per step and epoch time.

Runs ``gnnpar advise --validate --hosts 2`` with the flags after ``--`` (the grid's both deals;
``--repeats`` alternates their order), sampling the load average and the CPU busy share
(/proc/stat, every core) over the run, then prints, per deal, each hop's predicted remote share,
the bytes per step predicted and measured (the ranks' mean; the median of the repetitions) and
the epoch predicted (for two hosts sharing this machine) and measured.

    python -m benchmarks.advise.seed_deals_two_hosts --work W -- \\
        --profile A/advice.json --dataset P02-S2-METIS --model sage --layers 2 --hidden 256 \\
        --fanouts 15,10 --batch-size 512 --loader-workers 0 --strategies sampled --hosts 2 \\
        --ranks-per-host 1 --network 1gbit,1ms --epochs 2 --threads 1 --seed 3 --repeats 2

``--read DIR`` summarises an advise folder already made (its advice.json); ``--smoke`` reads the
stored figures of one such run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks import harness

SMOKE = harness.RESULTS / "seed_deals_2026-11-28" / "advice.json"


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of every core (/proc/stat's first line; idle includes iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    idle, total = after[0] - before[0], after[1] - before[1]
    return 1.0 - idle / total if total else 0.0


def run_advise(work: Path, flags: list[str]) -> dict:
    """``gnnpar advise --validate --out work/advise`` with ``flags``; its load figures."""
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            loads.append(harness.load_average()[0])

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    before, t0 = cpu_times(), time.perf_counter()
    argv = [sys.executable, "-m", "gnnpar", "advise", *flags, "--validate"]
    argv += ["--out", str(work / "advise")]
    proc = subprocess.run(argv, env=harness.module_env(), text=True)
    done.set()
    if proc.returncode:
        raise SystemExit(f"gnnpar advise failed (exit {proc.returncode})")
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_busy_share": busy_share(before, cpu_times()),
        "load_1min": [min(loads), max(loads)] if loads else None,
    }


def summary(advice: dict) -> list[dict]:
    """One row per validated deal of seeds."""
    preds = {json.dumps(p["settings"], sort_keys=True): p for p in advice["predictions"]}
    rows = []
    for case in advice.get("validation", {}).get("cases", []):
        p = preds.get(json.dumps(case["settings"], sort_keys=True), {})
        rows.append(
            {
                "seeds": case["settings"].get("seeds", "global"),
                "remote_share_per_hop": p.get("exchange", {}).get("remote_share_per_hop"),
                "predicted_bytes_per_step": case.get("predicted_exchange_bytes_per_step"),
                "measured_bytes_per_step": case.get("measured_exchange_bytes_per_step"),
                "bytes_error": case.get("exchange_error"),
                "predicted_epoch_s": case["predicted_epoch_s"],
                "measured_epoch_s": case["measured_epoch_s"],
                "measured_runs_epoch_s": case.get("measured_runs_epoch_s"),
                "epoch_error": case["error"],
                "speed_factors": case.get("speed_factors"),
            }
        )
    return rows


def show(rows: list[dict]) -> None:
    print("| seeds | remote share per hop | bytes/step predicted | measured | error "
          "| epoch predicted | measured (runs) | error |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        shares = ", ".join(f"{s:.3f}" for s in r["remote_share_per_hop"] or [])
        runs = ", ".join(f"{t:.1f}" for t in r["measured_runs_epoch_s"] or [])
        b, m = r["predicted_bytes_per_step"], r["measured_bytes_per_step"]
        print(
            f"| {r['seeds']} | {shares} | {b / 1e6:.2f} MB | {m / 1e6:.2f} MB | "
            f"{r['bytes_error']:+.1%} | {r['predicted_epoch_s']:.1f} s | "
            f"{r['measured_epoch_s']:.1f} s ({runs}) | {r['epoch_error']:+.0%} |"
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = harness.parser(__doc__, out=True)
    p.add_argument("--work", type=Path, default=None, help="folder for advise's output")
    p.add_argument("--read", type=Path, default=None, help="an advise folder already made")
    args = harness.start(p, own)
    if args.smoke:
        rows = summary(json.loads(SMOKE.read_text()))
        show(rows)
        return 0 if rows else 1
    if args.read is not None:
        advice, load = json.loads((args.read / "advice.json").read_text()), None
    else:
        if args.work is None or not flags:
            p.error("give --work W -- ADVISE FLAGS, or --read DIR")
        load = run_advise(args.work, flags)
        advice = json.loads((args.work / "advise" / "advice.json").read_text())
        print(f"load (1 min) {load['load_1min']}, CPU busy {load['cpu_busy_share']:.0%}")
    rows = summary(advice)
    show(rows)
    if args.out:
        harness.write_json(args.out, {"rows": rows, "load": load, "machine": harness.machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
