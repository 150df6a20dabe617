"""Config: TOML with the same keys as the flags, flags win, study defaults, one-line errors,
and no setting the user gives is silently ignored."""

from __future__ import annotations

import math
import subprocess
import sys
import typing

import pytest

from gnnpar import UsageError
from gnnpar.config.parse import FIELD_TYPES, KEYS, coerce, parse_int_list, parse_slowdown
from gnnpar.config.schema import Config
from gnnpar.configure import build_config, resolve, used_by
from gnnpar.models.presets import study_defaults


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_toml_accepts_flag_names_with_dashes_underscores_and_sections(tmp_path):
    toml = write(
        tmp_path,
        'dataset = "citeseer"\nsync-every = 5\nweight_decay = 0.001\nslowdown = "1=3"\n'
        '[data]\npartitions = 8\n[model]\nname = "gcn"\nhidden = 32\n'
        '[strategy]\nname = "allreduce"\ntimeout_s = 30\n',
    )
    cfg = build_config(toml, {})
    assert cfg.data.dataset == "citeseer" and cfg.data.partitions == 8
    assert cfg.strategy.sync_every == 5 and cfg.optim.weight_decay == 0.001
    assert cfg.strategy.slowdown == {1: 3.0}
    assert cfg.model.name == "gcn" and cfg.model.hidden == 32
    assert cfg.strategy.timeout_s == 30.0


# A value of the right type for every key, as TOML text.
TOML_VALUES = {
    "precision": '"bf16"',
    "eval-mode": '"layerwise"',
    "seeds": '"local"',
    "dataset": '"cora"',
    "data-root": '"/tmp/gnnpar-test-data"',
    "scale": "0.5",
    "partitioner": '"metis"',
    "model": '"gat"',
    "dropout": "0.1",
    "strategy": '"sequential"',
    "average": '"params"',
    "slowdown": '"0=2"',
    "jitter": "0.1",
    "balance": "[1, 1]",
    "microbatch": '"index"',
    "schedule": '"1f1b"',
    "fanouts": "[5, 5]",
    "timeout": "30.0",
    "optimizer": '"sgd"',
    "lr": "0.1",
    "weight-decay": "0.0",
    "out": '"/tmp/gnnpar-test-out"',
    "quiet": "true",
    "tensorboard": "true",
    "resume": "false",
    "recompute": "true",
    "model-args": "{ hidden_channels = 8, v2 = true }",
    "split-at": '["convs.1"]',
    "hops": "3",
}
# a --model of each kind (validate.model_kind) that config checks accept
MODEL_OF_KIND = {"pyg": "pyg:GIN", "pyg:GAT": "pyg:GAT", "factory": "torch_geometric.nn:GIN"}


def context_for(key: str) -> dict[str, str]:
    """Settings of a run that reads ``key`` (the first Use in used_by()), as TOML text."""
    uses = used_by().get(key)
    if not uses:
        return {}
    use = uses[0]
    strategy = use.strategies[0] if use.strategies else "sequential"
    model = MODEL_OF_KIND.get(use.models[0], use.models[0])
    ctx = {"strategy": f'"{strategy}"', "model": f'"{model}"'}
    if "graph" not in use.kinds:
        ctx.update(dataset='"synthetic-cifar10"', model='"vig"')
    elif use.generated:
        ctx["dataset"] = '"synthetic-reddit"'
    if use.needs:
        ctx[use.needs] = "2"
    return ctx


@pytest.mark.parametrize("key", list(KEYS))
def test_every_flag_is_a_toml_key_that_a_run_using_it_accepts(tmp_path, key):
    """The flags and the TOML keys come from one table, so each flag name works in a file."""
    settings = {**context_for(key), key: TOML_VALUES.get(key, "2")}
    text = "\n".join(f"{k} = {v}" for k, v in settings.items())
    cfg = build_config(write(tmp_path, text), {})
    value = getattr(getattr(cfg, KEYS[key].section), KEYS[key].name)
    assert value == coerce(key, _toml_value(settings[key]))


def _toml_value(text: str):
    import tomllib

    return tomllib.loads(f"v = {text}")["v"]


