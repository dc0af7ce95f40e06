"""A real training step (forward, backward, Adam) as an operator DAG with buffer sizes and lifetimes.

Design note
-----------
**The step.** :func:`train_step` is one step of a small stack of blocks — GPT-2 blocks (``shardlab.models.
TransformerBlock``: pre-LayerNorm, causal softmax attention, GeLU MLP, biases) or plain MLP layers — with an MSE loss,
a backward taken block by block (``torch.autograd.grad`` of each block's output w.r.t. its input and its parameters,
last block first: the order PyTorch's autograd engine runs them in), and PyTorch's Adam update written in place
exactly as ``torch.optim.Adam``'s single-tensor path does (:func:`adam_`, tested equal to it). Each parameter's
update runs at the end of the backward (``"end"``: what ``optimizer.step()`` after ``loss.backward()`` does) or as
soon as its block's gradients exist (``"eager"``); a per-parameter choice is a mapping name -> "eager" | "end". The
same function is traced by ``torch.fx`` here and built on the XLA device by :mod:`shardlab.memory.xla_step`.

**The trace.** :func:`trace_step` runs the step under ``make_fx`` in fake mode on meta tensors (nothing is
allocated: any size can be traced): every ATen operator in execution order, each output's storage and its bytes.
The node order is the *program order* (what eager PyTorch executes). Markers placed while tracing label every node
``forward``, ``backward`` or ``update:<parameter>``.

**The DAG** (:func:`dag_from_fx`) is a ``shardlab.profile.order.Graph`` — the memory model of notebook 08, stated
once there — built on *buffers* (storages), not on FX values:

- a buffer is allocated by the operator that first writes a new storage (its size: the storage's bytes) and freed
  right after its last reader or writer ran; while an operator runs, its inputs and its new outputs are live;
- views (``view``, ``t``, ``permute``, ``expand``, ``detach``, ``getitem`` of a tuple result ...) allocate nothing:
  they are folded, and their readers read the base buffer (which stays live as long as any view is read);
- in-place operators (``add_``, ``lerp_``, ``addcdiv_`` ...; found by storage identity, cross-checked with the
  operator schema's write annotation) allocate nothing and write the buffer they mutate; ordering edges keep every
  reader of the old value before the write and every later reader after it (0-byte token tensors in the Graph);
- parameters, Adam moments and the batch (graph inputs) are *resident*: never counted (Adam updates them in place);
  graph outputs (the loss) are counted and stay live to the end. Everything counted is a temporary of the step.

Example (notebook 08b's default step: two MLP layers, batch 8, hidden 16, ffn 64)::

    >>> step = trace_step(MemoryParams(layers=2, hidden=16, ffn=64, step_batch=8))
    >>> step.nodes, step.params[:2]
    (83, ('0.fc1.weight', '0.fc1.bias'))
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.multiprocessing.reductions import StorageWeakRef

from shardlab import models
from shardlab.memory.params import MemoryParams
from shardlab.profile.order import Graph, Op

UPDATES = ("eager", "end")
OPTIMIZERS = ("adam", "none")
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
DTYPE = torch.float32  # the step's element type (4 bytes: the peaks below are float32 bytes)


def build_model(p: MemoryParams) -> torch.nn.ModuleList:
    """``p.layers`` blocks of ``p.model`` on the current default device (``torch.device("meta")`` for tracing),
    seeded by ``p.seed``: GPT-2 blocks (h = ``p.hidden``, ``p.step_heads`` heads, ffn ``p.ffn``) or MLP layers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(p.seed)
        if p.model == "gpt2":
            blocks = [models.TransformerBlock(p.hidden, p.step_heads, p.ffn) for _ in range(p.layers)]
        else:
            blocks = [models.MLP(p.hidden, p.ffn) for _ in range(p.layers)]
    return torch.nn.ModuleList(blocks).to(DTYPE)


def activation_shape(p: MemoryParams) -> tuple[int, int, int]:
    """The step's input and target: [step_batch, step_seq, hidden]."""
    return p.step_batch, p.step_seq, p.hidden


