"""FlashAttention as a TPU custom call vs plain softmax attention: per-chip memory from the XLA:TPU compiler.

Design note
-----------
One attention core of a decoder layer, forward + backward, at the sizes of notebook 08b's parameters
(:class:`~shardlab.memory.params.MemoryParams`: ``seq``, ``heads``, ``kv_heads``, ``head_dim``, ``tensor``,
``softmax_fp32``; one sequence per chip, bf16), traced on the CPU device world and compiled compile-only by XLA:TPU
(``shardlab.memory.case.KernelAttentionCase`` through ``shardlab.core.harness``); every input is a placeholder, so
nothing is allocated and any sequence length can be asked for:

    q [b, a, s, hd], k, v [b, kv, s, hd], upstream gradient dO [b, a, s, hd]   (placeholders, bf16)
    GQA: k, v expanded to a heads ([b, kv, s, hd] -> [b, a, s, hd]), as a Llama layer does before attention
    kernel "flash": torch_xla's Pallas kernel (``custom_kernel.flash_attention``, causal) — three TPU custom
                    calls (forward, dq, dk/dv), traced with :mod:`shardlab.memory.pallas_tpu`'s two fixes
    kernel "plain": S = Q K^T / sqrt(hd) [b, a, s, s], causal mask, softmax in fp32 (as notebook 07's traced
                    step and Hugging Face's Llama do), P V; autograd's backward (dP, dS: [b, a, s, s] too)
    outputs         O, dQ, dK, dV  — the per-chip temporaries are everything else the program holds

With ``tensor`` = t > 1 the heads are split over t chips (Megatron): q, k, v, dO annotated on the head dimension,
the flash kernel called with ``partition_spec`` (torch_xla wraps it in a manual-sharding region).

What is compared (per chip, bytes):

- ``temp`` — the temporaries XLA:TPU's capacity check counts (``TpuMemory.checked_temp``), or for a program that
  does not fit the "program" size in its out-of-memory message;
- ``formula`` — the planner's attention-core terms (``formulas.activations``): without flash the softmax kept
  for the backward, e·a·s²·b/t, plus what the backward holds beside it, dP and dS, 2e·a·s²·b/t
  (``attention_backward_bytes``) — 3e·a·s²·b/t = 6·a·s²·b/t bytes in 16 bits; with flash the fp32 log-sum-exp,
  4·a·s·b/t, and nothing in the backward. The formula has no O(s·hd) terms (the GQA-expanded K and V, torch_xla's
  lane-padded softmax statistics): at short sequences they are what the compiler shows;
- ``largest`` — the largest arrays of the compiled program (entry computation and loop bodies; from the
  out-of-memory message when it does not fit), with the s × s ones marked.

**Fits** means the chip holds the program's peak: arguments + outputs that are not donated + temporaries
(``TpuMemory.peak``) within the capacity the compiler states (:attr:`AttentionMemory.holds`). XLA:TPU's own capacity
check counts arguments + temporaries, not outputs (``AttentionMemory.fits``): here nothing is donated, so O, dQ,
dK, dV come on top of what it checked. :func:`seq_max_fit` finds the longest sequence (a multiple of ``step``) for
which ``fits(s)`` holds — one compile per probe — by doubling then bisection.

:func:`square_arrays` sorts the s × s arrays the program writes by dtype and by whether a ``broadcast`` wrote them
(XLA:TPU's lowering of plain attention materialises f32 [a, s, s] broadcasts of a scalar and of the softmax's row
vectors — arrays the planner's terms have no reason to count).

Example (the planner's terms for Llama 3 8B's attention at s = 8192, one chip)::

    >>> from shardlab.memory.params import LLAMA3_8B_ATTENTION, MemoryParams
    >>> p = MemoryParams(seq=8192, **LLAMA3_8B_ATTENTION)
    >>> formula_temp_bytes(p, "plain") / 2**30, formula_temp_bytes(p, "flash") / 2**20    # 6·a·s²·b, 4·a·s·b
    (12.0, 1.0)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch_xla.distributed.spmd as xs  # this module is imported after runtime.setup (the ordering rule)
from torch_xla.core.xla_builder import create_placeholder_tensor as placeholder
from torch_xla.experimental.custom_kernel import flash_attention

from shardlab import runtime
from shardlab.formulas import activations as act
from shardlab.memory.pallas_tpu import pallas_for_tpu_compile
from shardlab.memory.params import FLASH_BLOCK, MemoryParams
from shardlab.profile.hlo import HloModule
from shardlab.profile.tpu import TpuCompile

KERNELS = ("flash", "plain")
DTYPE = torch.bfloat16  # q, k, v, O and their gradients
ALIAS_OPCODES = ("parameter", "tuple", "get-tuple-element", "bitcast", "constant", "copy-start", "copy-done",
                 "opt-barrier", "after-all", "add-dependency")


def check_kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} must be one of {KERNELS}")


# ------------------------------------------------------------------------------------------------- the graph
def attention_graph(p: MemoryParams, kernel: str) -> list[torch.Tensor]:
    """``[O, dQ, dK, dV]`` of one attention core on this process's world (placeholders; never execute it)."""
    check_kernel(kernel)
    b, a, kvh, s, hd = 1, p.heads, p.kv_heads, p.seq, p.head_dim
    world = runtime.current()
    mesh = runtime.mesh((p.tensor,), ("tensor",)) if p.tensor > 1 else None
    heads_spec = (None, "tensor", None, None)

    def leaf(shape: tuple[int, ...]) -> torch.Tensor:
        return placeholder(shape, DTYPE).requires_grad_(True)

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        if mesh is None:
            return t
        t = t * 1  # a placeholder cannot carry a sharding itself; its product can
        return xs.mark_sharding_with_gradients(t, mesh, heads_spec) if t.requires_grad else \
            xs.mark_sharding(t, mesh, heads_spec).global_tensor

    q0, k0, v0 = leaf((b, a, s, hd)), leaf((b, kvh, s, hd)), leaf((b, kvh, s, hd))
    dout = split_heads(placeholder((b, a, s, hd), DTYPE))  # [b, a, s, hd]
    q, k, v = split_heads(q0), split_heads(k0), split_heads(v0)
    rep = a // kvh  # each KV head serves `rep` query heads
    k = k[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)  # [b, kv, s, hd] -> [b, a, s, hd]
    v = v[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)
    scale = hd ** -0.5
    if kernel == "flash":
        spec = dict(partition_spec=heads_spec, mesh=mesh) if mesh is not None else {}
        with pallas_for_tpu_compile(active=world.kind != "tpu"):
            o = flash_attention(q, k, v, causal=True, sm_scale=scale, **spec)  # [b, a, s, hd]
            grads = torch.autograd.grad(o, (q0, k0, v0), dout)  # traces the dq and dk/dv kernels
    else:
        scores = torch.einsum("bash,bath->bast", q, k) * scale  # [b, a, s, s]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores.float() if p.softmax_fp32 else scores, dim=-1).to(DTYPE)  # [b, a, s, s]
        o = torch.einsum("bast,bath->bash", probs, v)  # [b, a, s, hd]
        grads = torch.autograd.grad(o, (q0, k0, v0), dout)
    return [o, *grads]