def test_the_flag_table_covers_every_key_and_names_known_choices():
    from gnnpar.configure import MODELS, USER_KINDS, common_keys
    from gnnpar.strategies import registry

    USED_BY = used_by()
    assert set(USED_BY) <= set(KEYS)
    assert set(common_keys()) == {
        "dataset", "data-root", "model", "strategy", "workers",
        "optimizer", "lr", "weight-decay", "epochs", "seed", "out", "quiet", "eval-every",
        "max-steps", "threads", "timeout", "tensorboard", "checkpoint-every", "resume",
        "max-restarts", "precision",
    }  # fmt: skip
    for uses in USED_BY.values():
        for use in uses:
            assert set(use.strategies or ()) <= set(registry.names())
            assert set(use.models) <= set(MODELS) | set(USER_KINDS)
    assert USED_BY["fanouts"][0].strategies == ("sampled",)
    assert USED_BY["replicas"][0].strategies == ("hybrid",)
    assert set(USED_BY["slowdown"][0].strategies) == {
        "allreduce", "gossip", "gossip-bipartite", "sampled",
    }  # fmt: skip


def test_flags_win_over_the_file(tmp_path):
    toml = write(tmp_path, 'model = "gcn"\nepochs = 9\nlr = 0.5\n')
    cfg = build_config(toml, {"epochs": "3", "lr": None})  # None: flag not given
    assert cfg.run.epochs == 3 and cfg.optim.lr == 0.5 and cfg.model.name == "gcn"


def test_study_defaults_fill_unset_settings():
    gat = build_config(None, {"model": "gat"})
    assert (gat.model.hidden, gat.model.heads, gat.model.layers, gat.model.dropout) == (
        8,
        8,
        2,
        0.6,
    )
    assert (gat.optim.lr, gat.optim.weight_decay, gat.run.epochs) == (0.005, 5e-4, 300)
    gat3 = build_config(None, {"model": "gat3"})
    assert (gat3.model.hidden, gat3.model.heads, gat3.model.layers) == (16, 1, 3)
    assert gat3.model.dropout == 0.6 and gat3.optim.lr == 5e-3
    sage = build_config(None, {"model": "sage"})
    assert (sage.model.hidden, sage.model.layers, sage.model.dropout) == (256, 3, 0.5)
    reddit = build_config(None, {"model": "sage", "dataset": "synthetic-reddit"})
    assert (reddit.model.hidden, reddit.model.dropout, reddit.optim.lr) == (128, 0.2, 1e-2)
    amazon = build_config(None, {"model": "sage", "dataset": "synthetic-amazon"})
    assert (amazon.model.hidden, amazon.model.dropout) == (512, 0.1)
    sampled = build_config(
        None, {"model": "sage", "dataset": "synthetic-reddit", "strategy": "sampled"}
    )  # study 002's table 1, not study 003's
    assert (sampled.model.hidden, sampled.optim.lr, sampled.strategy.fanouts) == (
        256,
        5e-3,
        [25, 10, 10],
    )
    gcn = build_config(None, {"model": "gcn", "dataset": "amazon"})
    assert (gcn.model.hidden, gcn.model.layers, gcn.run.epochs) == (512, 3, 30)
    vig = build_config(None, {"model": "vig", "dataset": "synthetic-cifar10"})
    assert (vig.model.hidden, vig.model.layers, vig.strategy.batch_size) == (107, 8, 32)
    assert build_config(None, {"model": "gat", "hidden": "4"}).model.hidden == 4


def test_presets_are_plain_data_and_resolve_takes_them():
    assert study_defaults("gat", "cora") == dict(
        hidden=8, layers=2, heads=8, dropout=0.6, lr=0.005, weight_decay=5e-4, epochs=300
    )
    assert study_defaults("sage", "reddit", sampled=False)["hidden"] == 128
    assert study_defaults("sage", "reddit", sampled=True)["hidden"] == 256
    cfg = Config()
    cfg.model.name, cfg.data.dataset = "gcn", "synthetic-reddit"
    resolve(cfg)
    d = study_defaults("gcn", "synthetic-reddit")
    assert (cfg.model.hidden, cfg.model.layers, cfg.model.dropout) == (
        d["hidden"],
        d["layers"],
        d["dropout"],
    )
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.run.epochs) == (
        d["lr"],
        d["weight_decay"],
        d["epochs"],
    )


