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

import ast
import importlib
import inspect
import io
import json
import tokenize
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from shardlab import planner
from shardlab.formulas.common import RECOMPUTE_POLICIES
from shardlab.profile.tpu import parse_slice

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
    """Fields every notebook declares; subclasses add their own and extend :meth:`checks`.

    A size that sets a view's device count (ranks, blocks, degrees, a mesh) may exceed ``num_devices``: formula and
    ledger need no devices, the harness skips the CPU compiler view with a note and compiles the TPU view for that
    many chips in a helper process."""

    NOTEBOOK: ClassVar[str] = ""
    # The one-field rules, each class listing its own fields (validate() applies those of every class in the MRO)
    POSITIVE: ClassVar[tuple[str, ...]] = ()  # positive ints
    FLAGS: ClassVar[tuple[str, ...]] = ()  # True or False
    CHOICES: ClassVar[dict[str, tuple[Any, ...]]] = {}  # field -> the values it may take
    # TPU slice names: a user may write "v6e-8" or libtpu's "v6e:2x4"; validate() stores the one form ("v6e-8")
    SLICES: ClassVar[tuple[str, ...]] = ()

    num_devices: int = 8  # virtual CPU devices (or TPU chips) of this kernel; needs a kernel restart to change
    results_dir: str | None = None  # where the JSON record goes (the report runner sets it)
    seed: int = 0  # seed of every random tensor
    answers: dict | None = None  # exercise answer key (the tests and the report inject it); leave None

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
        for klass in reversed(type(self).__mro__):
            rules = vars(klass)
            for name in rules.get("POSITIVE", ()):
                positive_int(name, getattr(self, name))
            for name in rules.get("FLAGS", ()):
                boolean(name, getattr(self, name))
            for name, allowed in rules.get("CHOICES", {}).items():
                one_of(name, getattr(self, name), allowed)
            for name in rules.get("SLICES", ()):
                # the boundary: the notebook's own code and the library see the generation-chips name only
                object.__setattr__(self, name, parse_slice(getattr(self, name), name))
        self.checks()
        return self

    def checks(self) -> None:
        """Notebook-specific rules beyond POSITIVE, FLAGS and CHOICES (subclasses)."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default value (default factories called)."""
        return {f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                for f in fields(cls)}

    @classmethod
    def parameters_cell(cls) -> str:
        """The notebook's ``parameters`` cell, generated from the dataclass: one ``name = default  # comment``
        line per field, in field order, the comment of the class that declared the field last."""
        comments: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if klass is object or not hasattr(klass, "__dataclass_fields__"):
                continue
            comments |= field_comments(klass)
        lines = []
        defaults = cls.defaults()
        defaults["answers"] = defaults.pop("answers")  # last: the learner never sets it
        for name, value in defaults.items():
            text = f"{name} = {_literal(value)}"
            lines.append(f"{text}  # {comments[name]}" if comments.get(name) else text)
        return "\n".join(lines)

    def as_record(self) -> dict[str, Any]:
        """The parameters as the record stores them: ``results_dir`` (where, not what) and the injected answer
        key (not a parameter of the measurement) are left out."""
        out = asdict(self)
        out.pop("results_dir")
        out.pop("answers")
        return out


def _literal(value: Any) -> str:
    """A default as the plain literal papermill injects (tuples as lists)."""
    if isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    ast.literal_eval(text)  # a parameters cell holds literals only
    return text


