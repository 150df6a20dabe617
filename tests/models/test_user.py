"""A user's model in (gnnpar.models.user): flags, pyg:NAME's arguments, factories and their
checks, model.pt's recipe, gnnpar.fit's instances. One process, no subprocess (quick lane);
the runs of every strategy are in tests/e2e/test_user_models.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.datasets import KarateClub
from torch_geometric.nn import GATv2Conv, PNAConv
from torch_geometric.nn.models import GAT, GIN, PNA

from gnnpar import UsageError
from gnnpar.api import factory_name, instance_recipe
from gnnpar.cli import main
from gnnpar.config.schema import ModelConfig
from gnnpar.configure import build_config
from gnnpar.models import build_model
from gnnpar.models.user import build_user_model, degree_histogram, make, pyg_class, recipe
from gnnpar.result import read_model_file
from tests.models import user_models

HAND = "tests.models.user_models:build"


def karate():
    return KarateClub()[0]


def cfg_of(**flags):
    return build_config(None, {"dataset": "karate", "data_root": None, **flags})


# ------------------------------------------------------------------------------------ flags
def test_model_args_json_and_toml_table(tmp_path):
    cfg = cfg_of(model=HAND, model_args='{"hidden": 8, "K": 2}')
    assert cfg.model.args == {"hidden": 8, "K": 2}
    toml = tmp_path / "c.toml"
    toml.write_text(f'model = "{HAND}"\n[model-args]\nhidden = 4\n')
    assert build_config(str(toml), {}).model.args == {"hidden": 4}


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"model": HAND, "model_args": "{hidden: 8}"}, "must be a JSON object such as"),
        ({"model": HAND, "model_args": "[1, 2]"}, "must be a JSON object (or a TOML table)"),
        ({"model": HAND, "model_args": '{"1x": 2}'}, "is not a keyword-argument name"),
        ({"model": "gcn", "model_args": "{}"}, "--model-args is used by --model pyg:NAME, module"),
        ({"model": HAND, "hidden": "8"}, "--hidden is used by --model gcn"),
        ({"model": "pyg:GIN", "heads": "2"}, "--heads is used by --model gat, gat3, pyg:GAT only"),
        ({"model": HAND, "split_at": "lin1"}, "--split-at is used by --strategy pipeline, hybrid"),
        ({"model": "gat", "hops": "2", "strategy": "pipeline"}, "--hops is used by"),
        ({"model": HAND, "split_at": "convs.1,,convs.2", "strategy": "pipeline"}, "empty entry"),
        ({"model": HAND, "split_at": "convs.1,convs.1", "strategy": "pipeline"}, "twice"),
        ({"model": HAND, "split_at": "convs[1]", "strategy": "pipeline"}, "submodule names"),
        ({"model": HAND, "hops": "0", "strategy": "pipeline"}, "--hops must be between 1"),
        ({"model": "nosuchmodule_x:build"}, "no module named 'nosuchmodule_x'"),
        ({"model": "pyg:"}, "Unknown --model 'pyg:'"),
        ({"model": "my model"}, "pyg:NAME (a model of torch_geometric.nn.models) or module:"),
    ],
)
def test_bad_model_settings_are_usage_errors(flags, message):
    with pytest.raises(UsageError) as e:
        cfg_of(**flags)
    assert message in str(e.value)


def test_flags_a_user_model_reads_are_accepted():
    cfg = cfg_of(model="pyg:GAT", heads="4", hidden="16", layers="3", model_args='{"v2": true}')
    assert (cfg.model.heads, cfg.model.hidden, cfg.model.layers) == (4, 16, 3)
    cfg = cfg_of(model=HAND, strategy="pipeline", split_at="lin1,prop", hops="4")
    assert cfg.model.split_at == ["lin1", "prop"] and cfg.model.hops == 4


# --------------------------------------------------------------------------- pyg:NAME
def test_pyg_names_map_the_flags_onto_the_constructor():
    m = ModelConfig("pyg:GIN", hidden=32, layers=3, heads=1, dropout=0.25)
    rec = recipe(m, 34, 4)
    assert rec == {
        "target": "pyg:GIN",
        "call": "class",
        "kwargs": dict(
            in_channels=34, hidden_channels=32, num_layers=3, out_channels=4, dropout=0.25
        ),
    }
    gin = make(rec, 34, 4)
    assert isinstance(gin, GIN) and gin.num_layers == 3 and gin.out_channels == 4


def test_pyg_gat_takes_heads_and_model_args_win_over_flags():
    m = ModelConfig("pyg:GAT", hidden=16, layers=2, heads=4, dropout=0.0, args={"v2": True})
    gat = make(recipe(m, 34, 4), 34, 4)
    assert isinstance(gat, GAT) and isinstance(gat.convs[0], GATv2Conv) and gat.convs[0].heads == 4
    m.args = {"hidden_channels": 8}
    assert recipe(m, 34, 4)["kwargs"]["hidden_channels"] == 8


def test_pyg_pna_gets_the_degree_histogram_of_the_graph():
    data = karate()
    m = ModelConfig("pyg:PNA", hidden=16, layers=2, heads=1, dropout=0.0)
    rec = recipe(m, 34, 4, data)
    assert rec["kwargs"]["deg"] == PNAConv.get_degree_histogram([data]).tolist()
    assert rec["kwargs"]["deg"] == degree_histogram(data.edge_index, data.num_nodes)
    json.dumps(rec)  # plain values: model.pt keeps it as it is
    assert isinstance(make(rec, 34, 4), PNA)
    with pytest.raises(UsageError, match="needs the graph's degree histogram"):
        recipe(m, 34, 4)


def test_pyg_unknown_names_and_missing_arguments_say_what_to_do():
    with pytest.raises(UsageError, match="has no model 'Gin'.*GIN"):
        pyg_class("Gin")
    m = ModelConfig("pyg:LINKX", hidden=16, layers=2, heads=1, dropout=0.0)
    with pytest.raises(UsageError, match="pyg:LINKX needs num_nodes.*--model-args"):
        recipe(m, 34, 4)


# ---------------------------------------------------------------------- factories, checks
@pytest.mark.parametrize(
    "name, message",
    [
        ("raises", "raises(in_dim, num_classes, **model_args) raised ValueError: no such layer"),
        ("not_a_module", "not_a_module() returned a str, not a torch.nn.Module"),
        ("frozen", "has no trainable parameters"),
        ("wrong_width", "must return logits of shape [34, 4] (one row per node, one column"),
        ("broken", "calling it as model(x, edge_index) on the graph's first 34 nodes"),
        ("nothing_here", "has no function or class nothing_here"),
    ],
)
def test_malformed_models_are_usage_errors_naming_the_model(name, message):
    m = ModelConfig(f"tests.models.user_models:{name}", hidden=8, layers=2, heads=1, dropout=0.0)
    with pytest.raises(UsageError) as e:
        build_user_model(m, 34, 4, karate())
    assert f"--model tests.models.user_models:{name}" in str(e.value)
    assert message in str(e.value)


def test_a_factory_module_that_fails_to_import_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "badimport_u20.py").write_text("import torch\nraise RuntimeError('oops')\n")
    m = ModelConfig("badimport_u20:build", hidden=8, layers=2, heads=1, dropout=0.0)
    with pytest.raises(UsageError, match="importing badimport_u20 failed: RuntimeError: oops"):
        build_user_model(m, 34, 4)


def test_recipes_call_only_model_code():
    for target in ("shutil:rmtree", "os:system", "torch:save"):
        with pytest.raises(UsageError, match="is no model factory"):
            make({"target": target, "call": "factory", "kwargs": {}}, 3, 2)
    with pytest.raises(UsageError, match="is not a torch.nn.Module class"):
        make({"target": "subprocess:Popen", "call": "class", "kwargs": {"args": "true"}}, 3, 2)


def test_build_model_wraps_the_module_and_shares_its_parameters():
    m = ModelConfig(HAND, hidden=8, layers=2, heads=1, dropout=0.0, args={"hidden": 8})
    data = karate()
    torch.manual_seed(0)
    bm = build_model(m, 34, 4, graph=data)
    module = bm.user_module
    assert isinstance(module, user_models.LinearAPPNP) and module.hidden == 8
    assert {id(p) for p in bm.parameters()} == {id(p) for p in module.parameters()}
    torch.testing.assert_close(bm(data.x, data.edge_index), module(data.x, data.edge_index))


# ----------------------------------------------------------------------- gnnpar.fit's inputs
def test_instances_are_rebuilt_from_their_class_and_attributes():
    target, kwargs = instance_recipe(GIN(34, 16, 2, 4))
    assert target == "torch_geometric.nn.models.basic_gnn:GIN"
    assert kwargs["hidden_channels"] == 16 and kwargs["out_channels"] == 4
    target, kwargs = instance_recipe(GAT(34, 16, 2, 4, v2=True, heads=2))
    assert kwargs["v2"] is True and kwargs["heads"] == 2
    target, kwargs = instance_recipe(user_models.LinearAPPNP(34, 4, hidden=8, K=2))
    assert target == "tests.models.user_models:LinearAPPNP"
    assert kwargs == {"in_dim": 34, "num_classes": 4, "hidden": 8, "K": 2}


def test_instances_that_cannot_be_rebuilt_say_so():
    with pytest.raises(UsageError, match="cannot tell which in_dim, num_classes built it"):
        instance_recipe(user_models.Broken(34, 4))
    gin = GIN(34, 16, 2, 4, act="elu")  # kept as a module, not by its name: rebuilt with relu
    with pytest.raises(UsageError, match="is not the same model"):
        instance_recipe(gin)


def test_factories_go_by_module_and_name():
    assert factory_name(user_models.build, 2) == HAND
    with pytest.raises(UsageError, match="at the top level of a module"):
        factory_name(lambda i, c: user_models.build(i, c), 1)


# --------------------------------------------------------------- model.pt, predict, load
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One sequential run of the hand-written model, in this process."""
    out = tmp_path_factory.mktemp("user-run")
    args = ["train", "--dataset", "karate", "--model", HAND, "--model-args", '{"hidden": 8}']
    args += ["--epochs", "2", "--quiet", "--threads", "1", "--out", str(out / "run")]
    assert main(args) == 0
    return out / "run"


