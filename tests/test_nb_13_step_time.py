"""Notebook 13 through papermill: every in-notebook check must pass (the graded answer key included) at the defaults
and at other legal parameter sets (v6e, a 4-chip slice from a 4-device kernel, a 1-device kernel); the recorded
formula values equal the scaling book's algebra worked out here from the published chip figures (not from the
library's hardware module): FLOPs over the bf16 peak, wire bytes over the ICI egress of the slice's torus."""

from __future__ import annotations

import pytest

# published per-chip figures (Cloud TPU documentation): bf16 FLOP/s, bidirectional ICI bytes/s, torus links per chip
CHIPS = {"v5e": (197e12, 400e9, 4), "v6e": (918e12, 800e9, 4), "v5p": (459e12, 1200e9, 6)}


def _by(record):  # type: ignore[no-untyped-def]
    return {(m["name"], m["source"]): m["value"] for m in record["measurements"]}


def _egress(gen: str, chips: int) -> float:
    """A group of all chips of a 2-D torus slice spans both axes once it has more than 2 chips (2x1: one axis); a
    v5p slice of 4 chips is 2x2x1 (two axes), of 8 or more 2x2x2 and up (all three). Each axis: two links, one way
    each, of a link's bidirectional share (published / links)."""
    _, ici, links = CHIPS[gen]
    axes = (2 if chips == 4 else 3) if gen == "v5p" else (1 if chips == 2 else 2)
    return axes * ici / links


def _expect(record, gen: str, chips: int, hidden: int, ffn: int) -> None:  # type: ignore[no-untyped-def]
    by = _by(record)
    peak = CHIPS[gen][0]
    egress = _egress(gen, chips)
    for t in record["params"]["tokens"]:
        p = 2 * hidden * ffn
        assert by[(f"time.fsdp.T{t}.compute_s", "formula")] == pytest.approx(6 * t * p / peak, rel=1e-12)
        assert by[(f"time.fsdp.T{t}.comm_s.fsdp", "formula")] == pytest.approx(
            2 * (chips - 1) / chips * 2 * p / egress, rel=1e-12)
        assert by[(f"time.fsdp.T{t}.step_s", "tpu")] >= by[(f"time.fsdp.T{t}.compute_s", "tpu")] > 0
    assert by[("time.fsdp.critical.tokens", "formula")] == round(2 / 3 * (chips - 1) / chips * peak / egress)
    assert by[("time.tensor.critical.ffn", "formula")] == round(2 / 3 * (chips - 1) * peak / egress)


@pytest.mark.notebook
def test_notebook_13_defaults(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("13_step_time")
    _expect(record, "v5e", 8, 2048, 8192)
    by = _by(record)
    # the 8192³ matmul: FLOP roofline 2·1024·8192·8192 / 197e12 per chip
    assert by[("time.matmul.k8192.compute_s", "formula")] == pytest.approx(2 * 1024 * 8192**2 / 197e12, rel=1e-12)
    assert 1.0 <= by[("time.matmul.k8192.compute_s", "tpu")] / by[("time.matmul.k8192.compute_s", "formula")] < 1.3


@pytest.mark.notebook
def test_notebook_13_v6e_four_chips(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("13_step_time", num_devices=4, generation="v6e", chips=4, hidden=1024, ffn=4096,
                          tokens=[512, 2048], ffns=[1024, 4096])
    _expect(record, "v6e", 4, 1024, 4096)


@pytest.mark.notebook
def test_notebook_13_one_device(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("13_step_time", num_devices=1, chips=2, tokens=[1024, 8192], ffns=[4096, 16384])
    _expect(record, "v5e", 2, 2048, 8192)


@pytest.mark.notebook
def test_notebook_13_v5p_four_chips(run_notebook) -> None:  # type: ignore[no-untyped-def]
    record = run_notebook("13_step_time", num_devices=4, generation="v5p", chips=4, hidden=1024, ffn=4096,
                          tokens=[512, 4096], ffns=[1024, 8192])
    _expect(record, "v5p", 4, 1024, 4096)
