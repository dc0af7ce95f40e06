"""Sharding plans for Hugging Face parameters: FSDP on any mesh axis, Megatron rules by module name, your regexes.

Design note
-----------
A plan gives every parameter a partition spec (one entry per dimension: a mesh axis name, a tuple of axis names,
or None = not split), resolved in this order (first match wins):

1. **your rules** ``{regex: spec}``, matched with ``re.search`` against the parameter's name;
2. **Megatron tensor parallelism** on the ``tensor`` axis, by the module names HF models share
   (``nn.Linear`` weights are ``[out, in]``, GPT-2's ``Conv1D`` weights ``[in, out]``)::

       column-parallel  q_proj k_proj v_proj gate_proj up_proj (Mixtral w1 w3)   A[I, J_T]: weight [out_T, in]
       row-parallel     o_proj down_proj (Mixtral w2)                            B[J_T, K]: weight [out, in_T]
       vocabulary       embed_tokens / wte, lm_head                              E[V_T, h]
       GPT-2 Conv1D     c_attn c_fc by columns [in, out_T], c_proj by rows [in_T, out]

   norms, biases of row-parallel layers, position embeddings and the MoE router stay replicated over ``tensor``;
3. **FSDP** over the ``fsdp`` axes (one axis or several): the first dimension no earlier rule split whose size
   the FSDP degree divides (else the largest such dimension, padded by GSPMD); a dimension smaller than the
   degree is never split.
   **Fused projections** (:data:`FUSED`: Phi-3's ``qkv_proj`` / ``gate_up_proj``, GPT-NeoX's
   ``query_key_value``, Baichuan's ``W_pack``, DeepSeek-V3's MLA projections, gpt-oss's expert ``gate_up_proj``:
   weights whose output the model slices into parts) are split on another dimension (``nn.Linear``'s input),
   and their biases stay whole: split on the
   fused output dimension, each part would sit on a subset of the devices and the slicing after the matmul would
   move it (measured on a tiny Phi-3, v5e-4, fsdp 4: 26 all-to-alls and 46 collective-permutes per step, none
   now). GPT-2's ``c_attn`` is a ``Conv1D`` ``[in, q | k | v]``: its first dimension is already the input.

Errors (``PlanInputError``, raised before anything is traced) name the rule and the parameter: a rule of yours
that matches no parameter, a spec whose length is not the parameter's rank, an axis the mesh does not have, an
axis used twice in one spec, and — with ``strict=True`` — a parameter that neither your rules nor the Megatron
rules cover (FSDP's blanket rule does not count as covering it).

Example::

    >>> rules = megatron_rules("tensor")
    >>> spec_for("model.layers.0.mlp.down_proj.weight", (4096, 14336), [], rules, ("fsdp",), 8, {"fsdp": 8,
    ...          "tensor": 2})
    ('fsdp', 'tensor')
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Axis = str | tuple[str, ...] | None
Spec = tuple[Axis, ...]


class PlanInputError(ValueError):
    """A sharding plan that cannot apply (bad input: exit status 2 at the CLI)."""


@dataclass(frozen=True)
class Rule:
    """One rule: parameters whose name matches ``pattern`` get ``spec``."""

    pattern: str
    spec: Spec
    origin: str  # "user" | "megatron <kind>"


# (regex, spec with "T" for the tensor axis, kind): nn.Linear [out, in]; GPT-2 Conv1D [in, out].
_MEGATRON: tuple[tuple[str, tuple[str | None, ...], str], ...] = (
    (r"(^|\.)(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$", ("T", None), "column"),
    (r"(^|\.)(q_proj|k_proj|v_proj|gate_proj|up_proj)\.bias$", ("T",), "column"),
    (r"(^|\.)(o_proj|down_proj)\.weight$", (None, "T"), "row"),
    (r"(^|\.)experts\.\d+\.(w1|w3)\.weight$", ("T", None), "column"),
    (r"(^|\.)experts\.\d+\.w2\.weight$", (None, "T"), "row"),
    (r"(^|\.)(embed_tokens|wte)\.weight$", ("T", None), "vocabulary"),
    (r"(^|\.)lm_head\.weight$", ("T", None), "vocabulary"),
    (r"(^|\.)(c_attn|c_fc)\.weight$", (None, "T"), "column (Conv1D [in, out])"),
    (r"(^|\.)(c_attn|c_fc)\.bias$", ("T",), "column (Conv1D)"),
    (r"(^|\.)c_proj\.weight$", ("T", None), "row (Conv1D [in, out])"),
)


# Tensors whose output the model slices into parts (q / k / v, gate / up, MLA's compressed kv / rope key, each
# head's nope / rope parts): (regex, the dimensions FSDP must not split; None = keep the tensor whole).
FUSED: tuple[tuple[str, tuple[int, ...] | None], ...] = (
    (r"(^|\.)(qkv_proj|gate_up_proj|query_key_value|W_pack|kv_a_proj_with_mqa|q_b_proj|kv_b_proj)\.weight$", (0,)),
    (r"(^|\.)(qkv_proj|gate_up_proj|query_key_value|W_pack|kv_a_proj_with_mqa|q_b_proj|kv_b_proj)\.bias$", None),
    (r"(^|\.)experts\.gate_up_proj$", (2,)),  # gpt-oss: [E, h, 2 x ffn], gate and up interleaved (::2)
    (r"(^|\.)experts\.gate_up_proj_bias$", None),  # gpt-oss: [E, 2 x ffn]
)


def fused_skip(name: str) -> tuple[bool, tuple[int, ...] | None]:
    """``(is a fused tensor, the dimensions FSDP must not split or None = keep it whole)``."""
    for pattern, skip in FUSED:
        if re.search(pattern, name):
            return True, skip
    return False, ()


def megatron_rules(tensor_axis: str) -> list[Rule]:
    """The built-in tensor-parallel rules on ``tensor_axis`` (a catalogue: rules no parameter of a model matches
    are simply not for that model)."""
    return [Rule(p, tuple(tensor_axis if a == "T" else None for a in spec), f"megatron {kind}")
            for p, spec, kind in _MEGATRON]


def output_split(origin: str) -> str | None:
    """How a Megatron layer's output is split: 'column' / 'vocabulary' -> last dim on tensor, 'row' -> not split."""
    if origin.startswith(("megatron column", "megatron vocabulary")):
        return "tensor"
    return None


