"""A user's model as a :class:`~gnnpar.models.base.BlockModel`, so a pipeline can cut it (issue 20).

``to_block_model(module)`` returns ``stem -> blocks -> head`` built from the module's own
submodules, whose blocks, run one after the other, compute the same operations in the same order
as ``module(x, edge_index)`` (the same floats, dropout draws included); its own forward is the
module's. Parameters and buffers are shared objects, so training the block model (its stages)
trains ``module``, and loading weights into one loads them into the other. What can be cut, and
where:

* PyG's ``BasicGNN`` (GCN, GraphSAGE, GIN, GAT, EdgeCNN, PNA, ...): one block per conv, with its
  activation, norm and dropout exactly as ``BasicGNN.forward`` (``act_first``, ``norm``,
  ``jk``). With jumping knowledge ``cat``/``max``/``lstm`` the blocks carry every layer's output
  so far, concatenated along the features (one tensor crosses each cut); the head applies
  ``jk`` and the final ``lin``. The blocks' forward is the same floats; their gradients equal
  BasicGNN's to rounding only: a layer's output gradient, from the next conv and from ``jk``,
  is summed in another order.
* ``torch_geometric.nn.Sequential("x, edge_index", [...])``: cut wherever only one tensor (and
  the graph) is live between two children. (A plain ``torch.nn.Sequential`` cannot take
  ``(x, edge_index)``: its forward takes one input.)
* a module exposing ``blocks`` (and optionally ``stem`` and ``head``): taken as
  ``stem -> blocks -> head`` with each block ``(x, edge_index) -> x``; the strategies check that
  convention against the module's own forward (:func:`check_same_output`).
* otherwise, at the submodules named by ``split_at`` (``--split-at convs.1,convs.2``: cut just
  before the first call of each), from a ``torch.fx`` trace of the module's forward in which
  every submodule is a leaf, split by ``torch.fx.passes.split_module``; refused where more than
  one value, or a module's weights, would cross a cut. ``torch.distributed.pipelining.pipeline()``
  cannot be used for GNNs in torch 2.13: it exports with static shapes (no dynamic-shape
  argument), so the traced stages only accept the very graph they were traced on (GCNConv's
  added self-loops: "Sizes of tensors must match"; GATv2Conv: "Runtime assertion failed for
  expression u0 <= E"), while every graph micro-batch has its own edge count; and it refuses
  GINConv outright ("Child module 'aggr_module' is not a descendant of parent module
  'convs.1'"). The fx trace keeps MessagePassing layers whole, so no shape is baked in.
* anything else is one block (``splittable = False``, with ``why_not_splittable`` saying how to
  make it splittable); a pipeline of more than one stage refuses it.

Blocks without trainable parameters join the next one, no block starts with an in-place module
(a stage's input is a leaf), and :func:`join_where_not_tensors` joins blocks whose output is no
tensor: every stage trains something and sends one tensor.

:func:`message_passing_hops` is the receptive field the exact micro-batches need;
:func:`batch_statistics` names the layers (batch norms) for which no micro-batch is exact.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Sequence

import torch
from torch import nn

from gnnpar.models.base import BlockModel

HOW_TO_SPLIT = (
    "make it splittable with one of: a torch_geometric.nn.models BasicGNN (GCN, GraphSAGE, GIN, "
    "GAT, EdgeCNN, PNA); a torch_geometric.nn.Sequential('x, edge_index', [...]); a module "
    "with a `blocks` list (optional `stem`, `head`) whose forward is stem -> each block(x, "
    "edge_index) -> head; or --split-at NAME,NAME naming the submodules to cut before"
)


class AdaptedModel(BlockModel):
    """A BlockModel made of ``user_module``'s own submodules (see the module docstring).

    ``user_module`` is held as a plain attribute, not a child: the block model's parameters,
    state dict and checkpoints name each tensor once, by its place in the blocks.
    """

    def __init__(
        self,
        user_module: nn.Module,
        blocks: list[nn.Module],
        head: nn.Module | None = None,
        stem: nn.Module | None = None,
        how: str = "",
        why_not: str | None = None,
    ) -> None:
        super().__init__(_with_parameters(blocks), head=head, stem=stem)
        self.__dict__["user_module"] = user_module
        self.how = how  # how it was cut (result.json, messages)
        self.splittable = why_not is None
        self.why_not_splittable = why_not

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        """The user's module itself: a run without stages trains exactly it (its gradients
        too); pipeline stages run the blocks (:meth:`run_blocks`)."""
        return self.user_module(x, edge_index)

    def run_blocks(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """stem -> blocks -> head, as the stages run them one after the other."""
        return super().forward(x, edge_index)

    def train(self, mode: bool = True) -> AdaptedModel:
        self.user_module.train(mode)  # modules outside the blocks see the same mode
        return super().train(mode)


def _with_parameters(blocks: list[nn.Module]) -> list[nn.Module]:
    """Blocks without trainable parameters (a dropout, an activation, jumping knowledge's
    concatenation) joined with the next one (the last ones with the one before): a pipeline
    stage of them alone would have nothing to train."""
    groups: list[list[nn.Module]] = []
    pending: list[nn.Module] = []
    for block in blocks:
        pending.append(block)
        if any(p.requires_grad for p in block.parameters()):
            groups.append(pending)
            pending = []
    if pending and groups:
        groups[-1].extend(pending)
    elif pending:
        groups.append(pending)
    return [g[0] if len(g) == 1 else _Chain(g) for g in groups]


def to_block_model(module: nn.Module, *, split_at: Sequence[str] | None = None) -> AdaptedModel:
    """``module`` as ``stem -> blocks -> head``, cut where it can be (module docstring).

    With ``split_at`` the cuts are exactly there, or a :class:`gnnpar.UsageError` says why not.
    """
    from torch_geometric.nn import Sequential as PyGSequential
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if split_at:
        return _split_by_fx(module, list(split_at))
    if isinstance(module, BasicGNN) and type(module).forward is BasicGNN.forward:
        return _from_basic_gnn(module)
    if type(module) is PyGSequential:
        bm = _from_pyg_sequential(module)
        if bm is not None:
            return bm
    blocks = getattr(module, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)) and len(blocks) > 0:
        stem, head = getattr(module, "stem", None), getattr(module, "head", None)
        stem = stem if isinstance(stem, nn.Module) else None
        head = head if isinstance(head, nn.Module) else None
        return AdaptedModel(module, list(blocks), head=head, stem=stem, how="blocks")
    return AdaptedModel(
        module, [_Whole(module)], how="one block", why_not=cannot_cut(type(module).__name__)
    )


def cannot_cut(name: str) -> str:
    return f"gnnpar cannot cut the model {name} into pipeline stages by itself; {HOW_TO_SPLIT}."


def why_not_by_class(cls: type) -> str | None:
    """For one of PyG's model classes, known before it is built: None where to_block_model cuts
    its instances (BasicGNNs, Sequential), else why not (:func:`cannot_cut`)."""
    from torch_geometric.nn import Sequential as PyGSequential
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if issubclass(cls, BasicGNN) and cls.forward is BasicGNN.forward:
        return None
    if cls is PyGSequential:
        return None
    return cannot_cut(cls.__name__)


class _Whole(nn.Module):
    """The whole user module as one block."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.module(x, edge_index)


