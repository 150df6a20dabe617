"""How fast this machine is right now, against when it was profiled: a fixed reference work.

A prediction of ``gnnpar advise`` is for the machine as its profile found it. On a VM whose
speed drifts (the model-207 Xeon of BENCHMARKS.md: a fixed 11 ms piece of work took 11-79 ms
within one minute, and a grid's runs came out 16-59% faster than its profile in the direction
the machine had drifted), ``--validate`` cannot tell a model's error from the machine's. So the
profile times a reference work at its start and end (``Profile.speed_ref_s``), ``--validate``
times it again just before and just after each run, and each case reports the machine's
``speed_factor`` (the run's reference time over the profile's: above 1, the machine was slower
than when profiled) and the measured epoch at the profile's speed (measured / factor), with its
error, beside the plain error. It is a diagnosis, not a correction of the comparison: the
summary keeps the plain error as the result, and names the factors it saw.

The reference is one thread doing what a training step does, dense products and a pass over
memory (:func:`reference_once`, ~10 ms); :func:`reference_s` is the median of
``REFERENCE_SAMPLES`` of them, so one slow moment of the VM does not decide it.
"""

from __future__ import annotations

import statistics
import time

import torch

REFERENCE_SAMPLES = 15
# a run whose reference times are within this factor of the profile's ran at its speed: the
# reference's own median varies by a few percent from one timing to the next on a quiet machine
STEADY = 1.1
_N, _PRODUCTS, _STREAM = 256, 16, 1 << 20  # 256 x 256 float32 products; a 4 MiB pass


def reference_once(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> float:
    t0 = time.perf_counter()
    c = a
    for _ in range(_PRODUCTS):
        c = torch.mm(c, b)
        c.mul_(0.0625)  # keeps the values bounded (b's entries are in [0, 1))
    v.mul_(1.0001).add_(c[0, 0])
    return time.perf_counter() - t0


def reference_s(samples: int = REFERENCE_SAMPLES) -> float:
    """The median time of ``samples`` reference works, on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.rand(_N, _N, generator=g)
        b = torch.rand(_N, _N, generator=g)
        v = torch.rand(_STREAM, generator=g)
        reference_once(a, b, v)  # warm-up
        return statistics.median(reference_once(a, b, v) for _ in range(samples))
    finally:
        torch.set_num_threads(before)


def clean(refs: object) -> list[float]:
    """The reference times of a profile read from a file: positive finite numbers, else none."""
    if not isinstance(refs, list):
        return []
    ok = [
        float(r)
        for r in refs
        if isinstance(r, (int, float)) and not isinstance(r, bool) and 0 < r < float("inf")
    ]
    return ok if len(ok) == len(refs) else []


def speed_factor(profile_refs: list[float], run_refs: list[float]) -> float | None:
    """The machine's slowness around a run against its profile's (None: no reference kept)."""
    profile_refs = clean(profile_refs)
    if not profile_refs or not run_refs:
        return None
    return statistics.fmean(run_refs) / statistics.median(profile_refs)
