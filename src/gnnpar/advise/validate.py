"""``gnnpar advise --validate``: run what can be run here with ``gnnpar train``, compare.

Every configuration of the grid that this machine can run as the cluster describes it is
trained for real, one after the other, by ``python -m gnnpar train`` with the configuration's
flags (stragglers included) and ``--out <out>/validate/<n>``; its ``train_time_s`` / epochs is
compared with the predicted epoch time. Each run has a deadline (its ``--timeout`` plus the
predicted time, with room); one that misses it or fails is reported as such, with the end of
its output, and the others still run.

* One host (no ``--hosts``, or a one-rank configuration): as many ranks as there are cores.
* ``--hosts 2``: two hosts made of network namespaces (:mod:`gnnpar.runtime.netns`, needs root
  and iproute2), the link between them shaped to ``--network``: a veth pair with tc ``netem``
  (rate and one-way delay) or, where the kernel has no netem, a link emulated in user space
  with the same rate and delay (:mod:`gnnpar.runtime.wire`), each host running ``gnnpar
  torchrun --nnodes 2`` with ``--ranks-per-host`` ranks and an ``--out`` of its own, as the
  README's two-host commands do. Each two-host configuration is simulated again for the
  comparison as it really runs: both hosts' ranks sharing this machine's cores
  (``ClusterSpec.hosts_per_machine``), over the link as made (the asked one, unless it could
  have no delay); advice.json keeps the prediction for the cluster asked beside it
  (``predicted_epoch_s_asked_network``).
  Where namespaces cannot be made, those rows are skipped with one line saying why.

The error of a case is ``(predicted - measured) / measured``.

Around each run the reference work of :mod:`gnnpar.advise.speed` is timed (before and after),
and each case also reports the machine's ``speed_factor`` against the profile's and the error
the prediction would have had at the profile's speed (``error_at_profile_speed``): where the
machine drifted, that says how much of an error was the drift. The plain error stays the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from typing import Any

from gnnpar.advise.predict import Prediction, candidate_flags
from gnnpar.advise.speed import STEADY


def _two_hosts(req, stack: contextlib.ExitStack):
    """(hosts, a note on the link, the link as made) or (None, why not, None). The link always
    has the asked rate and delay: tc netem, or where the kernel lacks it the emulated link
    (:func:`gnnpar.runtime.netns.shaped_hosts`)."""
    from gnnpar.runtime.netns import NetnsUnavailable, shaped_hosts

    net = req.cluster.network
    rate_bit_s = net.bandwidth_Bps * 8
    try:
        hosts, how = stack.enter_context(
            shaped_hosts("v", "w", "10.213.0.9", "10.213.0.10", rate_bit_s, net.latency_s)
        )
    except NetnsUnavailable as e:
        return None, f"two network namespaces cannot be made here ({e})", None
    note = f"{rate_bit_s / 1e6:g} Mbit/s, {net.latency_s * 1e3:g} ms one way ({how})"
    return hosts, note, net


def measurable(req, p: Prediction) -> bool:
    c = req.cluster
    world = p.candidate.world
    return (world == 1 or c.hosts in (1, 2)) and world <= (os.cpu_count() or 1)


def across_hosts(req, p: Prediction) -> bool:
    return req.cluster.hosts == 2 and p.candidate.world > 1


def _argv(flags: dict[str, Any]) -> list[str]:
    argv = []
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif value is not False and value is not None:
            argv += [f"--{key}", str(value)]
    return argv


def _case(p: Prediction, cmd: list[str]) -> dict[str, Any]:
    case = {
        "strategy": p.candidate.strategy,
        "settings": dict(p.candidate.settings),
        "workers": p.candidate.world,
        "predicted_epoch_s": p.epoch_s,
        "measured_epoch_s": None,
        "error": None,
        "command": " ".join(cmd),
    }
    if p.exchange:  # across shards: the bytes a rank sends per step, too
        case["predicted_exchange_bytes_per_step"] = p.exchange["bytes_per_step"]
        case["measured_exchange_bytes_per_step"] = None
        case["exchange_error"] = None
    return case


def _measured_exchange(case: dict[str, Any], r: dict[str, Any]) -> None:
    """A run across shards: the mean over its ranks of result.json's
    ``exchange_bytes_per_step`` beside the predicted bytes (``exchange_error`` as ``error``)."""
    sent = r.get("exchange_bytes_per_step")
    if "predicted_exchange_bytes_per_step" not in case or not sent:
        return
    measured = statistics.fmean(float(b) for b in sent)
    case["measured_exchange_bytes_per_step"] = measured
    case["exchange_error"] = (case["predicted_exchange_bytes_per_step"] - measured) / measured


def _error(case: dict[str, Any], measured: float) -> float:
    """The case's prediction against ``measured``: (predicted - measured) / measured."""
    return (case["predicted_epoch_s"] - measured) / measured


