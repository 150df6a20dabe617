"""The grid fitted to the graph: the settings of ``gnnpar advise``'s own choosing that it allows.

:func:`~gnnpar.advise.predict.build_grid` chooses settings from the cluster alone: 2 Cluster-GCN
subgraphs per rank (at least 8), 2 and 4 micro-batches per copy of the model, batches of 512
and 1024 seeds. A small graph cannot always take them (KarateClub's 34 nodes on 64 ranks: 128
subgraphs), and ``gnnpar train`` would refuse such a run once its dataset is loaded.
:func:`fit_grid` checks every configuration against the graph as ``gnnpar train`` would: its
nodes, its training nodes, and its partitions made as ``gnnpar train`` makes them (cached, so
the profile reuses them). For a setting advise chose itself it takes the nearest one the graph
allows (the most subgraphs up to its default that each hold a training node, else that still
make no empty subgraph: a subgraph without a training node trains nothing, as in ``gnnpar
train``), and says which and why in one line; a setting the user gave is kept; a strategy
with no setting the graph allows is left out, with ``gnnpar train``'s reason in words.

With ``--profile`` the graph is the profile's: its sizes, and the subgraph counts it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gnnpar.errors import UsageError
from gnnpar.strategies import registry
from gnnpar.strategies.spec import SIM_GOSSIP, SIM_LOCKSTEP, SIM_PIPELINE, SIM_SAMPLED


def _simulation(strategy: str) -> str:
    """The simulation a strategy's spec declares for advise (its grid's candidates have one)."""
    advice = registry.get(strategy).advice
    assert advice is not None, strategy  # build_grid makes candidates of advised ones only
    return advice.simulation


def default_partitions(world: int) -> int:
    """advise's own ``--partitions``: 2 subgraphs per rank, at least 8 (predict.build_grid)."""
    return max(8, 2 * world)


@dataclass(frozen=True)
class Split:
    """What ``--partitions P`` makes of the graph: ``ok`` (``gnnpar train`` can train it: no
    empty subgraph), how many of its subgraphs hold no training node, or why it cannot."""

    ok: bool
    lacking: int = 0
    why: str = ""


@dataclass
class Facts:
    """What the grid must fit: the graph's nodes and training nodes, ``split(P)``, and the
    partition counts known to work (a saved profile's)."""

    num_nodes: int
    num_train: int
    split: Callable[[int], Split]
    known: tuple[int, ...] = ()
    microbatch: str = "exact"
    from_profile: bool = False  # a saved profile's: what it lacks is said where it is read
    shards: int = 0  # a folder prepared with --shards H: H (--seeds applies across them)
    _seen: dict[int, Split] = field(default_factory=dict)

    def parts(self, p: int) -> Split:
        if p not in self._seen:
            self._seen[p] = self.split(p)
        return self._seen[p]


def graph_facts(base: dict[str, Any], ds) -> Facts:
    """The facts of a loaded graph dataset; ``split`` partitions it as ``gnnpar train`` does
    (``--partitioner``, ``--seed``, the cache under ``--data-root``)."""
    import torch

    from gnnpar.advise.profile import flags_for, reference
    from gnnpar.configure import build_config
    from gnnpar.data.partition import load_partitions

    n = int(ds.num_nodes)
    train_mask = ds.data.train_mask

    def split(p: int) -> Split:
        if p > n:
            return Split(False, why=f"the graph has {n} nodes, fewer than {p} subgraphs")
        cfg = build_config(None, flags_for(base, reference("full"), partitions=p))
        try:
            graph, _, _ = load_partitions(cfg, ds)
        except UsageError as e:  # some subgraph would be empty
            return Split(False, why=str(e).split(". Use fewer")[0])
        part = graph.tensors["part"]
        held = torch.bincount(part[train_mask], minlength=p)
        return Split(True, lacking=int((held == 0).sum()))

    cfg = _config(base)
    shards = int((getattr(ds, "info", None) or {}).get("sharded") or 0)
    return Facts(n, int(train_mask.sum()), split, microbatch=cfg.strategy.microbatch, shards=shards)


def profile_facts(base: dict[str, Any], prof) -> Facts:
    """The facts of a saved profile: its sizes; a partition count works where it was profiled."""
    known = tuple(sorted(int(k) for k in prof.parts_step_s))

    def split(p: int) -> Split:
        if str(p) in prof.parts_step_s:
            return Split(True)
        return Split(False, why=f"--profile holds no {p} subgraphs")

    cfg = _config(base)
    shards = int(prof.shards.get("hosts") or 0)
    return Facts(
        prof.num_nodes, prof.num_train, split, known, cfg.strategy.microbatch, True, shards
    )