def param_names(model: torch.nn.ModuleList) -> tuple[str, ...]:
    return tuple(n for n, _ in model.named_parameters())


# ---------------------------------------------------------------------------------------------- the step
def adam_(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int = 1,
          lr: float = ADAM["lr"], beta1: float = ADAM["beta1"], beta2: float = ADAM["beta2"],
          eps: float = ADAM["eps"]) -> None:
    """``torch.optim.Adam``'s single-tensor update (no weight decay, not amsgrad), in place on p, m, v."""
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)  # one parameter-sized temporary
    p.addcdiv_(m, denom, value=-step_size)


Mark = Callable[[str], None]


def train_step(model: torch.nn.ModuleList, x: torch.Tensor, target: torch.Tensor, params: Sequence[torch.Tensor],
               ms: Sequence[torch.Tensor], vs: Sequence[torch.Tensor], schedule: Mapping[str, str] | None = None,
               mark: Mark | None = None, after_block: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
               update: str = "end", optimizer: str = "adam") -> list[torch.Tensor]:
    """Forward, block-by-block backward and Adam; returns ``[loss]`` (``optimizer="none"``: ``[loss, *grads]``).

    ``params`` / ``ms`` / ``vs`` follow :func:`param_names`; they are updated in place. ``schedule`` maps a parameter
    name to "eager" or "end" (default ``update``). ``mark(tag)`` is called at every phase boundary;
    ``after_block(g, updated)`` may replace the gradient flowing to the next block after the eager updates of the
    parameters ``updated`` (indices) ran (the XLA build puts an optimization barrier there).
    """
    if update not in UPDATES:
        raise ValueError(f"update={update!r} must be one of {UPDATES}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {OPTIMIZERS}")
    names = param_names(model)
    if not (len(params) == len(ms) == len(vs) == len(names)):
        raise ValueError(f"{len(names)} parameters but params/ms/vs have {len(params)}/{len(ms)}/{len(vs)} tensors")
    sched = {n: update for n in names} | dict(schedule or {})
    bad = {k: v for k, v in sched.items() if k not in names or v not in UPDATES}
    if bad:
        raise ValueError(f"schedule {bad}: keys must be parameter names and values one of {UPDATES}")
    mark = mark or (lambda tag: None)
    index = {n: i for i, n in enumerate(names)}
    per_block: list[list[int]] = [[index[f"{b}.{n}"] for n, _ in blk.named_parameters()]
                                  for b, blk in enumerate(model)]
    leaves = [p.detach().requires_grad_(True) for p in params]
    # forward: every block input is a fresh leaf, so each block's backward is one autograd.grad call
    inputs, outputs = [], []
    h = x
    for b, blk in enumerate(model):
        h_in = h.detach().requires_grad_(b > 0)
        local = {n: leaves[i] for n, i in zip((n for n, _ in blk.named_parameters()), per_block[b], strict=True)}
        h = torch.func.functional_call(blk, local, (h_in,))  # [b, s, h]
        inputs.append(h_in)
        outputs.append(h)
    loss = ((h.float() - target.float()) ** 2).mean()
    mark("forward")
    grads: list[torch.Tensor | None] = [None] * len(params)
    g = torch.autograd.grad(loss, h)[0]  # dL/dh of the last block's output
    for b in reversed(range(len(model))):
        wrt = ([inputs[b]] if b > 0 else []) + [leaves[i] for i in per_block[b]]
        out = torch.autograd.grad(outputs[b], wrt, g)
        for i, gi in zip(per_block[b], out[1:] if b > 0 else out, strict=True):
            grads[i] = gi
        g = out[0] if b > 0 else g
        mark(f"backward:{b}")
        eager = [i for i in per_block[b] if sched[names[i]] == "eager"] if optimizer == "adam" else []
        with torch.no_grad():
            for i in eager:
                adam_(params[i], grads[i], ms[i], vs[i])  # type: ignore[arg-type]
                grads[i] = None
                mark(f"update:{names[i]}")
        if after_block is not None and b > 0:
            g = after_block(g, eager)
    if optimizer == "none":
        return [loss, *grads]  # type: ignore[list-item]
    with torch.no_grad():
        for i, gi in enumerate(grads):
            if gi is not None:
                adam_(params[i], gi, ms[i], vs[i])
                grads[i] = None
                mark(f"update:{names[i]}")
    return [loss]


