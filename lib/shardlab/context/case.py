"""Context parallelism as cases (notebook 10): all-gather CP, the ring and Ulysses through the four views.

Design
------
Each case holds the notebook's :class:`~shardlab.context.params.ContextParams` ``p`` and the variant it shows;
:mod:`shardlab.core.harness` runs it through the views (formula, ledger, XLA:CPU, XLA:TPU)::

    AllGatherCase(p, backward, pin)        all-gather CP (Llama 3), contiguous layout: per rank
                                           (shardlab.context.allgather) and as sequence annotations (gspmd)
    RingCase(p, backward, scan, remat)     ring attention: per rank with the hand-written ring backward
                                           (shardlab.context.ring, layout p.layout) and as ONE SPMD program — K/V
                                           stacked on the `context` axis and shifted, unrolled or inside scan
    UlyssesCase(p, backward)               DeepSpeed-Ulysses: all-to-alls sequence <-> heads (kv_heads % cp == 0)

Every view's values are named ``<key>.<...>``; the notebook records them under the prefix ``cp``.

**Counting the ring's traffic, one unit for every view: block transfers.** A block is one rank's K (or V, dK, dV)
shard, b·(s/cp)·hkv·d elements. ``<key>.p2p.count`` is the blocks one rank sends per layer, ``.bytes`` /
``.elements`` what they weigh: the formula's sends (``formulas.context.ring_p2p``), the ledger's send rows (k and v
sent separately), a compiler's collective-permutes counted as they execute — Σ runs · source-target pairs ·
operand elements / devices, divided by the block (the SPMD ring shifts K and V stacked: one permute carries two
blocks; inside ``scan`` it runs trip-count times). Each compiler's own instruction count is recorded beside it,
``<key>.collective_permute.count`` (in the program) and ``.executed`` (times trip counts), compared between
the compilers only when neither split a cyclic shift into several permutes (XLA:TPU does: then recorded with the
measured reason). Two backwards exist: the per-rank ring's own (K/V travel again, dK/dV travel home:
``backward="ring"``) and autograd's through the SPMD ring (every visiting block saved: only dK, dV travel back,
``backward="saved"``), so a forward + backward case names them apart::

    key                    what                                             sources
    ring                   forward (unrolled SPMD ring)                      formula, ledger, hlo, tpu
    ring.scan              forward, the SPMD ring inside scan                formula, hlo, tpu (+ while.trip_count)
    ring.fwd_bwd           forward + the per-rank ring backward             formula, ledger
    ring.spmd.fwd_bwd      forward + autograd's backward, unrolled          formula, hlo, tpu
    ring.scan.fwd_bwd      forward + autograd's backward inside scan        formula, hlo, tpu (+ while.trip_count)
    allgather              the all-gathers (forward only): count, bytes,    formula, ledger, hlo, tpu
                           elements; with backward also reduce_scatter.*
    ulysses[.fwd_bwd]      all_to_all.*                                     formula, ledger, hlo, tpu

The model is float32; XLA:TPU reads the forward's K/V in bf16 (its default matmul precision) and moves them so:
its ``bytes`` are then recorded with that reason and ``elements`` compared instead.

Example::

    case = RingCase(ContextParams(cp=4, seq=64))
    harness.record(rec, "cp", *harness.views(case))     # cp.ring.p2p.count: 6 in every view
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from shardlab import runtime
from shardlab.comm import Ledger
from shardlab.context import gspmd
from shardlab.context.allgather import allgather_attention_step
from shardlab.context.attention import dense_attention, unshard_sequence
from shardlab.context.gspmd import ROWS, SEQ, context_mesh, mark, permute_traffic, stack_rows, unstack_rows
from shardlab.context.params import ContextParams
from shardlab.context.ring import ring_attention_step
from shardlab.context.ulysses import ulysses_step
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import View, traffic
from shardlab.formulas import context as fcp
from shardlab.formulas.common import dtype_bytes
from shardlab.models import loss
from shardlab.profile.hlo import HloModule

if TYPE_CHECKING:
    from torch_xla.distributed.spmd import Mesh

DTYPE = "float32"  # the model's element type (notebook 10 is float32 throughout)
TOL = dict(rtol=2e-5, atol=2e-5)  # float32 summed in another order (blocks, devices): measured <= 4e-6
__all__ = ["AllGatherCase", "RingCase", "UlyssesCase", "ulysses_params"]


@dataclass(frozen=True)
class CpCase(Case):
    """One attention layer's forward (+ backward of ½‖out − target‖², ``models.loss``: its output gradient
    out − target depends on the forward's output, as in training) under context parallelism."""

    p: ContextParams
    backward: bool = False

    size_name: ClassVar[str] = "cp"
    mesh_text: ClassVar[str] = gspmd.MESH_TEXT
    ops: ClassVar[tuple[str, ...]] = ()
    layout: ClassVar[str] = "contiguous"  # how the per-rank program and the graph hold the sequence

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @property
    def dtype(self) -> str:
        return DTYPE

    @property
    def block_elements(self) -> int:
        """One rank's K (or V) shard: b·(s/cp)·hkv·d."""
        p = self.p
        return p.batch * p.seq // p.cp * p.kv_heads * p.head_dim

    def inputs(self) -> dict[str, torch.Tensor]:
        """q, target [b, s, hq, d] and k, v [b, s, hkv, d], float32, seeded by ``p.seed``."""
        p = self.p
        g = torch.Generator().manual_seed(p.seed)
        qs, ks = (p.batch, p.seq, p.heads, p.head_dim), (p.batch, p.seq, p.kv_heads, p.head_dim)
        return {n: torch.randn(shape, generator=g) for n, shape in (("q", qs), ("k", ks), ("v", ks), ("target", qs))}

    def oracle(self) -> dict[str, torch.Tensor]:
        """PyTorch's scaled_dot_product_attention on the whole sequence: out and, with backward, dq, dk, dv."""
        data = self.inputs()
        q, k, v = (data[n].clone().requires_grad_(self.backward) for n in ("q", "k", "v"))
        out = dense_attention(q, k, v, self.p.causal)
        if not self.backward:
            return {"out": out.detach()}
        loss(out, data["target"]).backward()
        return {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}

    def _step_args(self) -> tuple[torch.Tensor, ...]:
        data = self.inputs()
        return data["q"], data["k"], data["v"], data["target"] if self.backward else None

    def parity(self, source: str, got: Any, ref: dict[str, torch.Tensor]) -> Checks:
        """Per rank: each rank's rows, put back in sequence order (``layout``); compiled: the program's outputs."""
        if source == "ledger":
            full = {n: unshard_sequence([r[n] for r in got], self.layout) for n in ref}
            what = "the ranks' rows, in sequence order"
        else:
            full = {n: self.to_sequence(t) for n, t in zip(ref, got, strict=True)}
            what = "the partitioned program's output"
        key = self.ledger_key if source == "ledger" else self.key
        return {f"parity.{source}.{key}.{n}": (
            torch.allclose(full[n], ref[n], **TOL),
            f"{what} == PyTorch's dense attention ({'causal' if self.p.causal else 'no mask'}), "
            f"max |diff| {(full[n] - ref[n]).abs().max().item():.1e}") for n in ref}

    def to_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """A graph output back to [b, s, h, d]."""
        return x

    @property
    def key(self) -> str:
        """The prefix of this case's value names (see the module note)."""
        raise NotImplementedError

    @property
    def ledger_key(self) -> str:
        return self.key

    def _leaf(self, x: torch.Tensor, mesh: Mesh, spec: tuple) -> torch.Tensor:
        """A graph input on the devices, annotated ``spec`` (a leaf that needs a gradient when ``backward``)."""
        x = mark(x.to(runtime.device()), mesh, spec)
        return x.detach().requires_grad_(True) if self.backward else x

    def _finish(self, out: torch.Tensor, leaves: tuple[torch.Tensor, ...], target: torch.Tensor) -> list[Any]:
        """[out] or, with backward, [out, the leaves' gradients] of ½‖out − target‖² (``target`` annotated as out)."""
        if not self.backward:
            return [out]
        loss(out, target).backward()
        return [out, *(t.grad for t in leaves)]

    def groups_checks(self, view: View, module: HloModule) -> View:
        """Every collective stays inside one context group (devices g·cp … (g+1)·cp − 1 of the mesh)."""
        cp = self.p.cp
        members = [set(g) for c in module.collectives for g in c.replica_groups]
        members += [{s, t} for c in module.collectives for s, t in c.source_target_pairs]
        view.checks[f"{view.source}.{self.key}.within_context_groups"] = (
            all(len({d // cp for d in m}) == 1 for m in members),
            f"every collective's devices lie in one group of cp={cp} along the context axis")
        return view


# ------------------------------------------------------------------------------------------------ all-gather
@dataclass(frozen=True)
class AllGatherCase(CpCase):
    """All-gather CP: k and v all-gathered forward (2 all-gathers of a shard), dk and dv reduce-scattered backward
    (2 reduce-scatters of the full gradient). ``pin``: the graph pins the K/V gradient replicated first (without it
    the partitioner moves the O(s²) score gradient instead — see shardlab.context.gspmd)."""

    pin: bool = True

    cpu_reduce_scatter: ClassVar[bool] = True

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("all_gather", "reduce_scatter") if self.backward else ("all_gather",)

    @property
    def key(self) -> str:
        return "allgather"

    @property
    def phase(self) -> str:
        return self.key

    def renamed(self, view: View) -> View:
        """``allgather.all_gather.<q>`` -> the record's ``allgather.<q>`` (the backward adds no all-gather)."""
        return view.renamed(lambda n: n.replace("allgather.all_gather.", "allgather.", 1))

    def formula(self) -> View:
        p = self.p
        f = fcp.allgather_kv(p.batch, p.seq, p.kv_heads, p.head_dim, p.cp, DTYPE, backward=self.backward)
        return self.renamed(traffic(View("formula", detail=f), self.phase, {op: f[op]["count"] for op in self.ops},
                                    {op: f[op]["bytes"] for op in self.ops}, DTYPE, self.ops))

    def program(self) -> list[Program]:
        return [(allgather_attention_step, (*self._step_args(), self.p.causal))]

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        return self.renamed(view)

    def graph(self) -> Step:
        p = self.p
        mesh = context_mesh(p.cp)
        data = self.inputs()
        q, k, v = (self._leaf(data[n], mesh, SEQ) for n in ("q", "k", "v"))
        qpos = kpos = None
        if p.causal:
            pos = torch.arange(p.seq)
            qpos = mark(pos.to(runtime.device()), mesh, (gspmd.AXIS,))  # this device's query positions
            kpos = mark(pos.to(runtime.device()), mesh, (None,))  # every key position
        out = mark(gspmd.allgather_attention(q, k, v, mesh, qpos, kpos, self.pin), mesh, SEQ)
        return Step(self._finish(out, (q, k, v), mark(data["target"].to(runtime.device()), mesh, SEQ)))

    def read(self, view: View, module: HloModule) -> View:
        view = self.renamed(view)
        view.notes.append(collectives_story(view.source, module))
        return self.groups_checks(view, module)


# ------------------------------------------------------------------------------------------------------ ring
@dataclass(frozen=True)
class RingCase(CpCase):
    """Ring attention (Liu et al. 2023): per rank (ledger) and as the SPMD ring both compilers see. ``scan``: the
    SPMD ring's steps 1 … cp − 1 inside torch_xla's scan (one while loop each way, trip count cp − 1) instead of
    unrolled; ``remat``: scan's backward recomputes the loop body (min-cut partition). See the module note for
    the names and the counting rule."""

    scan: bool = False
    remat: bool = False

    @property
    def layout(self) -> str:  # type: ignore[override]
        return self.p.layout

    @property
    def key(self) -> str:
        """The compiled programs' key (see the module note)."""
        if not self.backward:
            return "ring.scan" if self.scan else "ring"
        return "ring.scan.fwd_bwd" if self.scan else "ring.spmd.fwd_bwd"

    @property
    def ledger_key(self) -> str:
        """The per-rank program's key."""
        return "ring.fwd_bwd" if self.backward else "ring"

    def formula(self) -> View:
        p = self.p
        kv = (p.batch, p.seq, p.kv_heads, p.head_dim, p.cp, DTYPE)
        view = View("formula")
        for key, backward in ((self.ledger_key, "ring"), (self.key, "saved")):
            f = fcp.ring_p2p(*kv, phase="step" if self.backward else "forward", backward=backward)
            view.add(f"{key}.p2p.count", f["count"], "count")
            view.add(f"{key}.p2p.bytes", f["bytes"], "bytes")
            view.add(f"{key}.p2p.elements", f["bytes"] // dtype_bytes(DTYPE), "elements")
        if self.scan:  # step 0 (the device's own block) runs before the loop: cp − 1 trips, one loop each way
            view.add(f"{self.key}.while.trip_count", [p.cp - 1] * (2 if self.backward else 1), "count")
        view.detail = {"block_bytes": fcp.kv_block_bytes(*kv)}
        return view

    def program(self) -> list[Program]:
        return [(ring_attention_step, (*self._step_args(), self.p.causal, self.layout))]

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        sends = ledger.select("send")
        elements = sum(e.payload_bytes // dtype_bytes(e.dtype) for e in sends)
        view.add(f"{self.ledger_key}.p2p.count", len(sends), "count")
        view.add(f"{self.ledger_key}.p2p.bytes", sends.payload_bytes(), "bytes")
        view.add(f"{self.ledger_key}.p2p.elements", elements, "elements")
        view.checks[f"ledger.{self.ledger_key}.sends_are_blocks"] = (
            all(e.payload_bytes == self.block_elements * dtype_bytes(DTYPE) for e in sends),
            f"every send carries one K, V, dK or dV block of b·(s/cp)·hkv·d = {self.block_elements} elements")
        view.checks[f"ledger.{self.ledger_key}.sends_to_next_rank"] = (
            all(e.peer == 1 % self.p.cp for e in sends), "rank 0 only ever sends to rank 1 (a ring)")
        return view

    def to_sequence(self, x: torch.Tensor) -> torch.Tensor:
        return unstack_rows(x, self.layout)

    def graph(self) -> Step:
        p, dev = self.p, runtime.device()
        mesh = context_mesh(p.cp)
        data = self.inputs()
        q, k, v = (self._leaf(stack_rows(data[n], self.layout, p.cp), mesh, ROWS) for n in ("q", "k", "v"))
        kv = mark(torch.cat([k, v], dim=1), mesh, ROWS)  # [cp, 2b, c, hkv, d]: one permute moves both
        pos = stack_rows(torch.arange(p.seq).view(1, -1), self.layout, p.cp)[:, 0]  # [cp, c] positions row r holds
        qpos = kposs = None
        if p.causal:
            qpos = mark(pos.float().to(dev), mesh, (gspmd.AXIS, None))
            steps = torch.stack([pos.roll(t, 0) for t in range(p.cp)]).float()  # [cp steps, cp, c] keys held
            if self.scan:
                kposs = mark(steps.to(dev), mesh, (None, gspmd.AXIS, None))
            else:
                kposs = [mark(steps[t].to(dev), mesh, (gspmd.AXIS, None)) for t in range(p.cp)]
        if self.scan:
            out = gspmd.ring_attention_scan(q, kv, qpos, kposs, self.remat)
        else:
            out = gspmd.ring_attention_unrolled(q, kv, qpos, kposs)
        out = mark(out, mesh, ROWS)
        target = mark(stack_rows(data["target"], self.layout, p.cp).to(dev), mesh, ROWS)
        return Step(self._finish(out, (q, k, v), target))

    def read(self, view: View, module: HloModule) -> View:
        t = permute_traffic(module)
        n, key, src = module.num_partitions, self.key, view.source
        elements = t["sent_elements"]
        blocks = elements / self.block_elements if elements is not None else None
        view.add(f"{key}.p2p.count", int(blocks) if blocks is not None and blocks == int(blocks) else blocks, "count")
        view.add(f"{key}.p2p.bytes", t["sent_bytes"], "bytes")
        view.add(f"{key}.p2p.elements", elements, "elements")
        if set(t["dtypes"]) - {"f32"}:
            view.differs[f"{key}.p2p.bytes"] = (
                f"the {src} program moves {'/'.join(t['dtypes'])} (XLA:TPU reads the forward's f32 K/V in bf16 at its "
                "default matmul precision); elements agree instead")
        view.add(f"{key}.collective_permute.count", t["count"], "count")
        view.add(f"{key}.collective_permute.executed", t["executed"], "count")
        split = {k: v for k, v in t["pairs"].items() if k < n}
        if split:
            why = (f"the {src} compiler split cyclic shifts: permutes by source-target pairs {t['pairs']} on {n} "
                   "devices (block transfers agree instead)")
            view.differs[f"{key}.collective_permute.count"] = why
            view.differs[f"{key}.collective_permute.executed"] = why
        if src == "tpu":
            view.add(f"{key}.collective_permute.async", t["async"], "count")
        if self.scan:
            view.add(f"{key}.while.trip_count", [trips for _, trips in t["loops"]], "count")
            if not t["loops"] and self.p.cp == 2:  # measured: XLA:CPU at cp = 2, XLA:TPU keeps both loops
                view.differs[f"{key}.while.trip_count"] = (
                    f"the {src} compiler inlined the loops: at cp = 2 each runs once (trip count 1), and its "
                    "while-loop simplifier replaces a one-trip loop by its body (block transfers agree instead)")
        view.notes.append(permute_story(src, t, n))
        return self.groups_checks(view, module)


def collectives_story(source: str, module: HloModule) -> str:
    """One line: every collective of a compiled program — op, element type, form (sync, start / done, async
    collective fusion ...), operands when combined, and whether XLA:CPU's all-reduce feeds a dynamic-slice."""
    parts = [f"{c.op} {c.dtype} {c.form}" + (f" ({c.operands} operands)" if c.operands > 1 else "")
             + (" + dynamic-slice" if c.feeds_dynamic_slice else "") for c in module.collectives]
    return f"{'XLA:TPU' if source == 'tpu' else 'XLA:CPU'}: " + ("; ".join(parts) or "no collectives")


def permute_story(source: str, t: dict[str, Any], devices: int) -> str:
    """One line: what a compiler did with the ring's collective-permutes (read from its program)."""
    compiler = "XLA:TPU" if source == "tpu" else "XLA:CPU"
    loops = f", in {len(t['loops'])} while loop(s) of {[n for _, n in t['loops']]} trips" if t["loops"] else ""
    combined = t["operands"] - t["count"]
    return (f"{compiler}: {t['count']} collective-permute instruction(s){loops}, executed {t['executed']} times; "
            f"source-target pairs per permute {t['pairs']} on {devices} devices; {t['async']} asynchronous "
            f"(start/done); {'none' if combined == 0 else combined} combined; element types {'/'.join(t['dtypes'])}")


# --------------------------------------------------------------------------------------------------- Ulysses
def ulysses_params(p: ContextParams) -> tuple[ContextParams | None, str]:
    """The parameters Ulysses runs with — ``p`` itself when cp divides kv_heads, else multi-head attention
    (kv_heads = heads) — or None and why it cannot run at this cp."""
    if p.kv_heads % p.cp == 0:
        return p, f"kv_heads={p.kv_heads} is divisible by cp={p.cp}"
    if p.heads % p.cp == 0:
        return replace(p, kv_heads=p.heads), (f"kv_heads={p.kv_heads} is not divisible by cp={p.cp}: shown with "
                                              f"multi-head attention, kv_heads = heads = {p.heads}")
    return None, f"neither kv_heads={p.kv_heads} nor heads={p.heads} is divisible by cp={p.cp}: no whole heads per rank"


@dataclass(frozen=True)
class UlyssesCase(CpCase):
    """DeepSpeed-Ulysses (Jacobs et al. 2023): q, k, v all-to-all'd from sequence shards to head shards, dense
    attention per head group, the output all-to-all'd back: 4 all-to-alls forward, 4 backward."""

    ops: ClassVar[tuple[str, ...]] = ("all_to_all",)

    def __post_init__(self) -> None:
        if self.p.kv_heads % self.p.cp:
            raise ValueError(f"kv_heads={self.p.kv_heads} is not divisible by cp={self.p.cp} (Ulysses gives each "
                             "rank whole heads; see ulysses_params)")

    @property
    def key(self) -> str:
        return "ulysses.fwd_bwd" if self.backward else "ulysses"

    @property
    def phase(self) -> str:
        return self.key

    def formula(self) -> View:
        p = self.p
        f = fcp.ulysses_all_to_all(p.batch, p.seq, p.heads, p.kv_heads, p.head_dim, p.cp, DTYPE,
                                   backward=self.backward)
        return traffic(View("formula", detail=f), self.phase, {"all_to_all": f["count"]},
                       {"all_to_all": f["bytes"]}, DTYPE, self.ops)

    def program(self) -> list[Program]:
        return [(ulysses_step, (*self._step_args(), self.p.causal))]

    def graph(self) -> Step:
        mesh = context_mesh(self.p.cp)
        data = self.inputs()
        q, k, v = (self._leaf(data[n], mesh, SEQ) for n in ("q", "k", "v"))
        out = mark(gspmd.ulysses_attention(q, k, v, mesh, self.p.causal), mesh, SEQ)
        return Step(self._finish(out, (q, k, v), mark(data["target"].to(runtime.device()), mesh, SEQ)))

    def read(self, view: View, module: HloModule) -> View:
        view.notes.append(collectives_story(view.source, module))
        return self.groups_checks(view, module)
