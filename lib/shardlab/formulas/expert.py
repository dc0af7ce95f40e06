"""Expert parallelism: capacity, dropped tokens, the dispatch / combine all-to-alls and expert memory per chip.

GShard (Lepikhin et al. 2020), Switch Transformer (Fedus et al. 2021). E experts sharded over ep ranks (E/ep
each), k experts per token, capacity factor cf, h hidden, f expert inner width, e bytes per element. Tokens are
routed in groups — one group of S tokens per rank (S = tokens / ranks) — and each expert takes at most

    C = ceil(cf · k · S / E)   slots per group                               (:func:`capacity`)

**All-to-all.** Each rank packs its group into a buffer [E, C, h] (slot c of expert e; empty slots are zeros)
and sends expert block j (E/ep experts) to rank j — the dispatch; the experts' outputs come back the same way —
the combine. Per rank per MoE layer:

    forward    2 all-to-alls, payload E·C·h·e each (the full buffer handed over; wire (ep − 1)/ep · payload)
    backward   2 more of the same size (the gradients of the two, in reverse)

With E | cf·k·S the payload E·C·h·e equals cf·k·S·h·e = **tokens · k · cf · h · e / ranks**: the usual
statement, with "capacity" read as the capacity *factor* and "tokens" as the global count. The measured buffer
is E·C rows whatever the routing: the slots are paid for even when empty, and C's ceiling rounds up
(:func:`all_to_all` uses C; :func:`statement_bytes` is the rounded-free statement). The GSPMD program moves the
same [E, G/n, C, h] per device (one group per device). On a 2-D mesh (data × expert, n = dp·ep devices) "ranks"
in the statement is n, not ep: every device routes its own T/n tokens, the all-to-all runs within the ep devices
of an expert group, and the payload E·C·h·e does not depend on ep — only the wire, (ep − 1)/ep · payload, does
(measured: the same 80 KiB all-to-alls at ep 8 and at ep 4 × data 2 for T/n = 128 tokens per device).

**Expert weights** per chip: (E/ep) · 3·h·f · e (SwiGLU: W1, W3 [h, f], W2 [f, h]).

**Dropped tokens.** For the routing at hand, with loads L_{g,e} (assignments of group g to expert e, kept or
not): dropped = Σ_{g,e} max(0, L_{g,e} − C) (:func:`dropped_from_loads`); fraction = dropped / (G·S·k).
Under *uniform* random routing each expert's load in a group is Binomial(S, k/E), and the expected dropped
fraction is E[max(0, X − C)] / (S·k/E) (:func:`expected_dropped_fraction`) — a learned router is not uniform;
the notebook shows both.

**Dispatch as dense tensors vs permute.** GShard's einsum form builds a dispatch mask and combine weights
[S, E, C] per group — S·E·C ≈ cf·k·S² entries each, quadratic in the tokens a device routes — and multiplies by
them: dispatch einsum("sec,sh->ech") and combine einsum("sec,ech->sh") cost 2·S·E·C·h FLOPs each, against the
experts' 2·E·C·(3hf) (SwiGLU): a ratio 2S/(3f) that does not depend on E, k or cf (:func:`dispatch_cost`). A
sort-based dispatch (MegaBlocks, Megatron's token dispatcher, MaxText's sparse matmul) permutes the k·S
token-expert rows into expert order (a gather of k·S·h elements, no FLOPs) and runs a grouped GEMM over them;
the combine is a weighted scatter-add of 2·k·S·h FLOPs.

Example::

    >>> capacity(tokens_per_group=64, experts=8, top_k=2, capacity_factor=1.25)
    20
    >>> all_to_all(tokens_per_rank=64, hidden=32, experts=8, top_k=2, capacity_factor=1.25, ep=4)
    {'count': 2, 'bytes': 40960, 'wire_bytes': 30720.0}
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from shardlab.formulas.common import DTypeLike, dtype_bytes, wire_bytes


def _check(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")


def _factor(capacity_factor: float) -> Fraction:
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float) or capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor!r} must be a positive number")
    return Fraction(str(capacity_factor))  # 1.25 -> 5/4 exactly: the ceiling is not at the mercy of rounding


def capacity(tokens_per_group: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """C = ceil(cf · k · S / E): slots per expert per group (computed exactly, in fractions)."""
    _check(tokens_per_group=tokens_per_group, experts=experts, top_k=top_k)
    return math.ceil(_factor(capacity_factor) * top_k * tokens_per_group / experts)


def _check_ep(experts: int, ep: int) -> None:
    _check(experts=experts, ep=ep)
    if experts % ep:
        raise ValueError(f"experts={experts} is not divisible by ep={ep} (each rank holds E/ep whole experts)")


def all_to_all(tokens_per_rank: int, hidden: int, experts: int, top_k: int, capacity_factor: float, ep: int,
               dtype: DTypeLike = "float32", backward: bool = False, slots: int | None = None) -> dict[str, Any]:
    """The dispatch + combine all-to-alls of one MoE layer, per rank: ``{"count", "bytes", "wire_bytes"}``.
    ``slots`` overrides C (the dropless variant sizes the buffer to the largest load)."""
    _check(hidden=hidden)
    _check_ep(experts, ep)
    c = slots if slots is not None else capacity(tokens_per_rank, experts, top_k, capacity_factor)
    if ep == 1:
        return {"count": 0, "bytes": 0, "wire_bytes": 0.0}
    payload = experts * c * hidden * dtype_bytes(dtype)  # [E, C, h]
    n = 4 if backward else 2
    return {"count": n, "bytes": n * payload, "wire_bytes": n * wire_bytes("all_to_all", payload, ep)}


def statement_bytes(tokens: int, hidden: int, top_k: int, capacity_factor: float, ep: int,
                    dtype: DTypeLike = "float32") -> float:
    """One all-to-all's payload per rank as usually stated: tokens · k · cf · h · e / ranks (no ceiling)."""
    _check(tokens=tokens, hidden=hidden, top_k=top_k, ep=ep)
    return float(tokens * top_k * _factor(capacity_factor) * hidden * dtype_bytes(dtype) / ep)


