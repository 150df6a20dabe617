"""GPipe pipelines of a BlockModel (studies 000 and 001), in three parts, as the gossip package:
how a model is cut into stages (:mod:`~gnnpar.parallel.pipeline.stages`), what flows through them
(:mod:`~gnnpar.parallel.pipeline.batches`: graph or image micro-batches), and the step that runs one
schedule (:mod:`~gnnpar.parallel.pipeline.step`). The strategies that compose them are
:mod:`gnnpar.strategies.pipeline` and :mod:`gnnpar.strategies.hybrid`.
"""