@pytest.mark.parametrize(
    "strategy,flags,average",
    [
        ("sequential", {}, None),
        ("pipeline", {}, None),
        ("hybrid", {}, None),
        ("sampled", {}, None),
        ("allreduce", {}, "grads"),  # K = 1: synchronous data parallelism, DDP's maths
        ("allreduce", {"sync-every": "5"}, "params"),
        ("gossip", {}, "params"),
        ("gossip", {"sync-every": "20"}, "params"),
        ("gossip-bipartite", {}, "params"),
        ("gossip", {"average": "grads"}, "grads"),  # the user's choice stays
        ("allreduce", {"average": "grads", "sync-every": "5"}, "grads"),
    ],
)
def test_average_defaults_to_what_trains_best(strategy, flags, average):
    cfg = build_config(None, {"model": "gcn", "strategy": strategy, **flags})
    assert cfg.strategy.average == average


def test_unknown_key_message_names_key_source_and_suggestion(tmp_path):
    with pytest.raises(
        UsageError, match=r"Unknown setting 'sync_evry' in config file .*sync-every"
    ):
        build_config(write(tmp_path, "sync_evry = 2\n"), {})


def test_bad_toml_and_bad_types_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not valid TOML"):
        build_config(write(tmp_path, "epochs = = 3\n"), {})
    with pytest.raises(UsageError, match="'quiet' must be true or false"):
        build_config(write(tmp_path, 'quiet = "yes"\n'), {})
    with pytest.raises(UsageError, match="'epochs' must be an integer, got 2.5"):
        build_config(write(tmp_path, "epochs = 2.5\n"), {})
    with pytest.raises(UsageError, match="'lr' must be a number, got 'fast'"):
        build_config(None, {"lr": "fast"})
    with pytest.raises(UsageError, match="'model' must be a string"):
        build_config(write(tmp_path, 'model = ["gat"]\n'), {})


# ---------------------------------------------------------------- settings a run would ignore
@pytest.mark.parametrize(
    "flags,message",
    [
        (
            {"fanouts": "10,10"},
            "--fanouts is used by --strategy sampled only; --strategy sequential would ignore "
            "it. Drop it, or choose a strategy that uses it.",
        ),
        (
            {"strategy": "pipeline", "slowdown": "1=3"},
            "--slowdown is used by --strategy allreduce, gossip, gossip-bipartite, sampled only; "
            "--strategy pipeline would ignore it",
        ),
        ({"scale": "0.5"}, "--scale is used by synthetic-* datasets only; --dataset cora"),
        (
            {"model": "gcn", "heads": "4"},
            "--heads is used by --model gat, gat3, pyg:GAT only; --model gcn",
        ),
        ({"model": "sage", "heads": "1"}, "choose a model that uses it"),
        ({"strategy": "pipeline", "replicas": "2"}, "--replicas is used by --strategy hybrid"),
        ({"strategy": "sampled", "sync-every": "2"}, "--sync-every is used by --strategy allred"),
        ({"strategy": "sequential", "average": "params"}, "--average is used by"),
        ({"strategy": "allreduce", "loader-workers": "2"}, "--loader-workers is used by"),
        ({"strategy": "gossip", "chunks": "4"}, "--chunks is used by --strategy pipeline, hybr"),
        ({"strategy": "sampled", "model": "sage", "partitions": "4"}, "--partitions is used by"),
        (  # sequential reads --batch-size for images only: the dataset is what to change
            {"batch-size": "64"},
            "--dataset cora (a graph dataset) would ignore it. Drop it, or choose a dataset",
        ),
        (
            {"dataset": "synthetic-cifar10", "model": "vig", "partitions": "4"},
            "--dataset synthetic-cifar10 (an image dataset) would ignore it",
        ),
        (
            {"strategy": "pipeline", "dataset": "synthetic-cifar10", "model": "vig"}
            | {"microbatch": "index"},
            "--microbatch is used by --strategy pipeline, hybrid with a graph dataset only",
        ),
        ({"partitioner": "metis"}, "--partitioner is only read together with --partitions"),
        (  # a pipeline scores its own micro-batches
            {"strategy": "pipeline", "eval-mode": "layerwise"},
            "--eval-mode is used by --strategy sequential, allreduce, gossip, gossip-bipartite, "
            "sampled with a graph dataset only",
        ),
    ],
)
def test_a_setting_the_run_would_ignore_is_a_usage_error(flags, message):
    with pytest.raises(UsageError) as e:
        build_config(None, flags)
    assert message in str(e.value)