# ---------------------------------------------------------------------------------------------- the formula
def formula_temp_bytes(p: MemoryParams, kernel: str) -> float:
    """The planner's attention-core bytes per chip: kept core + what the backward holds beside it.

    No flash: e·a·s²·b/t (softmax kept) + 2e·a·s²·b/t (dP, dS) = 3e·a·s²·b/t; flash: 4·a·s·b/t (log-sum-exp).
    """
    check_kernel(kernel)
    flash = kernel == "flash"
    hidden, e = p.heads * p.head_dim, DTYPE.itemsize
    terms = act.block_activation_bytes(p.seq, 1, hidden, hidden, p.heads, p.kv_heads, p.tensor, flash_attention=flash,
                                       dropout=False, gated_mlp=True, act_bytes=e)
    return terms.attention_core + act.attention_backward_bytes(p.seq, 1, p.heads, p.tensor, flash, e)


# -------------------------------------------------------------------------------------------- measurement
@dataclass(frozen=True)
class Buffer:
    """One array of the compiled program (or of the out-of-memory message)."""

    nbytes: int
    shape: str  # e.g. "bf16[32,8192,8192]"
    label: str  # the HLO instruction
    square: bool  # two dimensions equal to the sequence length: an s x s array


@dataclass
class AttentionMemory:
    """Per-chip memory of one compiled attention core (bytes)."""

    config: dict[str, Any]
    topology: str
    fits: bool
    temp: int  # temporaries the capacity check counts (checked_temp), or the OOM message's "program"
    arguments: int | None
    outputs: int | None
    peak: int | None  # arguments + outputs + temporaries (a fitting program), else the message's "Used"
    formula: float  # the planner's attention-core terms
    largest: list[Buffer] = field(default_factory=list)
    compile_s: float = 0.0
    custom_calls: int = 0  # tpu_custom_call instructions in the program (3 with flash: fwd, dq, dk/dv)
    message: str = ""  # the compiler's first line when it ran out of memory
    capacity: int = 0  # the HBM bytes the compiler says one chip has (v5e: 15.75 GiB)
    squares: dict[str, int] = field(default_factory=dict)  # square_arrays(): "<dtype> broadcast|computed" -> bytes

    @property
    def holds(self) -> bool:
        """The chip holds the program's peak (arguments + outputs not donated + temporaries) — stricter than
        ``fits``, the compiler's capacity check (arguments + temporaries)."""
        return self.fits and self.peak is not None and 0 < self.capacity and self.peak <= self.capacity

    @property
    def square_bytes(self) -> int:
        """Bytes of the largest s x s array (0 when there is none)."""
        return max((b.nbytes for b in self.largest if b.square), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "square_bytes": self.square_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttentionMemory:
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        kw["largest"] = [Buffer(**b) for b in kw.get("largest", [])]
        return cls(**kw)


def _square(shape: str, seq: int) -> bool:
    dims = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1].split("]", 1)[0])]
    return sum(d == seq for d in dims) >= 2


