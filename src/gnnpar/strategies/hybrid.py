"""Data + pipeline parallelism (study 000, section 4): R copies of an S-stage GPipe pipeline.

Ranks form a replica x stage DeviceMesh (rank = replica * S + stage). Each copy trains on its
own share of the data: images, its own ``--batch-size`` images of every global batch of R x
batch-size; graphs, its own R-th of the micro-batches planned over the training nodes. After
each step the gradients of corresponding stages are summed over the copies
(:class:`~gnnpar.training.sync.ReplicaGradSum`; the study used DDP per stage). Every micro-batch loss is
already divided by the target count of the whole global step, so the summed gradient is exactly
the full-batch (global-batch) gradient and the copies stay identical.

result.json's loss_curve holds each copy's own mean loss: {"replica0": [...], "replica1": [...]}
(study 000 figure 3 plots them against the sequential curve; `gnnpar bench vig-pipeline`).

    gnnpar train --dataset synthetic-cifar10 --model vig --strategy hybrid --replicas 2 \\
        --stages 2 --workers 4 --chunks 5 --batch-size 40 --max-steps 20
    gnnpar train --dataset cora --model gat --strategy hybrid --replicas 2 --stages 2 --workers 4
"""

from __future__ import annotations

from dataclasses import replace

from gnnpar.strategies import pipeline
from gnnpar.strategies.spec import reads, replicated_pipeline

SPEC = replace(
    pipeline.SPEC,
    name="hybrid",
    help="--replicas data-parallel copies of a pipeline",
    degrees=replicated_pipeline,
    reads={**pipeline.SPEC.reads, **reads("replicas")},
)