def _measured(case: dict[str, Any], outs: list[str], code: int, output: str) -> dict[str, Any]:
    """The case with its measured epoch time from the run's result.json (in one of ``outs``:
    it is written on the host of global rank 0), or why it failed."""
    results = [os.path.join(o, "result.json") for o in outs]
    found = [r for r in results if os.path.exists(r)]
    if code != 0 or not found:
        tail = output.strip().splitlines()[-3:]
        case["failed"] = f"exit {code}: {' | '.join(tail)}"
        return case
    with open(found[0]) as f:
        r = json.load(f)
    measured = r["train_time_s"] / r["epochs"]
    case["measured_epoch_s"] = measured
    case["error"] = _error(case, measured)
    _measured_exchange(case, r)
    return case


def _deadline_s(flags: dict[str, Any], p: Prediction) -> float:
    return float(flags.get("timeout", 120)) + 3 * p.train_time_s + 60


def run_one(req, p: Prediction, out: str) -> dict[str, Any]:
    flags = candidate_flags(req, p.candidate)
    flags["out"] = out
    timeout = _deadline_s(flags, p)
    cmd = [sys.executable, "-m", "gnnpar", "train", *_argv(flags)]
    case = _case(p, cmd[1:])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        case["failed"] = f"gnnpar train did not finish within {timeout:.0f} s"
        return case
    return _measured(case, [out], done.returncode, done.stderr or done.stdout)


def host_shard_folder(sharded: str, host: int, into: str) -> str:
    """``into``: the sharded folder's ``manifest.json`` and ``shard-<host>/`` only (hard links
    where the disk allows, else copies), as a host of a run across shards holds it."""
    from gnnpar.data.prepared import read_manifest

    top = os.path.abspath(os.path.expanduser(sharded))
    rec = read_manifest(top)["shards"][host]
    shutil.rmtree(into, ignore_errors=True)
    os.makedirs(into)
    shutil.copy(os.path.join(top, "manifest.json"), os.path.join(into, "manifest.json"))
    src, dst = os.path.join(top, rec["folder"]), os.path.join(into, rec["folder"])
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
    return into