def _config(base: dict[str, Any]):
    from gnnpar.advise.profile import flags_for, reference
    from gnnpar.configure import build_config

    return build_config(None, flags_for(base, reference("full")))


def choose_partitions(default: int, lo: int, facts: Facts, multiple: int = 1) -> int | None:
    """advise's ``--partitions`` for configurations needing at least ``lo`` subgraphs, a
    ``multiple`` of the ranks (each rank the same number of subgraphs: a rank left without one
    in a step of ``gnnpar train --sync-every K`` > 1 has no gradients, and torch's model
    averager then fails): the largest count, ``default`` first, then the graph's training nodes
    and halvings down to ``lo`` (and a profile's counts, nearest first), whose subgraphs each
    hold a training node; else the first one the graph can be split into at all; None where
    none can."""
    start = min(default, facts.num_train, facts.num_nodes)
    tries = [default]
    while start >= lo:
        tries.append(start)
        start //= 2
    tries += sorted(facts.known, key=lambda k: (abs(k - default), -k))
    tries = [t - t % multiple for t in tries]
    usable = None
    for p in dict.fromkeys(t for t in tries if lo <= t <= facts.num_nodes):
        s = facts.parts(p)
        if not s.ok:
            continue
        if s.lacking == 0:
            return p
        usable = usable or p
    return usable


def _why_no_partitions(lo: int, world: int, facts: Facts, default: int) -> str:
    n = facts.num_nodes
    if world > 1 and lo > n:
        return (
            f"each of the {world} ranks needs a subgraph of its own (--partitions >= ranks), "
            f"and the graph has {n} nodes"
        )
    tried = facts.parts(max(lo, min(default, n)))
    return f"no count of subgraphs from {lo} to {default} splits the graph ({tried.why})"


def fit_grid(req, facts: Facts) -> list[str]:
    """Fit ``req.grid`` to the graph (see the module's text): configurations changed or left
    out in place (``req.grid``, ``req.omitted``); returns what advise changed of its own
    choices, a phrase each."""
    fit = _GridFit(req, facts)
    kept: list[Any] = []  # predict.Candidate (predict imports this module)
    for c in req.grid:
        s = dict(c.settings)
        if "partitions" in s and not fit.partitions(c, s):
            continue
        if _simulation(c.strategy) == SIM_SAMPLED and not fit.sampled(c, s):
            continue
        if "seeds" in s and not fit.seeds(s):
            continue
        if _simulation(c.strategy) == SIM_PIPELINE and not req.images and not fit.pipeline(c, s):
            continue
        kept.append(replace(c, settings=s))
    unique: dict[tuple, Any] = {}
    for c in kept:
        unique.setdefault(c.key(), c)
    req.grid = list(unique.values())
    present = {c.strategy for c in req.grid}
    for name, why in fit.why_out.items():
        if name not in present:
            req.omitted.setdefault(name, why)
            fit.changes.pop(name, None)
    return list(fit.changes.values())


