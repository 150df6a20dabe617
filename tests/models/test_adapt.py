"""A user's model cut into blocks (gnnpar.models.adapt): the cut computes what the model
computes, bit for bit, with the model's own parameters; and the receptive field it reports is
the one exact micro-batches need (one hop fewer is not enough)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import ChebConv, GCNConv, JumpingKnowledge, SAGEConv, SGConv
from torch_geometric.nn import Sequential as PyGSequential
from torch_geometric.nn.models import GAT, GCN, GIN, PNA, EdgeCNN, GraphSAGE
from torch_geometric.utils import to_undirected

from gnnpar import UsageError
from gnnpar.data.microbatch import build_plan
from gnnpar.models.adapt import (
    batch_statistics,
    check_same_output,
    join_where_not_tensors,
    message_passing_hops,
    to_block_model,
)
from tests.models.handwritten import (
    APPNPNet,
    BlocksNet,
    InPlaceNet,
    MisleadingBlocksNet,
    SkipNet,
    TwiceNet,
)


def random_graph(n: int = 40, edges: int = 100, dim: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, edges), generator=g)
    ei = to_undirected(ei[:, ei[0] != ei[1]], num_nodes=n)
    return torch.randn(n, dim, generator=g), ei


def jk_sequential() -> nn.Module:
    """PyG's own jumping-knowledge example: cuttable only where one value is live."""
    return PyGSequential(
        "x, edge_index",
        [
            (nn.Dropout(p=0.2), "x -> x"),
            (GCNConv(8, 16), "x, edge_index -> x1"),
            nn.ReLU(),
            (GCNConv(16, 16), "x1, edge_index -> x2"),
            nn.ReLU(),
            (lambda x1, x2: torch.cat([x1, x2], dim=-1), "x1, x2 -> x"),
            (nn.Linear(32, 4), "x -> x"),
        ],
    )


MODELS = {  # name: (factory, blocks, hops)
    "GIN": (lambda: GIN(8, 16, 3, 4, dropout=0.3), 3, 3),
    "GIN jk=cat batch_norm": (lambda: GIN(8, 16, 3, 4, jk="cat", norm="batch_norm"), 3, 3),
    "GATv2 jk=max": (lambda: GAT(8, 16, 3, 4, v2=True, heads=2, jk="max", dropout=0.2), 3, 3),
    "GCN jk=lstm act_first": (
        lambda: GCN(8, 16, 3, 4, jk="lstm", act_first=True, norm="layer_norm"),
        3,
        4,  # GCN: one hop more (source degrees)
    ),
    "GraphSAGE jk=last graph_norm": (
        lambda: GraphSAGE(8, 16, 2, 4, jk="last", norm="graph_norm"),
        2,
        2,
    ),
    "EdgeCNN": (lambda: EdgeCNN(8, 16, 2, 4), 2, 2),
    "PNA": (
        lambda: PNA(
            8,
            16,
            2,
            4,
            aggregators=["mean", "max"],
            scalers=["identity", "amplification"],
            deg=torch.tensor([0, 4, 6, 3, 1]),
        ),
        2,
        2,
    ),
    "PyG Sequential": (  # the relu has no parameters: it joins the conv after it
        lambda: PyGSequential(
            "x, edge_index",
            [
                (GCNConv(8, 16), "x, edge_index -> x"),
                nn.ReLU(),
                (SAGEConv(16, 4), "x, edge_index -> x"),
            ],
        ),
        2,
        3,
    ),
    "PyG Sequential jk": (jk_sequential, 3, 3),  # no cut while x1 and x2 are both live
    "blocks attribute": (lambda: BlocksNet(8, 4, layers=3), 3, 4),
    "APPNP --split-at prop": (lambda: APPNPNet(8, 4, K=3), 2, 4),
    "GAT jk=cat --split-at convs.1": (  # the one value crossing: layer 0's output
        lambda: GAT(8, 16, 3, 4, jk="cat", dropout=0.3),
        2,
        3,
    ),
}


