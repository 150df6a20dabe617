"""A finished ``gnnpar advise --validate`` taken apart per rank: what each rank measured against
what the simulation of the current model has it do, term by term.

For every case of the validation folder (``--out`` of the advise run: its advice.json and the
runs under ``validate/NN-strategy/<host>/result.json``), one line per rank measured (steps
trained, exchanges, and per epoch: compute (the loop's steps without waits: for gossip its
store calls at a boundary included), sync (blocked in collectives, exchanges and barriers),
data (taking a batch: gossip's pool), median and mean step) and one per rank simulated (steps,
exchanges, busy, wait and, for gossip, compute alone), each case simulated as validate does
(two-host cases for two namespace hosts sharing this machine).

    python -m benchmarks.advise.validation_terms runs/advise-2h [more folders ...]

``--strip OUT`` copies a folder's advice.json and the fields of each result.json read here
(small enough to keep beside the figures); ``--smoke`` reads a stored, stripped folder.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from benchmarks import harness

SMOKE = harness.RESULTS / "advise-2h_terms_2026-11-28" / "run3"
FIELDS = (
    "epochs",
    "train_time_s",
    "time_breakdown_s",
    "per_worker_batches",
    "per_worker_exchanges",
    "per_worker_step_time_s",
    "rank_train_time_s",
)


def results(folder: Path) -> list[dict]:
    """Each validated case's result.json, in the order of advice.json's cases (None: it failed)."""
    out = []
    for run in sorted((folder / "validate").iterdir()):
        found = sorted(run.glob("*/result.json")) + sorted(run.glob("result.json"))
        out.append(json.loads(found[0].read_text()) if found else None)
    return out


def simulated(advice: dict, case: dict):
    from gnnpar.advise import simulate as sim
    from gnnpar.advise.predict import Candidate, ClusterSpec, simulate
    from gnnpar.advise.profile import Profile

    prof = Profile(**advice["profile"])
    c = advice["cluster"]
    net = c.get("network")
    link = sim.Link(net["latency_s"], net["bandwidth_Bps"]) if net else None
    spec = ClusterSpec(c["hosts"], c["ranks_per_host"], link)
    if case.get("hosts") == 2:
        spec = dataclasses.replace(spec, hosts_per_machine=2)
    strag = sim.Stragglers(
        {int(k): v for k, v in c.get("slowdown", {}).items()}, c.get("jitter", 0.0), prof.seed
    )
    cand = Candidate(case["strategy"], case["settings"], case["workers"])
    return simulate(cand, prof, spec, strag, c["epochs"])


def terms(folder: Path) -> list[dict]:
    advice = json.loads((folder / "advice.json").read_text())
    rows = []
    for case, r in zip(advice["validation"]["cases"], results(folder), strict=True):
        if r is None or case.get("measured_epoch_s") is None:
            continue
        e = r["epochs"]
        res = simulated(advice, case)
        measured = [
            {
                "steps": r["per_worker_batches"][i],
                "exchanges": r["per_worker_exchanges"][i],
                **{k: t[k] / e for k in ("compute", "sync", "data_wait")},
                "step_median_s": r["per_worker_step_time_s"][i]["median"],
                "step_mean_s": r["per_worker_step_time_s"][i]["mean"],
            }
            for i, t in enumerate(r["time_breakdown_s"])
        ]
        sims = [
            {
                "steps": res.batches[i],
                "exchanges": res.exchanges,
                "busy": res.busy_s[i] / e,
                "wait": res.wait_s[i] / e,
                "compute": res.compute_s[i] / e if res.compute_s else None,
            }
            for i in range(len(res.batches))
        ]
        rows.append({
            "case": f"{case['strategy']}({', '.join(f'{k}={v}' for k, v in case['settings'].items())})",
            "predicted_epoch_s": case["predicted_epoch_s"], "now_epoch_s": res.mean_epoch_s,
            "measured_epoch_s": case["measured_epoch_s"], "measured": measured, "simulated": sims,
        })  # fmt: skip
    return rows


def show(folder: Path, rows: list[dict]) -> None:
    print(f"\n{folder}")
    for row in rows:
        print(
            f"{row['case']}: predicted then {row['predicted_epoch_s'] * 1e3:.1f} ms, now "
            f"{row['now_epoch_s'] * 1e3:.1f}, measured {row['measured_epoch_s'] * 1e3:.1f}"
        )
        for i, m in enumerate(row["measured"]):
            print(
                f"  measured  rank {i}: {m['steps']:5d} steps {m['exchanges']:4d} exchanges; per "
                f"epoch compute {m['compute'] * 1e3:6.1f} ms, sync {m['sync'] * 1e3:6.1f}, data "
                f"{m['data_wait'] * 1e3:5.1f}; step median {m['step_median_s'] * 1e3:.2f} ms, "
                f"mean {m['step_mean_s'] * 1e3:.2f}"
            )
        for i, s in enumerate(row["simulated"]):
            alone = "" if s["compute"] is None else f", compute {s['compute'] * 1e3:6.1f}"
            print(
                f"  simulated rank {i}: {s['steps']:5d} steps {s['exchanges']:4d} exchanges; per "
                f"epoch busy {s['busy'] * 1e3:6.1f} ms, wait {s['wait'] * 1e3:6.1f}{alone}"
            )


def strip(folder: Path, out: Path) -> None:
    """``folder``'s advice.json and, of each result.json, the fields read here."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "advice.json").write_text((folder / "advice.json").read_text())
    for run in sorted((folder / "validate").iterdir()):
        for found in sorted(run.glob("*/result.json")):
            r = json.loads(found.read_text())
            dest = out / "validate" / run.name / found.parent.name / "result.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            harness.write_json(dest, {k: r[k] for k in FIELDS if k in r})


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--strip", type=Path, help="copy the one folder's fields read here to this")
    ap.add_argument("--json", type=Path, help="write every case's terms here")
    args = harness.start(ap, argv)
    if args.smoke:
        args.folders = [SMOKE]
    if not args.folders:
        ap.error("name at least one advise --validate folder")
    for folder in args.folders:
        if not (folder / "advice.json").is_file() or not (folder / "validate").is_dir():
            print(f"{folder}: not a gnnpar advise --validate folder", file=sys.stderr)
            return 2
    if args.strip:
        if len(args.folders) != 1:
            ap.error("--strip takes one folder")
        strip(args.folders[0], args.strip)
        return 0
    every = {}
    for folder in args.folders:
        every[str(folder)] = rows = terms(folder)
        show(folder, rows)
    if args.json:
        harness.write_json(args.json, {"machine": harness.machine(), "folders": every})
    return 0


if __name__ == "__main__":
    sys.exit(main())