def run_two_hosts(req, p: Prediction, out: str, hosts, port: int) -> dict[str, Any]:
    """One configuration on the two namespace hosts: ``gnnpar torchrun --nnodes 2`` on each,
    host A holding the rendezvous; each host its own ``--out`` (``out``/a, ``out``/b). A run
    across shards (``p.exchange``: a sampled run over a sharded folder) gives host h its own
    folder holding the manifest and ``shard-<h>/`` only (``out``/data-a, data-b: hard links,
    removed after the run), and fixes the node ranks (A 0, B 1: torch's static rendezvous), so
    that each host trains its shard as the run would on two machines; with every shard on
    every host each would train the whole graph alone."""
    flags = candidate_flags(req, p.candidate)
    flags.pop("workers", None)  # torchrun's --nproc-per-node says it
    timeout = _deadline_s(flags, p)
    procs, outs, logs, data = [], [], [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(k, None)
    for h, (side, ns, dev, addr, conf) in enumerate(
        (
            ("a", hosts.a, hosts.if_a, hosts.addr_a, "is_host=true,join_timeout=60"),
            ("b", hosts.b, hosts.if_b, hosts.addr_b, "join_timeout=60"),
        )
    ):
        host_out = os.path.join(out, side)
        os.makedirs(host_out, exist_ok=True)
        host_flags = {**flags, "out": host_out}
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "gnnpar", "torchrun"]
        cmd += ["--nnodes", "2", "--nproc-per-node", str(req.cluster.ranks_per_host)]
        if p.exchange:
            folder = os.path.join(out, f"data-{side}")
            host_flags["dataset"] = host_shard_folder(flags["dataset"], h, folder)
            data.append(folder)
            cmd += ["--node-rank", str(h), "--master-addr", hosts.addr_a]
            cmd += ["--master-port", str(port)]
        else:
            cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.addr_a}:{port}"]
            cmd += ["--rdzv-id", f"validate{port}", "--rdzv-conf", conf, "--local-addr", addr]
        cmd += ["train", *_argv(host_flags)]
        log = open(os.path.join(out, f"host-{side}.log"), "w")  # noqa: SIM115 (closed below)
        logs.append(log)
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**env, "GLOO_SOCKET_IFNAME": dev, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        )
        outs.append(host_out)
    case = _case(p, cmd[4:])  # host B's command, from `python -m gnnpar torchrun` on
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        case["failed"] = f"the two hosts did not finish within {timeout:.0f} s"
        return case
    finally:
        for log in logs:
            log.close()
        for folder in data:  # hard links (or copies) of the shards: not kept
            shutil.rmtree(folder, ignore_errors=True)
    output = "\n".join(
        open(os.path.join(out, f"host-{side}.log")).read()
        for side in "ab"  # noqa: SIM115
    )
    return _measured(case, outs, max(codes, key=abs), output)


def _with_speed(case: dict[str, Any], profile_refs: list[float], refs: list[float]):
    """The case with the machine's speed factor around its run (the reference times ``refs``,
    before and after it, over the profile's) and its measured epoch at the profile's speed."""
    from gnnpar.advise.speed import speed_factor

    factor = speed_factor(profile_refs, refs)
    case["speed_factor"] = factor
    if factor is None or case["measured_epoch_s"] is None:
        case["measured_at_profile_speed_epoch_s"] = case["error_at_profile_speed"] = None
        return case
    at = case["measured_epoch_s"] / factor
    case["measured_at_profile_speed_epoch_s"] = at
    case["error_at_profile_speed"] = _error(case, at)
    return case


def _round_order(n: int, r: int) -> list[int]:
    """The order of the configurations in repetition ``r``: forwards, then backwards, and so on,
    so that a drift of the machine's speed during the grid does not always fall on the same
    configurations."""
    return list(range(n)) if r % 2 == 0 else list(range(n - 1, -1, -1))


def _combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One case from its repetitions: the median measured epoch time (the error from it), every
    repetition's in ``measured_runs_epoch_s``; failed where no repetition measured anything."""
    case = dict(runs[0])
    times = [c["measured_epoch_s"] for c in runs if c["measured_epoch_s"] is not None]
    failures = [c["failed"] for c in runs if c.get("failed")]
    case.pop("failed", None)
    if failures:
        case["failed_runs"] = failures
    if not times:
        case["failed"] = failures[0]
        case["measured_epoch_s"] = case["error"] = None
        return case
    measured = statistics.median(times)
    case["measured_epoch_s"] = measured
    case["measured_runs_epoch_s"] = times
    case["error"] = _error(case, measured)
    case["speed_factors"] = [
        c.get("speed_factor") for c in runs if c["measured_epoch_s"] is not None
    ]
    sent = [c.get("measured_exchange_bytes_per_step") for c in runs]
    sent = [b for b in sent if b is not None]
    if sent:  # the bytes do not drift with the machine's speed: their median
        b = statistics.median(sent)
        case["measured_exchange_bytes_per_step"] = b
        case["exchange_error"] = (case["predicted_exchange_bytes_per_step"] - b) / b
    case.pop("speed_factor", None)
    at = [c.get("measured_at_profile_speed_epoch_s") for c in runs]
    at = [t for t in at if t is not None]
    if at and len(at) == len(times):
        case["measured_at_profile_speed_epoch_s"] = statistics.median(at)
        case["error_at_profile_speed"] = _error(case, statistics.median(at))
    else:
        case["measured_at_profile_speed_epoch_s"] = case["error_at_profile_speed"] = None
    return case