def build(name: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    module = MODELS[name][0]()
    split = name.split("--split-at ")[1].split(",") if "--split-at" in name else None
    return module, to_block_model(module, split_at=split)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_cut_computes_the_module_bit_for_bit_in_training_and_evaluation(name):
    module, bm = build(name)
    x, ei = random_graph()
    assert bm.user_module is module and bm.splittable
    assert len(bm.blocks) == MODELS[name][1]
    for training in (True, False):  # dropout draws the same mask: the same ops, in order
        bm.train(training)
        assert module.training is training
        torch.manual_seed(1)
        theirs = module(x, ei)
        torch.manual_seed(1)
        ours = bm.run_blocks(x, ei)
        assert torch.equal(ours, theirs), f"{name} ({'train' if training else 'eval'})"
        torch.manual_seed(1)
        assert torch.equal(bm(x, ei), theirs)  # whole, it is the module itself


@pytest.mark.parametrize(
    "name", ["GIN", "GraphSAGE jk=last graph_norm", "APPNP --split-at prop", "GATv2 jk=max"]
)
def test_gradients_equal_and_land_in_the_modules_own_parameters(name):
    """Bit for bit; with jk "max" (cat, lstm) to rounding: each layer's output gradient, from
    the next conv and from jk, is summed in another order when the blocks carry the outputs."""
    module, bm = build(name)
    x, ei = random_graph()
    torch.manual_seed(1)
    module(x, ei).square().sum().backward()
    theirs = {k: p.grad.clone() for k, p in module.named_parameters()}
    module.zero_grad()
    torch.manual_seed(1)
    bm.run_blocks(x, ei).square().sum().backward()
    assert {id(p) for p in bm.parameters()} == {id(p) for p in module.parameters()}
    for k, p in module.named_parameters():
        if "jk" in name:
            torch.testing.assert_close(p.grad, theirs[k], rtol=1e-5, atol=1e-6, msg=k)
        else:
            assert torch.equal(p.grad, theirs[k]), k


def test_trained_and_loaded_weights_are_the_modules_own():
    module, bm = build("GIN jk=cat batch_norm")
    x, ei = random_graph()
    opt = torch.optim.SGD(bm.parameters(), lr=0.1)
    bm.run_blocks(x, ei).sum().backward()
    opt.step()  # a step on the block model moves the module's weights, buffers included
    assert module.state_dict()["convs.0.nn.lins.0.weight"] is not None
    assert torch.equal(module.convs[0].nn.lins[0].weight, bm.blocks[0].conv.nn.lins[0].weight)
    assert module.norms[0].module.num_batches_tracked.item() == 1  # PyG BatchNorm wraps one
    fresh = to_block_model(GIN(8, 16, 3, 4, jk="cat", norm="batch_norm"))
    fresh.load_state_dict(bm.state_dict())
    bm.eval(), fresh.eval()
    assert torch.equal(fresh.user_module(x, ei), module(x, ei))


def test_cuts_where_a_list_crosses_are_joined():
    """PyG's own JumpingKnowledge example: after the lambda only the list ``xs`` is live, a cut
    the sequence allows but a pipeline cannot send."""
    torch.manual_seed(0)
    seq = PyGSequential(
        "x, edge_index",
        [
            (GCNConv(8, 16), "x, edge_index -> x1"),
            nn.ReLU(inplace=True),
            (GCNConv(16, 16), "x1, edge_index -> x2"),
            nn.ReLU(inplace=True),
            (lambda x1, x2: [x1, x2], "x1, x2 -> xs"),
            (JumpingKnowledge("cat", 16, num_layers=2), "xs -> x"),
            (nn.Linear(32, 4), "x -> x"),
        ],
    )
    bm = to_block_model(seq)
    x, ei = random_graph()
    # cuts after the first conv's (in-place) relu, the second's, the lambda; jk has no
    # parameters: it joins the linear layer after it
    assert len(bm.blocks) == 3
    join_where_not_tensors(bm, x, ei)
    assert len(bm.blocks) == 2
    bm.eval()
    h = x
    for block in bm.blocks:  # as a stage runs it: its input a leaf that requires grad
        h = block(h.detach().requires_grad_(), ei)
        assert torch.is_tensor(h)
    assert torch.equal(h, seq(x, ei))


def test_a_model_it_cannot_cut_is_one_block_that_says_how():
    module = APPNPNet(8, 4)
    bm = to_block_model(module)
    assert not bm.splittable and len(bm.blocks) == 1
    assert "APPNPNet" in bm.why_not_splittable and "--split-at" in bm.why_not_splittable
    assert "blocks" in bm.why_not_splittable and "BasicGNN" in bm.why_not_splittable
    x, ei = random_graph()
    bm.eval()
    assert torch.equal(bm.run_blocks(x, ei), module(x, ei))


def test_split_at_the_output_layer_and_its_dropout_trace_follows_train_and_eval():
    module = APPNPNet(8, 4, dropout=0.5)
    bm = to_block_model(module, split_at=["lin2"])
    x, ei = random_graph()
    bm.eval()
    assert torch.equal(bm.run_blocks(x, ei), module.eval()(x, ei))  # no dropout in evaluation
    bm.train()
    torch.manual_seed(3)
    a = bm.run_blocks(x, ei)
    torch.manual_seed(3)
    assert torch.equal(a, module(x, ei)) and not torch.equal(a, bm.eval().run_blocks(x, ei))


@pytest.mark.parametrize(
    "module, split, message",
    [
        (APPNPNet(8, 4), ["nope"], "no such submodule"),
        (SkipNet(8, 4), ["prop"], "only the running features cross"),
        (SkipNet(8, 4), ["lin2"], "only the running features cross"),
        (APPNPNet(8, 4), ["prop.aggr_module"], "prop is a message-passing layer"),
        (GAT(8, 16, 3, 4, jk="cat"), ["convs.2"], "hands 2 values on"),
        (TwiceNet(8, 4), ["prop"], "uses the weights of mid on both sides of a cut"),
    ],
)
def test_split_points_that_cannot_work_are_usage_errors(module, split, message):
    with pytest.raises(UsageError, match=message):
        to_block_model(module, split_at=split)


def test_a_stage_starting_in_place_gets_its_own_copy_of_the_input():
    module = InPlaceNet(8, 4)
    bm = to_block_model(module, split_at=["act"])
    x, ei = random_graph()
    h = bm.blocks[0](x, ei).detach().requires_grad_()  # as the second stage receives it
    out = bm.blocks[1](h, ei)
    out.sum().backward()
    assert h.grad is not None and torch.equal(out, module.lin2(module.prop(h.relu(), ei)))


def test_a_blocks_model_whose_forward_does_otherwise_is_refused():
    x, ei = random_graph()
    good = to_block_model(BlocksNet(8, 4))
    check_same_output(good, x, ei)
    bad = to_block_model(MisleadingBlocksNet(8, 4))
    with pytest.raises(UsageError, match="does not compute what its forward computes"):
        check_same_output(bad, x, ei)


@pytest.mark.parametrize(
    "module, hops",
    [
        (GIN(8, 16, 2, 4), 2),
        (GAT(8, 16, 3, 4, v2=True), 3),
        (GCN(8, 16, 2, 4), 3),
        (GCN(8, 16, 2, 4, normalize=False), 2),
        (APPNPNet(8, 4, K=5), 6),
        (nn.Sequential(nn.Linear(8, 8)), 0),
    ],
)
def test_hops_count_propagations_and_one_more_for_source_degrees(module, hops):
    assert message_passing_hops(module) == hops


class _Shared(nn.Module):
    """One GIN layer applied three times: three hops, one module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)
        self.conv = GIN(16, 16, 1, 16).convs[0]
        self.out = nn.Linear(16, 4)

    def forward(self, x, edge_index):
        x = self.lin(x)
        for _ in range(3):
            x = self.conv(x, edge_index).relu()
        return self.out(x)


def test_a_layer_called_three_times_counts_three_hops_given_a_probe_graph():
    x, ei = random_graph()
    module = _Shared()
    assert message_passing_hops(module) == 1  # the modules alone
    assert message_passing_hops(module, x[:10], ei[:, (ei < 10).all(0)]) == 3
    assert exact_rows(module, *random_graph(n=60, edges=90), 3)
    assert not exact_rows(module, *random_graph(n=60, edges=90), 2)


class _Convs(nn.Module):
    def __init__(self, conv: nn.Module, tail: nn.Module | None = None) -> None:
        super().__init__()
        self.conv, self.tail = conv, tail

    def forward(self, x, edge_index):
        x = self.conv(x, edge_index)
        return x if self.tail is None else self.tail(x.relu(), edge_index)


def exact_rows(module: nn.Module, x, ei, hops: int) -> bool:
    """Each micro-batch (targets + their ``hops``-hop subgraph) gives its targets' full rows."""
    module.eval()
    with torch.no_grad():
        full = module(x, ei)
        plan = build_plan(ei, x.size(0), torch.arange(x.size(0)), 4, hops, "exact", 0)
        for b in plan.batches:
            if not torch.allclose(module(x[b.nodes], b.edge_index)[b.out_pos], full[b.out_nodes]):
                return False
    return True


@pytest.mark.parametrize(
    "name, module",
    [
        ("GIN", GIN(8, 16, 3, 4)),
        ("GATv2", GAT(8, 16, 2, 4, v2=True, heads=2)),
        ("GCN", GCN(8, 16, 2, 4)),
        ("APPNP", APPNPNet(8, 4, K=3)),
        ("SGConv K=2", _Convs(SGConv(8, 4, K=2))),
        ("ChebConv K=3 then GIN", _Convs(ChebConv(8, 8, K=3), GIN(8, 8, 1, 4).convs[0])),
    ],
)
def test_exact_micro_batches_equal_the_full_batch_with_the_counted_hops(name, module):
    torch.manual_seed(0)
    x, ei = random_graph(n=60, edges=90)  # sparse: many distances, few whole-graph halos
    hops = message_passing_hops(module)
    assert message_passing_hops(module, x, ei) == hops  # each layer called once
    assert exact_rows(module, x, ei, hops), name
    assert not exact_rows(module, x, ei, hops - 1), f"{name}: {hops - 1} hops were enough"


@pytest.mark.parametrize(
    "module, names",
    [
        (GIN(8, 16, 2, 4), []),
        (
            GIN(8, 16, 2, 4, norm="batch_norm"),
            ["convs.0.nn.norms.0", "convs.1.nn.norms.0", "norms.0"],
        ),
        (GCN(8, 16, 2, 4, norm="layer_norm"), ["norms.0"]),  # PyG's default mode: "graph"
        (GCN(8, 16, 2, 4, norm="layer_norm", norm_kwargs={"mode": "node"}), []),
        (GCN(8, 16, 2, 4, norm="graph_norm"), ["norms.0"]),
    ],
)
def test_layers_whose_statistics_span_the_batch_are_named(module, names):
    assert batch_statistics(module) == names
