"""Notebook 00 through papermill, at its defaults and at two other device worlds.

The notebook's own checks (views agree, predicted sharding strings == torch_xla's, ring bytes == the ring formula,
the answer key graded) must pass; the recorded numbers must equal the arithmetic done here: an all-reduce or
reduce-scatter hands in the whole vector (n·4 bytes), an all-gather its shard ((n/W)·4 bytes), and a ring
all-reduce sends 2(W−1)/W of the payload per rank.
"""

from __future__ import annotations

import pytest


def _values(rec):  # type: ignore[no-untyped-def]
    return {(r["name"], r["source"]): r["value"] for r in rec["measurements"]}


def _assert_collectives(values, n: int, w: int, sources: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    for src in sources:
        assert values[("welcome.sum.all_reduce.count", src)] == 1
        assert values[("welcome.sum.all_reduce.bytes", src)] == n * 4
        assert values[("welcome.gather.all_gather.bytes", src)] == n // w * 4
        assert values[("welcome.scatter.reduce_scatter.bytes", src)] == n * 4
        assert values[("welcome.scatter.reduce_scatter.group_size", src)] == w
    assert values[("welcome.sum.all_reduce.wire_bytes", "ledger")] == 2 * (w - 1) / w * n * 4  # ring-counted


@pytest.mark.notebook
def test_notebook_00_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    rec = run_notebook("00_welcome")
    _assert_collectives(_values(rec), 1024, 8, ("formula", "ledger", "hlo", "tpu"))
    assert not rec["notes"]  # nothing skipped on 8 devices


@pytest.mark.notebook
def test_notebook_00_one_device(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """Free-Colab shape: one device. The CPU compiler is skipped with a note; the TPU compiler still compiles the
    4-rank program (in a helper process)."""
    rec = run_notebook("00_welcome", num_devices=1, world_size=4, n=1000)
    values = _values(rec)
    _assert_collectives(values, 1000, 4, ("formula", "ledger", "tpu"))
    assert not any(src == "hlo" for (_, src) in values)
    assert any(s["source"] == "hlo" and "world_size=4" in s["reason"] for s in rec["skipped"])


@pytest.mark.notebook
def test_notebook_00_four_devices_two_ranks(run_notebook) -> None:  # type: ignore[no-untyped-def]
    rec = run_notebook("00_welcome", num_devices=4, world_size=2, n=512)
    _assert_collectives(_values(rec), 512, 2, ("formula", "ledger", "hlo", "tpu"))


@pytest.mark.notebook
def test_notebook_00_bad_parameter(run_notebook) -> None:  # type: ignore[no-untyped-def]
    """The error names the parameter and the rule (every rule: tests/test_params.py, on the dataclass)."""
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="n=1001 is not divisible by world_size=8"):
        run_notebook("00_welcome", n=1001)