# --- PyG BasicGNN ------------------------------------------------------------------------------


class _BasicGNNLayer(nn.Module):
    """Layer ``i`` of a BasicGNN: conv, then (except on the last layer without jk) act/norm in
    ``act_first`` order, dropout. ``carry``: jumping knowledge needs every layer's output, so the
    input is all previous outputs concatenated (features of the last one at the end) and the
    output appends this layer's."""

    def __init__(self, gnn: nn.Module, i: int, carry: bool) -> None:
        super().__init__()
        self.conv, self.norm = gnn.convs[i], gnn.norms[i]
        self.act, self.dropout = gnn.act, gnn.dropout
        self.act_first = gnn.act_first
        self.norm_batch = gnn.supports_norm_batch
        self.edge_weight, self.edge_attr = gnn.supports_edge_weight, gnn.supports_edge_attr
        self.post = i < gnn.num_layers - 1 or gnn.jk_mode is not None
        self.carry = carry and i > 0
        self.hidden = gnn.hidden_channels

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = h[..., -self.hidden :].contiguous() if self.carry else h
        if self.edge_weight and self.edge_attr:
            x = self.conv(x, edge_index, edge_weight=None, edge_attr=None)
        elif self.edge_weight:
            x = self.conv(x, edge_index, edge_weight=None)
        elif self.edge_attr:
            x = self.conv(x, edge_index, edge_attr=None)
        else:
            x = self.conv(x, edge_index)
        if self.post:
            if self.act is not None and self.act_first:
                x = self.act(x)
            x = self.norm(x, None, None) if self.norm_batch else self.norm(x)
            if self.act is not None and not self.act_first:
                x = self.act(x)
            x = self.dropout(x)
        if self.carry:
            return torch.cat([h, x], dim=-1)
        return x


