"""Simulate a finished ``gnnpar advise --validate`` again with the current model, from the
profile its advice.json holds, and compare with what that validation measured.

The measurements do not depend on the model, so a change to the simulation (a cost it did not
charge, a calibration) can be judged on grids already run, without training them again. Each
case is re-predicted as validate predicts it: two-host cases for two namespace hosts sharing
this machine's cores (``hosts_per_machine=2``) over the link as made (the asked one where it
had its delay: netem or the emulated link). Prints, per case, the prediction recorded then,
the prediction now, the median measured and both errors; then median and largest |error|.

    python -m benchmarks.advise.repredict_validation runs/advise-check/advice.json [more advice.json ...]

``--json OUT`` also writes every case (both predictions, the measurement, both errors) and the
summaries per file, with the machine it was re-predicted on.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

from benchmarks import harness

SMOKE = [harness.RESULTS / "advise_validate_cora_amd_2026-11-27_wake_gossip.json"]


def repredict(path: Path) -> list[dict]:
    from gnnpar.advise import simulate as sim
    from gnnpar.advise.predict import Candidate, ClusterSpec, predict
    from gnnpar.advise.profile import Profile

    advice = json.loads(path.read_text())
    val = advice.get("validation")
    if not val:
        raise SystemExit(f"{path}: no validation in it (run gnnpar advise --validate)")
    prof = Profile(**advice["profile"])
    c = advice["cluster"]
    net = c.get("network")
    link = sim.Link(net["latency_s"], net["bandwidth_Bps"]) if net else None
    spec = ClusterSpec(c["hosts"], c["ranks_per_host"], link)
    strag = sim.Stragglers(
        {int(k): v for k, v in c.get("slowdown", {}).items()}, c.get("jitter", 0.0), prof.seed
    )
    rows = []
    for case in val["cases"]:
        if case.get("measured_epoch_s") is None:
            continue
        cand = Candidate(case["strategy"], case["settings"], case["workers"])
        s = spec
        if case.get("hosts") == 2:
            emulated = "no added delay" not in case.get("link", "")
            s = dataclasses.replace(
                spec, network=link if emulated else sim.Link(0.0, link.bandwidth_Bps),
                hosts_per_machine=2,
            )  # fmt: skip
        now = predict(cand, prof, s, strag, c["epochs"]).epoch_s
        m = case["measured_epoch_s"]
        rows.append({
            "case": f"{case['strategy']}({', '.join(f'{k}={v}' for k, v in case['settings'].items())})",
            "then": case["predicted_epoch_s"], "now": now, "measured": m,
            "err_then": (case["predicted_epoch_s"] - m) / m, "err_now": (now - m) / m,
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("advice", nargs="*", type=Path)
    ap.add_argument("--json", type=Path, help="write the cases and summaries here")
    args = ap.parse_args(argv)
    if args.smoke:  # a stored grid, simulated again
        args.advice = SMOKE
    if not args.advice:
        ap.error("name at least one advice.json")
    files = {}
    for path in args.advice:
        rows = repredict(path)
        print(f"\n{path}")
        print(
            "| configuration | predicted then ms | predicted now ms | measured ms (median) | error then | error now |"
        )
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['case']} | {r['then'] * 1e3:.1f} | {r['now'] * 1e3:.1f} | "
                f"{r['measured'] * 1e3:.1f} | {r['err_then']:+.0%} | {r['err_now']:+.0%} |"
            )
        summary = {}
        for key in ("err_then", "err_now"):
            e = [abs(r[key]) for r in rows]
            summary[key] = {"median_abs": statistics.median(e), "largest_abs": max(e)}
            print(f"{key}: median |error| {statistics.median(e):.0%}, largest {max(e):.0%}")
        files[str(path)] = {"cases": rows, "summary": summary}
    if args.json:
        harness.write_json(args.json, {"machine": harness.machine(), "files": files})
    return 0


if __name__ == "__main__":
    sys.exit(main())
