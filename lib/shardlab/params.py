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
from dataclasses import asdict, dataclass, fields
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


# ------------------------------------------------------------------------------------------------------ FSDP
def layer_widths(name: str, value: Any) -> tuple[int, ...]:
    """A list/tuple of >= 2 positive ints (MLP widths), returned as a tuple."""
    if (not isinstance(value, list | tuple) or len(value) < 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value)):
        shown = list(value) if isinstance(value, tuple) else value
        raise ValueError(f"{name}={shown!r} must be a list of >= 2 positive ints (MLP widths)")
    return tuple(value)


@dataclass(frozen=True)
class FsdpParamsBase(NotebookParams):
    """Shared by 05 and 05b: an MLP Linear(d0, d1) -> tanh -> ... trained data-parallel on ``world_size`` FSDP
    ranks. ``world_size`` may exceed ``num_devices``: the FlatParameter and the formulas need no devices."""

    world_size: int = 8  # FSDP ranks W (SimulatedWorld ranks; the GSPMD mesh's fsdp axis)
    layer_sizes: tuple[int, ...] = (30, 50, 10)  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
    batch: int = 64  # global batch, split evenly over the W ranks

    def __post_init__(self) -> None:
        if isinstance(self.layer_sizes, list):  # papermill injects YAML lists
            object.__setattr__(self, "layer_sizes", tuple(self.layer_sizes))

    def checks(self) -> None:
        positive_int("world_size", self.world_size)
        layer_widths("layer_sizes", self.layer_sizes)
        positive_int("batch", self.batch)
        divisible("batch", self.batch, "world_size", self.world_size, "every rank trains on batch / world_size rows")


@dataclass(frozen=True)
class FsdpParams(FsdpParamsBase):
    NOTEBOOK: ClassVar[str] = "05_fsdp_flat_params"

    align: bool = False  # True: alignment padding like use_orig_params (16-byte parameter starts)
    steps: int = 3  # training steps for the parity check

    def checks(self) -> None:
        super().checks()
        boolean("align", self.align)
        positive_int("steps", self.steps)


@dataclass(frozen=True)
class FsdpGspmdParams(FsdpParamsBase):
    """``world_size`` must tile ``num_devices`` for the CPU compiler view (else it is skipped with a note)."""

    NOTEBOOK: ClassVar[str] = "05b_fsdp_gspmd"

    torch_fsdp_world: int = 2  # ranks (gloo processes) for PyTorch FSDP1 / FSDP2; 0 skips them (process start-up)

    def checks(self) -> None:
        super().checks()
        if isinstance(self.torch_fsdp_world, bool) or not isinstance(self.torch_fsdp_world, int) \
                or not 0 <= self.torch_fsdp_world <= 4:
            raise ValueError(f"torch_fsdp_world={self.torch_fsdp_world!r} must be an int in [0, 4] "
                             "(0 skips PyTorch FSDP)")


NOTEBOOK_PARAMS: dict[str, type[NotebookParams]] = {
    cls.NOTEBOOK: cls for cls in (MlpParams, AttentionParams, VocabParams, FsdpParams, FsdpGspmdParams)
}
