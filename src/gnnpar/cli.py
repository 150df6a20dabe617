"""Command line: argument parsing -> Config -> run. Nothing else lives here.

gnnpar train [flags]            one run, writes <out>/result.json
gnnpar bench [SUITE] [--quick]  a suite of runs, report.md, results.json, plots
gnnpar datasets                 what is available offline, and where files are expected
gnnpar advise [flags]           profile here, predict every strategy on a cluster, rank them
gnnpar prepare --dataset D --out FOLDER   a graph as a prepared folder, trained from disk
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from gnnpar.config.parse import KEYS
from gnnpar.configure import Use, build_config, describe_uses, used_by
from gnnpar.errors import RankFailedError, UsageError
from gnnpar.strategies import registry


class _Parser(argparse.ArgumentParser):
    """argparse with gnnpar's error shape, and no abbreviated flags: ``--load 2`` must not quietly
    become ``--loader-workers 2`` (nor become something else when a new flag is added)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse's own errors: same shape, exit 2
        self.print_usage(sys.stderr)
        print(f"gnnpar: error: {message}", file=sys.stderr)
        sys.exit(2)


CONFIG_HELP = "TOML file with the same keys as these flags"


def flag_help(key: str, uses: dict[str, tuple[Use, ...]] | None = None) -> str:
    """The flag's meaning, and who reads it when that is not every run (``uses``:
    :func:`gnnpar.configure.used_by`, derived from the strategies' specs)."""
    uses = used_by() if uses is None else uses
    text = strategy_help() if key == "strategy" else KEYS[key].help
    if key in uses:
        text += f" [used by {describe_uses(key, uses)} only]"
    return text


def strategy_help() -> str:
    """--strategy's help: every registered strategy with its one line."""
    return "; ".join(f"{spec.name}: {spec.help}" for spec in registry.specs())


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gnnpar",
        description="Train GNNs in parallel and measure what pays off.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser(
        "train",
        help="one training run; writes <out>/result.json",
        description="One training run. A flag that the chosen strategy, model or dataset does "
        "not use is an error (exit 2); each flag's help says who uses it.",
    )
    t.add_argument("--config", help=CONFIG_HELP)
    uses = used_by()
    for key in KEYS:
        if key in ("quiet", "tensorboard", "resume", "recompute"):
            t.add_argument(f"--{key}", action="store_true", default=None, help=KEYS[key].help)
            continue
        t.add_argument(
            f"--{key}", dest=key.replace("-", "_"), default=None, help=flag_help(key, uses)
        )
    _add_advise(sub, uses)
    b = sub.add_parser("bench", help="run a suite; report.md, results.json and plots")
    b.add_argument(
        "suite",
        nargs="?",
        default="tour",
        help="tour (default: every strategy on bundled Cora), vig-pipeline (study 000), "
        "gat-citation (001), sampled-ddp (002), gossip-vs-allreduce (003)",
    )
    b.add_argument("--quick", action="store_true", help="smaller runs for a fast look")
    b.add_argument("--out", default=None, help="output folder (default runs/bench-<suite>)")
    b.add_argument("--data-root", default=None)
    b.add_argument("--quiet", action="store_true")
    pr = sub.add_parser("predict", help="per-node predictions and scores of a finished run's model")
    pr.add_argument("run", metavar="RUN_DIR", help="a run's folder (holds model.pt)")
    pr.add_argument("--dataset", default=None, help="another graph (default: the run's dataset)")
    pr.add_argument("--out", default=None, help="FILE: writes FILE.pt and FILE.csv")
    pr.add_argument("--data-root", default=None, help="default: the run's")
    sub.add_parser(  # listed for --help; main() hands its arguments to runtime/torchrun.py
        "torchrun",
        help="torchrun running `gnnpar train` on every rank, ending in one message: "
        "gnnpar torchrun [torchrun's flags] train [train's flags]",
        add_help=False,
    )
    pp = sub.add_parser(
        "prepare",
        help="write a graph as a prepared folder that runs train from disk",
        description="Write any graph gnnpar reads (or a DGL GraphBolt OnDiskDataset folder) "
        "as a prepared folder of .npy arrays and a manifest; `gnnpar train --dataset FOLDER` "
        "then trains from disk, memory-mapped. --verify FOLDER checks every byte of one.",
    )
    pp.add_argument("--dataset", default=None, help=KEYS["dataset"].help)
    pp.add_argument("--out", default=None, help="the folder to write (must not exist)")
    pp.add_argument("--scale", default=None, help=KEYS["scale"].help)
    pp.add_argument(
        "--seed", default=None, help="generator seed, and split seed of a graph without masks"
    )
    pp.add_argument(
        "--feature-dtype", dest="feature_dtype", default=None, help="fp32 (default), fp16 or bf16"
    )
    pp.add_argument("--data-root", dest="data_root", default=None, help=KEYS["data-root"].help)
    pp.add_argument(
        "--shards",
        default=None,
        metavar="H",
        help="shard the graph across H hosts: FOLDER/shard-<h>/ per host, nodes renumbered",
    )
    pp.add_argument(
        "--partitioner",
        default=None,
        help="with --shards: metis (default; the structure in memory), stream (LDG, one pass, "
        "bounded memory) or random",
    )
    pp.add_argument("--verify", default=None, metavar="FOLDER", help="check a prepared folder")
    pp.add_argument("--quiet", action="store_true", help="no progress display")
    d = sub.add_parser("datasets", help="list datasets and whether they are available offline")
    d.add_argument("--data-root", default=None, help="folder holding <name>/ (default: see list)")
    return p


