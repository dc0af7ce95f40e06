"""Notebook parameters: one frozen dataclass per notebook, validated once, before any XLA work.

Design
------
papermill injects plain literals into a notebook's first cell (tagged ``parameters``). That cell stays a
list of literals, and the cell after it reads them into the notebook's dataclass in one line::

    p = MlpParams.from_namespace(globals())      # exactly the declared fields; validated; errors name the rule

``from_namespace`` takes every field of the dataclass from the namespace (a missing one is an error, so a
parameter cannot be silently ignored) and calls :meth:`NotebookParams.validate`, which raises ``ValueError``
naming the parameter and the rule ("ffn=100 is not divisible by tp=8"). The :class:`Recorder` takes the
object (``Recorder.for_params(p, world)``), so a notebook never writes its parameters twice.
``tests/test_params.py`` checks that each notebook's parameters cell declares exactly its dataclass's fields
with the same defaults — no notebook declares a parameter it does not use.

Example::

    >>> MlpParams(tp=3).validate()
    Traceback (most recent call last):
    ValueError: ffn=256 is not divisible by tp=3 (ParallelMLP splits the MLP's inner dimension)
    >>> MlpParams(tp=4, num_devices=1).validate().tp
    4
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

DTYPES = ("float32", "bfloat16")


def positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")


def divisible(name: str, value: int, by_name: str, by: int, why: str) -> None:
    if value % by:
        raise ValueError(f"{name}={value} is not divisible by {by_name}={by} ({why})")


def one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {allowed}")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")


@dataclass(frozen=True)
class NotebookParams:
    """Fields every notebook declares; subclasses add their own and extend :meth:`checks`."""

    NOTEBOOK: ClassVar[str] = ""

    num_devices: int = 8  # devices of this process's world: virtual CPU devices, or TPU chips
    results_dir: str | None = None  # where the JSON record goes (the report runner sets it)
    seed: int = 0
    answers: dict | None = None  # exercise answer key injected by the tests / the report; None for a learner

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> Self:
        """Read every field from ``namespace`` (a notebook's ``globals()``) and validate."""
        missing = [f.name for f in fields(cls) if f.name not in namespace]
        if missing:
            raise ValueError(f"{cls.NOTEBOOK or cls.__name__}: the parameters cell does not define {missing}")
        return cls(**{f.name: namespace[f.name] for f in fields(cls)}).validate()

    def validate(self) -> Self:
        if self.num_devices is not None:  # None: all TPU chips of a TPU host
            positive_int("num_devices", self.num_devices)
        if self.results_dir is not None and not isinstance(self.results_dir, str):
            raise ValueError(f"results_dir={self.results_dir!r} must be a path string or None")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")
        if self.answers is not None and not isinstance(self.answers, dict):
            raise ValueError(f"answers={self.answers!r} must be None or a dict of exercise number to answer")
        self.checks()
        return self

    def checks(self) -> None:
        """Notebook-specific rules (subclasses)."""

    def as_record(self) -> dict[str, Any]:
        """The parameters as the record stores them: ``results_dir`` (where, not what) and the injected answer
        key (not a parameter of the measurement) are left out."""
        out = asdict(self)
        out.pop("results_dir")
        out.pop("answers")
        return out


# ------------------------------------------------------------------------------------------- tensor parallel
@dataclass(frozen=True)
class TensorParallelParams(NotebookParams):
    """Shared by 02-04: a tensor-parallel degree and activation sizes. ``tp`` may exceed ``num_devices``:
    formula and ledger run at ``tp`` anyway, the CPU compiler view is then skipped with a note, and the TPU
    view compiles for a ``tp``-chip topology in a helper process."""

    tp: int = 4  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
    batch: int = 2
    seq: int = 8
    hidden: int = 64
    dtype: str = "float32"  # "float32" or "bfloat16"

    def checks(self) -> None:
        for name in ("tp", "batch", "seq", "hidden"):
            positive_int(name, getattr(self, name))
        one_of("dtype", self.dtype, DTYPES)


@dataclass(frozen=True)
class MlpParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "02_megatron_mlp"

    ffn: int = 256  # MLP inner size (4 * hidden in GPT)
    run_gloo: bool = True  # also run the per-rank code in tp real processes (torch.distributed, gloo)

    def checks(self) -> None:
        super().checks()
        positive_int("ffn", self.ffn)
        divisible("ffn", self.ffn, "tp", self.tp, "ParallelMLP splits the MLP's inner dimension")
        boolean("run_gloo", self.run_gloo)


@dataclass(frozen=True)
class AttentionParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "03_megatron_attention"

    ffn: int = 256  # MLP inner size of the transformer-layer section (attention + MLP)
    heads: int = 8

    def checks(self) -> None:
        super().checks()
        positive_int("ffn", self.ffn)
        positive_int("heads", self.heads)
        divisible("hidden", self.hidden, "heads", self.heads, "each head has hidden / heads dimensions")
        divisible("heads", self.heads, "tp", self.tp, "whole heads per rank")
        divisible("ffn", self.ffn, "tp", self.tp, "the layer's MLP is split like notebook 02's")


@dataclass(frozen=True)
class VocabParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "04_vocab_parallel_embedding_ce"

    tp: int = 8
    batch: int = 1
    vocab: int = 50257  # GPT-2's vocabulary: NOT divisible by 8 (50257 = 8 * 6282 + 1)
    label_smoothing: float = 0.1  # for the parity section (torch's global definition)

    def checks(self) -> None:
        super().checks()
        positive_int("vocab", self.vocab)
        if self.tp == 1:
            raise ValueError("tp=1 communicates nothing: choose tp >= 2 to compare vocab-parallel CE with "
                             "gathered logits")
        if self.vocab < self.tp:
            raise ValueError(f"vocab={self.vocab} is smaller than tp={self.tp}: some rank would own no rows")
        if isinstance(self.label_smoothing, bool) or not isinstance(self.label_smoothing, int | float) \
                or not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing!r} is not a number in [0, 1]")


