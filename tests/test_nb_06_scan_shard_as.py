"""Notebook 06 through papermill with a short sweep: its own checks pass and the record holds the required names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.notebook, pytest.mark.xla]

SWEEP = [2, 4]


def test_notebook_06_short_sweep(run_notebook: Callable[..., dict[str, Any]]) -> None:
    record = run_notebook("06_scan_shard_as", layers_sweep=SWEEP, hidden=64, ffn=256, batch=4, seq=4,
                          devices_sweep=[], placeholder_hiddens=[64])
    values: dict[str, dict[str, Any]] = {}
    for m in record["measurements"]:
        values.setdefault(m["name"], {})[m["source"]] = m["value"]
    required = [f"scan.{q}.{mode}.L{n}" for q in ("compile_s", "hlo_instructions")
                for mode in ("loop", "scan", "scan_layers") for n in SWEEP]
    required += [f"shard_as.{t}.{q}" for t in ("on", "off") for q in ("grad_spec", "while_state.bytes",
                                                                      "buffers.total.bytes")]
    required += [f"placeholder.trace.h2d.bytes.{k}" for k in ("scan", "loop", "no_placeholder")]
    missing = [n for n in required if n not in values]
    assert not missing, missing

    kinds = {m["name"]: m["kind"] for m in record["measurements"]}
    assert kinds["scan.compile_s.loop.L2"] == "timing" and kinds["scan.hlo_instructions.loop.L2"] == "structural"
    # structural facts, independent of timing
    assert values["scan.hlo_instructions.scan.L2"]["hlo"] == values["scan.hlo_instructions.scan.L4"]["hlo"]
    assert values["scan.hlo_instructions.loop.L4"]["hlo"] > values["scan.hlo_instructions.loop.L2"]["hlo"]
    assert values["shard_as.on.grad_spec"]["hlo"] == "{devices=[1,2,4]0,1,2,3,4,5,6,7}"
    assert values["shard_as.off.grad_spec"]["hlo"].endswith("last_tile_dim_replicate}")
    for q in ("while_state.bytes", "buffers.total.bytes"):
        assert values[f"shard_as.off.{q}"]["hlo"] > values[f"shard_as.on.{q}"]["hlo"]
    assert values["placeholder.trace.h2d.bytes.scan"]["metrics"] == 0
    assert values["placeholder.trace.h2d.bytes.loop"]["metrics"] == 0
    assert values["placeholder.trace.h2d.bytes.no_placeholder"]["metrics"] > 0


@pytest.mark.slow
def test_compile_vs_devices_runs_each_count_in_a_fresh_process(xla_world: Any) -> None:
    from shardlab.xla_scan import measure as X
    from shardlab.xla_scan.model import StackConfig

    rows = X.compile_vs_devices(StackConfig(layers=1, hidden=16, ffn=32, batch=2, seq=2), "scan", (1, 2))
    assert [r["num_devices"] for r in rows] == [1, 2]
    assert [tuple(r["mesh"]) for r in rows] == [(1, 1), (2, 1)]
    assert all(not r["cached"] and r["hlo_instructions"] > 0 for r in rows)
    with pytest.raises(ValueError, match="hidden=16 is not divisible by fsdp=3"):
        X.compile_vs_devices(StackConfig(layers=1, hidden=16, ffn=32, batch=2, seq=2), "scan", (3,))
