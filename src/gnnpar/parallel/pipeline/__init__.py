"""GPipe pipelines of a BlockModel (studies 000 and 001): how a model is cut into stages
(:mod:`~gnnpar.parallel.pipeline.stages`). What flows through them and the step that runs one
schedule are plug-ins of the training loop, :mod:`gnnpar.training.pipeline_batches` (graph or
image micro-batches) and :mod:`gnnpar.training.pipeline_step`; the strategies that compose them
are :mod:`gnnpar.strategies.pipeline` and :mod:`gnnpar.strategies.hybrid`.
"""
