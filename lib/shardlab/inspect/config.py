"""One inspect run, declared once: :class:`InspectConfig`, its validation, and the plan it implies (:class:`Layout`).

Design note
-----------
Every knob has one name, one default and one comment here; the step builder (``step.build``, which may run in a
helper process: the config is a frozen, picklable dataclass), the planner's mapping and the report read this
object. :func:`make_config` accepts friendlier forms (a mesh dict or ``"data=2,fsdp=4"``, a model as a preset
name, path, dict or ``PretrainedConfig``, rules as a dict) and normalises them.

:meth:`InspectConfig.validate` checks every rule **before anything is traced or compiled** and raises
:class:`InspectInputError` naming the value and the rule: an unknown slice (or one the compiler has no
compile-only topology for), a mesh that does not tile the slice, an axis named twice, FSDP / tensor axes the mesh
lacks, a batch the batch axes cannot divide, heads the tensor axis cannot divide, a sequence longer than learned
position embeddings, a config that cannot be built, a rule that matches nothing (``sharding``). All of it is
cheap: the model is built on the meta device.

Slice names: one form, generation-chips (``v6e-8``: the names of ``data/hardware`` and of the compile-only
topologies of ``shardlab.profile.tpu``). :func:`make_config` — the public entry the CLI, notebook 12 and
``inspect()`` go through — also accepts libtpu's generation:shape form (``v6e:2x4``) and converts it once
(``shardlab.profile.tpu.parse_slice``); :class:`InspectConfig` holds the generation-chips name.

Example::

    >>> cfg = make_config("gpt2", mesh="fsdp=8", topology="v5e:2x4", batch=8, seq=128, num_layers=2)
    >>> cfg.validate().mesh_dict, cfg.topology
    ({'fsdp': 8}, 'v5e-8')
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeAlias

from shardlab.formulas import hardware
from shardlab.formulas.optimizers import OPTIMIZERS, PRECISIONS
from shardlab.inspect import models as M
from shardlab.inspect import sharding as S
from shardlab.inspect.attention import ATTENTION, flash_refusal, flash_seq_refusal
from shardlab.profile import tpu

RECOMPUTE = ("full", "selective", "none", "offload")
LAYER_MODES = ("scan", "scan_layers", "loop")
AUTO = "auto"
# a mesh as a user writes it: "data=2,fsdp=4", {"data": 2, "fsdp": 4} or pairs
MeshSpec: TypeAlias = "str | Mapping[str, int] | Sequence[tuple[str, int]]"
RulesSpec: TypeAlias = "Mapping[str, Any] | Sequence[tuple[str, Any]] | None"  # sharding.normalize_rules


class InspectInputError(ValueError):
    """Bad input to inspect, found before any compile (exit status 2 at the CLI)."""


@dataclass(frozen=True)
class InspectConfig:
    model_json: str  # the model's config.json fields (model_type included), JSON text with sorted keys
    model_name: str = ""  # the preset name or file stem, for tables
    topology: str = "v6e-8"  # the slice: v5e-8, v6e-8, v6e-64, ... (generation-chips; make_config converts)
    mesh: tuple[tuple[str, int], ...] = (("fsdp", 8),)  # mesh axes in device order: (name, size)
    fsdp: tuple[str, ...] = ("fsdp",)  # axes FSDP splits every parameter over; () = no FSDP
    tensor: str | None = None  # axis of the Megatron tensor-parallel rules; None = none
    rules: tuple[tuple[str, S.Spec], ...] = ()  # your (parameter-name regex, spec) rules, first match wins
    strict: bool = False  # every parameter must match one of your rules or a Megatron rule
    batch: int = 8  # global batch: sequences per step, split over every mesh axis except the tensor axis
    seq: int = 2048  # tokens per sequence
    optimizer: str = "adamw"  # adamw | adafactor | sgd | sgd-momentum (formulas.optimizers: the state each keeps)
    optimizer_dtype: str = "fp32"  # fp32: fp32 master + fp32 state | bf16: no master, bf16 state; updated in place
    recompute: str = "full"  # full: each layer recomputed in the backward (saves its input only) | selective:
    # the projections' outputs kept, the attention core and elementwise ops recomputed (scans only) | none |
    # offload: full, the kept layer inputs placed in host memory (scans only; step.OffloadPartition)
    layers: str = "scan"  # decoder layers: scan (stacked weights) | scan_layers (torch_xla's) | loop (HF's own)
    attention: str = "eager"  # eager | sdpa (HF's; [b, a, s, s] scores exist) | flash (torch_xla's Pallas kernel)
    num_layers: int | None = None  # override the config's layer count (quick checks); None = as published
    donate: bool = True  # parameters and optimizer state aliased to their updates (torch_xla's in-place step)
    fit_margin: float = 0.10  # the planner's: "fits" only under (1 - fit_margin) x usable HBM
    overrides: tuple[tuple[str, Any], ...] = ()  # other config fields to override (tiny test models)
    rules_mesh: tuple[tuple[str, int], ...] | None = None  # resolve the rules on this mesh (a small trace of a big
    #                                                        slice: the real mesh, so the specs are its); None = mesh

    # ------------------------------------------------------------------ derived
    @property
    def mesh_dict(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def chips(self) -> int:
        return math.prod(n for _, n in self.mesh)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """Mesh axes the batch is split over: all but the tensor axis (sizes > 1 only)."""
        return tuple(a for a, n in self.mesh if a != self.tensor and n > 1)

    @property
    def batch_degree(self) -> int:
        return math.prod(self.mesh_dict[a] for a in self.batch_axes)

    @property
    def degrees(self) -> tuple[int, int, int]:
        """The planner's (data, fsdp, tensor) degrees of this mesh."""
        m = self.mesh_dict
        f = math.prod(m[a] for a in self.fsdp) if self.fsdp else 1
        t = m[self.tensor] if self.tensor else 1
        return self.chips // (f * t), f, t

    def config_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.model_json))

    def hf_config(self) -> Any:
        over = dict(self.overrides)
        if self.num_layers is not None:
            over[M.num_layers_key(M.load_config(self.config_dict()))] = self.num_layers
        return M.load_config(self.config_dict(), over)

    @property
    def label(self) -> str:
        mesh = ",".join(f"{a}={n}" for a, n in self.mesh)
        layers = f" L={self.num_layers}" if self.num_layers else ""
        return f"{self.model_name or 'model'}{layers} on {self.topology} ({mesh}), batch {self.batch} x seq {self.seq}"

    # ------------------------------------------------------------------ validation
    def validate(self, model: bool = True) -> InspectConfig:
        """Every rule, before any trace; returns self. Errors: :class:`InspectInputError` naming value and rule.
        ``model=False``: only the rules that need no model build (slice, mesh, axes, batch; no torch import)."""
        chips = check_slice(self.topology)
        for name, value, allowed in (("optimizer", self.optimizer, OPTIMIZERS),
                                     ("optimizer_dtype", self.optimizer_dtype, PRECISIONS),
                                     ("recompute", self.recompute, RECOMPUTE), ("layers", self.layers, LAYER_MODES),
                                     ("attention", self.attention, ATTENTION)):
            if value not in allowed:
                raise InspectInputError(f"{name}={value!r} must be one of {allowed}")
        names = [a for a, _ in self.mesh]
        if not names:
            raise InspectInputError("mesh is empty: give at least one axis, e.g. fsdp=8")
        if len(set(names)) != len(names):
            raise InspectInputError(f"mesh {list(self.mesh)} names an axis twice ({names})")
        for a, n in self.mesh:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InspectInputError(f"mesh axis {a}={n!r} must be an integer >= 1")
        if self.chips != chips:
            raise InspectInputError(f"mesh {' x '.join(f'{a}={n}' for a, n in self.mesh)} = {self.chips} devices "
                                    f"does not tile {self.topology} ({chips} chips): the product of the mesh axes "
                                    "must equal the slice's chip count")
        for a in self.fsdp:
            if a not in names:
                raise InspectInputError(f"fsdp axis {a!r} is not a mesh axis ({names})")
        if self.tensor is not None and self.tensor not in names:
            raise InspectInputError(f"tensor axis {self.tensor!r} is not a mesh axis ({names})")
        if self.tensor is not None and self.tensor in self.fsdp:
            raise InspectInputError(f"axis {self.tensor!r} cannot be both the tensor axis and an FSDP axis")
        for name, v in (("batch", self.batch), ("seq", self.seq)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InspectInputError(f"{name}={v!r} must be an integer >= 1")
        if self.batch % self.batch_degree:
            raise InspectInputError(f"batch={self.batch} is not divisible by the batch axes "
                                    f"{' x '.join(self.batch_axes)} = {self.batch_degree}: every device needs "
                                    "whole sequences")
        if self.num_layers is not None and (isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int)
                                            or self.num_layers < 1):
            raise InspectInputError(f"num_layers={self.num_layers!r} must be None or an integer >= 1")
        if not 0 <= self.fit_margin < 1:
            raise InspectInputError(f"fit_margin={self.fit_margin!r} must be in [0, 1)")
        if self.recompute == "offload" and self.layers == "loop":
            raise InspectInputError("recompute='offload' moves the layer inputs a scan keeps for its backward to host "
                                    "memory (a partition of the scanned layer); HF's loop under torch_xla's "
                                    "checkpoint has no such partition: use layers='scan' or 'scan_layers'")
        if self.recompute == "selective" and self.layers == "loop":
            raise InspectInputError("recompute='selective' needs a partition of each layer's forward and backward, "
                                    "which HF's loop under torch_xla's checkpoint does not take: use layers='scan' "
                                    "or 'scan_layers'")
        if not model:
            return self
        try:
            lay = layout(self)
        except (M.ModelInputError, S.PlanInputError) as exc:
            raise InspectInputError(str(exc)) from None
        c = lay.hf_config
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", 1)
        if self.tensor is not None:
            t = self.mesh_dict[self.tensor]
            kv = getattr(c, "num_key_value_heads", None) or heads
            if heads % t:
                raise InspectInputError(f"heads={heads} is not divisible by {self.tensor}={t}: Megatron attention "
                                        "gives each device whole heads")
            if kv % t and t % kv:
                raise InspectInputError(f"kv_heads={kv} and {self.tensor}={t}: one must divide the other")
        if self.attention == "flash":
            why = flash_refusal(c, M.layer_windows(c, lay.num_layers)) or flash_seq_refusal(self.seq)
            if why:
                raise InspectInputError(f"attention='flash': {why}; use attention='eager' or 'sdpa'")
        positions = getattr(c, "n_positions", None) if c.model_type == "gpt2" else None
        if positions is not None and self.seq > positions:
            raise InspectInputError(f"seq={self.seq} is longer than the {positions} learned position embeddings of "
                                    f"{c.model_type} (n_positions)")
        return self