# ---------------------------------------------------------------------------------------------- the trace
@dataclass
class StepGraph:
    """A traced step: the DAG (program order = ``graph.order``), and what each operator belongs to."""

    p: MemoryParams  # the sizes traced (model, layers, hidden, ffn, step_heads, step_seq, step_batch, seed)
    graph: Graph
    phase: dict[str, str]  # op -> "forward" | "backward:<block>" | "update:<param>"
    params: tuple[str, ...]
    param_bytes: dict[str, int]
    fx_nodes: int  # nodes of the FX graph (views and getitems included)
    folded: int  # FX nodes that are views / renames (no operator in the DAG)
    schedule: dict[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return len(self.graph.ops)

    def update_ops(self) -> dict[str, list[str]]:
        """parameter -> its update's operators, in program order."""
        out: dict[str, list[str]] = {p: [] for p in self.params}
        for op in self.graph.order or ():
            ph = self.phase[op]
            if ph.startswith("update:"):
                out[ph.split(":", 1)[1]].append(op)
        return out

    def resident_bytes(self) -> int:
        """Parameters + Adam moments + batch: the bytes the step keeps resident (not counted in peaks)."""
        return sum(self.graph.external.values())


def _storage_key(t: torch.Tensor) -> int:
    return StorageWeakRef(t.untyped_storage()).cdata


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, list | tuple):
        return [t for v in val for t in _tensors(v)]
    return []


def _writes(node: torch.fx.Node) -> bool:
    """Does the operator's schema declare a written argument (an in-place or out= operator)?"""
    schema = getattr(node.target, "_schema", None)
    return bool(schema and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments))


