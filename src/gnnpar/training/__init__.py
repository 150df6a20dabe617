"""The training loop and the parts it is built from, shared by every strategy.

The one loop (:mod:`~gnnpar.training.loop`) and what a strategy's plan plugs into it: sources of
batches (:mod:`~gnnpar.training.sources`; a pipeline's micro-batches,
:mod:`~gnnpar.training.pipeline_batches`), sync policies (:mod:`~gnnpar.training.sync`; gossip's,
:mod:`~gnnpar.training.gossip_sync`), a pipeline's step (:mod:`~gnnpar.training.pipeline_step`),
losses
and the local step (:mod:`~gnnpar.training.losses`), the optimizer
(:mod:`~gnnpar.training.optim`), ``--precision`` (:mod:`~gnnpar.training.precision`), seeds
(:mod:`~gnnpar.training.seeding`), emulated stragglers (:mod:`~gnnpar.training.straggler`),
checkpoints (:mod:`~gnnpar.training.checkpoint`), evaluation
(:mod:`~gnnpar.training.evaluation`), the choice of the final model
(:mod:`~gnnpar.training.final_model`), statistics and scores (:mod:`~gnnpar.training.metrics`),
the progress bar and ``metrics.jsonl`` (:mod:`~gnnpar.training.progress`). What the loop calls
on a source and a sync policy is declared in :mod:`~gnnpar.training.protocols`; result.json is
built from the loop's outcome in :mod:`gnnpar.result`. The strategies that build the plans are in
:mod:`gnnpar.strategies`, above this package; below it, processes, process groups and launching
are in :mod:`gnnpar.runtime`, and the gossip protocol, pipeline stages and collectives in
:mod:`gnnpar.parallel`.
"""