def _add_advise(sub, uses: dict[str, tuple[Use, ...]]) -> None:
    """``gnnpar advise``: train's flags (but those naming one strategy or a run to resume)
    and the cluster to predict (gnnpar.advise.command)."""
    from gnnpar.advise import NOT_TAKEN  # not .command: it imports torch, --help must not

    a = sub.add_parser(
        "advise",
        help="profile briefly here, predict every strategy on a cluster, rank them",
        description="Profile briefly on this machine, simulate every applicable strategy on "
        "the cluster described (default: --workers ranks on this host), rank them, and write "
        "<out>/advice.json and advice.png. Strategy settings given (--partitions, "
        "--sync-every, --chunks, --batch-size, ...) fix that setting; the others are varied.",
    )
    for key in KEYS:
        if key in NOT_TAKEN:
            continue
        if key in ("quiet", "recompute"):
            a.add_argument(f"--{key}", action="store_true", default=None, help=KEYS[key].help)
            continue
        help_text = KEYS[key].help
        if key == "workers":
            help_text = "ranks on this one host (without --hosts)"
        a.add_argument(f"--{key}", dest=key.replace("-", "_"), default=None, help=help_text)
    a.add_argument("--hosts", default=None, help="hosts of the cluster to predict")
    a.add_argument("--ranks-per-host", dest="ranks_per_host", default=None, help="ranks per host")
    a.add_argument(
        "--network", default=None, help="between hosts: BANDWIDTH,LATENCY, e.g. 10gbit,50us"
    )
    a.add_argument(
        "--strategies",
        default=None,
        help="comma-separated strategies to consider (default: every one that applies)",
    )
    a.add_argument(
        "--profile",
        default=None,
        help="simulate from the profile in an earlier advise's advice.json instead of "
        "profiling again (same dataset, model and --threads)",
    )
    a.add_argument(
        "--validate",
        action="store_true",
        default=None,
        help="also run every configuration measurable here with gnnpar train and print "
        "predicted against measured",
    )
    a.add_argument(
        "--profile-rounds",
        default=None,
        help="take every timing and ratio probe of the profile in this many rounds and keep "
        "the median of each (default 3; 1 profiles 2-3x quicker, unguarded against a machine "
        "whose speed changes while it is profiled)",
    )
    a.add_argument(
        "--repeats",
        default=None,
        help="with --validate: train each configuration this many times, in rounds whose "
        "order alternates, and compare with the median (default 1)",
    )


WATCHED_ENV = "GNNPAR_WATCHED"  # set in the child of _watched: it trains, nobody forks again


def _one_rank_under_a_memory_limit(cfg) -> bool:
    """One rank, not started by torchrun, in a memory cgroup whose limit is tighter than the
    machine's available memory (several ranks are watched by their launcher already)."""
    from gnnpar.runtime import launch, resources  # not torch: the child imports it

    if os.environ.get(WATCHED_ENV) == "1" or launch.started_as_rank():  # torchrun's, srun's
        return False
    if registry.get(cfg.strategy.name).parallel_dims(cfg, None).world > 1:
        return False
    budget = resources.available_memory()
    return budget is not None and budget.limit is not None


