"""Hybrid strategy: 2 copies x 2 stages (4 gloo processes) give the gradients of one sequential
step over the union of the copies' data, i.e. the same as all-reducing over that data: for the
built-in models and for a user's (PyG's GAT, cut by gnnpar.models.adapt)."""

from __future__ import annotations

import pytest

from gnnpar.cli import main
from tests.parallel.test_pipeline import config, run_ranks


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_hybrid_2x2_matches_allreduce_over_the_same_data(tmp_path):
    scenarios = [
        ("image", config("image", 2, 2, 4, "gpipe")),  # each copy: 12 of the 24 images
        ("graph", config("graph", 2, 2, 2, "gpipe")),  # each copy: 2 of the 4 micro-batches
        ("user:GATv2", config("graph", 2, 2, 2, "gpipe")),  # PyG's GAT(v2=True, jk="cat")
    ]
    for (kind, _), results in zip(scenarios, run_ranks(tmp_path, 4, scenarios)):
        lasts = [results[1], results[3]]  # ranks replica * 2 + stage: last stages are 1 and 3
        # the copies' micro-batch losses add up to the sequential loss over all their data
        assert sum(r["loss"] for r in lasts) == pytest.approx(lasts[0]["ref_loss"], abs=1e-5)
        assert results[0]["params"] == results[2]["params"]  # same stage, same parameters
        if kind == "image":  # equal halves: each copy's own mean averages to the global mean
            own = [r["own_loss"] for r in lasts]
            assert sum(own) / 2 == pytest.approx(lasts[0]["ref_loss"], abs=1e-5)


def test_replicas_times_stages_must_equal_workers(capsys, tmp_path):
    flags = ["train", "--dataset", "cora", "--strategy", "hybrid", "--replicas", "2"]
    flags += ["--stages", "2", "--workers", "3", "--quiet", "--out", str(tmp_path)]
    assert main(flags) == 2
    assert "2 replicas x 2 stages needs 4 ranks" in capsys.readouterr().err