class _BasicGNNHead(nn.Module):
    """BasicGNN's readout: jumping knowledge over the carried layer outputs, then ``lin``."""

    def __init__(self, gnn: nn.Module) -> None:
        super().__init__()
        self.jk = getattr(gnn, "jk", None)
        self.lin = getattr(gnn, "lin", None)
        self.hidden = gnn.hidden_channels

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.jk is not None:
            h = self.jk(list(h.split(self.hidden, dim=-1)))
        return self.lin(h) if self.lin is not None else h


def _from_basic_gnn(gnn: nn.Module) -> AdaptedModel:
    carry = hasattr(gnn, "jk")  # jk "cat", "max", "lstm" read every layer's output
    blocks = [_BasicGNNLayer(gnn, i, carry) for i in range(len(gnn.convs))]
    head = _BasicGNNHead(gnn) if carry or hasattr(gnn, "lin") else None
    return AdaptedModel(gnn, blocks, head=head, how=f"{type(gnn).__name__}: one block per conv")


# --- torch_geometric.nn.Sequential -------------------------------------------------------------


class _SequentialRun(nn.Module):
    """Children ``[lo, hi)`` of a PyG Sequential: ``feat`` holds the one live tensor on entry,
    ``graph`` the graph input; returns the child output the next run (or the caller) reads."""

    def __init__(self, seq: nn.Module, lo: int, hi: int, feat: str, graph: str, out: str | None):
        super().__init__()
        self.children_ = seq._children[lo:hi]
        self.mods = nn.ModuleList(
            [m for c in self.children_ if isinstance(m := getattr(seq, c.name), nn.Module)]
        )
        self.calls = [getattr(seq, c.name) for c in self.children_]
        self.feat, self.graph, self.out = feat, graph, out

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        values = {self.feat: x, self.graph: edge_index}
        outs = x
        for child, call in zip(self.children_, self.calls):
            outs = call(*[values[n] for n in child.param_names])
            if len(child.return_names) == 1:
                values[child.return_names[0]] = outs
            else:
                values.update(zip(child.return_names, outs))
        return outs if self.out is None else values[self.out]


def _from_pyg_sequential(seq: nn.Module) -> AdaptedModel | None:
    inputs = list(seq.signature.param_dict)
    if len(inputs) != 2:
        return None
    feat, graph = inputs
    children = seq._children
    if any(graph in c.return_names for c in children):
        return None  # the graph changes along the way: no stage could look it up
    # after child i, the values later children read (before writing them again)
    cuts, live_feat = [], []
    for i in range(len(children) - 1):
        live, written = set(), set()
        for c in children[i + 1 :]:
            live |= {n for n in c.param_names if n not in written}
            written |= set(c.return_names)
        live.discard(graph)
        in_place = getattr(getattr(seq, children[i + 1].name), "inplace", False) is True
        if len(live) == 1 and not in_place:  # a stage's input is a leaf: not changed in place
            cuts.append(i + 1)
            live_feat.append(live.pop())
    if not cuts:
        return None
    edges = [0, *cuts, len(children)]
    ins = [feat, *live_feat]
    outs: list[str | None] = [*live_feat, None]
    blocks = [
        _SequentialRun(seq, lo, hi, ins[k], graph, outs[k])
        for k, (lo, hi) in enumerate(zip(edges, edges[1:]))
    ]
    return AdaptedModel(seq, blocks, how="torch_geometric.nn.Sequential: cut between children")


# --- --split-at: a torch.fx trace with every submodule a leaf ----------------------------------


class _LeafTracer(torch.fx.Tracer):
    """Keeps every submodule whole except those that contain a split point."""

    def __init__(self, ancestors: set[str]) -> None:
        super().__init__()
        self.ancestors = ancestors

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name not in self.ancestors


class _FxStage(nn.Module):
    """One piece of the split trace, called as ``(x, edge_index) -> x``. Traces of the training
    and the evaluation forward are both kept: ``self.training`` read in the forward (e.g.
    ``F.dropout(x, training=self.training)``) is a constant in a trace."""

    def __init__(self, pieces: dict[bool, nn.Module], args: dict[bool, list[str]]) -> None:
        super().__init__()
        self.train_piece, self.eval_piece = pieces[True], pieces[False]
        self.args = args

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        piece = self.train_piece if self.training else self.eval_piece
        if x.is_leaf and x.requires_grad:  # a stage's input: the piece may change it in place
            x = x.clone()
        given = {"x": x, "edge_index": edge_index}
        return piece(*[given[a] for a in self.args[self.training]])


