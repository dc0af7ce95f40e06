"""FlashAttention as a TPU custom call vs plain softmax attention: per-chip memory from the XLA:TPU compiler.

Design note
-----------
One attention core of a decoder layer, forward + backward, traced on the CPU device world and compiled
compile-only for a v5e slice (``shardlab.profile.tpu``); every input is a placeholder, so nothing is allocated
and any sequence length can be asked for:

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

:func:`seq_max_fit` finds the longest sequence (a multiple of ``step``) whose step compiles within the chip's HBM,
by doubling then bisection (each probe is one compile).

Example::

    >>> cfg = AttentionConfig(kernel="flash", seq=4096)          # doctest: +SKIP
    >>> measure(cfg).temp / 2**20                                # doctest: +SKIP
    128.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

KERNELS = ("flash", "plain")
# torch_xla's flash kernel tiles the sequence: its dq kernel by min(1024, s) (FlashAttention.DEFAULT_BLOCK_SIZES
# block_q_dq; measured: s = 179712 fails "q_seq_len=179712 should be divisible by block_q_dq=1024")
FLASH_BLOCK = 1024
ALIAS_OPCODES = ("parameter", "tuple", "get-tuple-element", "bitcast", "constant", "copy-start", "copy-done",
                 "opt-barrier", "after-all", "add-dependency")
_ALLOC_OOM = re.compile(r"RESOURCE_EXHAUSTED: Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)"
                        r"(?:.*?shape = '([^']*)')?(?:.*?tag = '([^']*)')?", re.S)


@dataclass(frozen=True)
class AttentionConfig:
    """One attention core (forward + backward) per chip; defaults: Llama 3 8B's attention, one sequence."""

    kernel: str = "flash"  # "flash" (torch_xla's Pallas kernel) | "plain" (softmax(QK^T)V with s x s arrays)
    seq: int = 1024  # s, tokens per sequence
    batch: int = 1  # b, sequences per chip
    heads: int = 32  # a, query heads
    kv_heads: int = 8  # KV heads (GQA); expanded to `heads` before the kernel
    head_dim: int = 128  # hd
    tensor: int = 1  # t: chips the heads are split over (the compile targets a slice of t chips)
    dtype: str = "bfloat16"
    softmax_fp32: bool = True  # plain kernel: softmax in fp32 (07's traced step, HF Llama); False: in `dtype`
    generation: str = "v5e"  # TPU generation of the slice

    def validate(self) -> AttentionConfig:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel={self.kernel!r} must be one of {KERNELS}")
        for name in ("seq", "batch", "heads", "kv_heads", "head_dim", "tensor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads} (GQA groups)")
        if self.heads % self.tensor or self.kv_heads % self.tensor:
            raise ValueError(f"heads={self.heads} and kv_heads={self.kv_heads} must both be divisible by "
                             f"tensor={self.tensor} (the heads are split over the chips)")
        if self.kernel == "flash" and self.seq % FLASH_BLOCK and self.seq > FLASH_BLOCK:
            raise ValueError(f"seq={self.seq}: the flash kernel tiles the sequence by {FLASH_BLOCK}; use a multiple "
                             f"of {FLASH_BLOCK} (or at most {FLASH_BLOCK})")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype={self.dtype!r} must be 'bfloat16' or 'float32'")
        return self

    @property
    def topology(self) -> str:
        from shardlab.profile import tpu

        return tpu.topology_for(self.tensor, self.generation)

    @property
    def act_bytes(self) -> int:
        return torch.finfo(getattr(torch, self.dtype)).bits // 8


