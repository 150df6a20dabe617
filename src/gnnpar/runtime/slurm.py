"""SLURM: run a task started by ``srun`` as the rank SLURM says it is.

Tasks started by ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` set, more
than one task, no ``RANK``/``WORLD_SIZE``) take their rank, world and local rank from SLURM, as
PyG's multi-node example does; :func:`adopt` writes them as torchrun's variables, so the
rest of gnnpar sees one kind of launch. ``MASTER_ADDR`` defaults to the first host of the step's
node list, ``MASTER_PORT`` to ``20000 + SLURM_JOB_ID mod 10000`` (below Linux's ephemeral ports).

:func:`adopt` changes the process's environment, so it is called once, explicitly, where a run
starts (:func:`gnnpar.run.run`); :func:`gnnpar.runtime.dist.launched_by_torchrun` and the
other questions about the launch only read the environment.
"""

from __future__ import annotations

import os
import re

from gnnpar.errors import UsageError

_adopted = False  # set once adopt() took the ranks from SLURM (dist's error messages say so)


def adopted() -> bool:
    """Whether :func:`adopt` took this process's rank from SLURM (a question: changes nothing)."""
    return _adopted


def adopt() -> bool:
    """Under ``srun`` (and not torchrun), set torchrun's variables from SLURM's; True if it did.

    Applies only when ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURM_LOCALID`` are all set,
    ``RANK`` and ``WORLD_SIZE`` are not, and ``SLURM_NTASKS > 1``: a one-task allocation (or a
    batch script's own shell, which sees its allocation's task count but is one process) keeps
    ``--workers N``. Sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and,
    unless given, ``MASTER_ADDR`` (first host of ``SLURM_STEP_NODELIST``,
    ``SLURM_JOB_NODELIST`` or ``SLURM_NODELIST``) and ``MASTER_PORT`` (``20000 + SLURM_JOB_ID
    mod 10000``: every task of a job computes the same port without talking to the others).
    """
    global _adopted
    env = os.environ
    names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    if _adopted or not all(n in env for n in names) or "RANK" in env or "WORLD_SIZE" in env:
        return False
    procid, ntasks, localid = (_slurm_int(n) for n in names)
    if ntasks < 1 or not 0 <= procid < ntasks:
        raise UsageError(
            f"SLURM_PROCID={procid} SLURM_NTASKS={ntasks} from the environment are inconsistent "
            "(need 0 <= SLURM_PROCID < SLURM_NTASKS); start gnnpar with srun, or unset them."
        )
    if ntasks == 1:
        return False
    local_world = _slurm_local_world(ntasks)
    if not 0 <= localid < local_world:
        raise UsageError(
            f"SLURM_LOCALID={localid} is not below the {local_world} tasks on this node "
            "(SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE); start gnnpar with srun."
        )
    updates = {
        "RANK": str(procid),
        "WORLD_SIZE": str(ntasks),
        "LOCAL_RANK": str(localid),
        "LOCAL_WORLD_SIZE": str(local_world),
    }
    if not env.get("MASTER_ADDR"):
        nodelist = next(
            (env[n] for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
             if env.get(n)),
            None,
        )  # fmt: skip
        if nodelist is None:
            raise UsageError(
                "SLURM gives this task its rank but no node list (SLURM_JOB_NODELIST): set "
                "MASTER_ADDR to the host of task 0."
            )
        updates["MASTER_ADDR"] = first_host(nodelist)
    if not env.get("MASTER_PORT"):
        if "SLURM_JOB_ID" not in env:
            raise UsageError(
                "SLURM gives this task its rank but no SLURM_JOB_ID to derive a port from: set "
                "MASTER_PORT (the same free port for every task)."
            )
        updates["MASTER_PORT"] = str(20000 + _slurm_int("SLURM_JOB_ID") % 10000)
    env.update(updates)
    _adopted = True
    return True


def _slurm_int(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise UsageError(
            f"Environment variable {name}={raw!r} is not an integer; it is set by SLURM's srun "
            "(unset the SLURM_* variables to run without SLURM)."
        ) from None


def _slurm_local_world(ntasks: int) -> int:
    """Tasks on this node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID, else
    SLURM_NTASKS_PER_NODE, else every task (only the thread count per rank depends on it)."""
    env = os.environ
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = env.get("SLURM_NODEID", "")
    if spec and node.isdigit():
        counts: list[int] = []
        for item in spec.split(","):
            m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
            if m is None:
                counts = []
                break
            counts += [int(m[1])] * int(m[2] or 1)
        if int(node) < len(counts):
            return counts[int(node)]
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else ntasks


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[01-03,07],gpu5`` -> ``node01``.

    The first host is the first entry with every bracket replaced by the first number of its
    range (zero padding kept), which is what ``scontrol show hostnames`` prints first; no
    expansion of the rest, and no ``scontrol`` needed on the compute node."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first comma outside brackets ends the first entry
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end].strip()

    def first(m: re.Match) -> str:
        return re.split(r"[-,]", m[1], maxsplit=1)[0].strip()

    host = re.sub(r"\[([^\]]*)\]", first, entry)
    if not host or depth < 0 or any(c in host for c in "[], "):
        raise UsageError(
            f"Cannot read the first host of the SLURM node list {nodelist!r}: set MASTER_ADDR "
            "to the host of task 0."
        )
    return host