def _watched(args: argparse.Namespace) -> int:
    """``gnnpar train`` of one rank inside a memory limit, run in a forked child while this
    process waits: the kernel's OOM killer kills the process that outgrows the limit, and only a
    parent that outlives it can say so (``the run was killed by the memory limit of 3.0 GiB``),
    instead of the shell's bare ``Killed``. A fork shares this process's pages, so the watch
    costs the cgroup almost nothing (the elastic launcher's fork server would cost a second
    torch). Ctrl-C reaches the child from the terminal; SIGTERM is passed on to it."""
    from gnnpar.runtime import resources

    before = resources.oom_kills()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the whole command, its messages and exit status its own
        os.environ[WATCHED_ENV] = "1"
        code = 1
        try:
            code = _command(args)
        finally:
            if "gnnpar.run" in sys.modules:
                from gnnpar.run import discard_unused_out

                discard_unused_out(keep=code == 0)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, lambda sig, frame: os.kill(pid, sig))
    try:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:  # pragma: no cover (PEP 475 retries it)
                continue
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        words = resources.killed_by_memory_limit(before, resources.oom_kills())
        if sig == signal.SIGKILL and words is not None:
            raise UsageError(
                f"the run was killed by {words}: it needed more memory than that. Use a smaller "
                "--batch-size, --fanouts or --hidden, --feature-cache 0, --eval-mode sampled, "
                "or run where the limit is higher."
            )
        print(f"gnnpar: error: the run was stopped by {signal.Signals(sig).name}", file=sys.stderr)
        return 128 + sig
    return os.WEXITSTATUS(status)


def _start_ranks_server(cfg) -> None:
    """Local ranks (``--workers N``) are forked from a server that imports torch, PyG and
    gnnpar: start it before this process imports them too, so that the two import at once."""
    from gnnpar.runtime import launch

    if launch.started_as_rank():  # its world is the environment's, and it launches nothing
        return
    world = registry.get(cfg.strategy.name).parallel_dims(cfg, None).world
    launch.start_fork_server_early(
        world, cfg.run.threads, ("gnnpar.run", *launch.TRAIN_RANK_MODULES)
    )


