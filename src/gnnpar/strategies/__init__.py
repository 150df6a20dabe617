"""The training strategies: one module per strategy, each defining its ``SPEC``.

A :class:`~gnnpar.strategies.spec.StrategySpec` says, without torch, which settings the strategy
reads, how the ranks split into data-parallel copies and pipeline stages, its defaults, its
checks, and how a rank builds its :class:`~gnnpar.training.loop.Plan`.
:mod:`gnnpar.strategies.registry` lists them by ``--strategy`` name; adding a strategy is one
module here and one line there.

Nothing is imported here: import :mod:`gnnpar.strategies.registry` (or a strategy's module).
"""