def test_model_pt_records_the_recipe_and_the_users_own_weights(trained):
    payload = read_model_file(trained)
    assert payload["user_model"]["target"] == HAND
    assert payload["user_model"]["kwargs"] == {"hidden": 8}
    assert payload["user_model"]["class"] == "tests.models.user_models.LinearAPPNP"
    assert set(payload["state_dict"]) == {"lin1.weight", "lin1.bias", "lin2.weight", "lin2.bias"}
    result = json.loads((trained / "result.json").read_text())
    assert result["user_model"]["parameters"] == 34 * 8 + 8 + 8 * 4 + 4
    import gnnpar

    model = gnnpar.load(trained)
    assert isinstance(model, user_models.LinearAPPNP) and not model.training


def test_a_factory_that_cannot_be_imported_at_load_time_exits_2(trained, tmp_path, capsys):
    payload = torch.load(trained / "model.pt", weights_only=True)
    payload["user_model"]["target"] = "gone_module_u20:build"
    (tmp_path / "run").mkdir()
    torch.save(payload, tmp_path / "run" / "model.pt")
    assert main(["predict", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--model gone_module_u20:build: no module named 'gone_module_u20'" in err
    assert "Traceback" not in err


# ------------------------------------------------ checkpoints, --resume, bf16 (one process)
def _train(out, *flags: str) -> dict:
    args = ["train", "--dataset", "karate", "--model", "pyg:GIN", "--hidden", "8", "--quiet"]
    assert main([*args, "--threads", "1", "--out", str(out), *flags]) == 0
    return json.loads((out / "result.json").read_text())


def test_a_resumed_user_model_run_equals_an_uninterrupted_one(tmp_path):
    flags = ["--partitions", "2", "--checkpoint-every", "1"]
    whole = _train(tmp_path / "whole", *flags, "--epochs", "3")
    _train(tmp_path / "cut", *flags, "--epochs", "2")
    resumed = _train(tmp_path / "cut", *flags, "--epochs", "3", "--resume")
    assert resumed["resumed_from"].endswith("epoch-000001-step-00000000")
    assert resumed["loss_curve"] == whole["loss_curve"]
    a, b = (read_model_file(tmp_path / d)["state_dict"] for d in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_user_model_scores_are_reproduced_by_predict(tmp_path):
    from gnnpar.predict import predict

    result = _train(tmp_path / "bf16", "--precision", "bf16", "--epochs", "2")
    got = predict(str(tmp_path / "bf16"))
    assert got["scores"]["test"] == pytest.approx(result["test_score"], abs=1e-6)


def test_fit_trains_an_instance_in_place_and_records_how_to_rebuild_it(tmp_path):
    import gnnpar

    model = user_models.LinearAPPNP(34, 4, hidden=8, K=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = gnnpar.fit(
        karate(), model=model, epochs=2, quiet=True, threads=1,
        data_root=str(tmp_path / "data"), out=str(tmp_path / "run"),
    )  # fmt: skip
    assert run.model is model and not model.training
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    rec = run.result["user_model"]
    assert rec["target"] == "tests.models.user_models:LinearAPPNP" and rec["call"] == "class"
    assert rec["kwargs"] == {"in_dim": 34, "num_classes": 4, "hidden": 8, "K": 2}
    again = gnnpar.load(run.out)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=0, atol=0)