def check_train_flags(flags: list[str]) -> None:
    """Train's flags as `gnnpar train` would check them (UsageError), for `gnnpar torchrun`."""
    parser = build_parser()
    try:
        ns = parser.parse_args(["train", *flags])
    except SystemExit as e:  # the parser printed its one message already
        raise UsageError("train's flags above are not right (`gnnpar train --help`)") from e
    values = {k: v for k, v in vars(ns).items() if k not in ("command", "config")}
    build_config(ns.config, values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["torchrun"]:  # torchrun's own flags, then train's: not argparse's to read
        from gnnpar.runtime.torchrun import main as torchrun_main

        return torchrun_main(argv[1:], check_train_flags)
    args = build_parser().parse_args(argv)
    code = 1
    try:
        code = _command(args)
        return code
    finally:  # a command that failed leaves no output folder it made and wrote nothing into
        if "gnnpar.run" in sys.modules:
            from gnnpar.run import discard_unused_out

            discard_unused_out(keep=code == 0)


def start_cache_writer(cfg):  # noqa: ANN001, ANN201 (a Config; a CacheWriter or None)
    """Start writing the feature cache of ``cfg``'s run on a thread now
    (gnnpar.data.cache_writer), where one process trains sampled from an unsharded prepared
    folder; None elsewhere (torchrun's or srun's ranks, several local ranks, other strategies).
    Imports neither torch nor PyG."""
    from gnnpar.data import cache_writer
    from gnnpar.data.prepared import is_prepared, is_sharded, read_manifest
    from gnnpar.runtime import launch, resources
    from gnnpar.strategies import registry

    s, d = cfg.strategy, cfg.data
    if s.name != "sampled" or not d.dataset or not is_prepared(d.dataset):
        return None
    if is_sharded(d.dataset) or launch.started_as_rank():  # torchrun's or srun's ranks
        return None
    if registry.get(s.name).parallel_dims(cfg, None).world != 1 or not s.fanouts:
        return None
    try:
        m = read_manifest(d.dataset)
    except Exception:  # noqa: BLE001 (the main thread's own check names it)
        return None
    budget = resources.available_memory()
    free = None if budget is None else max(0, budget.free - cache_writer.IMPORTS_BYTES)
    batch = cache_writer.batch_feature_bytes(
        m["num_nodes"], m["num_features"], s.batch_size, s.fanouts
    )
    return cache_writer.start(
        d.dataset, s.feature_cache, free, cache_writer.STEP_BATCHES * batch, s.fanouts,
        s.batch_size,
    )  # fmt: skip


def _train(args: argparse.Namespace) -> int:
    """``gnnpar train``: checked flags, then (in a watched child inside a memory limit) the
    run. Nothing before ``gnnpar.run`` imports torch: a prepared folder's feature cache is
    written on a thread meanwhile (gnnpar.data.cache_writer)."""
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    cfg = build_config(args.config, flags)
    if _one_rank_under_a_memory_limit(cfg):
        return _watched(args)
    _start_ranks_server(cfg)
    from gnnpar.data import cache_writer

    start_cache_writer(cfg)  # its reads wait on the disk while torch is imported
    try:
        from gnnpar.run import run

        result = run(cfg)
    finally:  # a run that ended before its source took the cache
        cache_writer.discard()
    if result is not None:
        if not cfg.run.quiet:
            _print_summary(result)
        print(f"gnnpar: result.json, model.pt and metrics.jsonl in {cfg.run.out}")
    return 0


def _command(args: argparse.Namespace) -> int:
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "advise":
            from gnnpar.advise.command import run_advise

            flags = {k: v for k, v in vars(args).items() if k != "command"}
            run_advise(flags)
            return 0
        if args.command == "predict":
            from gnnpar.predict import predict

            p = predict(args.run, args.dataset, args.out, args.data_root)
            scores = "  ".join(f"{k} {v:.4f}" for k, v in p["scores"].items()) or "no split masks"
            print(f"{p['dataset']}: {p['nodes']} predictions; {scores}")
            print(f"gnnpar: predictions in {' and '.join(p['files'])}")
            return 0
        if args.command == "bench":
            from gnnpar.bench import run_suite

            run_suite(
                args.suite,
                quick=args.quick,
                out=args.out,
                data_root=args.data_root,
                quiet=args.quiet,
            )
            return 0
        if args.command == "prepare":
            from gnnpar.data.prepare_command import run_prepare

            flags = {k: v for k, v in vars(args).items() if k != "command"}
            with _sigterm_stops():
                line = run_prepare(**flags)
            print(f"gnnpar: {line}")
            return 0
        if args.command == "datasets":
            from gnnpar.data.listing import print_datasets

            print_datasets(args.data_root)
            return 0
    except UsageError as e:
        from gnnpar.runtime.torchrun import note_refusal

        note_refusal()  # under gnnpar torchrun: this message is the run's one message
        print(f"gnnpar: error: {e}", file=sys.stderr)
        return 2
    except RankFailedError as e:  # a rank of a multi-process run failed: not a usage problem
        print(f"gnnpar: error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # a cache lock whose holder stopped answering: exit 1, its message
        from gnnpar.data.filelock import CacheLockTimeout

        peer = _peer_failure(e)  # torchrun's rank: a peer (or the network to it) went away
        if not isinstance(e, CacheLockTimeout) and peer is None:
            raise
        print(f"gnnpar: error: {peer or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gnnpar: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("gnnpar: stopped by SIGTERM; nothing half-written is left", file=sys.stderr)
        return 143
    return 0


class _Terminated(BaseException):  # noqa: N818 (a signal, as KeyboardInterrupt is)
    """SIGTERM received during ``gnnpar prepare``."""


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM (``kill``, a batch job's time limit) ends ``gnnpar prepare`` as Ctrl-C does: the
    exception unwinds through the writers, which remove their unfinished folder and scratch
    files (a 1.5 GB of edge buckets at ``--scale 1`` was left behind before), exit 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise _Terminated

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _peer_failure(e: RuntimeError) -> str | None:
    if "torch.distributed" not in sys.modules:  # no rank ever joined a group here
        return None
    from gnnpar.runtime.dist import peer_failure

    return peer_failure(e)


def _print_summary(r: dict) -> None:
    st = r["step_time_s"]
    print(
        f"{r['strategy']} {r['model']} on {r['dataset']} x{r['workers']}: "
        f"{r['score_name']} val {r['val_score']:.4f} test {r['test_score']:.4f}; "
        f"train {r['train_time_s']:.2f}s, step {st['mean'] * 1e3:.1f}±{st['std'] * 1e3:.1f} ms "
        f"(median {st['median'] * 1e3:.1f} ms, n={st['count']})"
    )


if __name__ == "__main__":
    sys.exit(main())