def int_list(name: str, value: Any, least: int = 1, empty_ok: bool = False) -> None:
    if not isinstance(value, list | tuple) or (not value and not empty_ok):
        raise ValueError(f"{name}={value!r} must be a {'' if empty_ok else 'non-empty '}list of ints >= {least}")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < least]
    if bad:
        raise ValueError(f"{name}={list(value)} has entries {bad}: each must be an int >= {least}")


# ------------------------------------------------------------------------------------------------------ scan
@dataclass(frozen=True)
class ScanParams(NotebookParams):
    """Notebook 06. The mesh (fsdp, tensor) may differ from ``num_devices``: the formulas and the TPU compiler
    (a fsdp·tensor-chip slice, in a helper process when the counts differ) run at the mesh anyway; the CPU
    sections need exactly fsdp·tensor devices in this process and are skipped with a note otherwise."""

    NOTEBOOK: ClassVar[str] = "06_scan_shard_as"

    layers_sweep: list = field(default_factory=lambda: [2, 4])  # L values of the compile curves (>= 2 each)
    hidden: int = 64  # H: W_up [H, F] is split H over fsdp
    ffn: int = 256  # F: split over tensor
    batch: int = 8  # B: split over fsdp
    seq: int = 8  # S: split over tensor in the nn.Linear trap
    mesh_fsdp: int = 2  # mesh (fsdp, tensor)
    mesh_tensor: int = 4
    devices_sweep: list = field(default_factory=list)  # compile time vs device count: one fresh process per count
    placeholder_hiddens: list = field(default_factory=lambda: [64, 256])  # widths for the trace transfers

    def checks(self) -> None:
        for name in ("hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor"):
            positive_int(name, getattr(self, name))
        int_list("layers_sweep", self.layers_sweep, least=2)  # XLA removes a While that runs once
        if self.mesh_fsdp == 1:
            raise ValueError("mesh_fsdp=1 leaves shard_as nothing to do (the gradient's 1-D and 2-D shardings "
                             "coincide when the batch is not split): choose mesh_fsdp >= 2")
        f, t = self.mesh_fsdp, self.mesh_tensor
        for name, size, axis, n in (("hidden", self.hidden, "mesh_fsdp", f), ("ffn", self.ffn, "mesh_tensor", t),
                                    ("batch", self.batch, "mesh_fsdp", f), ("seq", self.seq, "mesh_tensor", t)):
            divisible(name, size, axis, n, f"it is split over {axis.removeprefix('mesh_')}")
        for name, size, axis, n in (("hidden", self.hidden, "mesh_tensor", t), ("ffn", self.ffn, "mesh_fsdp", f),
                                    ("batch", self.batch, "mesh_tensor", t)):
            divisible(name, size, axis, n, "the transposed mesh (fsdp and tensor sizes swapped) splits it so")
        int_list("devices_sweep", self.devices_sweep, empty_ok=True)
        for n in self.devices_sweep:
            if n > 8 or self.hidden % n or self.batch % n:
                raise ValueError(f"devices_sweep entry {n}: must be <= 8 CPU devices and divide hidden={self.hidden} "
                                 f"and batch={self.batch} (it runs mesh (fsdp={n}, tensor=1))")
        int_list("placeholder_hiddens", self.placeholder_hiddens)
        for h in self.placeholder_hiddens:
            if h % f or (4 * h) % t:
                raise ValueError(f"placeholder_hiddens entry {h}: must be divisible by mesh_fsdp={f}, and ffn = 4·{h} "
                                 f"by mesh_tensor={t} (the traced stack is split like the notebook's)")


NOTEBOOK_PARAMS: dict[str, type[NotebookParams]] = {
    cls.NOTEBOOK: cls for cls in (MlpParams, AttentionParams, VocabParams, ScanParams)
}
