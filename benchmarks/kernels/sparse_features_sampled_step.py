"""Sampled training on bag-of-words features: the batch's CSR plan gathered from the whole
feature matrix's against built from the batch (issue 21).

GCN and GAT (their first block keeps a CSR plan of a mostly-zero input, models/gat.py) on a
neighbour-sampled citation graph: each step trains a new batch, so without the whole matrix's
plan the batch's is built from its dense features every step (``nonzero``, ``count_nonzero``,
``sort`` over all of its elements). The sampled strategy's own plan and step (``gnnpar train
--strategy sampled``: loader, model, Adam), one process; per repetition both sides train the
same batches in turn, alternating which goes first:

* ``gathered``: the batches as the sampled source yields them, features marked as rows of the
  graph's (what gnnpar does);
* ``examined``: the same batches with their features copied (before the clock) into tensors
  nobody marked, which the model examines itself (what gnnpar did before).

Both sides draw the same random numbers: their losses must agree to the bit, which is checked.
Reported: the median over repetitions of each side's mean step, and the ratio.

    python -m benchmarks.kernels.sparse_features_sampled_step --dataset cora --model gcn --reps 5

Run it alone on the machine (``flock`` the benchmark lock).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from benchmarks import harness
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.runtime.dist import DistContext
from gnnpar.strategies import registry


def main(argv: list[str] | None = None) -> None:
    p = harness.parser(__doc__, reps=5, threads=1, data_root=True)
    p.add_argument("--dataset", default="cora")
    p.add_argument("--model", default="gcn")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=20, help="batches per side per repetition")
    args = harness.start(
        p, argv, {"batches": 2, "reps": 2}, header=False
    )  # printed with the figures
    root = args.data_root or str(harness.smoke_root())
    flags = {"dataset": args.dataset, "model": args.model, "strategy": "sampled"}
    flags |= {"batch_size": args.batch_size, "data_root": root, "threads": args.threads}
    cfg = build_config(None, flags)
    ds = load_dataset(args.dataset, root)
    torch.manual_seed(0)
    spec = registry.get("sampled")
    plan = spec.build(cfg, ds, DistContext(), spec.parallel_dims(cfg, 1))
    plan.source.start()
    batches = [b for _, b in zip(range(args.batches), plan.source.epoch(0))]
    density = float((ds.data.x != 0).float().mean())

    def train(bs: list, seed: int) -> tuple[float, list[float]]:
        torch.manual_seed(seed)
        losses, t0 = [], time.perf_counter()
        for b in bs:
            plan.optimizer.zero_grad(set_to_none=True)
            loss = plan.step(b)
            plan.optimizer.step()
            losses.append(float(loss))
        return (time.perf_counter() - t0) / len(bs), losses

    # a step lets go of its batch's features (seed_loss's free_features): each trains a shallow
    # copy (the same tensors, so still marked as the graph's rows)
    train([copy.copy(b) for b in batches], 99)  # warm-up: the whole matrix's plan, allocator
    train([b.clone() for b in batches], 99)
    times: dict[str, list[float]] = {"gathered": [], "examined": []}
    for rep in range(args.reps):
        order = ("gathered", "examined") if rep % 2 == 0 else ("examined", "gathered")
        start = copy.deepcopy((plan.model.state_dict(), plan.optimizer.state_dict()))
        seen = {}
        for side in order:
            plan.model.load_state_dict(start[0])
            plan.optimizer.load_state_dict(copy.deepcopy(start[1]))  # it keeps the tensors
            # examined: new tensors (copied before the clock), unmarked, as every batch was
            bs = [copy.copy(b) if side == "gathered" else b.clone() for b in batches]
            step_s, seen[side] = train(bs, 1000 + rep)
            times[side].append(step_s)
        # the same start, batches and random numbers: the same losses, to the bit
        assert seen["gathered"] == seen["examined"], (seen["gathered"][:3], seen["examined"][:3])
    g, e = (statistics.median(times[s]) for s in ("gathered", "examined"))
    harness.print_header(args.threads)
    print(
        f"{args.dataset} ({ds.num_nodes} x {ds.num_features}, {density:.1%} non-zero), "
        f"{args.model}, sampled, fan-outs {cfg.strategy.fanouts}, {args.batch_size} seeds, "
        f"{args.batches} batches x {args.reps} repetitions (alternating), losses equal\n"
        f"  gathered from the whole plan: {g * 1e3:.2f} ms/step  "
        f"(per rep {', '.join(f'{t * 1e3:.2f}' for t in times['gathered'])})\n"
        f"  built from each batch:       {e * 1e3:.2f} ms/step  "
        f"(per rep {', '.join(f'{t * 1e3:.2f}' for t in times['examined'])})\n"
        f"  ratio examined/gathered: {e / g:.2f}x"
    )
    plan.source.close()


if __name__ == "__main__":
    main()
