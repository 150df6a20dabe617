"""``gnnpar torchrun`` (runtime/torchrun.py): torch's elastic agent running ``gnnpar train``, its
ends turned into one message.

Quick lane (in-process, no agent started): bad torchrun flags, a missing ``train``, ``-m``, and
bad train flags each end with one ``gnnpar: error:`` line and exit 2 before anything starts;
the agent's log records lose their tracebacks. Slow: a real agent on this host — 2 ranks
train and write result.json; a rendezvous that the second host never joins ends after its
``join_timeout`` with exit 1 and one line naming the endpoint, no traceback (the two-host ends,
over network namespaces: tests/e2e/test_two_hosts_outage.py).
"""

from __future__ import annotations

import json
import logging

import pytest

from gnnpar.cli import build_parser
from gnnpar.cli import main as cli_main
from gnnpar.runtime.torchrun import AGENT_LOGGERS, quiet_agent_logs, rdzv_conf
from tests.helpers import run_cli


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnnpar: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nnodes", "1", "--bogus", "train"], "unrecognized arguments: --bogus"),
        (["--nnodes", "1", "-m", "gnnpar", "train"], "leave out -m/--no-python"),
        (["--nnodes", "1", "predict", "runs/x"], "got 'predict' where `train` should follow"),
        (["--nnodes", "1", "train", "--dataset", "nope"], "Unknown --dataset 'nope'"),
        (["--nnodes", "1", "train", "--epochs", "x"], "'epochs' must be an integer"),
    ],
)
def test_bad_input_is_one_message_and_exit_2_before_any_agent_starts(capsys, argv, says):
    assert cli_main(["torchrun", *argv]) == 2
    assert says in _one_error(capsys)


def test_the_subcommand_is_listed_by_help():
    assert "torchrun" in build_parser().format_help()


def test_rdzv_conf_is_read_as_torchrun_reads_it():
    assert rdzv_conf("is_host=true, join_timeout=20") == {"is_host": "true", "join_timeout": "20"}
    assert rdzv_conf("") == {} and rdzv_conf("junk") == {}


def test_the_agents_log_records_keep_their_text_and_lose_their_tracebacks(capsys):
    saved = [
        (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate) for n in AGENT_LOGGERS
    ]
    try:
        log = logging.getLogger("torch.distributed.elastic.agent.server.api")
        log.disabled = True  # as logging.config.dictConfig leaves loggers it does not name
        quiet_agent_logs()
        try:
            raise RuntimeError("the store went away")
        except RuntimeError:
            log.exception("Error waiting on exit barrier. Elapsed: %s seconds", 3)
        err = capsys.readouterr().err
        assert err == "torchrun: Error waiting on exit barrier. Elapsed: 3 seconds\n", err
    finally:
        for name, (handlers, propagate) in zip(AGENT_LOGGERS, saved, strict=True):
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).propagate = propagate


@pytest.mark.slow
def test_two_local_ranks_train_under_gnnpar_torchrun(tmp_path):
    out = tmp_path / "run"
    p = run_cli(
        "torchrun", "--nnodes", "1", "--nproc-per-node", "2",
        "train", "--dataset", "karate", "--model", "gcn", "--strategy", "allreduce",
        "--partitions", "2", "--epochs", "2", "--threads", "1", "--quiet", "--out", str(out),
        "--data-root", str(tmp_path / "data"),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert json.loads((out / "result.json").read_text())["workers"] == 2


@pytest.mark.slow
def test_a_rendezvous_nobody_joins_ends_after_join_timeout_with_one_message(tmp_path):
    from gnnpar.runtime.launch import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    p = run_cli(
        "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "alone",
        "--rdzv-conf", "is_host=true,join_timeout=3",
        "train", "--dataset", "karate", "--model", "gcn", "--epochs", "2", "--quiet",
        "--out", str(tmp_path / "run"), "--data-root", str(tmp_path / "data"),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("gnnpar: error:")]
    assert len(errors) == 1, p.stderr
    assert f"the rendezvous at {endpoint} (run id alone)" in errors[0], errors
    assert "join_timeout of 3 s" in errors[0] and "--nnodes 2" in errors[0], errors
    assert "Traceback" not in p.stderr and 'File "' not in p.stderr, p.stderr
    assert not (tmp_path / "run" / "result.json").exists()


def _agent_ending(monkeypatch, capsys, refuse: bool) -> tuple[int, str]:
    """run_agent with torch's ``run`` replaced by one whose rank refused (or not) before the
    agent lost its rendezvous: the race of two hosts refusing the same input, where the host
    holding the rendezvous ends first."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    from gnnpar.cli import check_train_flags
    from gnnpar.runtime.torchrun import note_refusal, parse, run_agent

    def lost(args) -> None:  # noqa: ANN001
        if refuse:
            note_refusal()  # what cli.main does in a rank before its exit 2
        raise RendezvousConnectionError("The connection to the C10d store has failed.")

    monkeypatch.setattr(torchrun, "run", lost)
    monkeypatch.delenv("GNNPAR_REFUSAL_DIR", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as torchrun's agent sets it for a rank
    argv = ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400", "train"]
    code = run_agent(parse(argv, check_train_flags))
    return code, capsys.readouterr().err


def test_a_lost_rendezvous_after_this_hosts_ranks_refused_adds_no_second_message(
    monkeypatch, capsys
):
    code, err = _agent_ending(monkeypatch, capsys, refuse=True)
    assert code == 2 and "gnnpar: error:" not in err, err


def test_a_lost_rendezvous_is_one_message_naming_the_endpoint(monkeypatch, capsys):
    code, err = _agent_ending(monkeypatch, capsys, refuse=False)
    assert code == 1, err
    assert (
        err.startswith("gnnpar: error: the rendezvous at 10.0.0.1:29400")
        and err.count("gnnpar: error:") == 1
    ), err
    assert "stopped answering" in err and "--resume" in err, err


def test_a_refusal_mark_outside_torchruns_ranks_or_in_a_bad_folder_is_nothing(
    monkeypatch, tmp_path
):
    from gnnpar.runtime.torchrun import REFUSAL_ENV, note_refusal

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.delenv(REFUSAL_ENV, raising=False)
    note_refusal()
    monkeypatch.setenv(REFUSAL_ENV, str(tmp_path / "missing" / "\x01"))
    note_refusal()
    assert not (tmp_path / "missing").exists()
    # a folder that exists, outside torchrun's ranks (a plain `gnnpar train`): no file there
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv(REFUSAL_ENV, str(tmp_path))
    note_refusal()
    assert list(tmp_path.iterdir()) == []