def expert_params_per_chip(experts: int, ep: int, hidden: int, ffn: int, dtype: DTypeLike = "float32") -> int:
    """(E/ep) · 3·h·f · e bytes of expert weights on each chip."""
    _check_ep(experts, ep)
    _check(hidden=hidden, ffn=ffn)
    return experts // ep * 3 * hidden * ffn * dtype_bytes(dtype)


def dropped_from_loads(loads: list[list[int]], capacity_per_group: int) -> int:
    """Assignments beyond capacity for loads[g][e] (group g, expert e): Σ max(0, L − C)."""
    if capacity_per_group < 1:
        raise ValueError(f"capacity_per_group={capacity_per_group} must be >= 1")
    return sum(max(0, load - capacity_per_group) for row in loads for load in row)


def expected_dropped_fraction(tokens_per_group: int, experts: int, top_k: int, capacity_per_group: int) -> float:
    """Expected dropped fraction under uniform random routing: load ~ Binomial(S, k/E) per expert,
    E[max(0, X − C)] / (S · k / E)."""
    _check(tokens_per_group=tokens_per_group, experts=experts, top_k=top_k, capacity_per_group=capacity_per_group)
    if top_k > experts:
        raise ValueError(f"top_k={top_k} must be <= experts={experts}")
    s, p = tokens_per_group, Fraction(top_k, experts)
    excess = sum(math.comb(s, x) * p**x * (1 - p) ** (s - x) * (x - capacity_per_group)
                 for x in range(capacity_per_group + 1, s + 1))
    return float(excess / (s * p))


def dispatch_cost(tokens_per_group: int, experts: int, top_k: int, capacity_factor: float, hidden: int,
                  ffn: int, dtype: DTypeLike = "float32") -> dict[str, float]:
    """One group's forward dispatch + combine, two ways, beside the experts' own FLOPs (SwiGLU):
    ``{"entries", "tensor_bytes", "einsum_flops", "expert_flops", "einsum_over_experts", "permute_elements",
    "permute_flops"}`` — entries of ONE [S, E, C] tensor (the mask and the combine weights are two), the bytes of
    both, the FLOPs of the dispatch and combine einsums together, the experts' FLOPs on all E·C slots, their
    ratio, the elements a sort-based permute gathers (k·S rows of h) and the FLOPs of its weighted combine."""
    _check(hidden=hidden, ffn=ffn)
    s, c = tokens_per_group, capacity(tokens_per_group, experts, top_k, capacity_factor)
    entries = s * experts * c  # [S, E, C]
    einsum = 2 * (2 * entries * hidden)  # dispatch "sec,sh->ech" + combine "sec,ech->sh"
    expert = 2 * experts * c * 3 * hidden * ffn  # W1, W3 [h, f], W2 [f, h] on every slot
    return {"entries": entries, "tensor_bytes": 2 * entries * dtype_bytes(dtype), "einsum_flops": einsum,
            "expert_flops": expert, "einsum_over_experts": einsum / expert,
            "permute_elements": top_k * s * hidden, "permute_flops": 2 * top_k * s * hidden}