def make_config(model: M.ModelSpec, *, mesh: MeshSpec = "fsdp=8", topology: str = "v6e-8",
                fsdp: str | Sequence[str] | None = AUTO, tensor: str | None = AUTO, rules: RulesSpec = None,
                **kw: Any) -> InspectConfig:
    """An :class:`InspectConfig` from friendly forms; nothing is validated here (call ``validate``).

    ``mesh``: ``{"fsdp": 8}``, ``"data=2,fsdp=4"`` or pairs; ``fsdp``: axis name(s), ``"auto"`` (the ``fsdp`` axis if
    the mesh has one) or None; ``tensor``: axis name, ``"auto"`` (the ``tensor`` axis if present) or None;
    ``rules``: ``{regex: spec}``; ``model``: see ``models.config_dict``; other keywords are fields.
    """
    try:
        d = M.config_dict(model)
    except M.ModelInputError as exc:
        raise InspectInputError(str(exc)) from None
    name = kw.pop("model_name", None) or (Path(str(model)).stem if isinstance(model, str | Path) else
                                          str(d.get("model_type", "model")))
    pairs = parse_mesh(mesh)
    axes = [a for a, _ in pairs]
    f = (("fsdp",) if "fsdp" in axes else ()) if fsdp == AUTO else () if fsdp is None else \
        (fsdp,) if isinstance(fsdp, str) else tuple(fsdp)
    t = ("tensor" if "tensor" in axes else None) if tensor == AUTO else tensor
    if "overrides" in kw and isinstance(kw["overrides"], dict):
        kw["overrides"] = tuple(sorted(kw["overrides"].items()))
    try:
        norm_rules = S.normalize_rules(rules)
    except S.PlanInputError as exc:
        raise InspectInputError(str(exc)) from None
    return InspectConfig(json.dumps(d, sort_keys=True), name, slice_name(topology), pairs, f, t, norm_rules,
                         **kw)