def test_a_foreign_key_in_a_toml_file_names_the_key_and_the_file(tmp_path):
    toml = write(tmp_path, 'strategy = "pipeline"\njitter = 0.5\n')
    with pytest.raises(UsageError) as e:
        build_config(toml, {})
    assert f"--jitter (set in config file {toml}) is used by --strategy allreduce" in str(e.value)
    # the same key is fine once the flags choose a strategy that reads it
    assert build_config(toml, {"strategy": "gossip"}).strategy.jitter == 0.5


def test_defaults_and_flags_not_given_are_never_foreign():
    cfg = build_config(None, {"fanouts": None, "scale": None, "heads": None})  # None: not given
    assert cfg.strategy.batch_size == 1024 and cfg.strategy.fanouts is None  # filled, not given
    sampled = build_config(None, {"strategy": "sampled", "model": "sage"})
    assert sampled.strategy.fanouts == [25, 10, 10] and sampled.strategy.average is None
    # settings every run reads are accepted with every strategy
    for strategy in ("sequential", "allreduce", "gossip", "pipeline", "hybrid", "sampled"):
        flags = {"strategy": strategy, "model": "gcn", "seed": "3", "timeout": "9"}
        flags.update({"max-steps": "2", "eval-every": "0", "threads": "1", "workers": "2"})
        assert build_config(None, flags).run.max_steps == 2


@pytest.mark.parametrize(
    "flags,message",
    [
        ({"epochs": "0"}, "--epochs must be at least 1"),
        ({"dropout": "1.5"}, r"--dropout must be in \[0, 1\)"),
        ({"dropout": "-0.1"}, r"--dropout must be in \[0, 1\)"),
        ({"dataset": "synthetic-reddit", "scale": "2"}, r"--scale must be in \(0, 1\]"),
        ({"dataset": "synthetic-reddit", "scale": "0"}, r"--scale must be in \(0, 1\]"),
        ({"heads": "0"}, "--heads must be at least 1"),
        ({"workers": "0"}, "--workers must be at least 1"),
        ({"strategy": "allreduce", "jitter": "-1"}, "--jitter must be >= 0"),
        ({"strategy": "sampled", "batch-size": "0"}, "--batch-size must be at least 1"),
        ({"strategy": "pipeline", "balance": "2,0"}, "--balance entries must each be at least 1"),
        ({"strategy": "sampled", "fanouts": "10,0"}, "--fanouts entries must be positive, or -1"),
        ({"strategy": "gossip", "slowdown": "1=0.5"}, "factors >= 1"),
        ({"partitions": "4", "partitioner": "kmeans"}, "Unknown --partitioner 'kmeans'"),
        ({"strategy": "allreduce", "average": "weights"}, "Unknown --average"),
        ({"optimizer": "lamb"}, "Unknown --optimizer 'lamb'"),
        ({"seed": "-1"}, "--seed must be between 0 and 4294967295"),
        ({"seed": str(2**40)}, "--seed must be between 0 and 4294967295"),
        ({"eval-mode": "exact"}, "Unknown --eval-mode 'exact'. Choose one of: auto, layerwise"),
        (  # only sampled training has fan-outs to evaluate with
            {"strategy": "allreduce", "eval-mode": "sampled"},
            "--eval-mode sampled samples with the fan-outs of sampled training; --strategy "
            "allreduce has none",
        ),
    ],
)
def test_impossible_values_are_usage_errors(flags, message):
    with pytest.raises(UsageError, match=message):
        build_config(None, flags)