# ------------------------------------------------------------------------------------------------- the graph
def build(cfg: AttentionConfig) -> list[torch.Tensor]:
    """``[O, dQ, dK, dV]`` of one attention core on this process's world (placeholders; never execute it).

    Module-level so ``tpu.compile_program`` can rebuild it in a worker whose device count is ``cfg.tensor``.
    """
    import torch_xla.distributed.spmd as xs
    from torch_xla.core.xla_builder import create_placeholder_tensor as placeholder

    from shardlab import runtime
    from shardlab.memory.pallas_tpu import pallas_for_tpu_compile

    cfg.validate()
    b, a, kvh, s, hd = cfg.batch, cfg.heads, cfg.kv_heads, cfg.seq, cfg.head_dim
    dt = getattr(torch, cfg.dtype)
    world = runtime.current()
    mesh = runtime.mesh((cfg.tensor,), ("tensor",)) if cfg.tensor > 1 else None
    heads_spec = (None, "tensor", None, None)

    def leaf(shape: tuple[int, ...]) -> torch.Tensor:
        return placeholder(shape, dt).requires_grad_(True)

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        if mesh is None:
            return t
        t = t * 1  # a placeholder cannot carry a sharding itself; its product can
        return xs.mark_sharding_with_gradients(t, mesh, heads_spec) if t.requires_grad else \
            xs.mark_sharding(t, mesh, heads_spec).global_tensor

    q0, k0, v0 = leaf((b, a, s, hd)), leaf((b, kvh, s, hd)), leaf((b, kvh, s, hd))
    dout = split_heads(placeholder((b, a, s, hd), dt))  # [b, a, s, hd]
    q, k, v = split_heads(q0), split_heads(k0), split_heads(v0)
    rep = a // kvh  # each KV head serves `rep` query heads
    k = k[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)  # [b, kv, s, hd] -> [b, a, s, hd]
    v = v[:, :, None].expand(b, kvh, rep, s, hd).reshape(b, a, s, hd)
    scale = hd ** -0.5
    if cfg.kernel == "flash":
        from torch_xla.experimental.custom_kernel import flash_attention

        spec = dict(partition_spec=heads_spec, mesh=mesh) if mesh is not None else {}
        with pallas_for_tpu_compile(active=world.kind != "tpu"):
            o = flash_attention(q, k, v, causal=True, sm_scale=scale, **spec)  # [b, a, s, hd]
            grads = torch.autograd.grad(o, (q0, k0, v0), dout)  # traces the dq and dk/dv kernels
    else:
        scores = torch.einsum("bash,bath->bast", q, k) * scale  # [b, a, s, s]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        p = torch.softmax(scores.float() if cfg.softmax_fp32 else scores, dim=-1).to(dt)  # [b, a, s, s]
        o = torch.einsum("bast,bath->bash", p, v)  # [b, a, s, hd]
        grads = torch.autograd.grad(o, (q0, k0, v0), dout)
    return [o, *grads]


# ---------------------------------------------------------------------------------------------- the formula
def formula_temp_bytes(cfg: AttentionConfig) -> float:
    """The planner's attention-core bytes per chip: kept core + what the backward holds beside it.

    No flash: e·a·s²·b/t (softmax kept) + 2e·a·s²·b/t (dP, dS) = 3e·a·s²·b/t; flash: 4·a·s·b/t (log-sum-exp).
    >>> formula_temp_bytes(AttentionConfig(kernel="plain", seq=8192)) / 2**30    # 6 a s^2 b, a = 32
    12.0
    """
    from shardlab.formulas import activations as act

    cfg.validate()
    flash = cfg.kernel == "flash"
    hidden = cfg.heads * cfg.head_dim
    terms = act.block_activation_bytes(cfg.seq, cfg.batch, hidden, hidden, cfg.heads, cfg.kv_heads, cfg.tensor,
                                       flash_attention=flash, dropout=False, gated_mlp=True,
                                       act_bytes=cfg.act_bytes)
    return terms.attention_core + act.attention_backward_bytes(cfg.seq, cfg.batch, cfg.heads, cfg.tensor, flash,
                                                               cfg.act_bytes)


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

    @property
    def square_bytes(self) -> int:
        """Bytes of the largest s x s array (0 when there is none)."""
        return max((b.nbytes for b in self.largest if b.square), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "square_bytes": self.square_bytes}


def _square(shape: str, seq: int) -> bool:
    dims = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1].split("]", 1)[0])]
    return sum(d == seq for d in dims) >= 2


def largest_arrays(module: Any, seq: int, k: int = 5) -> list[Buffer]:
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


def allocation_oom(message: str) -> tuple[int, int, str, str] | None:
    """XLA:TPU's second out-of-memory form, raised before the heap simulation when one array alone exceeds HBM:
    ``RESOURCE_EXHAUSTED: Allocation (size=N) would exceed memory (size=M) :: ... shape = '...' ... tag = '...'``
    -> ``(N, M, shape, tag)``; None for any other message.

    >>> allocation_oom("RESOURCE_EXHAUSTED: Allocation (size=8) would exceed memory (size=4) :: #a [shape = "
    ...                "'bf16[2,2]{1,0}', space=hbm, size = 0x1, tag = 'output of fusion.1'] :: x")
    (8, 4, 'bf16[2,2]{1,0}', 'output of fusion.1')
    """
    m = _ALLOC_OOM.search(message)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), m.group(3) or "", m.group(4) or ""