def parse_mesh(mesh: MeshSpec) -> tuple[tuple[str, int], ...]:
    """``"data=2,fsdp=4"`` / ``{"data": 2, "fsdp": 4}`` / pairs -> ``(("data", 2), ("fsdp", 4))``."""
    if isinstance(mesh, str):
        pairs = []
        for part in mesh.replace(" ", "").split(","):
            name, sep, size = part.partition("=")
            if not sep or not name or not size.isdigit():
                raise InspectInputError(f"mesh {mesh!r}: {part!r} is not NAME=SIZE (e.g. fsdp=8 or data=2,fsdp=4)")
            pairs.append((name, int(size)))
        return tuple(pairs)
    if isinstance(mesh, dict):
        return tuple((str(k), v) for k, v in mesh.items())
    return tuple((str(a), n) for a, n in mesh)


def slice_name(topology: str) -> str:
    """A user's slice name (``v6e-8``, or libtpu's ``v6e:2x4``) as the suite's ``v6e-8``; unknown: InspectInputError."""
    try:
        return tpu.parse_slice(topology)
    except ValueError as exc:
        raise InspectInputError(str(exc)) from None


def check_slice(name: str) -> int:
    """The chip count of the slice ``name`` (generation-chips), which the planner and the compiler must both know."""
    try:
        _, chips = hardware.topology(name)
    except ValueError as exc:
        raise InspectInputError(f"topology={name!r}: {exc}") from None
    try:
        tpu.get_topology(name)
    except ValueError as exc:
        raise InspectInputError(str(exc)) from None
    return chips