def parse_spec(text: str) -> Spec:
    """CLI spec text -> spec: ``"fsdp,tensor"``, ``"-,tensor"`` (``-`` or ``None`` = not split), ``"data+fsdp,-"``.

    >>> parse_spec("data+fsdp,-")
    (('data', 'fsdp'), None)
    """
    out: list[Axis] = []
    for part in text.split(","):
        part = part.strip()
        if part in ("-", "None", "none", ""):
            out.append(None)
        elif "+" in part:
            out.append(tuple(a.strip() for a in part.split("+")))
        else:
            out.append(part)
    return tuple(out)


def normalize_rules(rules: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, Spec], ...]:
    """``{regex: spec}`` (spec a tuple/list, or CLI text) -> a hashable tuple of (regex, spec); bad regex -> error."""
    items = list(rules.items()) if isinstance(rules, Mapping) else list(rules or [])
    out = []
    for pattern, spec in items:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise PlanInputError(f"rule {pattern!r}: not a regular expression ({exc})") from None
        if isinstance(spec, str):
            spec = parse_spec(spec)
        spec = tuple(tuple(a) if isinstance(a, list) else a for a in spec)
        out.append((pattern, spec))
    return tuple(out)


def _axes(a: Axis) -> tuple[str, ...]:
    return () if a is None else (a,) if isinstance(a, str) else tuple(a)


def check_spec(name: str, shape: tuple[int, ...], spec: Spec, rule: Rule, mesh: Mapping[str, int]) -> None:
    """The spec fits the parameter and the mesh; errors name the parameter, the rule and the numbers."""
    if len(spec) != len(shape):
        raise PlanInputError(f"rule {rule.pattern!r} ({rule.origin}) gives {name} (shape {list(shape)}, rank "
                             f"{len(shape)}) the spec {spec} of length {len(spec)}: one entry per dimension")
    used = [a for s in spec for a in _axes(s)]
    for a in used:
        if a not in mesh:
            raise PlanInputError(f"rule {rule.pattern!r} ({rule.origin}) uses mesh axis {a!r} for {name}, but the "
                                 f"mesh has only {list(mesh)}")
    if len(set(used)) != len(used):
        raise PlanInputError(f"rule {rule.pattern!r} ({rule.origin}) uses a mesh axis twice in {spec} for {name}")