def test_every_flag_says_what_it_means_in_the_one_table():
    """The flag's help is its row of KEYS (beside the field it sets), and `gnnpar train --help`
    shows it."""
    from gnnpar.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    shown = {a.option_strings[0][2:]: a.help for a in train._actions if a.option_strings}
    for key, k in KEYS.items():
        assert k.help and len(k.help) > 10, key
        if key != "strategy":  # its help lists the registered strategies instead
            assert shown[key].startswith(k.help), key


# ---------------------------------------------------------------- type coercion
def test_every_field_type_is_coerced_from_the_dataclass_fields():
    assert set(FIELD_TYPES) == set(KEYS)
    assert FIELD_TYPES["lr"] == float | None and FIELD_TYPES["seed"] is int
    assert FIELD_TYPES["fanouts"] == list[int] | None
    assert FIELD_TYPES["slowdown"] == dict[int, float]
    samples = {int: "3", float: "0.25", str: "x", bool: True}
    for key, kind in FIELD_TYPES.items():
        base = kind
        if isinstance(kind, type(int | None)):
            (base,) = [a for a in typing.get_args(kind) if a is not type(None)]
        origin = typing.get_origin(base)
        if base == list[str]:  # --split-at
            assert coerce(key, "convs.1, convs.2") == ["convs.1", "convs.2"]
            assert coerce(key, ["a.b"]) == ["a.b"]  # a TOML list
        elif origin is list:
            assert coerce(key, "4, 5") == [4, 5] and coerce(key, [1, 2]) == [1, 2]
        elif base == dict[str, typing.Any]:  # --model-args: JSON or a TOML table
            assert coerce(key, '{"hidden": 4, "v2": true}') == {"hidden": 4, "v2": True}
            assert coerce(key, {"jk": "cat"}) == {"jk": "cat"}
        elif origin is dict:
            assert coerce(key, "1=3,0=1.5") == {1: 3.0, 0: 1.5}
            assert coerce(key, {"2": 4}) == {2: 4.0}  # a TOML table
        else:
            value = coerce(key, samples[base])
            assert type(value) is base, key
        assert coerce(key, None) is None


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("epochs", 3.0, 3),  # an integral TOML float is an integer
        ("epochs", " 7", 7),
        ("lr", 1, 1.0),  # a TOML integer for a float setting
        ("lr", "1e-3", 1e-3),
        ("hidden", "-2", -2),  # validate() says what is wrong with it, coerce only types
        ("quiet", False, False),
        ("out", 5, "5"),
        ("seed", 2**63 - 1, 2**63 - 1),
    ],
)
def test_coercion_accepts(key, value, expected):
    got = coerce(key, value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("epochs", "three", "'epochs' must be an integer, got 'three'."),
        ("epochs", True, "'epochs' must be an integer, got True."),
        ("epochs", 2.5, "'epochs' must be an integer, got 2.5."),
        ("lr", "x", "'lr' must be a number, got 'x'."),
        ("lr", False, "'lr' must be a number, got False."),
        ("quiet", "yes", "'quiet' must be true or false, got 'yes'."),
        ("quiet", 1, "'quiet' must be true or false, got 1."),
        ("dataset", {"a": 1}, "'dataset' must be a string, got {'a': 1}."),
    ],
)
def test_coercion_rejects_with_the_old_messages(key, value, message):
    with pytest.raises(UsageError) as e:
        coerce(key, value)
    assert str(e.value) == message


@pytest.mark.parametrize("key", [k for k, t in FIELD_TYPES.items() if t in (float, float | None)])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", math.nan, math.inf, "1e999", 10**400])
def test_every_float_setting_rejects_non_finite_values(key, value):
    with pytest.raises(UsageError, match=f"'{key}' must be a finite number"):
        coerce(key, value)


@pytest.mark.parametrize("key", [k for k, t in FIELD_TYPES.items() if t in (int, int | None)])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, "9" * 30, "9" * 5000, 1e300])
def test_every_integer_setting_rejects_values_beyond_64_bits(key, value):
    with pytest.raises(UsageError, match=f"'{key}' must fit in 64 bits") as e:
        coerce(key, value)
    assert len(str(e.value)) < 200  # a 5000-digit number is cut short


