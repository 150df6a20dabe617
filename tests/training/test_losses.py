"""A batch without training rows: no NaN loss, zero gradients, and the collectives still run."""

from __future__ import annotations

import math

import torch
from torch_geometric.data import Data

from gnnpar.training.losses import LocalStep, NoTrainingRows, graph_loss


def _batch(train: list[bool]) -> Data:
    n = len(train)
    edge_index = torch.tensor([[i for i in range(n - 1)], [i + 1 for i in range(n - 1)]])
    return Data(
        x=torch.randn(n, 3),
        edge_index=edge_index,
        y=torch.zeros(n, dtype=torch.long),
        train_mask=torch.tensor(train),
    )


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, edge_index):
        return self.lin(x)


def test_a_batch_without_training_rows_reports_no_loss_and_zero_gradients():
    net = Net()
    batch = _batch([False, False, False])
    assert isinstance(graph_loss(net, batch, False), NoTrainingRows)
    assert LocalStep(net, lambda m, b: graph_loss(m, b, False))(batch) is None
    for p in net.parameters():  # zero, not None: a backward ran through the model
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0


def test_a_batch_with_training_rows_is_unchanged():
    torch.manual_seed(0)
    net = Net()
    batch = _batch([True, False, True])
    loss = LocalStep(net, lambda m, b: graph_loss(m, b, False))(batch)
    out = net(batch.x, batch.edge_index)
    expected = torch.nn.functional.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
    assert math.isfinite(float(loss)) and torch.equal(loss, expected.detach())


def test_cluster_gcn_parts_without_training_nodes_give_a_finite_loss_curve(tmp_path):
    """karate in 3 parts: one part holds no training node (its 4 labelled nodes are elsewhere);
    the epoch's loss was NaN before."""
    import gnnpar

    run = gnnpar.fit(
        "karate", model="gcn", partitions=3, epochs=2, out=str(tmp_path / "run"), quiet=True
    )
    assert all(math.isfinite(v) for v in run.result["loss_curve"]), run.result["loss_curve"]