def _split_by_fx(module: nn.Module, split_at: list[str]) -> AdaptedModel:
    from gnnpar.errors import UsageError

    name = type(module).__name__
    names = dict(module.named_modules())
    unknown = [s for s in split_at if s not in names or s == ""]
    if unknown:
        sample = ", ".join(n for n in list(names)[1:9])
        raise UsageError(
            f"--split-at {','.join(unknown)}: no such submodule in the model {name}; "
            f"name submodules as in model.named_modules(), e.g. {sample}."
        )
    ancestors = {""} | {s.rsplit(".", k)[0] for s in split_at for k in range(1, s.count(".") + 1)}
    from torch_geometric.nn import MessagePassing

    inside = sorted(a for a in ancestors if isinstance(names[a], MessagePassing))
    if inside:
        raise UsageError(
            f"--split-at {','.join(split_at)}: {inside[0]} is a message-passing layer; a "
            f"pipeline cuts between layers: name {inside[0]} itself or a module after it."
        )
    params = list(inspect.signature(module.forward).parameters.values())
    concrete = {p.name: p.default for p in params[2:] if p.default is not inspect.Parameter.empty}
    if len(params) < 2 or len(concrete) != len(params) - 2:
        raise UsageError(
            f"--split-at needs the model {name}'s forward to take (x, edge_index) and nothing "
            f"else without a default; {HOW_TO_SPLIT}."
        )
    pieces: dict[bool, list[nn.Module]] = {}
    args: dict[bool, list[list[str]]] = {}
    was_training = module.training
    try:
        for mode in (True, False):
            module.train(mode)
            pieces[mode], args[mode] = _trace_and_split(module, split_at, ancestors, concrete)
    finally:
        module.train(was_training)
    blocks = [
        _FxStage({m: pieces[m][k] for m in pieces}, {m: args[m][k] for m in args})
        for k in range(len(split_at) + 1)
    ]
    return AdaptedModel(module, blocks, how=f"--split-at {','.join(split_at)} (torch.fx)")


def _trace_and_split(
    module: nn.Module, split_at: list[str], ancestors: set[str], concrete: dict
) -> tuple[list[nn.Module], list[list[str]]]:
    """A user's ``module`` traced by torch.fx and split before each of ``split_at``: the pieces
    (stages' blocks) and, per piece, the names it holds; a UsageError naming what stops the
    split (tracing, a missing or late name, a weight or a tensor used across pieces, a piece
    with more than one input or output).

    Why one function: each check reads the traced graph and the node -> piece map the previous
    ones built, in the order the graph is split."""
    from torch.fx.passes.split_module import split_module

    from gnnpar.errors import UsageError

    name = type(module).__name__
    try:
        graph = _LeafTracer(ancestors).trace(module, concrete_args=concrete)
    except Exception as e:  # noqa: BLE001 - any failure of a user's forward under tracing
        raise UsageError(
            f"--split-at: torch.fx cannot trace the forward of the model {name} "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {HOW_TO_SPLIT}."
        ) from None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    feat, graph_in = placeholders[0], placeholders[1]
    for extra in placeholders[2:]:  # arguments fixed at their defaults: only checked, unused
        for user in list(extra.users):
            if user.op == "call_function" and not user.users and "assert" in str(user.target):
                graph.erase_node(user)
        if extra.users:
            raise UsageError(
                f"--split-at: the forward of the model {name} computes with its argument "
                f"{extra.target} beyond (x, edge_index); {HOW_TO_SPLIT}."
            )
        graph.erase_node(extra)
    gm = torch.fx.GraphModule(module, graph)
    part, seen, of = 0, set(), {}
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target in split_at and node.target not in seen:
            seen.add(node.target)
            part += 1
        of[node] = part
    missing = [s for s in split_at if s not in seen]
    if missing:
        raise UsageError(
            f"--split-at {','.join(missing)}: the forward of the model {name} never calls "
            f"that submodule itself; name submodules its forward calls."
        )
    owner: dict[int, tuple[int, str]] = {}  # tensor id -> (stage, who used it first)
    for node in gm.graph.nodes:
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            tensors = [*mod.parameters(), *mod.buffers()]
        elif node.op == "get_attr":
            tensors = [operator.attrgetter(node.target)(gm)]  # a weight read directly
        else:
            continue
        for t in tensors:
            stage, who = owner.setdefault(id(t), (of[node], node.target))
            if stage != of[node]:
                raise UsageError(
                    f"--split-at {','.join(split_at)}: the model {name} uses the weights of "
                    f"{who} on both sides of a cut; a stage holds its own weights: cut where "
                    f"each submodule is used on one side only."
                )
    for node in gm.graph.nodes:
        if node is graph_in:
            continue  # every stage looks the graph up itself
        late = [u for u in node.users if of[u] > of[node] + (0 if node is feat else 1)]
        if late:
            raise UsageError(
                f"--split-at {','.join(split_at)}: a value computed before a cut is read "
                f"after it ({node.name} by {late[0].name}); a pipeline sends one tensor from "
                f"stage to stage: choose cuts that only the running features cross."
            )
    split = split_module(gm, module, lambda n: of[n], keep_original_order=True)
    pieces, arg_names = [], []
    for k in range(len(split_at) + 1):
        piece = getattr(split, f"submod_{k}")
        inputs = [n for n in piece.graph.nodes if n.op == "placeholder"]
        crossing = [n for n in inputs if n.name != graph_in.name]
        if len(crossing) != 1:
            raise UsageError(
                f"--split-at {','.join(split_at)}: stage {k} of the model {name} reads "
                f"{len(crossing)} values from the stage before it, not one tensor; choose cuts "
                f"that only the running features cross."
            )
        outputs = next(n for n in piece.graph.nodes if n.op == "output").args[0]
        if isinstance(outputs, (tuple, list)) and len(outputs) != 1:
            raise UsageError(
                f"--split-at {','.join(split_at)}: stage {k} of the model {name} hands "
                f"{len(outputs)} values on, not one tensor; choose cuts that only the running "
                f"features cross."
            )
        pieces.append(_Single(piece))
        arg_names.append(["edge_index" if n.name == graph_in.name else "x" for n in inputs])
    return pieces, arg_names


