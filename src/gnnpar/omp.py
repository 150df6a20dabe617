"""How idle OpenMP threads wait, chosen when gnnpar is imported (before torch loads) and for the
processes gnnpar starts. Imported first by the package itself (``gnnpar/__init__.py``); torch-free.
"""

import contextlib
import os
from collections.abc import Iterator

# How long idle OpenMP threads spin before they sleep, chosen before torch loads (libgomp reads
# it once, when torch is first imported; a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins).
# - One gnnpar process on the host's cores (``gnnpar train`` with one rank, ``gnnpar advise``'s
#   profile, the Python API): a short spin, GOMP_SPINCOUNT=10000. Sleeping at once
#   (OMP_WAIT_POLICY=PASSIVE) wakes the other threads by a system call at each of the ~1,000
#   small parallel regions of a full-batch GAT step: on CiteSeer 29-30 ms a step at 2 threads
#   against 23 ms at 1, and 16 ms with the short spin (BENCHMARKS.md, issue 21).
# - Several gnnpar ranks on one host (started by gnnpar's launcher, which sets PASSIVE for them;
#   by torchrun, LOCAL_WORLD_SIZE > 1; by srun, more than one task per node): PASSIVE. Spinning
#   threads of one rank take the core another rank's thread needs: with the short spin, two
#   2-thread processes on 2 cores ran their steps 8-11x slower than one alone instead of ~2x
#   (BENCHMARKS.md, issues 21 and 22); libgomp's default spin (300,000) made 2 epochs of
#   sampled SAGE on Cora 26 s instead of 0.6 s.
OWN_OMP_POLICY = "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ


def _ranks_share_this_host() -> bool:
    """Whether a launcher says this process is one of several ranks on its host. Values that
    are not counts (garbage in the environment) say nothing."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        first = os.environ.get(name, "").split("(")[0].split(",")[0].strip()
        if first.isdigit() and int(first) > 1:
            return True
    return False


@contextlib.contextmanager
def ranks_sleep_at_once() -> Iterator[None]:
    """Processes started inside (ranks; multiprocessing's fork server, whose libgomp every
    process forked from it inherits) get OMP_WAIT_POLICY=PASSIVE, unless the user chose."""
    keys = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    old = {k: os.environ.get(k) for k in keys}
    if OWN_OMP_POLICY:
        os.environ.pop("GOMP_SPINCOUNT", None)
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


if OWN_OMP_POLICY:
    if _ranks_share_this_host():
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        os.environ["GOMP_SPINCOUNT"] = "10000"
