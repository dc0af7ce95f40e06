"""Notebook 12's parameters: your model, the slice and mesh it is inspected on, and the live tiny run.

Light on purpose (no torch, no torch_xla): the notebook reads it before ``runtime.setup()``. The dataclass is the
notebook's configuration; inspect's own per-run object (:class:`shardlab.inspect.config.InspectConfig`, the API
scripts and the CLI use) is built from it at the call — :meth:`YourModelParams.inspect_config` for your model at
full size, :meth:`YourModelParams.tiny_config` for the same family at tiny widths
(:func:`shardlab.inspect.models.tiny_overrides`), compiled live in seconds. Every rule that needs no model build
(the slice, the mesh tiling it, the axes, the batch) is checked in :meth:`checks`; the rest (heads over the tensor
axis, your rules against the model's parameter names) by ``InspectConfig.validate()`` in the notebook, before any
trace.

Example::

    >>> YourModelParams(mesh="fsdp=4").validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: model='llama-3-8b', topology='v6e-8', mesh='fsdp=4', batch=8: mesh fsdp=4 = 4 devices does not ...
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from shardlab import runtime
from shardlab.core.params import NotebookParams
from shardlab.inspect import config as C
from shardlab.inspect import models as M


@dataclass(frozen=True)
class YourModelParams(NotebookParams):
    """Notebook 12 (see the module note)."""

    NOTEBOOK: ClassVar[str] = "12_your_model"
    POSITIVE: ClassVar[tuple[str, ...]] = ("batch", "seq", "tiny_layers", "tiny_seq")
    FLAGS: ClassVar[tuple[str, ...]] = ("strict", "compare_layers", "full_size")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"recompute": C.RECOMPUTE, "layers": C.LAYER_MODES}
    SLICES: ClassVar[tuple[str, ...]] = ("topology", "tiny_topology")

    model: str | dict = "llama-3-8b"  # a preset of data/models, a config.json path, or a dict of config fields
    overrides: dict = field(default_factory=dict)  # config fields to change, e.g. {"num_hidden_layers": 16}
    topology: str = "v6e-8"  # the slice your model is inspected on: v5e-8, v6e-8, v6e-64 ...
    mesh: str = "fsdp=8"  # mesh axes NAME=SIZE in device order (fsdp: FSDP, tensor: Megatron, others: data)
    batch: int = 8  # global batch: sequences per step, split over every axis but tensor
    seq: int = 8192  # tokens per sequence
    rules: dict = field(default_factory=dict)  # your rules {parameter-name regex: spec}, first match wins
    strict: bool = False  # every parameter must match a rule of yours or a Megatron rule
    recompute: str = "full"  # full (each layer recomputed in the backward) | selective (scans) | none
    layers: str = "scan"  # decoder layers: scan (stacked weights) | scan_layers (torch_xla's) | loop (HF's)
    tiny_topology: str = "v5e-8"  # slice of the live run: your model's family at tiny widths (seconds)
    tiny_mesh: str = "fsdp=4,tensor=2"  # mesh of the live run (your rules apply there too)
    tiny_layers: int = 2  # decoder layers of the live run (>= 2: XLA removes a loop that runs once)
    tiny_seq: int = 64  # tokens per sequence of the live run
    compare_layers: bool = False  # also compile the live run with scan_layers and HF's loop (seconds each)
    full_size: bool = False  # compile the full-size runs with XLA:TPU (minutes each); False: cached

    def checks(self) -> None:
        if not isinstance(self.model, str | dict):
            raise ValueError(f"model={self.model!r} must be a preset name, a config.json path or a dict of fields")
        for name in ("overrides", "rules"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a dict")
        for name in ("mesh", "tiny_mesh"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a string")
        if self.tiny_layers < 2:
            raise ValueError(f"tiny_layers={self.tiny_layers} must be >= 2 (XLA removes a While loop that runs once)")
        for names, build in ((("model", "topology", "mesh", "batch"), self.inspect_config),
                             (("model", "tiny_topology", "tiny_mesh"), self.tiny_config)):
            try:
                build().validate(model=False)
            except ValueError as exc:  # InspectInputError: named with the parameters it came from
                shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
                raise ValueError(f"{shown}: {exc}") from None
        chips = self.inspect_config().chips
        if self.full_size and chips > runtime.MAX_CPU_DEVICES:
            raise ValueError(f"topology={self.topology!r} has {chips} chips: tracing its step at full size needs that "
                             f"many CPU devices, at most {runtime.MAX_CPU_DEVICES} here (runtime.MAX_CPU_DEVICES)")

    def inspect_config(self) -> C.InspectConfig:
        """inspect's configuration of your model at full size, from these parameters."""
        return C.make_config(self.model, mesh=self.mesh, topology=self.topology, rules=self.rules or None,
                             strict=self.strict, batch=self.batch, seq=self.seq, recompute=self.recompute,
                             layers=self.layers, overrides=dict(self.overrides))

    def tiny_config(self) -> C.InspectConfig:
        """The live run: your model's family at tiny widths and ``tiny_layers`` layers, on ``tiny_topology`` with
        ``tiny_mesh``, two sequences of ``tiny_seq`` tokens per device of the batch axes; your rules apply."""
        full = self.inspect_config()
        over = {**dict(self.overrides), **M.tiny_overrides({**full.config_dict(), **dict(self.overrides)})}
        cfg = C.make_config(self.model, mesh=self.tiny_mesh, topology=self.tiny_topology, rules=self.rules or None,
                            strict=self.strict, batch=1, seq=self.tiny_seq, recompute=self.recompute,
                            layers=self.layers, num_layers=self.tiny_layers, overrides=over,
                            model_name=f"{full.model_name} (tiny)")
        return replace(cfg, batch=2 * cfg.batch_degree)

    def tiny_variant(self, layers: str) -> C.InspectConfig:
        """The live run with another layer mode (the compile-time comparison)."""
        return replace(self.tiny_config(), layers=layers)
