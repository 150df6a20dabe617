"""Scores, losses, timing statistics and result.json, checked on hand-computed examples."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gnnpar.result import REQUIRED_KEYS, write_result
from gnnpar.training.losses import loss_fn
from gnnpar.training.metrics import score, score_name, summarize


def test_accuracy_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.5, 0.0, 2.0], [1.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 1, 2])  # right, right, wrong, wrong
    assert score(logits, y, multilabel=False) == 0.5
    assert score_name(False) == "accuracy" and score_name(True) == "micro_f1"


def test_micro_f1_by_hand():
    # logit > 0 is a predicted positive.
    logits = torch.tensor([[1.0, -1.0, 2.0], [-0.5, 0.3, -2.0]])
    y = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    # tp: (0,0), (1,1) = 2; fp: (0,2) = 1; fn: (0,1) = 1 -> F1 = 2*2 / (2*2 + 1 + 1) = 2/3
    assert score(logits, y, multilabel=True) == pytest.approx(2 / 3)
    assert score(torch.tensor([[-1.0, -1.0]]), torch.tensor([[0.0, 0.0]]), True) == 1.0
    assert score(torch.tensor([[1.0]]), torch.tensor([[0.0]]), True) == 0.0


def test_empty_selection_scores_zero():
    assert score(torch.empty(0, 3), torch.empty(0, dtype=torch.long), False) == 0.0


def test_losses_are_cross_entropy_and_bce_with_logits():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 0])
    expected = -(math.log(math.e**2 / (math.e**2 + 1)) + math.log(1 / (1 + math.e))) / 2
    assert loss_fn(logits, y, False).item() == pytest.approx(expected, rel=1e-6)
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    sig = torch.sigmoid(logits)
    bce = -(targets * sig.log() + (1 - targets) * (1 - sig).log()).mean()
    assert loss_fn(logits, targets, True).item() == pytest.approx(bce.item(), rel=1e-6)


def test_summarize_by_hand():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert s == {
        "mean": 2.5,
        "std": pytest.approx(math.sqrt(1.25)),  # population std, as the studies' tables
        "min": 1.0,
        "max": 4.0,
        "median": 2.5,
        "count": 4,
    }
    assert summarize([0.5])["std"] == 0.0 and summarize([0.5])["median"] == 0.5
    assert summarize([]) == dict(mean=0.0, std=0.0, min=0.0, max=0.0, median=0.0, count=0)


def test_write_result_requires_every_contract_key(tmp_path):
    result = {k: 0 for k in REQUIRED_KEYS} | {"loss_curve": torch.tensor([1.0, 0.5])}
    path = write_result(result, tmp_path / "out")
    written = json.loads(path.read_text())
    assert written["loss_curve"] == [1.0, 0.5] and set(written) == set(REQUIRED_KEYS)
    del result["machine"]
    with pytest.raises(RuntimeError, match="machine"):
        write_result(result, tmp_path / "bad")


def test_accuracy_is_the_count_over_the_total_exactly():
    """405 right of 500 is 0.81 itself, not float32's mean (on CUDA one unit off the CPU's, so
    `gnnpar predict` on the CPU did not reproduce a GPU run's score)."""
    y = torch.zeros(500, dtype=torch.long)
    logits = torch.zeros(500, 2)
    logits[405:, 1] = 1.0
    assert score(logits, y, multilabel=False) == 0.81