def largest_arrays(module: HloModule, seq: int, k: int = 5) -> list[Buffer]:
    """The ``k`` largest arrays the program's scheduled code writes (entry and loop bodies; renames skipped)."""
    scheduled = {module.entry} | {w.body for w in module.while_loops} if module.while_loops else {module.entry}
    rows = []
    for comp in scheduled:
        for name in module.computations.get(comp, []):
            ins = module.instructions[name]
            if ins.opcode in ALIAS_OPCODES or not ins.shape:
                continue
            shape = ", ".join(str(a) for a in ins.shape)
            rows.append(Buffer(ins.nbytes, shape, name, any(_square(str(a), seq) for a in ins.shape)))
    return sorted(rows, key=lambda r: (-r.nbytes, r.label))[:k]


def square_arrays(module: HloModule, seq: int) -> dict[str, int]:
    """Bytes of the s × s arrays the program's scheduled code writes (entry and loop bodies; renames skipped),
    by ``"<dtype> broadcast"`` (written by a ``broadcast`` of a lower-rank value: a scalar, a row vector, the mask)
    or ``"<dtype> computed"``. A sum over the program, not what is live at once."""
    scheduled = {module.entry} | {w.body for w in module.while_loops} if module.while_loops else {module.entry}
    out: dict[str, int] = {}
    for comp in scheduled:
        for name in module.computations.get(comp, []):
            ins = module.instructions[name]
            if ins.opcode in ALIAS_OPCODES:
                continue
            for arr in ins.shape or []:
                if _square(str(arr), seq):
                    key = f"{arr.dtype} {'broadcast' if ins.opcode == 'broadcast' else 'computed'}"
                    out[key] = out.get(key, 0) + arr.nbytes
    return dict(sorted(out.items()))


def attention_config(p: MemoryParams, kernel: str) -> dict[str, Any]:
    """The attention core's sizes as a row's ``config`` records them."""
    return {"kernel": kernel, "seq": p.seq, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": p.head_dim,
            "tensor": p.tensor, "softmax_fp32": p.softmax_fp32, "generation": p.generation}


def memory_row(p: MemoryParams, kernel: str, c: TpuCompile, k: int = 5) -> AttentionMemory:
    """Per-chip memory of one compiled attention core: from the program when it fits, else from the compiler's
    out-of-memory message (its program size, or the one array that alone exceeds the chip)."""
    formula = formula_temp_bytes(p, kernel)
    config = attention_config(p, kernel)
    if c.fits and c.memory is not None and c.module is not None:
        m = c.memory
        calls = c.hlo_text.count('custom_call_target="tpu_custom_call"') if c.hlo_text else 0
        return AttentionMemory(config, c.topology, True, m.checked_temp, m.argument, m.output, m.peak, formula,
                               largest_arrays(c.module, p.seq, k), c.compile_s, calls, capacity=m.capacity,
                               squares=square_arrays(c.module, p.seq))
    o = c.oom
    if o is None:
        raise ValueError(f"the compile for {c.topology} neither fits nor reports out of memory")
    buffers = [Buffer(b.size, re.sub(r"\{.*", "", b.shape), b.label.split(" = ", 1)[0], _square(b.shape, p.seq))
               for b in o.buffers[:k]]
    return AttentionMemory(config, c.topology, False, o.program or o.used, o.arguments, o.outputs, o.used, formula,
                           buffers, c.compile_s, 0, o.first_line[:300], capacity=o.capacity)