def field_comments(cls: type) -> dict[str, str]:
    """``{field: trailing comment}`` of the annotated assignments in ``cls``'s own body."""
    source = inspect.getsource(cls)
    tree = ast.parse(source)
    body = tree.body[0].body  # type: ignore[attr-defined]
    lines = {n.lineno: n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    out: dict[str, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in lines:
            out[lines[tok.start[0]]] = tok.string.lstrip("#").strip()
    return out


# ------------------------------------------------------------------------------------------- 00 and 01
@dataclass(frozen=True)
class WelcomeParams(NotebookParams):
    """Notebook 00. ``world_size`` ranks take part in every collective shown (formula, ledger, both compilers)."""

    NOTEBOOK: ClassVar[str] = "00_welcome"
    WORLD_SIZES: ClassVar[tuple[int, ...]] = (2, 4, 8)
    POSITIVE = ("n", "world_size")

    n: int = 1024  # elements of each rank's vector in the collectives
    world_size: int = 8  # ranks in the collectives (2, 4 or 8)

    def checks(self) -> None:
        if self.world_size not in self.WORLD_SIZES:
            raise ValueError(f"world_size={self.world_size} must be one of {self.WORLD_SIZES} (a collective needs "
                             "2 or more ranks, and the TPU compiler has a slice of that many chips)")
        divisible("n", self.n, "world_size", self.world_size,
                  "the all-gather and the reduce-scatter split the vector evenly over the ranks")


@dataclass(frozen=True)
class BlocksParams(NotebookParams):
    """Notebook 01. Every view splits the product over ``parts`` = p blocks, one per device."""

    NOTEBOOK: ClassVar[str] = "01_block_matrices"
    POSITIVE = ("m", "k", "n", "parts")
    CHOICES = {"dtype": DTYPES}

    m: int = 16  # x is m×k
    k: int = 64  # inner dimension
    n: int = 32  # W is k×n
    parts: int = 4  # p, the number of blocks and of devices in the split; the 2-D grid is 2 by p/2
    dtype: str = "float32"  # "float32" or "bfloat16"
    matmul: tuple = (64, 128, 32)  # I, J, K of section 7's sharded matmuls A[I, J]·B[J, K] on the (X 2, Y 4) mesh

    def checks(self) -> None:
        if not isinstance(self.matmul, list | tuple) or len(self.matmul) != 3:
            raise ValueError(f"matmul={self.matmul!r} must be three positive ints (I, J, K)")
        for name, v, d in zip("IJK", self.matmul, (8, 4, 4), strict=True):
            positive_int(f"matmul {name}", v)
            if v % d:
                raise ValueError(f"matmul={tuple(self.matmul)}: {name}={v} is not divisible by {d} (on the (X 2, Y 4) "
                                 f"mesh {name} is split over {'X and Y' if name == 'I' else 'Y'})")
        for name in ("k", "n"):
            if self.parts > getattr(self, name):
                raise ValueError(f"parts={self.parts} is more than {name}={getattr(self, name)}: every block "
                                 "needs at least one row/column")
        if self.parts % 2 == 0 and self.m % 2:
            raise ValueError(f"m={self.m} is odd: the 2-D grid (2, parts/2) splits x's rows in 2 (choose an even m, "
                             "or an odd parts to leave the grid out)")


# ------------------------------------------------------------------------------------------- tensor parallel
@dataclass(frozen=True)
class TensorParallelParams(NotebookParams):
    """Shared by 02-04: a tensor-parallel degree and activation sizes."""

    POSITIVE = ("tp", "batch", "seq", "hidden")
    CHOICES = {"dtype": DTYPES}

    tp: int = 4  # tensor-parallel degree: ranks in the ledger, size of the `tensor` mesh axis
    batch: int = 2
    seq: int = 8
    hidden: int = 64
    dtype: str = "float32"  # "float32" or "bfloat16"


@dataclass(frozen=True)
class MlpParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "02_megatron_mlp"
    POSITIVE = ("ffn",)
    FLAGS = ("run_gloo",)

    ffn: int = 256  # MLP inner size (4 * hidden in GPT)
    run_gloo: bool = True  # also run the per-rank code in tp real processes (torch.distributed, gloo)

    def checks(self) -> None:
        divisible("ffn", self.ffn, "tp", self.tp, "ParallelMLP splits the MLP's inner dimension")


@dataclass(frozen=True)
class AttentionParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "03_megatron_attention"
    POSITIVE = ("ffn", "heads")

    ffn: int = 256  # MLP inner size of the transformer-layer section (attention + MLP)
    heads: int = 4  # head dim hidden / heads = 16 differs from seq = 8, so the [s, s] score arrays are countable

    def checks(self) -> None:
        divisible("hidden", self.hidden, "heads", self.heads, "each head has hidden / heads dimensions")
        divisible("heads", self.heads, "tp", self.tp, "whole heads per rank")
        divisible("ffn", self.ffn, "tp", self.tp, "the layer's MLP is split like notebook 02's")


@dataclass(frozen=True)
class VocabParams(TensorParallelParams):
    NOTEBOOK: ClassVar[str] = "04_vocab_parallel_embedding_ce"
    POSITIVE = ("vocab",)

    tp: int = 8
    batch: int = 1
    vocab: int = 50257  # GPT-2's vocabulary: NOT divisible by 8 (50257 = 8 * 6282 + 1)
    label_smoothing: float = 0.1  # for the parity section (torch's global definition)
    memory_tokens: int = 0  # b·s of an extra compile-only TPU pair (gathered vs vocab-parallel loss); 0 skips it

    def checks(self) -> None:
        if isinstance(self.memory_tokens, bool) or not isinstance(self.memory_tokens, int) or self.memory_tokens < 0:
            raise ValueError(f"memory_tokens={self.memory_tokens!r} must be an int >= 0 (0 skips the TPU memory "
                             "comparison)")
        if self.tp == 1:
            raise ValueError("tp=1 communicates nothing: choose tp >= 2 to compare vocab-parallel CE with "
                             "gathered logits")
        if self.vocab < self.tp:
            raise ValueError(f"vocab={self.vocab} is smaller than tp={self.tp}: some rank would own no rows")
        if isinstance(self.label_smoothing, bool) or not isinstance(self.label_smoothing, int | float) \
                or not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing!r} is not a number in [0, 1]")


# ------------------------------------------------------------------------------------------ compiler levers
GENERATIONS = ("v5e", "v6e")
SEARCHES = ("off", "small", "full")


def int_sequence(name: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{name}={value!r} must be a non-empty list of positive ints")
    for v in value:
        positive_int(f"{name} entry", v)


@dataclass(frozen=True)
class LeversParams(NotebookParams):
    """Notebook 08: combining, overlap, memory order, automatic strategy, fusion — each off vs on."""

    NOTEBOOK: ClassVar[str] = "08_compiler_levers"
    POSITIVE = ("layers", "hidden", "batch", "gloo_repeats", "mlp_seq", "mlp_hidden", "mlp_ffn", "toy_rows",
                "big_layers", "overlap_hidden", "overlap_batch", "update_hidden", "update_batch")
    FLAGS = ("run_tpu", "auto_sharding")
    CHOICES = {"generation": GENERATIONS, "optimizer": ("sgd", "adam"), "search": SEARCHES}

    generation: str = "v5e"  # TPU generation compiled for (compile-only): "v5e" or "v6e"
    run_tpu: bool = True  # False: formula, ledger, CPU compiler and timings only (no TPU compiles)
    layers: int = 8  # L weight gradients of the data-parallel / FSDP step (combining, overlap)
    hidden: int = 256  # width of those square layers
    batch: int = 64  # global batch of that step, sharded over all devices
    bucket_bytes: int = 1048576  # hand-made gradient buckets for the ledger (DDP's bucket_cap_mb), bytes
    bucket_first_bytes: int = 1048576  # the first bucket's own limit (DDP: dist._DEFAULT_FIRST_BUCKET_BYTES)
    gloo_world: int = 2  # processes for the real all-reduce timings; 0 skips them
    gloo_repeats: int = 5  # timed samples per point (after 2 warm-up rounds)
    gloo_numels: tuple = (4096, 1048576)  # float32 elements per timed point (all m calls together)
    gloo_calls: tuple = (1, 8, 32)  # m: the point's elements are split over m all-reduces
    mlp_seq: int = 512  # Megatron MLP (bf16, batch 2, tp equal to num_devices) for overlap and fusion
    mlp_hidden: int = 512
    mlp_ffn: int = 2048
    toy_rows: int = 262144  # memory-order toy on the TPU: one unit = [toy_rows, 256] bf16 per chip
    big_layers: int = 4  # layers of the two large compile-only steps (overlap, weight update)
    overlap_hidden: int = 2048  # the FSDP step of the overlap section (compile-only, bf16): [h, h] weights
    overlap_batch: int = 8192  # and its global batch [B, h]
    update_hidden: int = 512  # the memory-aware weight update (compile-only, bf16, replicated)
    update_batch: int = 256
    optimizer: str = "adam"  # "sgd" or "adam"
    search: str = "small"  # layouts compiled for the TPU: "off", "small" (4 meshes), "full" (every mesh+layout)
    auto_sharding: bool = True  # also try XLA's auto-sharding (compile-only) on the Megatron MLP

    def checks(self) -> None:
        for name in ("bucket_bytes", "bucket_first_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be an int >= 0 (0: a bucket closes after one gradient)")
        if isinstance(self.gloo_world, bool) or not isinstance(self.gloo_world, int) or self.gloo_world < 0 \
                or self.gloo_world == 1:
            raise ValueError(f"gloo_world={self.gloo_world!r} must be 0 (skip the timings) or an int >= 2")
        int_sequence("gloo_numels", self.gloo_numels)
        int_sequence("gloo_calls", self.gloo_calls)
        for n in self.gloo_numels:
            for k in self.gloo_calls:
                divisible("gloo_numels entry", n, "gloo_calls entry", k, "k all-reduces of n / k elements each")
        if self.gloo_world and (len(set(self.gloo_calls)) < 2 or len(set(self.gloo_numels)) < 2):
            raise ValueError(f"gloo_numels={self.gloo_numels} and gloo_calls={self.gloo_calls} need >= 2 distinct "
                             "values each: the α–β fit separates the per-call and the per-byte cost")
        n = self.num_devices or 1
        divisible("batch", self.batch, "num_devices", n, "the step shards the batch over every device")
        divisible("hidden", self.hidden, "num_devices", n, "FSDP shards each [hidden, hidden] weight's rows")
        divisible("mlp_ffn", self.mlp_ffn, "num_devices", n, "the Megatron MLP splits ffn over tp = num_devices")
        divisible("mlp_hidden", self.mlp_hidden, "num_devices", n, "the layout search splits hidden too")
        divisible("overlap_batch", self.overlap_batch, "num_devices", n, "the FSDP step shards its batch")
        divisible("overlap_hidden", self.overlap_hidden, "num_devices", n, "FSDP shards each weight's rows")


# ------------------------------------------------------------------------------------------------------ planner
@dataclass(frozen=True)
class PlannerParams(planner.PlanConfig, NotebookParams):
    """Notebook 07: a plan and a small validation configuration.

    The plan's fields — model, slice, degrees, recompute, batch and the planner's assumptions — are
    :class:`shardlab.planner.PlanConfig`'s, declared there once: ``planner.plan(p)`` plans these parameters. The plan
    is pure arithmetic, legal at any ``num_devices``. The validation runs at ``val_world`` ranks (the tensor degree
    of the Megatron MLP and layer, the data degree of the data-parallel and FSDP steps)."""

    NOTEBOOK: ClassVar[str] = "07_planner"
    POSITIVE = ("data", "fsdp", "tensor", "global_batch", "seq", "val_world", "val_tokens", "val_hidden", "val_ffn",
                "val_heads")
    FLAGS = ("full_size",)
    CHOICES = {"recompute": RECOMPUTE_POLICIES}
    SLICES = ("topology",)

    val_world: int = 8  # ranks of the validation configurations
    val_tokens: int = 64  # tokens (b = 1, s = val_tokens) of the validation MLP / layer / steps
    val_hidden: int = 128
    val_ffn: int = 512
    val_heads: int = 8  # heads of the validation transformer layer
    full_size: bool = False  # compile the presets' full training steps with XLA:TPU (tens of minutes); False: cached

    def checks(self) -> None:
        if not isinstance(self.model, str | dict):
            raise ValueError(f"model={self.model!r} must be a preset name or a dict of sizes")
        w = self.val_world
        divisible("val_ffn", self.val_ffn, "val_world", w, "the validation MLP splits its inner dimension")
        divisible("val_heads", self.val_heads, "val_world", w, "whole heads per rank in the validation layer")
        divisible("val_hidden", self.val_hidden, "val_heads", self.val_heads, "each head has hidden / heads "
                  "dimensions")
        divisible("val_hidden", self.val_hidden, "val_world", w, "the FSDP step shards the weights' hidden rows")
        divisible("val_tokens", self.val_tokens, "val_world", w, "data parallelism splits the tokens")
        planner.plan(self)  # the plan's own rules: degrees x slice, divisibility, known names, assumptions




def int_list(name: str, value: Any, least: int = 1, empty_ok: bool = False) -> None:
    if not isinstance(value, list | tuple) or (not value and not empty_ok):
        raise ValueError(f"{name}={value!r} must be a {'' if empty_ok else 'non-empty '}list of ints >= {least}")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < least]
    if bad:
        raise ValueError(f"{name}={list(value)} has entries {bad}: each must be an int >= {least}")


# ------------------------------------------------------------------------------------------------------ scan
@dataclass(frozen=True)
class ScanParams(NotebookParams):
    """Notebook 06. The CPU sections need exactly fsdp·tensor devices (the mesh spans all of them)."""

    NOTEBOOK: ClassVar[str] = "06_scan_shard_as"
    POSITIVE = ("hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor", "layers")
    FLAGS = ("full_size",)

    layers_sweep: list = field(default_factory=lambda: [2, 8, 64])  # L values of the compile curves, each >= 2
    layers: int = 4  # L of the shard_as sections, the small seed story and the trace transfers (>= 2)
    hidden: int = 64  # h: W_up [h, F] is split h over fsdp
    ffn: int = 256  # F: split over tensor
    batch: int = 8  # b: split over fsdp
    seq: int = 8  # s: split over tensor in the nn.Linear trap
    mesh_fsdp: int = 2  # mesh (fsdp, tensor); the CPU sections need fsdp × tensor devices
    mesh_tensor: int = 4
    devices_sweep: list = field(default_factory=list)  # compile time vs device count, one fresh process per count
    placeholder_hiddens: list = field(default_factory=lambda: [64, 256])  # model widths for the trace-transfer growth
    full_size: bool = False  # compile the 405B-size seed with XLA:TPU (minutes); False: show the cached compiles

    def checks(self) -> None:
        int_list("layers_sweep", self.layers_sweep, least=2)  # XLA removes a While that runs once
        if self.layers < 2:
            raise ValueError(f"layers={self.layers} must be >= 2 (XLA removes a While loop that runs once)")
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
    ranks."""

    POSITIVE = ("world_size", "batch")

    world_size: int = 8  # FSDP ranks N (SimulatedWorld ranks; the GSPMD mesh's fsdp axis)
    layer_sizes: tuple[int, ...] = (30, 50, 10)  # MLP widths: Linear(30, 50) -> tanh -> Linear(50, 10)
    batch: int = 64  # global batch b, split evenly over the N ranks

    def __post_init__(self) -> None:
        if isinstance(self.layer_sizes, list):  # papermill injects YAML lists
            object.__setattr__(self, "layer_sizes", tuple(self.layer_sizes))

    def checks(self) -> None:
        layer_widths("layer_sizes", self.layer_sizes)
        divisible("batch", self.batch, "world_size", self.world_size, "every rank trains on batch / world_size rows")


@dataclass(frozen=True)
class FsdpParams(FsdpParamsBase):
    NOTEBOOK: ClassVar[str] = "05_fsdp_flat_params"
    POSITIVE = ("steps",)
    FLAGS = ("align",)

    align: bool = False  # True: alignment padding like use_orig_params (16-byte parameter starts)
    steps: int = 3  # training steps for the parity check


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


# Modules that declare notebook parameter dataclasses (light: no torch_xla at import).
PARAM_MODULES = ("shardlab.params", "shardlab.expert.params", "shardlab.pipeline.params", "shardlab.context.params",
                 "shardlab.memory.params", "shardlab.inspect.params", "shardlab.timing.params")


def notebook_params() -> dict[str, type[NotebookParams]]:
    """``{notebook stem: its parameter dataclass}`` over every module of :data:`PARAM_MODULES`."""
    for name in PARAM_MODULES:
        importlib.import_module(name)
    found: dict[str, type[NotebookParams]] = {}
    todo = list(NotebookParams.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.NOTEBOOK:
            found[cls.NOTEBOOK] = cls
    return dict(sorted(found.items()))
