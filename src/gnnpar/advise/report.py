"""What ``gnnpar advise`` shows and writes: the ranked table, a plot, ``<out>/advice.json``.

advice.json (the contract in docs/CONTRACTS.md)::

    {"profile_s": 12.3,
     "predictions": [{"strategy": "allreduce", "settings": {"partitions": 8, "sync_every": 20},
                      "epoch_s": ..., "train_time_s": ..., "speedup": ...,
                      "peak_bytes_per_rank": ..., "workers": 4, "bytes_on_network": ...,
                      "wait_share": ...}, ...],              # fastest first
     "recommended": {"strategy": ..., "settings": {...}, "why": "..."},
     "cluster": {...}, "profile": {...}}                     # what the prediction assumed

It is written to a temporary file in the same folder and renamed, so a reader never sees half
of it.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from gnnpar.advise.predict import Prediction
from gnnpar.advise.profile import PROBE_ROUNDS


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def rows(preds: list[Prediction]) -> list[list[str]]:
    out = []
    for i, p in enumerate(sorted(preds, key=lambda p: p.train_time_s), 1):
        out.append(
            [
                str(i),
                p.candidate.label(),
                str(p.candidate.world),
                _seconds(p.epoch_s),
                _seconds(p.train_time_s),
                f"{p.speedup:.2f}x",
                f"{p.wait_share:.0%}",
                _bytes(p.peak_bytes_per_rank),
                _bytes(p.bytes_on_network),
            ]
        )
    return out


# a ratio probe whose rounds differ by more than this says the machine was not steady
UNSTEADY = 1.2
PROBES = {
    "loop_factor": "real loop's slowdown",
    "corun_factor": "two ranks' co-run slowdown",
    "sampled_corun_factor": "two sampled ranks' co-run slowdown",
}


def steadiness_note(
    probe_rounds: dict[str, list[float]],
    rounds: int = PROBE_ROUNDS,
    speed_refs: list[float] | None = None,
) -> str | None:
    """A warning when a ratio probe's rounds (``Profile.probe_rounds``) disagree by more than
    :data:`UNSTEADY`: predictions from the profile are no closer than that spread. Whose fault
    it says from the reference work timed through the profile (``Profile.speed_ref_s``,
    :mod:`gnnpar.advise.speed`): where those times differ by more than :data:`UNSTEADY` too,
    this machine's speed changed while it was profiled (a shared VM); where they agree, the
    machine ran at one speed and the steps themselves varied (their threads time-sharing the
    cores with each other or with other processes); a profile without them (from before)
    cannot tell. None when every probe agreed. A profile of one round
    (``--profile-rounds 1``) cannot tell, and says so."""
    if rounds == 1:
        return (
            "note: profiled in one round (--profile-rounds 1): whether this machine's speed "
            "changed while it was profiled is not known."
        )
    spread = {k: max(v) / min(v) for k, v in probe_rounds.items() if len(v) > 1 and min(v) > 0}
    worst = max(spread, key=spread.__getitem__, default=None)
    if worst is None or spread[worst] < UNSTEADY:
        return None
    v = probe_rounds[worst]
    if worst == "step_drift":
        seen = (
            f"the same steps, timed again later, took {min(v):.2f}-{max(v):.2f}x their first time"
        )
    else:
        seen = (
            f"the {PROBES.get(worst, worst)} came out at {min(v):.2f}-{max(v):.2f} in {len(v)} "
            f"rounds (the median, {statistics.median(v):.2f}, is used)"
        )
    closer = "predictions from this profile are no closer than that"
    refs = [r for r in speed_refs or [] if r > 0]
    if len(refs) < 2:
        return f"note: {seen}: the machine's speed or the steps' own times varied; {closer}."
    ref = f"a reference work timed {len(refs)} times through the profile took "
    ref += f"{min(refs) * 1e3:.1f}-{max(refs) * 1e3:.1f} ms"
    if max(refs) / min(refs) >= UNSTEADY:
        return (
            f"note: this machine's speed changed while it was profiled ({ref}): {seen}; "
            f"{closer}. Profile on a quiet machine, or again."
        )
    return (
        f"note: {seen}, while this machine's speed held steady ({ref}): the steps themselves "
        f"varied (their threads time-sharing the cores, with each other or other processes); "
        f"{closer}. Fewer --threads per rank, or a quieter machine, steadies them."
    )


HEADER = ["#", "strategy (settings)", "ranks", "epoch", "training", "speed-up", "waiting"]
HEADER += ["memory/rank", "network"]


def print_table(
    preds: list[Prediction], title: str, recommended: dict[str, Any], note: str | None = None
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in HEADER:
        table.add_column(h, justify="left" if h.startswith("strategy") else "right")
    for r in rows(preds):
        table.add_row(*r)
    console = Console(width=max(120, Console().width))
    console.print(table)
    settings = ", ".join(f"{k}={v}" for k, v in recommended["settings"].items())
    console.print(f"recommended: {recommended['strategy']} {settings}".rstrip())
    console.print(f"why: {recommended['why']}", soft_wrap=True)
    if note:
        console.print(note, soft_wrap=True)


def plot(preds: list[Prediction], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = sorted(preds, key=lambda p: p.train_time_s)
    labels = [p.candidate.label() for p in ranked]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(ranked) + 1.5))
    ax.barh(range(len(ranked)), [p.train_time_s for p in ranked], color="tab:blue")
    ax.set_yticks(range(len(ranked)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted training time (s)")
    ax.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def write_json_atomic(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def advice(
    profile_s: float,
    preds: list[Prediction],
    recommended: dict[str, Any],
    cluster: dict[str, Any],
    profile: dict[str, Any],
) -> dict[str, Any]:
    ranked = sorted(preds, key=lambda p: p.train_time_s)
    return {
        "profile_s": profile_s,
        "predictions": [p.to_json() for p in ranked],
        "recommended": recommended,
        "cluster": cluster,
        "profile": profile,
    }
