"""Gossip with study 003's algorithm 5 pairing: active ranks pick partners only among passive
ranks (the first half of the ranks is active). Everything else is :mod:`gnnpar.strategies.gossip`.

    gnnpar train ... --strategy gossip-bipartite --workers 4     # ranks 0,1 active; 2,3 passive
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from gnnpar.config.schema import Config
from gnnpar.errors import UsageError
from gnnpar.parallel.parallel_dims import ParallelDims
from gnnpar.strategies import gossip
from gnnpar.strategies.spec import SIM_GOSSIP, Advice


def check(cfg: Config, dims: ParallelDims) -> None:
    gossip.check(cfg, dims)
    if dims.world < 2:
        raise UsageError(
            "--strategy gossip-bipartite needs at least 2 ranks (an active and "
            "a passive one): pass --workers 2 or more."
        )


SPEC = replace(
    gossip.SPEC,
    name="gossip-bipartite",
    help="gossip whose active ranks pair with passive ones only",
    build=partial(gossip.build, bipartite=True),
    check=check,
    # not in advise's default grid: the studies compare gossip's own pairing
    advice=Advice(SIM_GOSSIP, default=False, bipartite=True),
)