def dag_from_fx(gm: torch.fx.GraphModule, marks: Sequence[tuple[str, int]] = (),
                name: str = "step") -> tuple[Graph, dict[str, str], int]:
    """The Graph of an FX graph traced in fake mode (module note): ``(graph, phase per op, folded nodes)``.

    ``marks`` are ``(tag, number of FX nodes when the tag was set)``: nodes before the first mark get its tag, and
    so on.
    """
    nodes = list(gm.graph.nodes)
    bounds = sorted(marks, key=lambda m: m[1])

    def phase_of(k: int) -> str:
        for tag, end in bounds:
            if k < end:
                return tag
        return "other"

    buf_of: dict[int, str] = {}  # storage key -> buffer name
    external: dict[str, int] = {}
    ops: list[Op] = []
    phase: dict[str, str] = {}
    readers: dict[str, list[int]] = {}  # buffer -> ops reading it since its last write
    writer: dict[str, int] = {}  # buffer -> last op that allocated or wrote it
    extra_inputs: dict[int, set[str]] = {}
    tokens: dict[int, str] = {}
    folded = 0
    out_bufs: set[str] = set()

    def token(i: int) -> str:
        if i not in tokens:
            tokens[i] = f"~{ops[i].name}"
        return tokens[i]

    for k, node in enumerate(nodes):
        vals = _tensors(node.meta.get("val"))
        if node.op in ("placeholder", "get_attr"):
            for t in vals:
                key = _storage_key(t)
                if key not in buf_of:
                    buf_of[key] = f"{node.name}"
                    external[buf_of[key]] = t.untyped_storage().nbytes()
            continue
        if node.op == "output":
            out_bufs = {buf_of[_storage_key(t)] for t in _tensors([a.meta.get("val") for a in node.all_input_nodes])
                        if _storage_key(t) in buf_of}
            continue
        if node.target is operator.getitem:
            folded += 1
            continue
        ins: list[str] = []
        for a in node.all_input_nodes:
            for t in _tensors(a.meta.get("val")):
                b = buf_of.get(_storage_key(t))
                if b is not None and b not in ins:
                    ins.append(b)
        new = [(t, _storage_key(t)) for t in vals if _storage_key(t) not in buf_of]
        written = [buf_of[_storage_key(t)] for t in vals if _storage_key(t) in buf_of] if _writes(node) else []
        if not new and not written:  # a view or a rename: its readers read the base buffer
            folded += 1
            continue
        i = len(ops)
        outs = []
        for t, key in new:
            if key in buf_of:
                continue  # two outputs on one new storage
            buf_of[key] = f"{node.name}" if len(new) == 1 else f"{node.name}.{len(outs)}"
            outs.append((buf_of[key], t.untyped_storage().nbytes()))
        deps: set[int] = set()
        for b in ins:
            if b in writer:
                deps.add(writer[b])  # read after the last write (true dependency or RAW on a mutated buffer)
        for b in written:
            deps.update(readers.get(b, []))  # write after every read of the old value
            if b in writer:
                deps.add(writer[b])
        op = Op(node.name, tuple(ins), tuple(outs))
        ops.append(op)
        phase[node.name] = phase_of(k)
        extra_inputs[i] = {token(d) for d in deps if d != i and _needs_token(ops, d, ins)}
        for b in ins:
            readers.setdefault(b, []).append(i)
        for b, _ in outs:
            writer[b], readers[b] = i, []
        for b in written:
            writer[b], readers[b] = i, []
    final = []
    for i, op in enumerate(ops):
        tok = ((tokens[i], 0),) if i in tokens else ()
        extra = tuple(sorted(extra_inputs.get(i, set()) - set(op.inputs)))
        final.append(Op(op.name, op.inputs + extra, op.outputs + tok))
    order = tuple(o.name for o in final)
    g = Graph(tuple(final), frozenset(b for b in out_bufs if b not in external), dict(external), order=order,
              name=name)
    return g, phase, folded


def _needs_token(ops: list[Op], d: int, ins: list[str]) -> bool:
    """A token is needed unless op ``d`` already allocated a buffer this op reads (the data edge orders them)."""
    return not any(b in ins for b, _ in ops[d].outputs)


def trace_step(p: MemoryParams, schedule: Mapping[str, str] | None = None, optimizer: str = "adam") -> StepGraph:
    """Trace :func:`train_step` at ``p``'s step sizes on meta tensors (fake mode): the step's DAG in program order
    (every update at the end unless ``schedule`` says "eager"; ``optimizer="none"``: forward + backward only)."""
    with torch.device("meta"):
        model = build_model(p)
        names = param_names(model)
        params = [w.detach() for w in model.parameters()]
        ms = [torch.empty_like(w) for w in params]
        vs = [torch.empty_like(w) for w in params]
        x = torch.empty(activation_shape(p), dtype=DTYPE)
        target = torch.empty(activation_shape(p), dtype=DTYPE)
    marks: list[tuple[str, int]] = []

    def mark(tag: str) -> None:
        mode = get_proxy_mode()
        if mode is not None:
            marks.append((tag, len(mode.tracer.graph.nodes)))

    n = len(params)

    def step(x: torch.Tensor, target: torch.Tensor, *flat: torch.Tensor) -> list[torch.Tensor]:
        return train_step(model, x, target, flat[:n], flat[n:2 * n], flat[2 * n:], schedule, mark,
                          optimizer=optimizer)

    gm = make_fx(step, tracing_mode="fake")(x, target, *params, *ms, *vs)
    graph, phase, folded = dag_from_fx(gm, marks, name=f"{p.model} L={p.layers} step")
    return StepGraph(p, graph, phase, names, {nm: w.numel() * w.element_size() for nm, w in zip(names, params,
                                                                                                 strict=True)},
                     len(gm.graph.nodes), folded, {nm: (schedule or {}).get(nm, "end") for nm in names})
