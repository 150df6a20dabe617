"""``gnnpar torchrun``: torch's elastic launcher (torchrun) running ``gnnpar train``, whose own
failures end in one message instead of a traceback.

torchrun's agent restarts the ranks under ``--max-restarts`` and re-forms the rendezvous
between hosts; gnnpar's ranks already end each failed attempt with one line naming the peer
that went silent. What torchrun itself prints when it gives up is a Python traceback:
``RendezvousTimeoutError`` when the other hosts did not (re)join within the rendezvous's
``join_timeout``, ``RendezvousConnectionError`` when the host holding the rendezvous cannot be
reached, ``ChildFailedError`` with its table when the ranks failed on every attempt. This
module runs the same agent through torch's public ``torch.distributed.run`` (its parser, its
``run``) and turns those ends into one ``gnnpar: error:`` line saying what happened and what
to do; the agent's log lines are kept (``torchrun: ...``, WARNING and above; ``LOGLEVEL=INFO``
shows the agent's progress) without their tracebacks.

    gnnpar torchrun [torchrun's flags] train [train's flags]

is ``torchrun [torchrun's flags] -m gnnpar train [train's flags]``. Train's flags are checked
here before any agent starts (exit 2, one message), so a typo is not retried on every attempt.
Each attempt gets a key-value store of its own (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

A rank that refused its input (exit 2, its one message printed) leaves a mark in a folder this
agent made (:func:`note_refusal`): when the agent then loses the rendezvous, because another
host's torchrun, refusing the same input, ended first and took the rendezvous with it, that loss
is a consequence, and the ranks' message stays the only one.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable

from gnnpar.errors import UsageError

#: the loggers torchrun's agent, launcher and rendezvous write to
AGENT_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")
DEFAULT_JOIN_TIMEOUT_S = 600  # torch's c10d rendezvous default (its README: join_timeout)
#: the folder where this host's ranks mark that they refused their input (set for the ranks)
REFUSAL_ENV = "GNNPAR_REFUSAL_DIR"


def note_refusal() -> None:
    """Mark, for this host's ``gnnpar torchrun``, that this rank ended with exit 2 after printing
    its one message. Nothing outside torchrun's ranks (``TORCHELASTIC_RUN_ID``, which its agent
    sets), so a stray ``GNNPAR_REFUSAL_DIR`` never gets a file, nor where the folder cannot be
    written."""
    folder = os.environ.get(REFUSAL_ENV)
    if not folder or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    try:
        with open(os.path.join(folder, f"rank-{os.getpid()}"), "w"):
            pass
    except OSError:
        pass


def _ranks_refused(folder: str) -> bool:
    try:
        return any(name.startswith("rank-") for name in os.listdir(folder))
    except OSError:
        return False


class _NoTraceback(logging.Formatter):
    """``torchrun: <message>``: the record's text, never its exception's traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return f"torchrun: {record.getMessage()}"