@dataclass
class Layout:
    """What a config implies before tracing: the model's parameters, each one's spec and per-chip shape."""

    hf_config: Any
    layer_path: str
    params: list[M.Param]
    specs: dict[str, S.Spec]  # per parameter name
    origins: dict[str, str]  # which rule gave the spec: user | megatron <kind> | fsdp | replicated
    stacked: dict[str, list[str]] = field(default_factory=dict)  # scan: suffix -> per-layer names (in order)
    num_layers: int = 0

    def local_bytes(self, name: str, itemsize: int) -> int:
        p = next(x for x in self.params if x.name == name)
        return math.prod(S.local_shape(p.shape, self.specs[name], self._mesh)) * itemsize

    _mesh: dict[str, int] = field(default_factory=dict)

    def trained(self, stacked: bool) -> list[tuple[str, tuple[int, ...], S.Spec]]:
        """The tensors the step holds and updates: ``(name, shape, spec)``; with ``stacked`` the decoder layers'
        weights are one ``[L, ...]`` tensor per suffix (named ``<layers>.*.<suffix>``), spec with a leading None."""
        out = []
        done: set[str] = set()
        for p in self.params:
            if stacked and p.layer is not None:
                if p.suffix in done:
                    continue
                done.add(p.suffix)
                out.append((f"{self.layer_path}.*.{p.suffix}", (self.num_layers, *p.shape),
                            (None, *self.specs[p.name])))
            else:
                out.append((p.name, p.shape, self.specs[p.name]))
        return out


@lru_cache(maxsize=16)
def layout(cfg: InspectConfig) -> Layout:
    """The meta-device model's parameters and the specs the rules give them (cached per config)."""
    hf = cfg.hf_config()
    model = M.build_meta(hf)
    path = M.layer_path(model)
    params = M.parameters(model, path)
    specs, origins = S.resolve(params, cfg.rules, cfg.tensor, cfg.fsdp,
                               dict(cfg.rules_mesh) if cfg.rules_mesh else cfg.mesh_dict, cfg.strict)
    n_layers = len(model.get_submodule(path))
    if cfg.layers != "loop":
        why = M.scan_refusal(hf, params)
        if why:
            raise M.ModelInputError(f"layers={cfg.layers!r}: {why}; use layers='loop'")
    stacked: dict[str, list[str]] = {}
    for p in params:
        if p.layer is not None:
            stacked.setdefault(p.suffix, []).append(p.name)
    if cfg.layers == "scan":
        for suffix, names in stacked.items():
            different = [n for n in names if specs[n] != specs[names[0]]]
            if different:
                raise S.PlanInputError(f"layers='scan' stacks {suffix!r} of every layer into one tensor, but "
                                       f"{different[0]} gets {specs[different[0]]} and {names[0]} {specs[names[0]]}"
                                       ": give every layer the same spec, or use layers='loop'")
    return Layout(hf, path, params, specs, origins, stacked, n_layers, cfg.mesh_dict)


def with_mesh(cfg: InspectConfig, mesh: tuple[tuple[str, int], ...], **kw: Any) -> InspectConfig:
    """The same run on another mesh (the nearest plan that fits); FSDP / tensor axes follow the names present."""
    axes = [a for a, _ in mesh]
    return replace(cfg, mesh=mesh, fsdp=tuple(a for a in axes if a == "fsdp"),
                   tensor="tensor" if "tensor" in axes else None, **kw)