def measure(cfg: AttentionConfig, k: int = 5) -> AttentionMemory:
    """Compile ``cfg``'s attention core for a ``cfg.tensor``-chip slice and read its per-chip memory."""
    from shardlab.profile import tpu

    cfg.validate()
    topology = cfg.topology
    formula = formula_temp_bytes(cfg)
    try:
        c = tpu.compile_program(build, cfg, topology, label=f"attention {cfg.kernel} s={cfg.seq}")
    except Exception as exc:  # one array larger than the chip: a different RESOURCE_EXHAUSTED form, not data in tpu
        alloc = allocation_oom(str(exc))
        if alloc is None:
            raise
        size, capacity, shape, tag = alloc
        first = next((ln for ln in str(exc).splitlines() if "RESOURCE_EXHAUSTED" in ln), str(exc))
        label = tag.removeprefix("output of ")
        return AttentionMemory(asdict(cfg), topology, False, size, None, None, None, formula,
                               [Buffer(size, re.sub(r"\{.*", "", shape), label, _square(shape, cfg.seq))],
                               0.0, 0, first[:300])
    if c.fits and c.memory is not None and c.module is not None:
        m = c.memory
        calls = c.hlo_text.count('custom_call_target="tpu_custom_call"') if c.hlo_text else 0
        return AttentionMemory(asdict(cfg), topology, True, m.checked_temp, m.argument, m.output, m.peak, formula,
                               largest_arrays(c.module, cfg.seq, k), c.compile_s, calls)
    o = c.oom
    assert o is not None
    buffers = [Buffer(b.size, re.sub(r"\{.*", "", b.shape), b.label.split(" = ", 1)[0],
                      _square(b.shape, cfg.seq)) for b in o.buffers[:k]]
    return AttentionMemory(asdict(cfg), topology, False, o.program or o.used, o.arguments, o.outputs, o.used, formula,
                           buffers, c.compile_s, 0, o.first_line)


def sweep(cfg: AttentionConfig, seqs: Iterable[int], kernels: Sequence[str] = KERNELS) -> list[AttentionMemory]:
    """:func:`measure` for every kernel x sequence length (same sizes otherwise)."""
    return [measure(replace(cfg, kernel=kern, seq=s)) for s in seqs for kern in kernels]


@dataclass
class SeqFit:
    """The longest sequence that compiled within one chip's HBM, and every probe on the way."""

    kernel: str
    seq: int  # 0 when not even `step` fits
    step: int
    probes: list[tuple[int, bool]]  # (seq, fits) in the order compiled


def seq_max_fit(cfg: AttentionConfig, step: int = FLASH_BLOCK, start: int | None = None,
                limit: int = 1 << 21) -> SeqFit:
    """Largest s (a multiple of ``step``, at most ``limit``) whose step fits, assuming fits(s) is monotone.

    Doubles from ``start`` (default ``step``) until a compile runs out of memory, then bisects between the last
    fitting and the first failing length: about 2·log2(s/step) compiles.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step={step!r} must be a positive int")
    if cfg.kernel == "flash" and step % FLASH_BLOCK:
        raise ValueError(f"step={step} must be a multiple of {FLASH_BLOCK} for the flash kernel")
    probes: list[tuple[int, bool]] = []

    def fits(units: int) -> bool:
        ok = measure(replace(cfg, seq=units * step), k=1).fits
        probes.append((units * step, ok))
        return ok

    lo_units = max(1, (start or step) // step)
    if not fits(lo_units):
        return SeqFit(cfg.kernel, 0, step, probes) if lo_units == 1 else seq_max_fit(cfg, step, step, limit)
    hi_units = lo_units * 2
    while hi_units * step <= limit and fits(hi_units):
        lo_units, hi_units = hi_units, hi_units * 2
    if hi_units * step > limit:
        return SeqFit(cfg.kernel, lo_units * step, step, probes)
    while hi_units - lo_units > 1:  # lo fits, hi does not
        mid = (lo_units + hi_units) // 2
        if fits(mid):
            lo_units = mid
        else:
            hi_units = mid
    return SeqFit(cfg.kernel, lo_units * step, step, probes)


def table(rows: Sequence[AttentionMemory]) -> list[dict[str, Any]]:
    """One row per (seq, kernel): GiB per chip, compiler vs formula, the largest s x s array."""
    gib = 2**30
    out = []
    for r in rows:
        out.append({"seq": r.config["seq"], "kernel": r.config["kernel"], "fits": r.fits,
                    "temp GiB (tpu)": round(r.temp / gib, 3), "formula GiB": round(r.formula / gib, 3),
                    "tpu / formula": round(r.temp / r.formula, 2) if r.formula else None,
                    "largest s×s GiB": round(r.square_bytes / gib, 3),
                    "largest": r.largest[0].shape if r.largest else "", "custom calls": r.custom_calls,
                    "compile s": round(r.compile_s, 1)})
    return out


def seq_grid(lo: int = 1024, hi: int = 32768) -> list[int]:
    """Powers of two from ``lo`` to ``hi``: 1k, 2k, ... 32k."""
    if lo < 1 or hi < lo:
        raise ValueError(f"lo={lo}, hi={hi}: need 1 <= lo <= hi")
    return [lo << i for i in range(int(math.log2(hi // lo)) + 1)]