class _Single(nn.Module):
    """A split_module piece returns its one value bare or in a 1-tuple; always bare."""

    def __init__(self, piece: nn.Module) -> None:
        super().__init__()
        self.piece = piece

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.piece(*args)
        return out[0] if isinstance(out, (tuple, list)) else out


# --- receptive field ---------------------------------------------------------------------------


def _propagations(m: nn.Module) -> int:
    """Edges one call of a MessagePassing layer reaches: K for the K-step propagations."""
    from torch_geometric.nn import APPNP, ARMAConv, ChebConv, SGConv, SSGConv, TAGConv

    if isinstance(m, ChebConv):
        return max(len(m.lins) - 1, 0)  # T_0 .. T_{K-1}: K-1 propagations
    if isinstance(m, (APPNP, SGConv, SSGConv, TAGConv)):
        return int(m.K)
    if isinstance(m, ARMAConv):
        return int(m.num_layers)
    return 1


def _reads_source_degree(m: nn.Module) -> bool:
    """True for layers that normalise a message by its *source* node's degree (D^-1/2 A D^-1/2):
    the source's degree reads its own in-edges, one hop further than its features."""
    from torch_geometric.nn import (
        APPNP,
        ARMAConv,
        ChebConv,
        FAConv,
        GCN2Conv,
        GCNConv,
        LGConv,
        SGConv,
        SSGConv,
        TAGConv,
    )

    if isinstance(m, (SGConv, SSGConv, ARMAConv)):
        return True
    if isinstance(m, ChebConv):
        return m.normalization == "sym"
    if isinstance(m, (GCNConv, APPNP, TAGConv, GCN2Conv, FAConv, LGConv)):
        return bool(getattr(m, "normalize", True))
    return False


