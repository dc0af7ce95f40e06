"""Element types: one table of names and sizes, used by the formulas, the ledger and the HLO parser.

Design note
-----------
Three vocabularies name the same element types: torch (``torch.bfloat16`` -> ``"bfloat16"``), XLA's HLO text
(``bf16``) and the short spellings people type (``"bf16"``, ``"fp32"``, ``"half"``). :data:`TORCH_TO_HLO` is
the one table that links a torch name to its HLO name; :data:`HLO_BYTES` gives the bytes per element of every
HLO element type (including ones torch has no name for, such as ``s4`` or ``token``). Everything else is
derived from these two tables. No torch import: formulas stay plain arithmetic; a torch dtype is accepted
through its ``itemsize`` / its ``str()``.

Example::

    >>> dtype_bytes("bf16"), dtype_bytes("float32"), hlo_name("bfloat16"), name("f32")
    (2, 4, 'bf16', 'float32')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import torch

DTypeLike: TypeAlias = "str | torch.dtype"  # a torch dtype, a torch name, an alias or an HLO name

HLO_BYTES: dict[str, int] = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "token": 0, "opaque": 0,
}
"""Bytes per element of each HLO element type (``token`` / ``opaque`` carry no data)."""

TORCH_TO_HLO: dict[str, str] = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
    "int64": "s64", "int32": "s32", "int16": "s16", "int8": "s8", "uint8": "u8", "bool": "pred",
    "complex64": "c64", "complex128": "c128",
}
"""torch dtype name -> HLO element type."""

ALIASES: dict[str, str] = {
    "fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
    "double": "float64",
}
"""Short spellings -> torch name. HLO names (``f32``, ``s64`` ...) are accepted as well."""

_HLO_TO_TORCH = {h: t for t, h in TORCH_TO_HLO.items()}


def name(dtype: DTypeLike) -> str:
    """The torch name of a dtype given as a torch dtype, a torch name, an alias or an HLO name.

    >>> name("bf16"), name("s32"), name("torch.float32")
    ('bfloat16', 'int32', 'float32')
    """
    key = str(dtype).removeprefix("torch.").lower()
    key = ALIASES.get(key, _HLO_TO_TORCH.get(key, key))
    if key not in TORCH_TO_HLO:
        known = sorted({*TORCH_TO_HLO, *ALIASES, *_HLO_TO_TORCH})
        raise ValueError(f"dtype={dtype!r} is unknown; known: {known}")
    return key


def dtype_bytes(dtype: DTypeLike) -> int:
    """Bytes per element of a torch dtype, a torch name, an alias or an HLO name ('bf16' -> 2)."""
    if not isinstance(dtype, str):
        itemsize = getattr(dtype, "itemsize", None)
        if isinstance(itemsize, int):
            return itemsize
    key = str(dtype).removeprefix("torch.").lower()
    if key in HLO_BYTES:
        return HLO_BYTES[key]
    return HLO_BYTES[TORCH_TO_HLO[name(dtype)]]


def hlo_name(dtype: DTypeLike) -> str:
    """The HLO element type XLA prints for a dtype: hlo_name('bfloat16') -> 'bf16'."""
    return TORCH_TO_HLO[name(dtype)]


def is_16bit_float(dtype: DTypeLike) -> bool:
    """True for bfloat16 / float16 in any spelling."""
    return name(dtype) in ("bfloat16", "float16")