class _GridFit:
    """:func:`fit_grid`'s steps, one per kind of setting: each fits one configuration's
    ``settings`` in place and says whether it stays (False: left out, the reason kept in
    ``why_out``); ``changes``: what advise changed of its own choices, a phrase each."""

    def __init__(self, req, facts: Facts) -> None:
        self.req, self.facts, self.fixed = req, facts, req.fixed
        self.changes: dict[str, str] = {}
        self.why_out: dict[str, str] = {}
        self.chosen: dict[tuple[int, int], int | None] = {}
        self.whose: dict[str, set[str]] = {}  # a change of the subgraphs -> whose they are

    def partitions(self, c, s: dict) -> bool:
        """The subgraph count: the user's checked, or advise's own fitted to the graph."""
        facts = self.facts
        parallel = _simulation(c.strategy) in (SIM_LOCKSTEP, SIM_GOSSIP)
        if self.fixed.get("partitions") is not None:
            split = facts.parts(s["partitions"])
            # the user's own setting: refused, as gnnpar train would refuse it
            if not split.ok and not facts.from_profile:
                raise UsageError(
                    f"--partitions {s['partitions']}: {split.why}. Use fewer --partitions "
                    "(or leave it out: advise then chooses a count this graph allows)."
                )
            return True
        default = s["partitions"]
        lo = c.world if parallel else 2
        if (lo, c.world) not in self.chosen:
            self.chosen[lo, c.world] = choose_partitions(default, lo, facts, c.world)
        p = self.chosen[lo, c.world]
        if p is None:
            self.why_out.setdefault(c.strategy, _why_no_partitions(lo, c.world, facts, default))
            return False
        if p != default:
            who = "the ranks'" if parallel else f"{c.strategy}'s"
            key = f"parts{p}-{default}"  # the same change for both: said once
            self.whose.setdefault(key, set()).add(who)
            self.changes[key] = _partitions_change(
                who if len(self.whose[key]) == 1 else "", p, default, facts, c.world
            )
        s["partitions"] = p
        return True

    def sampled(self, c, s: dict) -> bool:
        """Sampled: a training node per rank at least; one batch size of those that make the
        same run (each rank's nodes in one batch)."""
        facts = self.facts
        if facts.num_train < c.world:
            self.why_out.setdefault(
                c.strategy,
                f"the graph has {facts.num_train} training nodes, fewer than the {c.world} "
                "ranks: every rank needs at least one",
            )
            return False
        per_rank = facts.num_train // c.world
        if self.fixed.get("batch_size") is None and per_rank < s["batch_size"]:
            smallest = min(
                x.settings["batch_size"] for x in self.req.grid if x.strategy == c.strategy
            )
            if s["batch_size"] > smallest and per_rank < smallest:
                nodes = "training nodes make" if per_rank != 1 else "training node makes"
                self.changes[c.strategy] = (
                    f"{c.strategy} only at --batch-size {smallest} (each rank's {per_rank} "
                    f"{nodes} one batch at any larger size: the same run)"
                )
                return False
        return True

    def seeds(self, s: dict) -> bool:
        """--seeds deals the seeds of a run across shards: on a graph not prepared with
        --shards it means nothing (dropped; local refused where the user asked for it, as
        gnnpar train refuses it)."""
        if self.facts.shards >= 2:
            return True
        if s.pop("seeds") == "global":
            return True
        if self.fixed.get("seeds") == "local":
            raise UsageError(
                "--seeds local deals each host its own shard's training nodes: the dataset is "
                "not a folder prepared with --shards. Use --seeds global, or prepare the graph "
                "with gnnpar prepare --shards H."
            )
        return False

    def pipeline(self, c, s: dict) -> bool:
        """A pipeline over a graph: a node (a training node, exact micro-batches) for each of
        the copies' micro-batches."""
        facts = self.facts
        copies = s.get("replicas", 1)
        limit = facts.num_train if facts.microbatch == "exact" else facts.num_nodes
        what = "training nodes" if facts.microbatch == "exact" else "nodes"
        if copies * s["chunks"] <= limit:
            return True
        if self.fixed.get("chunks") is None:
            self.changes.setdefault(
                c.strategy,
                f"{c.strategy} not at {copies} x {s['chunks']} micro-batches (more "
                f"than the graph's {limit} {what}: each micro-batch needs one)",
            )
        self.why_out.setdefault(
            c.strategy,
            f"{copies} cop{'ies' if copies > 1 else 'y'} x {s['chunks']} micro-batches "
            f"(--chunks) is more than the graph's {limit} {what}; each micro-batch "
            f"needs one",
        )
        return False


def _partitions_change(who: str, p: int, default: int, facts: Facts, world: int = 1) -> str:
    split, n, t = facts.parts(p), facts.num_nodes, facts.num_train
    if default % world and (split.ok and not split.lacking) and facts.parts(default).ok:
        reason = f"a multiple of the {world} ranks: each rank as many subgraphs"
    elif split.lacking:
        reason = (
            f"no count from {p} to {default} gives every subgraph a training node; "
            f"{split.lacking} of these {p} hold none and train nothing, as in gnnpar train"
        )
    elif facts.from_profile:
        reason = f"--profile holds no {default} subgraphs"
    elif default > t:
        reason = (
            f"the graph's {t} training nodes, of {n} nodes, cannot give each of {default} "
            f"subgraphs one; each of these {p} holds one"
        )
    else:
        was = facts.parts(default)
        reason = was.why or (
            f"{was.lacking} of {default} subgraphs would hold no training node; each of "
            f"these {p} holds one"
        )
    whose = f" for {who} subgraphs" if who else ""
    return f"--partitions {p}{whose}, not {default} ({reason})"


def check_not_empty(req) -> None:
    """Exit 2 (a UsageError) naming every strategy left out and why, where none is left."""
    if req.grid:
        return
    raise UsageError(
        f"Nothing to predict for {', '.join(req.strategies)} on {req.cluster.world} rank(s) "
        f"({req.cluster.hosts} host(s) x {req.cluster.ranks_per_host}): "
        + "; ".join(f"{n}: {w}" for n, w in req.omitted.items())
        + ". Ask about fewer ranks, other --strategies, or a larger graph."
    )
