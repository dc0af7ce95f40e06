"""Up-front validation of the tensor-parallel notebooks' parameters (02, 03, 04), before any XLA work.

One function so the three notebooks reject bad input with the same words: every error names the parameter
and the rule ("ffn=100 is not divisible by tp=8").

Example::

    >>> check_tp_params(num_devices=8, tp=4, batch=2, seq=8, hidden=64, ffn=256, heads=8, vocab=1000,
    ...                 dtype="float32", divisible=("ffn",))
"""

from __future__ import annotations

DTYPES = ("float32", "bfloat16")
DIVISIBLE_BY_TP = ("hidden", "ffn", "heads")


def check_tp_params(num_devices: int, tp: int, batch: int, seq: int, hidden: int, ffn: int, heads: int,
                    vocab: int, dtype: str, divisible: tuple[str, ...] = ()) -> None:
    """Raise ValueError naming the first parameter that breaks a rule.

    ``divisible`` lists which of hidden / ffn / heads must divide by ``tp`` (the ones the notebook splits).
    """
    sizes = {"num_devices": num_devices, "tp": tp, "batch": batch, "seq": seq, "hidden": hidden, "ffn": ffn,
             "heads": heads, "vocab": vocab}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {DTYPES}")
    if tp > num_devices:
        raise ValueError(f"tp={tp} is larger than the device count num_devices={num_devices}")
    if num_devices % tp:
        raise ValueError(f"num_devices={num_devices} is not divisible by tp={tp} (mesh (data, tensor))")
    for name in divisible:
        if name not in DIVISIBLE_BY_TP:
            raise ValueError(f"divisible={divisible}: {name!r} is not one of {DIVISIBLE_BY_TP}")
        if sizes[name] % tp:
            raise ValueError(f"{name}={sizes[name]} is not divisible by tp={tp}")
