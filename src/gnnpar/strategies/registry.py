"""The strategies by ``--strategy`` name: one line each, in the order help texts list them.

:func:`register` adds one more (a test's toy strategy, a plugin): a module that defines a
:class:`~gnnpar.strategies.spec.StrategySpec` and registers it before the run's config is built.
Registration is per process: ranks started by ``--workers N`` find only what their own imports
register (the built-in strategies below).

Importing this imports every strategy's spec, and no torch: the config checks read it.
"""

from __future__ import annotations

from gnnpar.strategies import (
    allreduce,
    gossip,
    gossip_bipartite,
    hybrid,
    pipeline,
    sampled,
    sequential,
)
from gnnpar.strategies.spec import StrategySpec

_SPECS: dict[str, StrategySpec] = {}


def register(spec: StrategySpec) -> StrategySpec:
    """Make ``--strategy spec.name`` known; a name already taken by another spec is an error."""
    if _SPECS.get(spec.name, spec) is not spec:
        raise ValueError(f"a strategy named {spec.name!r} is registered already")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Forget a strategy added by :func:`register` (tests)."""
    _SPECS.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_SPECS)


def specs() -> tuple[StrategySpec, ...]:
    return tuple(_SPECS.values())


def get(name: str) -> StrategySpec:
    """The spec of ``--strategy name``; a KeyError for an unknown name (the config checks
    refuse those with a UsageError before anything looks a strategy up)."""
    return _SPECS[name]


register(sequential.SPEC)
register(allreduce.SPEC)
register(gossip.SPEC)
register(gossip_bipartite.SPEC)
register(pipeline.SPEC)
register(hybrid.SPEC)
register(sampled.SPEC)
