"""The sequential trainer: same seed, same loss curve, in all three regimes of the studies."""

from __future__ import annotations

import pytest
import torch

from gnnpar.configure import build_config
from gnnpar.data.datasets import GraphDataset, ImageDataset, load_dataset
from gnnpar.run import prepare, train_rank
from gnnpar.runtime.dist import DistContext
from helpers import tiny_graph


@pytest.fixture(autouse=True)
def one_thread():
    """Like a rank of `gnnpar train --threads 1`; small graphs gain nothing from more threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora", "unused-for-bundled", 1.0, 0)


def train(ds, data_root, **flags):
    cfg = build_config(None, {"quiet": True, "eval-every": 0, "data-root": str(data_root), **flags})
    return train_rank(cfg, ds, DistContext(), prepare(cfg))


def tiny_images(n: int = 24, size: int = 8, seed: int = 0) -> ImageDataset:
    """n images per split, 3 x size x size, whose class shows as a brighter red channel."""
    g = torch.Generator().manual_seed(seed)

    def split(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(count) % 10
        x = torch.randn(count, 3, size, size, generator=g)
        x[:, 0] += y.view(-1, 1, 1) / 3
        return x, y

    return ImageDataset("synthetic-cifar10", *split(n), *split(n // 2), *split(n // 2))


def test_full_batch_same_seed_same_loss_curve(cora, tmp_path):
    flags = dict(dataset="cora", model="gat", epochs=5, seed=3)
    first, second = train(cora, tmp_path, **flags), train(cora, tmp_path, **flags)
    assert len(first.loss_curve) == 5
    assert first.loss_curve == second.loss_curve  # exactly, not approximately
    assert first.test_score == second.test_score
    other = train(cora, tmp_path, **{**flags, "seed": 4})
    assert other.loss_curve != first.loss_curve
    assert first.per_worker_batches == [5] and len(first.step_times) == 5
    assert first.partition_time_s == 0.0
    assert first.loss_curve[-1] < first.loss_curve[0]


def test_cluster_gcn_same_seed_same_loss_curve(cora, tmp_path):
    flags = dict(dataset="cora", model="gcn", epochs=3, partitions=4, seed=1)
    first, second = train(cora, tmp_path, **flags), train(cora, tmp_path, **flags)
    assert first.loss_curve == second.loss_curve
    assert len(first.loss_curve) == 3  # one mean loss per epoch over its 4 mini-batches
    assert first.per_worker_batches == [12] and len(first.step_times) == 12
    assert first.partition_time_s > 0
    capped = train(cora, tmp_path, **flags, **{"max-steps": 2})
    assert capped.per_worker_batches == [6]
    other = train(cora, tmp_path, **{**flags, "seed": 2})
    assert other.loss_curve != first.loss_curve


def test_images_same_seed_same_loss_curve(tmp_path):
    ds = tiny_images()
    flags = dict(dataset="synthetic-cifar10", model="vig", hidden=8, layers=2, epochs=2)
    flags["batch-size"] = 8
    first, second = train(ds, tmp_path, **flags), train(ds, tmp_path, **flags)
    assert len(first.loss_curve) == 6  # image regime: one loss per mini-batch (24 / 8 x 2)
    assert first.loss_curve == second.loss_curve
    assert first.per_worker_batches == [6]
    assert len(first.test_step_times) == 2  # 12 test images in batches of 8
    assert 0.0 <= first.test_score <= 1.0 and 0.0 <= first.val_score <= 1.0
    other = train(ds, tmp_path, **{**flags, "seed": 5})
    assert other.loss_curve != first.loss_curve


def test_sequential_fits_a_tiny_graph(tmp_path):
    """GCN separates the two triangles of the 6-node graph: all four training nodes right."""
    ds = GraphDataset("cora", tiny_graph(), num_classes=2)
    out = train(ds, tmp_path, dataset="cora", model="gcn", epochs=100, dropout=0.0, lr=0.05)
    assert out.scores["train"] == 1.0
    assert out.loss_curve[-1] < 0.5 * out.loss_curve[0]