def message_passing_hops(
    module: nn.Module, x: torch.Tensor | None = None, edge_index: torch.Tensor | None = None
) -> int:
    """The receptive field in edges: the propagation steps of the ``MessagePassing`` layers on
    the path (one per layer; K for APPNP, SGConv, TAGConv, ...), plus one when any of them
    normalises by the source node's degree (GCN's rule,
    :func:`gnnpar.data.microbatch.receptive_hops`: the symmetric normalisation reads the
    neighbours' degrees, so one hop more).

    Counted from the modules, once each; given a probe graph ``(x, edge_index)``, also from the
    ``propagate`` calls of one forward on it (a layer the forward calls three times counts three
    times; layers side by side are added up, which can only overestimate), and the larger count
    wins. Message passing written without a ``MessagePassing`` module is not seen: ``--hops``
    overrides the count.
    """
    from torch_geometric.nn import MessagePassing

    layers = [m for m in module.modules() if isinstance(m, MessagePassing)]
    inner = {id(c) for m in layers for c in m.modules() if c is not m}
    layers = [m for m in layers if id(m) not in inner]  # a conv inside a conv: the outer one
    hops = sum(_propagations(m) for m in layers)
    if x is not None and edge_index is not None and layers:
        hops = max(hops, _propagate_calls(module, layers, x, edge_index))
    return hops + (1 if any(_reads_source_degree(m) for m in layers) else 0)


@torch.no_grad()
def _propagate_calls(module: nn.Module, layers: list, x: torch.Tensor, edge_index) -> int:
    """``propagate`` calls of the outer message-passing layers in one evaluation forward."""
    calls = [0]

    def count(conv, inputs, output):  # noqa: ANN001, ANN202 - PyG's propagate hook
        calls[0] += 1

    handles = [m.register_propagate_forward_hook(count) for m in layers]
    was = module.training
    module.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            module(x, edge_index)
    finally:
        module.train(was)
        for h in handles:
            h.remove()
    return calls[0]


class _Chain(nn.Module):
    """Blocks run one after the other as one block."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x, edge_index)
        return x


@torch.no_grad()
def join_where_not_tensors(bm: AdaptedModel, x: torch.Tensor, edge_index: torch.Tensor) -> None:
    """Join each block whose output on the probe ``(x, edge_index)`` is no tensor (a PyG
    Sequential cut where a list is the one live value, as before its JumpingKnowledge) with the
    next: a pipeline sends tensors only. Changes ``bm.blocks`` in place."""
    was = bm.training
    bm.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            h, groups = bm.stem(x), [[]]
            for i, block in enumerate(bm.blocks):
                h = block(h, edge_index)
                groups[-1].append(block)
                if torch.is_tensor(h) and i < len(bm.blocks) - 1:
                    groups.append([])
    finally:
        bm.train(was)
    if len(groups) < len(bm.blocks):
        bm.blocks = nn.ModuleList(g[0] if len(g) == 1 else _Chain(g) for g in groups)


def batch_statistics(module: nn.Module) -> list[str]:
    """Names of the submodules whose output for a node depends on the other nodes of the batch
    (BatchNorm in training; PyG's graph-mode LayerNorm, GraphNorm, InstanceNorm, PairNorm,
    MeanSubtractionNorm, DiffGroupNorm, GraphSizeNorm always): over exact micro-batches they see
    each micro-batch, halo and padding included, not the whole graph, so the micro-batches give
    the full-batch result only for models without them."""
    from torch_geometric.nn import norm as pyg

    always = (
        pyg.GraphNorm,
        pyg.InstanceNorm,
        pyg.PairNorm,
        pyg.MeanSubtractionNorm,
        pyg.DiffGroupNorm,
        pyg.GraphSizeNorm,
    )
    batch = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, pyg.BatchNorm)
    found = []
    for name, m in module.named_modules():
        graph_mode = isinstance(m, pyg.LayerNorm) and m.mode == "graph"
        if graph_mode or isinstance(m, always + batch):
            if not any(name.startswith(f + ".") for f in found):  # PyG BatchNorm wraps one
                found.append(name)
    return found


@torch.no_grad()
def check_same_output(bm: AdaptedModel, x: torch.Tensor, edge_index: torch.Tensor) -> None:
    """Raise a UsageError unless the block model's evaluation forward equals the user module's
    on ``(x, edge_index)`` (a ``blocks`` model whose forward is not stem -> blocks -> head, for
    instance). Within float tolerance, not bit for bit: the cut runs the same operations, but a
    GPU's scatter-add need not sum in the same order twice."""
    from gnnpar.errors import UsageError

    was = bm.training
    bm.eval()
    try:
        ours, theirs = bm.run_blocks(x, edge_index), bm.user_module(x, edge_index)
    finally:
        bm.train(was)
    if not (
        torch.is_tensor(theirs)
        and ours.shape == theirs.shape
        and torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    ):
        raise UsageError(
            f"The model {type(bm.user_module).__name__} cut as {bm.how} does not compute what "
            f"its forward computes; {HOW_TO_SPLIT}."
        )
