"""Automatic stage split (TorchAcc-style): trace the model, cost every node, cut where the slowest stage is fastest.

Design note
-----------
TorchAcc applies pipeline parallelism to the FX graph: it finds the stages in the traced graph and picks the cut
points.  Here:

1. **Trace** with `torch.fx` (a `Tracer` whose leaves are `nn.Linear`-like modules and `shardlab.models.Attention`
   — one node per attention, whose parameters stay inside it).
2. **Cost** every node by running the graph once on an example batch (`fx.Interpreter`): forward FLOPs counted
   by PyTorch's own `torch.utils.flop_counter.FlopCounterMode` around that node (matmuls only, 2 per
   multiply-add — the convention of `shardlab.formulas.flops`, whose `transformer_flops` the tests check the
   total against), parameter bytes of the module a node calls, and the bytes of the tensor it outputs.  Those
   outputs are NOT what autograd keeps for the backward: one block of notebook 09's default model outputs
   458,752 B over its nodes, while autograd saves 608,512 B of distinct tensors for it (641,280 B counting each
   saved tensor once per use: the block's input, LayerNorm's statistics, attention's reshaped copies);
   `saved_bytes` measures the latter with `torch.autograd.graph.saved_tensors_hooks`.  A node's training cost
   is 3 x its forward FLOPs (backward = 2 x forward, as in the formulas).  The embedding is heavy in
   parameters (V h) but costs no matmul FLOPs (a gather); the LM head is heavy in both, and the loss after it
   (softmax + cross-entropy over [b s, V]) runs on the last stage too — no matmul FLOPs, but its saved
   log-probabilities are the largest activation of the model when V >> h.
3. **Cut candidates**: positions in the node order after which exactly ONE tensor is still needed later (the
   activation the next stage receives; e.g. between blocks, or between a block's attention and its MLP, never
   inside the residual branch).
4. **Choose** the p - 1 cuts minimising the slowest stage's cost exactly: dynamic programming over the candidates
   (best[j][t] = the smallest max-cost of j stages ending at candidate t), O(p C^2).  `brute_force_cuts` tries
   every combination (the test oracle on small graphs).
5. **Split** with `torch.fx.passes.split_module`: one GraphModule per stage; composing them is the unsplit model
   (same ops in the same order: the tests compare with `torch.equal`).

`even_cuts` is the usual alternative: L/p transformer blocks per stage, the embedding on the first stage, the
final norm and the LM head on the last.  `compare_splits` puts the two side by side: each stage's cost, the
slowest stage, and the step time they predict (GPipe's flow-shop formula, 1F1B timed by the simulator).

Example::

    traced = trace(TinyLM(cfg), tokens)
    auto = best_cuts(traced.train_costs, traced.frontier, p=4)       # (max stage cost, cut positions)
    stages = split(traced, auto.cuts)                                 # 4 runnable GraphModules
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from shardlab.formulas.pipeline import pipeline_step_time
from shardlab.models import Attention
from shardlab.pipeline.schedules import build
from shardlab.pipeline.timeline import simulate

LEAF_MODULES: tuple[type[nn.Module], ...] = (Attention,)

__all__ = [
    "Cuts", "NodeCost", "SplitCost", "StageCost", "Stages", "Traced", "best_cuts", "brute_force_cuts",
    "compare_splits", "even_cuts", "saved_bytes", "split", "stage_costs", "stage_saved_bytes", "trace",
]


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, LEAF_MODULES) or super().is_leaf_module(m, module_qualified_name)


@dataclass(frozen=True)
class NodeCost:
    name: str
    op: str  # placeholder | call_module | call_function | call_method | get_attr | output
    layer: str  # the model's top-level child the node belongs to: "embed", "blocks.3", "head"; "" for none
    flops: float  # forward FLOPs of this node (FlopCounterMode)
    param_bytes: int  # parameters of the module it calls (or the tensor it fetches)
    act_bytes: int  # bytes of its tensor output(s)


@dataclass(frozen=True)
class Traced:
    model: nn.Module
    gm: fx.GraphModule
    nodes: tuple[NodeCost, ...]  # graph order
    frontier: tuple[int, ...]  # positions k: a cut after node k hands exactly one tensor to the next stage
    boundary: dict[int, tuple[tuple[int, ...], torch.dtype]]  # k -> shape, dtype of that tensor

    @property
    def train_costs(self) -> list[float]:
        """Per node, forward + backward FLOPs (3 x forward)."""
        return [3.0 * n.flops for n in self.nodes]


@dataclass(frozen=True)
class StageCost:
    flops: float  # forward FLOPs of the stage
    param_bytes: int
    act_bytes: int
    layers: tuple[str, ...]  # top-level children it holds (in part or whole)


@dataclass(frozen=True)
class Cuts:
    max_cost: float  # the slowest stage's cost (same units as the costs given)
    cuts: tuple[int, ...]  # node positions; stage j holds nodes (cuts[j-1], cuts[j]]


@dataclass(frozen=True)
class Stages:
    modules: tuple[fx.GraphModule, ...]
    param_names: tuple[dict[str, str], ...]  # per stage: its parameter name -> the unsplit model's name
    boundary: tuple[tuple[tuple[int, ...], torch.dtype], ...]  # the tensor each cut hands over (p - 1 entries)


def _layer(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        return next(iter(stack.values()))[0]  # outermost module below the root
    if node.op == "call_module":
        return str(node.target)
    return ""


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


class _CostInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.flops: dict[str, float] = {}
        self.outputs: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        with FlopCounterMode(display=False) as counter:
            out = super().run_node(n)
        self.flops[n.name] = float(counter.get_total_flops())
        self.outputs[n.name] = out
        return out


def trace(model: nn.Module, *example: torch.Tensor) -> Traced:
    """Trace `model`, run it once on `example` to cost every node, find the single-tensor cut positions."""
    graph = _Tracer().trace(model)
    for node in graph.nodes:  # an annotated input (`tokens: torch.Tensor`) makes the GraphModule unpicklable in
        node.type = None      # torch 2.9.0 (its code refers to a global "_torch_Tensor_" that is a str)
    gm = fx.GraphModule(model, graph)
    interp = _CostInterpreter(gm)
    with torch.no_grad():
        interp.run(*example)
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    costs = []
    for n in nodes:
        if n.op == "call_module":
            params = sum(p.numel() * p.element_size() for p in gm.get_submodule(str(n.target)).parameters())
        elif n.op == "get_attr":
            params = _tensor_bytes(interp.outputs.get(n.name))
        else:
            params = 0
        act = 0 if n.op in ("output", "get_attr") else _tensor_bytes(interp.outputs.get(n.name))
        costs.append(NodeCost(n.name, n.op, _layer(n), interp.flops.get(n.name, 0.0), params, act))

    last_use = {n: max((pos[u] for u in n.users), default=pos[n]) for n in nodes}
    frontier, boundary = [], {}
    for k in range(len(nodes) - 2):  # a cut after node k; the output node always stays last
        crossing = [n for n in nodes[: k + 1] if last_use[n] > k]
        if len(crossing) == 1 and crossing[0].op not in ("placeholder", "get_attr"):
            value = interp.outputs[crossing[0].name]
            if isinstance(value, torch.Tensor):
                frontier.append(k)
                boundary[k] = (tuple(value.shape), value.dtype)
    return Traced(model, gm, tuple(costs), tuple(frontier), boundary)


def _check_cut_args(costs: Sequence[float], candidates: Sequence[int], p: int) -> list[int]:
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r} must be an int >= 1")
    cands = sorted(set(candidates))
    if any(not 0 <= c < len(costs) - 1 for c in cands):
        raise ValueError(f"candidates must lie in [0, {len(costs) - 1}) (a cut after the last node is no cut)")
    if p - 1 > len(cands):
        raise ValueError(f"p={p} stages need {p - 1} cuts but the graph has only {len(cands)} cut positions")
    return cands


def best_cuts(costs: Sequence[float], candidates: Sequence[int], p: int) -> Cuts:
    """The p - 1 cuts (from `candidates`) minimising the largest stage sum of `costs`, by dynamic programming."""
    cands = _check_cut_args(costs, candidates, p)
    prefix = [0.0, *itertools.accumulate(costs)]  # prefix[k + 1] = cost of nodes 0..k

    def seg(a: int, b: int) -> float:  # nodes a+1 .. b  (a = -1: from the start)
        return prefix[b + 1] - prefix[a + 1]

    n_last = len(costs) - 1
    if p == 1:
        return Cuts(seg(-1, n_last), ())
    # best[t] for j stages: (max cost, cuts) of the first j stages ending at cands[t]
    best = [(seg(-1, c), (c,)) for c in cands]
    for _ in range(2, p):
        nxt = [(float("inf"), ())] * len(cands)
        for t, c in enumerate(cands):
            for u in range(t):
                if best[u][0] == float("inf"):
                    continue
                value = max(best[u][0], seg(cands[u], c))
                if value < nxt[t][0]:
                    nxt[t] = (value, best[u][1] + (c,))
        best = nxt
    value, cuts = min(((max(b[0], seg(cands[t], n_last)), b[1]) for t, b in enumerate(best)), key=lambda x: x[0])
    return Cuts(value, tuple(cuts))


def brute_force_cuts(costs: Sequence[float], candidates: Sequence[int], p: int) -> Cuts:
    """Every combination of p - 1 cuts; the smallest largest stage (first such combination in sorted order)."""
    cands = _check_cut_args(costs, candidates, p)
    best: Cuts | None = None
    for combo in itertools.combinations(cands, p - 1):
        bounds = [-1, *combo, len(costs) - 1]
        value = max(sum(costs[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds))
        if best is None or value < best.max_cost:
            best = Cuts(value, combo)
    assert best is not None
    return best


def even_cuts(traced: Traced, p: int, block_prefix: str = "blocks.") -> tuple[int, ...]:
    """L/p blocks per stage (the first L % p stages one more), embedding first, norm and head last."""
    blocks = sorted({n.layer for n in traced.nodes if n.layer.startswith(block_prefix)},
                    key=lambda name: int(name[len(block_prefix):]))
    if not 1 <= p <= len(blocks):
        raise ValueError(f"p={p} must be in [1, {len(blocks)}] for an even split of {len(blocks)} blocks")
    sizes = [len(blocks) // p + (j < len(blocks) % p) for j in range(p)]
    cuts = []
    for end in itertools.accumulate(sizes[:-1]):
        last = blocks[end - 1]
        k = max(i for i, n in enumerate(traced.nodes) if n.layer == last)
        if k not in traced.boundary:
            raise ValueError(f"the end of {last} (node {traced.nodes[k].name}) is not a single-tensor cut")
        cuts.append(k)
    return tuple(cuts)


def stage_costs(traced: Traced, cuts: Sequence[int]) -> list[StageCost]:
    """Per stage: forward FLOPs, parameter bytes, activation bytes and the layers it holds."""
    bounds = [-1, *cuts, len(traced.nodes) - 1]
    out = []
    for a, b in itertools.pairwise(bounds):
        part = traced.nodes[a + 1 : b + 1]
        layers = tuple(dict.fromkeys(n.layer for n in part if n.layer))
        out.append(StageCost(sum(n.flops for n in part), sum(n.param_bytes for n in part),
                             sum(n.act_bytes for n in part), layers))
    return out


def split(traced: Traced, cuts: Sequence[int]) -> Stages:
    """One GraphModule per stage (`torch.fx.passes.split_module`); stage j takes the tensor cut j-1 hands over
    (stage 0: the model's input) and returns the tensor cut j hands over (the last: the model's output)."""
    cuts = sorted(cuts)
    bad = [c for c in cuts if c not in traced.boundary]
    if bad:
        raise ValueError(f"cuts {bad} are not single-tensor cut positions (traced.frontier)")
    pos = {n: i for i, n in enumerate(traced.gm.graph.nodes)}

    def stage_of(node: fx.Node) -> int:
        return bisect.bisect_left(cuts, pos[node])  # nodes 0..cuts[0] -> 0, ...

    whole = split_module(traced.gm, traced.model, stage_of)
    modules = tuple(getattr(whole, f"submod_{j}") for j in range(len(cuts) + 1))
    original = {id(p): name for name, p in traced.model.named_parameters()}
    names = tuple({n: original[id(p)] for n, p in m.named_parameters()} for m in modules)
    return Stages(modules, names, tuple(traced.boundary[c] for c in cuts))


@dataclass(frozen=True)
class SplitCost:
    cuts: tuple[int, ...]
    stages: tuple[StageCost, ...]
    max_cost: float  # the slowest stage's training cost (3 x its forward FLOPs), per step
    gpipe_step: float  # step time in FLOP units (forward = its FLOPs, backward = 2 x): pipeline_step_time
    one_f_one_b_step: float  # the same costs timed under 1F1B by the simulator


def compare_splits(traced: Traced, p: int, m: int) -> dict[str, SplitCost]:
    """{"auto": the DP's cuts, "even": L/p blocks per stage}: stage costs and the step each predicts at m
    microbatches (each stage's forward per microbatch = its FLOPs / m, backward twice that)."""
    out = {}
    auto = best_cuts(traced.train_costs, traced.frontier, p).cuts
    for rule, cuts in (("auto", auto), ("even", even_cuts(traced, p))):
        st = stage_costs(traced, cuts)
        f = [s.flops / m for s in st]
        timed = simulate(build("1f1b", p, m), stage_costs=[(x, 2 * x) for x in f]).makespan
        out[rule] = SplitCost(tuple(cuts), tuple(st), 3 * max(s.flops for s in st),
                              pipeline_step_time(f, [2 * x for x in f], m), float(timed))
    return out


def saved_bytes(fn: Any, *inputs: Any) -> int:
    """Bytes autograd keeps for the backward while ``fn(*inputs)`` runs: every tensor saved through
    `torch.autograd.graph.saved_tensors_hooks`, counted once per storage, parameters' storages excluded."""
    params = {p.untyped_storage().data_ptr() for p in getattr(fn, "parameters", list)()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def stage_saved_bytes(stages: Stages, tokens: torch.Tensor, targets: torch.Tensor,
                      loss_fn: Any = None) -> list[int]:
    """Per stage, what autograd saves for ONE microbatch (``tokens`` / ``targets`` [b/m, s]) — the last stage
    with its loss (``loss_fn(logits, targets)``, the model's cross-entropy by default).  Under 1F1B stage s holds
    min(p - s, m) microbatches of it at once, under GPipe m."""
    if loss_fn is None:
        from shardlab.pipeline.model import lm_loss as loss_fn
    out, x = [], tokens
    for j, mod in enumerate(stages.modules):
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        last = j == len(stages.modules) - 1

        def run(inp: torch.Tensor, mod: Any = mod, last: bool = last) -> torch.Tensor:
            y = mod(inp)
            return loss_fn(y, targets) if last else y

        params = {p.untyped_storage().data_ptr() for p in mod.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor, params: set[int] = params, seen: dict[int, int] = seen) -> torch.Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = run(x)
        out.append(sum(seen.values()))
        x = y
    return out