def quiet_agent_logs() -> None:
    """The agent's log records on stderr, their text without tracebacks. Loggers under
    :data:`AGENT_LOGGERS` that something disabled (``logging.config.dictConfig`` disables every
    logger it does not name) are enabled again: a record of why a run ended is never dropped."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_NoTraceback())
    for name in AGENT_LOGGERS:
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.propagate = False
    for name, log in list(logging.root.manager.loggerDict.items()):
        if isinstance(log, logging.Logger) and any(
            name == n or name.startswith(n + ".") for n in AGENT_LOGGERS
        ):
            log.disabled = False


def rdzv_conf(text: str) -> dict[str, str]:
    """``--rdzv-conf`` as torchrun reads it: ``key=value`` pairs separated by commas."""
    conf = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            conf[key.strip()] = value.strip()
    return conf


def parse(argv: list[str], check_train_flags: Callable[[list[str]], None]):
    """torchrun's arguments, with ``-m gnnpar`` and the checked ``train ...`` as its script:
    ``check_train_flags`` checks train's flags as `gnnpar train` would (UsageError), before any
    rank starts, so that a mistake is said once, not once per attempt on every host (the command
    line's own check, :func:`gnnpar.cli.check_train_flags`)."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.prog = "gnnpar torchrun"

    def error(message: str):
        raise UsageError(f"gnnpar torchrun: {message} (`gnnpar torchrun --help` lists its flags)")

    parser.error = error  # argparse's error() prints usage and exits; one message instead
    args = parser.parse_args(argv)
    if args.module or args.no_python:
        raise UsageError(
            "gnnpar torchrun starts gnnpar on every rank itself: leave out -m/--no-python and "
            "give `train` and its flags after torchrun's flags."
        )
    if args.training_script != "train":
        raise UsageError(
            f"gnnpar torchrun runs `gnnpar train` on every rank; got {args.training_script!r} "
            "where `train` should follow torchrun's flags: gnnpar torchrun [torchrun's flags] "
            "train [train's flags]."
        )
    if str(args.nnodes).strip() in ("1", "1:1"):
        check_train_flags(args.training_script_args)
    else:  # several hosts: each host's shard of a sharded graph is agreed on once joined
        from gnnpar.data.shards import hosts_agree_later

        with hosts_agree_later():
            check_train_flags(args.training_script_args)
    args.training_script, args.module = "gnnpar", True
    args.training_script_args = ["train", *args.training_script_args]
    return args


def run_agent(args) -> int:
    """Run torch's elastic agent; 0, or the one message of how it ended (UsageError: 2)."""
    from torch.distributed import DistError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}"
    again = (
        "start the same command on every host again, with --resume added to train's flags if "
        "the run wrote checkpoints (--checkpoint-every): it continues from the newest one every "
        "rank holds"
    )
    quiet_agent_logs()
    # A new key-value store every attempt (rank 0 hosts it), instead of the agent's own, which
    # keeps the keys of earlier attempts: each agent counts only its own ranks' failures, so
    # after a restart that one host's failure caused, the hosts' counts differ and could not
    # tell this attempt's keys from an earlier one's (runtime/dist.py).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    with tempfile.TemporaryDirectory(prefix="gnnpar-torchrun-") as refusals:
        os.environ[REFUSAL_ENV] = refusals  # the ranks inherit it
        try:
            torchrun.run(args)
            return 0
        except (ChildFailedError, RendezvousError, DistError) as e:
            if _ranks_refused(refusals):  # a refusal here: the ranks' message is the one
                return 2
            return _verdict(e, args, endpoint, again)
        except SignalException as e:
            print(f"gnnpar: interrupted ({signal.Signals(e.sigval).name})", file=sys.stderr)
            return 128 + int(e.sigval)


def _verdict(e: Exception, args, endpoint: str, again: str) -> int:  # noqa: ANN001
    """Print the one message for how the agent ended (``e``) and return 1; or, if every rank
    refused its input (exit 2, their message printed), print nothing and return 2."""
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousError,
        RendezvousTimeoutError,
    )

    if isinstance(e, ChildFailedError):
        codes = {f.exitcode for f in e.failures.values()}
        attempts = args.max_restarts + 1
        if codes == {2}:  # the ranks refused their input: their one message is the message
            return 2
        rank, failure = e.get_first_failure()
        print(
            f"gnnpar: error: the ranks failed on all {attempts} attempt(s) (--max-restarts "
            f"{args.max_restarts}); the first to fail, rank {rank} (exit code "
            f"{failure.exitcode}), said why above. To go on, {again}.",
            file=sys.stderr,
        )
        return 1
    if isinstance(e, RendezvousTimeoutError):
        join_s = rdzv_conf(args.rdzv_conf).get("join_timeout", DEFAULT_JOIN_TIMEOUT_S)
        print(
            f"gnnpar: error: the rendezvous at {endpoint} (run id {args.rdzv_id}) did not "
            f"complete within its join_timeout of {join_s} s: not every one of --nnodes "
            f"{args.nnodes} hosts (re)joined. Check that every host is up and reaches "
            f"{endpoint}; then {again}.",
            file=sys.stderr,
        )
        return 1
    if isinstance(e, RendezvousConnectionError):
        print(
            f"gnnpar: error: the rendezvous at {endpoint} (run id {args.rdzv_id}) stopped "
            "answering: the host that holds it (--rdzv-endpoint) is down or cannot be reached "
            f"from here. When it is back, {again}.",
            file=sys.stderr,
        )
        return 1
    if isinstance(e, RendezvousClosedError):
        print(
            f"gnnpar: error: the rendezvous at {endpoint} (run id {args.rdzv_id}) was closed: "
            f"another host's torchrun ended (its output says why). To go on, {again}.",
            file=sys.stderr,
        )
        return 1
    assert isinstance(e, (RendezvousError, DistError)), e
    print(
        f"gnnpar: error: torchrun's rendezvous at {endpoint} failed: "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Check "
        f"--rdzv-endpoint and that every host reaches it; then {again}.",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str], check_train_flags: Callable[[list[str]], None]) -> int:
    """``gnnpar torchrun [torchrun's flags] train [train's flags]``: exit status 0, 1, 2 or 130.
    ``check_train_flags``: see :func:`parse`."""
    try:
        return run_agent(parse(argv, check_train_flags))
    except UsageError as e:
        print(f"gnnpar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gnnpar: interrupted", file=sys.stderr)
        return 130