def validate(req, preds: list[Prediction], prof=None) -> dict[str, Any]:
    """Train every measurable configuration here (``req.repeats`` times each, in rounds);
    ``prof`` (the profile the predictions came from) re-simulates two-host configurations on the
    link the namespaces really had."""
    runnable = [p for p in preds if measurable(req, p)]
    # a profile from a file had its reference times cleaned where it was read (reuse_profile)
    profile_refs = prof.speed_ref_s if prof is not None else []
    two = [p for p in runnable if across_hosts(req, p)]
    repeats = req.repeats
    times = f", {repeats} times each" if repeats > 1 else ""
    print(
        f"gnnpar advise --validate: training {len(runnable)} configuration(s) here{times}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        hosts, link_note, emulated = None, None, None
        two_ids = {id(p) for p in two}
        if two:
            hosts, link_note, emulated = _two_hosts(req, stack)
            if hosts is None:
                print(f"  {len(two)} two-host configuration(s) skipped: {link_note}", flush=True)
                runnable = [p for p in runnable if id(p) not in two_ids]
            else:
                print(f"  two hosts: network namespaces, link {link_note}", flush=True)
        compared = _as_emulated(req, runnable, two_ids, prof, emulated)
        runs: list[list[dict[str, Any]]] = [[] for _ in compared]
        for r in range(repeats):
            for i in _round_order(len(compared), r):
                asked, p = compared[i]
                two_hosts = (hosts, link_note, 29500 + (i + r * len(compared)) % 500)
                name = f"{i:02d}-{p.candidate.strategy}" + (f"-r{r}" if repeats > 1 else "")
                on_two = hosts is not None and id(asked) in two_ids
                case = _run_case(req, asked, p, name, on_two, two_hosts, profile_refs)
                runs[i].append(case)
                _print_case(p, case, r, repeats)
    cases = [_combined(c) for c in runs]
    if repeats > 1:
        for c in cases:
            if c["error"] is not None:
                print(
                    f"  median of {len(c['measured_runs_epoch_s'])}: {c['strategy']} "
                    f"{c['settings']}: measured {c['measured_epoch_s'] * 1e3:.1f} ms/epoch, "
                    f"error {c['error']:+.0%}",
                    flush=True,
                )
    summary = _summary(cases, repeats)
    if summary["median_abs_error"] is not None:
        print(
            f"  median |error| {summary['median_abs_error']:.0%}, "
            f"largest {summary['max_abs_error']:.0%}",
            flush=True,
        )
    line = speed_line(summary)
    if line:
        print(f"  {line}", flush=True)
    return summary


def _as_emulated(req, runnable: list, two_ids: set, prof, emulated) -> list[tuple]:
    """(asked, compared) for each configuration: a two-host one re-simulated on the link the
    namespaces have (with ``prof``), any other as asked."""
    compared = []
    for p in runnable:
        asked = p
        if id(p) in two_ids and prof is not None:
            from gnnpar.advise.predict import predict

            # the two hosts are namespaces of this one machine: their ranks share its
            # cores, and the link is the one made (the asked one unless it has no delay)
            spec = dataclasses.replace(req.cluster, network=emulated, hosts_per_machine=2)
            p = predict(p.candidate, prof, spec, req.stragglers, req.epochs)
        compared.append((asked, p))
    return compared


def _run_case(
    req, asked, p, name: str, on_two: bool, two_hosts: tuple, profile_refs: list[float]
) -> dict[str, Any]:
    """Train one configuration once (``on_two``: across the two namespaces ``two_hosts``, that
    is hosts, link note and port), the machine's reference work timed around it."""
    from gnnpar.advise.speed import reference_s

    out = str(req.out / "validate" / name)
    refs = [reference_s()] if profile_refs else []
    if on_two:
        hosts, link_note, port = two_hosts
        case = run_two_hosts(req, p, out, hosts, port)
        case["hosts"] = 2
        case["link"] = link_note
        case["predicted_epoch_s_asked_network"] = asked.epoch_s
    else:
        case = run_one(req, p, out)
    refs += [reference_s()] if profile_refs else []
    return _with_speed(case, profile_refs, refs)


def _print_case(p, case: dict[str, Any], r: int, repeats: int) -> None:
    shown = p.candidate.label() + (" across 2 hosts" if case.get("hosts") == 2 else "")
    shown += f" (run {r + 1} of {repeats})" if repeats > 1 else ""
    if case["error"] is None:
        print(f"  {shown}: predicted {p.epoch_s * 1e3:.1f} ms, {case.get('failed')}", flush=True)
        return
    factor = case["speed_factor"]
    print(
        f"  {shown}: predicted {p.epoch_s * 1e3:.1f} ms/epoch, measured "
        f"{case['measured_epoch_s'] * 1e3:.1f} ms/epoch, error {case['error']:+.0%}"
        + ("" if factor is None else f" (machine at {1 / factor:.2f}x its speed)")
        + _exchange_note(case),
        flush=True,
    )


def _exchange_note(case: dict[str, Any]) -> str:
    if case.get("exchange_error") is None:
        return ""
    return (
        f"; bytes sent per step {case['predicted_exchange_bytes_per_step'] / 1e6:.2f} MB "
        f"predicted, {case['measured_exchange_bytes_per_step'] / 1e6:.2f} MB measured, error "
        f"{case['exchange_error']:+.0%}"
    )


def _summary(cases: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """The validation's summary: the cases, their errors' median and largest (also at the
    profile's speed), the machine's speed range, and whether the recommendation was within
    10% of the best measured."""
    errors = [abs(c["error"]) for c in cases if c["error"] is not None]
    at_speed = [
        abs(c["error_at_profile_speed"]) for c in cases if c["error_at_profile_speed"] is not None
    ]
    factors = [f for c in cases for f in c.get("speed_factors", []) if f is not None]
    summary = {
        "cases": cases,
        "repeats": repeats,
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "median_abs_error_at_profile_speed": statistics.median(at_speed) if at_speed else None,
        "max_abs_error_at_profile_speed": max(at_speed) if at_speed else None,
        "speed_factor_range": [min(factors), max(factors)] if factors else None,
    }
    measured = [c for c in cases if c["measured_epoch_s"] is not None]
    if measured:
        best = min(measured, key=lambda c: c["measured_epoch_s"])
        pred_best = min(measured, key=lambda c: c["predicted_epoch_s"])
        summary["measured_best"] = {"strategy": best["strategy"], "settings": best["settings"]}
        summary["recommended_within_10pct"] = (
            pred_best["measured_epoch_s"] <= 1.1 * best["measured_epoch_s"]
        )
    return summary


def speed_line(summary: dict[str, Any]) -> str | None:
    """The line on the machine's speed around the runs, where the reference work measured a
    change (a run's factor beyond :data:`~gnnpar.advise.speed.STEADY` either way); None where
    it ran at its profile's speed, or nothing was measured against the profile's."""
    if summary.get("median_abs_error_at_profile_speed") is None:
        return None
    lo, hi = summary["speed_factor_range"] or (1.0, 1.0)
    if hi < STEADY and lo > 1 / STEADY:
        return None
    return (
        f"the machine ran at {1 / hi:.2f}-{1 / lo:.2f}x its speed when profiled (a reference "
        f"work timed around each run); at the profile's speed the median |error| would be "
        f"{summary['median_abs_error_at_profile_speed']:.0%}, the largest "
        f"{summary['max_abs_error_at_profile_speed']:.0%}"
    )
