"""``gnnpar advise --validate``: run what can be run here with ``gnnpar train``, compare.

Every configuration of the grid that this machine can run as the cluster describes it (one
host, no more ranks than cores) is trained for real, one after the other, by ``python -m gnnpar
train`` with the configuration's flags (stragglers included) and ``--out <out>/validate/<n>``;
its ``train_time_s`` / epochs is compared with the predicted epoch time. Each run has a
deadline (its ``--timeout`` plus the predicted time, with room); one that misses it or fails
is reported as such, with the end of its output, and the others still run.

The error of a case is ``(predicted - measured) / measured``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from gnnpar.advise.predict import Prediction, candidate_flags


def measurable(req, p: Prediction) -> bool:
    c = req.cluster
    world = p.candidate.world
    return (world == 1 or c.hosts == 1) and world <= (os.cpu_count() or 1)


def _argv(flags: dict[str, Any]) -> list[str]:
    argv = []
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not False and value is not None:
            argv += [f"--{key}", str(value)]
    return argv


def run_one(req, p: Prediction, out: str) -> dict[str, Any]:
    flags = candidate_flags(req, p.candidate)
    flags["out"] = out
    timeout = float(flags.get("timeout", 120)) + 3 * p.train_time_s + 60
    cmd = [sys.executable, "-m", "gnnpar", "train", *_argv(flags)]
    case = {
        "strategy": p.candidate.strategy,
        "settings": dict(p.candidate.settings),
        "workers": p.candidate.world,
        "predicted_epoch_s": p.epoch_s,
        "measured_epoch_s": None,
        "error": None,
        "command": " ".join(cmd[1:]),
    }
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        case["failed"] = f"gnnpar train did not finish within {timeout:.0f} s"
        return case
    result = os.path.join(out, "result.json")
    if done.returncode != 0 or not os.path.exists(result):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        case["failed"] = f"exit {done.returncode}: {' | '.join(tail)}"
        return case
    with open(result) as f:
        r = json.load(f)
    measured = r["train_time_s"] / r["epochs"]
    case["measured_epoch_s"] = measured
    case["error"] = (p.epoch_s - measured) / measured
    return case


def validate(req, preds: list[Prediction]) -> dict[str, Any]:
    cases = []
    runnable = [p for p in preds if measurable(req, p)]
    print(f"gnnpar advise --validate: training {len(runnable)} configuration(s) here", flush=True)
    for i, p in enumerate(runnable):
        out = str(req.out / "validate" / f"{i:02d}-{p.candidate.strategy}")
        case = run_one(req, p, out)
        cases.append(case)
        shown = p.candidate.label()
        if case["error"] is None:
            print(
                f"  {shown}: predicted {p.epoch_s * 1e3:.1f} ms, {case.get('failed')}", flush=True
            )
        else:
            print(
                f"  {shown}: predicted {p.epoch_s * 1e3:.1f} ms/epoch, measured "
                f"{case['measured_epoch_s'] * 1e3:.1f} ms/epoch, error {case['error']:+.0%}",
                flush=True,
            )
    errors = [abs(c["error"]) for c in cases if c["error"] is not None]
    summary = {
        "cases": cases,
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
    }
    measured = [c for c in cases if c["measured_epoch_s"] is not None]
    if measured:
        best = min(measured, key=lambda c: c["measured_epoch_s"])
        pred_best = min(measured, key=lambda c: c["predicted_epoch_s"])
        summary["measured_best"] = {"strategy": best["strategy"], "settings": best["settings"]}
        summary["recommended_within_10pct"] = (
            pred_best["measured_epoch_s"] <= 1.1 * best["measured_epoch_s"]
        )
    if errors:
        print(
            f"  median |error| {summary['median_abs_error']:.0%}, "
            f"largest {summary['max_abs_error']:.0%}",
            flush=True,
        )
    return summary