CRITERIA = ("peak", "check")  # the chip holds the peak (AttentionMemory.holds) / the compiler's check passes (fits)


@dataclass
class SeqFit:
    """The longest sequence that fits one chip by ``criterion``, and every probe on the way."""

    kernel: str
    seq: int  # 0 when not even `step` fits
    step: int
    probes: list[tuple[int, bool]]  # (seq, fits) in the order compiled
    criterion: str = "peak"  # "peak": peak <= capacity; "check": XLA:TPU's capacity check (arguments + temporaries)
    peaks: dict[int, int] = field(default_factory=dict)  # seq -> the program's peak bytes (or the OOM's "used")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeqFit:
        return cls(d["kernel"], d["seq"], d["step"], [(int(s), bool(f)) for s, f in d["probes"]],
                   d.get("criterion", "check"), {int(s): int(b) for s, b in d.get("peaks", {}).items()})


def seq_max_fit(fits: Callable[[int], bool], kernel: str = "flash", step: int = FLASH_BLOCK,
                start: int | None = None, limit: int = 1 << 21) -> SeqFit:
    """Largest s (a multiple of ``step``, at most ``limit``) with ``fits(s)``, assuming fits is monotone.

    Doubles from ``start`` (default ``step``) until ``fits`` fails, then bisects between the last fitting and the
    first failing length: about 2·log2(s/step) calls (each one compile in ``memory.case.seq_max_fit``).

    >>> seq_max_fit(lambda s: s <= 5000, "plain", step=1024, start=4096).seq
    4096
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step={step!r} must be a positive int")
    if kernel == "flash" and step % FLASH_BLOCK:
        raise ValueError(f"step={step} must be a multiple of {FLASH_BLOCK} for the flash kernel")
    probes: list[tuple[int, bool]] = []

    def probe(units: int) -> bool:
        ok = bool(fits(units * step))
        probes.append((units * step, ok))
        return ok

    lo_units = max(1, (start or step) // step)
    if not probe(lo_units):
        if lo_units == 1:
            return SeqFit(kernel, 0, step, probes)
        lo_units, hi_units = 0, lo_units  # bisect below the first probe (0 units: nothing fits)
    else:
        hi_units = lo_units * 2
        while hi_units * step <= limit and probe(hi_units):
            lo_units, hi_units = hi_units, hi_units * 2
        if hi_units * step > limit:
            return SeqFit(kernel, lo_units * step, step, probes)
    while hi_units - lo_units > 1:  # lo fits (or is 0), hi does not
        mid = (lo_units + hi_units) // 2
        if probe(mid):
            lo_units = mid
        else:
            hi_units = mid
    return SeqFit(kernel, lo_units * step, step, probes)


def table(rows: Sequence[AttentionMemory]) -> list[dict[str, Any]]:
    """One row per (seq, kernel): GiB per chip, compiler vs the planner's formula, the largest array (s × s or
    not) and the compiler's verdict."""
    gib = 2**30
    out = []
    for r in rows:
        if r.holds:
            verdict = "yes"
        elif r.fits:
            verdict = f"no: peak {(r.peak or 0) / gib:.2f} GiB (the compiler's check passes)"
        elif "would exceed memory" in r.message:
            verdict = "no: one array exceeds HBM"
        else:
            verdict = f"no: uses {(r.peak or 0) / gib:.2f} GiB"
        out.append({"seq": r.config["seq"], "kernel": r.config["kernel"], "fits": verdict,
                    "peak GiB": None if r.peak is None or not r.fits else round(r.peak / gib, 3),
                    "temporaries GiB (XLA:TPU)": round(r.temp / gib, 3), "planner GiB": round(r.formula / gib, 4),
                    "compiler / planner": round(r.temp / r.formula, 2) if r.formula else None,
                    "largest s×s GiB": round(r.square_bytes / gib, 3),
                    "largest array": r.largest[0].shape if r.largest else "", "custom calls": r.custom_calls})
    return out
