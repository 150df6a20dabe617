"""Your model in, cut into a pipeline (issue 20): PyG's GIN and GAT(v2=True) and a hand-written
model (two linear layers around an APPNP propagation, tests/models/user_models.py) each train
with 2 pipeline stages over exact micro-batches on Cora (2 gloo ranks), and model.pt reloads
and predicts the run's test score. A model gnnpar cannot cut exits 2 saying how to make it
splittable (tests/e2e/test_hostile_input.py has the rows for flags; these need ranks)."""

from __future__ import annotations

import json

import pytest

from gnnpar.cli import main
from gnnpar.predict import predict

PIPE = ["--dataset", "cora", "--strategy", "pipeline", "--workers", "2", "--chunks", "2"]
PIPE += ["--epochs", "2", "--threads", "1", "--quiet", "--eval-every", "0"]
MODELS = {  # name: (flags, how it is cut, hops, where the hops came from)
    "GIN": (["--model", "pyg:GIN", "--hidden", "16", "--layers", "2"], "GIN", 2, "counted"),
    "GATv2": (
        ["--model", "pyg:GAT", "--model-args", '{"v2": true}', "--hidden", "16", "--heads", "2"],
        "GAT",
        2,
        "counted",
    ),
    "APPNP": (  # K=4 propagations + 1 (gcn normalisation); --hops given to say so
        ["--model", "tests.models.user_models:build", "--split-at", "prop", "--hops", "5"],
        "--split-at prop",
        5,
        "--hops",
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three trainings, once (the fork server warmed by the first serves the others)."""
    out = {}
    for name, (flags, *_) in MODELS.items():
        folder = tmp_path_factory.mktemp(name)
        code = main(["train", *PIPE, *flags, "--out", str(folder)])
        out[name] = (code, folder)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(MODELS))
def test_a_users_model_trains_in_two_stages_and_predicts_its_test_score(runs, name):
    code, folder = runs[name]
    assert code == 0
    result = json.loads((folder / "result.json").read_text())
    _, cut, hops, source = MODELS[name]
    assert result["stages"] == 2 and result["microbatch"] == "exact"
    assert result["model_cut"].startswith(cut) and result["batch_statistics"] == []
    assert result["hops"] == hops and result["hops_source"].startswith(source)
    assert result["plan_train"]["hops"] == hops and len(result["loss_curve"]) == 2
    assert result["user_model"]["target"]  # model.pt's recipe (gnnpar.models.user)
    # full-graph inference of the rebuilt module: exact micro-batches scored the same nodes
    # with the same weights, so the same argmax (fp32 rounding aside)
    assert predict(str(folder))["scores"]["test"] == pytest.approx(result["test_score"], abs=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_model_that_cannot_be_cut_exits_2_saying_how(runs, tmp_path, capsys):
    """Found in the ranks (the model is built there, on the loaded graph): the launcher's one
    message, exit 2. After the trainings above, whose fork server it reuses."""
    flags = ["--model", "tests.models.user_models:build", "--out", str(tmp_path)]
    capsys.readouterr()
    assert main(["train", *PIPE, *flags]) == 2
    err = capsys.readouterr().err
    assert "cannot cut the model LinearAPPNP" in err and "--split-at" in err
    assert "Traceback" not in err and err.count("gnnpar: error:") == 1
    assert not (tmp_path / "result.json").exists()