def test_non_finite_and_huge_values_from_a_toml_file(tmp_path):
    with pytest.raises(UsageError, match="'lr' must be a finite number, got nan"):
        build_config(write(tmp_path, "lr = nan\n"), {})
    with pytest.raises(UsageError, match="'timeout' must be a finite number, got inf"):
        build_config(write(tmp_path, "timeout = inf\n"), {})
    with pytest.raises(UsageError, match="'seed' must fit in 64 bits"):
        build_config(write(tmp_path, "seed = 123456789012345678901234567890\n"), {})
    with pytest.raises(UsageError, match="--slowdown expects RANK=FACTOR"):
        build_config(write(tmp_path, 'strategy = "gossip"\nslowdown = {1 = nan}\n'), {})


def test_a_config_built_in_python_is_checked_for_non_finite_values_too():
    from gnnpar.configure import validate

    cfg = Config()
    cfg.strategy.jitter = math.nan  # nan < 0 is False: a range check alone lets it through
    resolve(cfg)
    with pytest.raises(UsageError, match="--jitter must be a finite number"):
        validate(cfg)


def test_list_and_slowdown_syntax():
    assert parse_int_list("25, 10,10", "fanouts") == [25, 10, 10]
    assert parse_int_list([4, 4], "balance") == [4, 4]
    assert parse_int_list("-1,5", "fanouts") == [-1, 5]
    with pytest.raises(UsageError, match="--balance expects comma-separated integers"):
        parse_int_list("4;4", "balance")
    with pytest.raises(UsageError, match="'fanouts' must fit in 64 bits"):
        parse_int_list(f"5,{2**64}", "fanouts")
    assert parse_slowdown("1=3,2=1.5") == {1: 3.0, 2: 1.5}
    assert parse_slowdown({"0": 2}) == {0: 2.0}
    for bad in ("1:3", "x=2", "1=", "=2", "1=nan", "1=inf"):
        with pytest.raises(UsageError, match="--slowdown expects RANK=FACTOR"):
            parse_slowdown(bad)


# ---------------------------------------------------------------- imports
@pytest.mark.slow
def test_config_the_strategy_specs_and_presets_import_no_torch():
    """Checking a config reads the strategies' specs and the dataset names, never torch (nor
    a strategy's build, which imports it when a rank runs it)."""
    code = (
        "import sys\n"
        "import gnnpar.config, gnnpar.models, gnnpar.models.presets\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from gnnpar.configure import build_config\n"
        "from gnnpar.cli import build_parser\n"
        "build_parser().format_help()\n"
        "build_config(None, {'strategy': 'allreduce', 'model': 'gcn', 'partitions': '4'})\n"
        "build_config(None, {'strategy': 'pipeline', 'dataset': 'synthetic-cifar10',"
        " 'model': 'vig', 'batch-size': '8'})\n"
        "assert 'torch' not in sys.modules, 'torch imported by build_config'\n"
        "assert 'gnnpar.training.loop' not in sys.modules, 'a build imported'\n"
        "from gnnpar.models import MODELS, BlockModel, build_model\n"
        "assert set(MODELS) == {'gcn', 'gat', 'gat3', 'sage', 'vig'}\n"
        "assert BlockModel.__name__ == 'BlockModel'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_bench_suite_run_gives_only_settings_its_run_reads():
    """The suites keep their studies' settings explicitly (--average above all, whose default
    changed) and pass nothing their strategy would ignore."""
    import importlib

    def suite(name):
        return importlib.import_module(f"gnnpar.bench.{name}")

    plans = []
    for quick in (True, False):
        plans += suite("tour").tour_runs(quick)
        data, intervals, _ = suite("gossip_vs_allreduce").grid(quick)
        for d in data:
            plans += suite("gossip_vs_allreduce").runs_for(d, intervals)
        plans += suite("sampled_ddp").grid(quick)[1]
        plans += suite("vig_pipeline").runs(quick, "/nonexistent")
    for dataset in ("cora", "citeseer", "pubmed"):
        plans += suite("gat_citation").runs(dataset, 5)
    for name, flags in plans:
        cfg = build_config(None, flags)
        if cfg.strategy.name in ("allreduce", "gossip", "gossip-bipartite"):
            assert "average" in flags and "sync-every" in flags, name
