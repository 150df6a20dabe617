"""The hosts of a run over a sharded prepared folder (gnnpar.data.shards) agree on their shards
before any step: each rank says what its host holds through the store, waits (within
``--timeout``, naming the rank that did not answer) for every rank's word, and all judge the
same words the same way, so that a host with a missing or damaged shard is named on every host
and every rank ends with exit 2; none waits on a peer that has given up."""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from gnnpar.data import shards
from gnnpar.runtime.store import wait_for_key


def host_index() -> int:
    """This host's node rank: torchrun's ``GROUP_RANK``, else SLURM's ``SLURM_NODEID``, else 0."""
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return 0


def agree(
    store: dist.Store, rank: int, world: int, folder: str, timeout_s: float, across: bool = False
) -> bool:
    """UsageError (the same one on every rank) unless every host can train from ``folder``.
    ``across``: the strategy can train across shards each host holds alone. True when the run
    trains across shards, False when every host holds every shard (shards.agreed)."""
    try:
        status = shards.host_status(folder, host_index())
    except Exception as e:  # noqa: BLE001 (the top manifest itself: said to every rank too)
        status = {"host": host_index(), "own": str(e), "every": False, "lacks": []}
    store.set(f"shards/{rank}", json.dumps(status))
    statuses = []
    for r in range(world):
        wait_for_key(store, f"shards/{r}", timeout_s, f"rank {r}'s check of its host's shard")
        statuses.append(json.loads(store.get(f"shards/{r}")))
    return shards.agreed(statuses, across)