def fsdp_dim(shape: tuple[int, ...], spec: Spec, degree: int, skip: tuple[int, ...] = ()) -> int | None:
    """The dimension FSDP splits: the first free one ``degree`` divides, else the largest free one; dimensions in
    ``skip`` only when no other is free (a fused projection's output dimension). A dimension smaller than the
    degree is never split: XLA:TPU keeps such a tensor whole (measured: gpt-oss's attention sinks and router bias
    ``[L, 4]`` over fsdp 8 are whole in the compiled program's header)."""
    free = [i for i, (d, s) in enumerate(zip(shape, spec, strict=True)) if s is None and d >= max(degree, 2)]
    if any(i not in skip for i in free):
        free = [i for i in free if i not in skip]
    if not free or degree <= 1:
        return None
    even = [i for i in free if shape[i] % degree == 0]
    return even[0] if even else max(free, key=lambda i: shape[i])


def spec_for(name: str, shape: tuple[int, ...], user: Sequence[Rule], tp: Sequence[Rule],
             fsdp_axes: tuple[str, ...], fsdp_degree: int, mesh: Mapping[str, int]) -> Spec:
    """The partition spec of one parameter (see the module note for the order)."""
    spec, _ = resolve_one(name, shape, user, tp, fsdp_axes, fsdp_degree, mesh)
    return spec


def resolve_one(name: str, shape: tuple[int, ...], user: Sequence[Rule], tp: Sequence[Rule],
                fsdp_axes: tuple[str, ...], fsdp_degree: int, mesh: Mapping[str, int]) -> tuple[Spec, Rule | None]:
    """``(spec, the explicit rule that matched or None)`` for one parameter."""
    rule = next((r for r in (*user, *tp) if re.search(r.pattern, name)), None)
    spec: Spec = rule.spec if rule else (None,) * len(shape)
    if rule:
        check_spec(name, shape, spec, rule, mesh)
    if fsdp_axes and not any(a in fsdp_axes for s in spec for a in _axes(s)):
        fused, skip = fused_skip(name) if rule is None else (False, ())
        if fused and skip is None:
            return spec, rule  # a fused bias: whole (small; split, its parts would move like the weight's)
        d = fsdp_dim(shape, spec, fsdp_degree, skip=skip or ())
        if d is not None:
            spec = tuple((fsdp_axes[0] if len(fsdp_axes) == 1 else fsdp_axes) if i == d else s
                         for i, s in enumerate(spec))
    return spec, rule


def local_shape(shape: tuple[int, ...], spec: Spec, mesh: Mapping[str, int]) -> tuple[int, ...]:
    """Per-chip shape of a tensor sharded by ``spec`` (uneven dimensions padded up, as GSPMD does)."""
    return tuple(math.ceil(d / math.prod(mesh[a] for a in _axes(s))) for d, s in zip(shape, spec, strict=True))


def resolve(params: Sequence[Any], user_rules: tuple[tuple[str, Spec], ...], tensor_axis: str | None,
            fsdp_axes: tuple[str, ...], mesh: Mapping[str, int], strict: bool = False
            ) -> tuple[dict[str, Spec], dict[str, str]]:
    """``({parameter name: spec}, {parameter name: origin of its rule})`` for every parameter (``models.Param``)."""
    user = [Rule(p, s, "user") for p, s in user_rules]
    tp = megatron_rules(tensor_axis) if tensor_axis else []
    degree = math.prod(mesh[a] for a in fsdp_axes) if fsdp_axes else 1
    specs: dict[str, Spec] = {}
    origin: dict[str, str] = {}
    hits = {r.pattern: 0 for r in user}
    for p in params:
        for r in user:
            if re.search(r.pattern, p.name):
                hits[r.pattern] += 1
        spec, rule = resolve_one(p.name, p.shape, user, tp, fsdp_axes, degree, mesh)
        specs[p.name] = spec
        origin[p.name] = rule.origin if rule else ("fsdp" if spec != (None,) * len(p.shape) else "replicated")
    dead = [pat for pat, n in hits.items() if n == 0]
    if dead:
        raise PlanInputError(f"rule {dead[0]!r} matches no parameter of this model (names look like "
                             f"{params[0].name!r}, {params[-1].name!r}; {len(params)} parameters)")
    if strict:
        bare = [p.name for p in params if origin[p.name] in ("fsdp", "replicated")]
        if bare:
            more = f" and {len(bare) - 3} more" if len(bare) > 3 else ""
            raise PlanInputError(f"strict: parameter {bare[0]!r} is covered by no rule of yours nor a Megatron rule "
                                 f"(uncovered: {', '.join(bare[:3])}{more})")
    return specs, origin
