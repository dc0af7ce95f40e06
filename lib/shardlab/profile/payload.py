"""Recording a three-way payload comparison (formula = ledger = HLO) when the compiler may change the dtype.

Design note
-----------
A notebook predicts a collective's payload in the model's dtype (formula), measures it in the per-rank code
(ledger) and reads it from the partitioned HLO. The first two always agree in bytes. The HLO may not: XLA's CPU
backend runs a bf16 all-reduce in f32 (measured, torch_xla 2.9; a TPU keeps bf16), so the bytes double while
the elements do not. :func:`agree_payload` records the bytes of all three views and, when the HLO's element
type differs from the model's, says so and checks the element counts instead — the quantity the per-rank code
and the partitioner both decide. It only records; the HLO module is parsed elsewhere (``shardlab.profile.hlo``).

Example::

    rec = Recorder("02_megatron_mlp")
    agree_payload(rec, "mlp.fwd.all_reduce.bytes", formula_bytes, ledger_bytes, cap.module, "all-reduce", "bfloat16")
    # float32 model: one check formula = ledger = hlo on bytes
    # bfloat16 on CPU: bytes recorded (hlo twice as large) + one check on mlp.fwd.all_reduce.elements
"""

from __future__ import annotations

from typing import Any

from shardlab.dtypes import dtype_bytes, hlo_name
from shardlab.profile.record import Recorder


def collective_elements(module: Any, op: str) -> int:
    """Elements (not bytes) the collectives ``op`` of an HLO module hand over per device: dtype-independent."""
    return sum(c.operand_bytes // dtype_bytes(c.dtype) for c in module.collectives if c.op == op)


def agree_payload(
    rec: Recorder, name: str, formula_bytes: int, ledger_bytes: int, module: Any, op: str, dtype: str
) -> dict[str, Any]:
    """Three-way payload row for ``name`` (``<...>.bytes``) against the HLO collectives ``op`` of ``module``.

    When XLA ran the collective in the model dtype, formula = ledger = hlo bytes. When it did not, the HLO bytes
    are recorded with the reason (printed), and formula = ledger = hlo is checked on ELEMENTS instead
    (``<...>.elements``).
    """
    cs = [c for c in module.collectives if c.op == op]
    hlo_bytes = sum(c.operand_bytes for c in cs)
    dtypes = {c.dtype for c in cs}
    if dtypes <= {hlo_name(dtype)}:
        return rec.agree(name, "bytes", formula=formula_bytes, ledger=ledger_bytes, hlo=hlo_bytes)
    e = dtype_bytes(dtype)
    rec.agree(name, "bytes", formula=formula_bytes, ledger=ledger_bytes)
    rec.measure(name, hlo_bytes, "bytes", "hlo")
    print(
        f"{name}: XLA ran the {op} in {sorted(dtypes)} while the model is {dtype}: HLO bytes {hlo_bytes} vs "
        f"{formula_bytes}; comparing elements instead"
    )
    return rec.agree(
        name.removesuffix(".bytes") + ".elements",
        "elements",
        formula=formula_bytes // e,
        ledger=ledger_bytes // e,
        hlo=collective_elements(module, op),
    )
