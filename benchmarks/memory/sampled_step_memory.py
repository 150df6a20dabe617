"""Peak memory of one neighbour-sampled GraphSAGE training step, beyond the batch it is given.

    python -m benchmarks.memory.sampled_step_memory --folder /work/data/shard-mem/p0.05 \\
        --fanouts 15,10,5 --batch-size 1024 --steps 3
    python -m benchmarks.memory.sampled_step_memory --smoke

A prepared folder's batches are made as training makes them (``SampledBatches``: batch i from
(seed, epoch, rank, step)), then, per step, the process's peak RSS is reset
(``/proc/self/clear_refs`` 5) with the batch already made, and forward, backward and the Adam
update run as the sampled strategy's step does (``seed_loss``, GraphSAGE 3 x 256, dropout 0.5,
the heap kept as a run keeps it: ``reuse_large_blocks``). Printed per step: the batch's nodes and
feature bytes, the peak RSS above the RSS before the step (the step's own memory: activations,
saved tensors, gradients; no file page is touched in the step), and the loss (compare runs bit
for bit). ``--profile`` also prints torch.profiler's largest allocations of one step.
"""

from __future__ import annotations

import os
import time

import torch

from benchmarks.harness import parser, start, write_json


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) << 10
    raise KeyError(key)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _smoke_folder(root: str) -> str:
    from gnnpar.data.prepare_command import run_prepare

    out = os.path.join(root, "step-mem-smoke")
    os.makedirs(root, exist_ok=True)
    if not os.path.isdir(out):
        run_prepare("synthetic-papers100m", out, "0.0002", "0", None, root, None, True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True, data_root=True)
    p.add_argument("--folder", default=None, help="a prepared folder (gnnpar prepare)")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--heap-block-mb", type=int, default=512, help="reuse_large_blocks' limit (a run's: 512)"
    )
    p.add_argument(
        "--trim", action="store_true", help="malloc_trim(0) with each batch made, before its step"
    )
    p.add_argument("--profile", action="store_true", help="torch.profiler's largest allocations")
    args = start(p, argv, smoke={"steps": 2, "batch_size": 64, "fanouts": "5,5,5"})
    torch.set_num_threads(args.threads)
    folder = _smoke_folder(args.data_root) if args.smoke else args.folder
    if not folder:
        p.error("--folder is required (or --smoke)")

    import inspect

    from gnnpar.config.schema import ModelConfig
    from gnnpar.data.sampling.loader import SampledBatches, open_graph_folder
    from gnnpar.models import build_model
    from gnnpar.runtime.allocator import release_free_memory, reuse_large_blocks
    from gnnpar.training.losses import seed_loss

    reuse_large_blocks(args.heap_block_mb << 20)
    # the sampled strategy's loss (a revision without free_features: the same loss)
    free = "free_features" in inspect.signature(seed_loss).parameters
    kw = {"free_features": True} if free else {}
    torch.manual_seed(0)
    g = open_graph_folder(folder)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    train = torch.from_numpy(__import__("numpy").load(os.path.join(folder, "train.npy")))
    batches = SampledBatches(folder, train.long(), fanouts, args.batch_size, 0, 1, 0, 10**6)
    mcfg = ModelConfig(name="sage", hidden=256, layers=len(fanouts), dropout=0.5)
    model = build_model(mcfg, g["x"].size(1), int(g["y"].max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    del g
    resettable = _reset_peak()
    base = _status("RssAnon")  # the interpreter, torch, the model and its optimiser
    print(f"anonymous memory before the first batch: {base / 2**20:.0f} MiB", flush=True)
    rows = []
    for i in range(args.steps):
        data = batches[i].to_data()
        nodes, xbytes = data.x.size(0), data.x.numel() * data.x.element_size()
        if args.trim:
            release_free_memory()
        _reset_peak()  # the batch made: its file pages are resident, the step touches none
        mapped = _status("VmRSS") - _status("RssAnon")
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if args.profile and i == args.steps - 1:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                loss = seed_loss(model, data, False, **kw)
                loss.backward()
            print(prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=15))
        else:
            loss = seed_loss(model, data, False, **kw)
            loss.backward()
        opt.step()
        secs = time.perf_counter() - t0
        anon_peak = _status("VmHWM") - mapped  # the step's peak of anonymous memory
        loss = float(loss.detach())
        row = {
            "step": i,
            "nodes": nodes,
            "feature_bytes": xbytes,
            "anon_before_batches": base,
            "anon_peak": anon_peak,
            "batch_and_step": anon_peak - base,
            "loss": loss,
            "seconds": secs,
        }
        rows.append(row)
        print(
            f"step {i}: {nodes:,} nodes, features {xbytes / 2**20:.0f} MiB; anonymous peak "
            f"{anon_peak / 2**20:.0f} MiB, {(anon_peak - base) / 2**20:.0f} MiB beyond the "
            f"model ({(anon_peak - base) / max(1, xbytes):.2f}x the batch's features); "
            f"{secs:.2f} s; loss {loss!r}",
            flush=True,
        )
        del data
    out = {"folder": folder, "fanouts": fanouts, "batch_size": args.batch_size, "steps": rows}
    out["peak_resettable"] = resettable
    if args.out:
        write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
