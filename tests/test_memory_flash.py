"""FlashAttention on the TPU compiler: each of the two fixes is needed, both are undone after the block, the
flash program has its three custom calls and no s x s array while plain attention's s x s arrays have the shape
the heads per chip imply; the planner's terms by hand; an out-of-memory compile is a row; the longest-fit search
against a known threshold; notebook 07's flash verdicts classified by the stated rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.core import harness
from shardlab.memory import case as C
from shardlab.memory import flash as F
from shardlab.memory import full_size as FS
from shardlab.memory import pallas_tpu as P
from shardlab.memory.params import LLAMA3_8B_ATTENTION, MemoryParams
from shardlab.planner.verdict import PlannerCheck
from shardlab.profile.tpu import TpuCompile
from shardlab.profile.tpu_memory import parse_oom

# 16 heads over 8 chips: 2 per chip (GQA 2:1); one compile each, in this process's 8-device world (v5e-8)
SMALL = MemoryParams(seq=2048, heads=16, kv_heads=8, tensor=8)


def test_formula_is_the_planners_statement() -> None:
    a, s, b, t = 32, 8192, 1, 1
    llama = MemoryParams(seq=s, **LLAMA3_8B_ATTENTION)
    assert F.formula_temp_bytes(llama, "plain") == 6 * a * s * s * b / t  # P, dP, dS in bf16
    assert F.formula_temp_bytes(llama, "flash") == 4 * a * s * b / t  # fp32 log-sum-exp
    assert F.formula_temp_bytes(SMALL, "plain") == 6 * 16 * 2048**2 / 8


def test_bad_parameters_name_the_rule() -> None:
    with pytest.raises(ValueError, match="seq=1536 is not divisible by 1024"):
        MemoryParams(seq=1536).validate()
    with pytest.raises(ValueError, match="kv_heads=2 is not divisible by tensor=4"):
        MemoryParams(tensor=4).validate()
    with pytest.raises(ValueError, match="head_dim=192 is more than 128"):
        MemoryParams(head_dim=192).validate()
    with pytest.raises(ValueError, match="kernel='xformers'"):
        C.AttentionCase(SMALL, "xformers")


@pytest.mark.xla
def test_patches_are_scoped(xla_world) -> None:  # type: ignore[no-untyped-def]
    before = P.ck.trace_pallas, P.tcc.get_ir_version
    with P.pallas_for_tpu_compile():
        assert P.patched() == {"platform": True, "ir_version": True}
    assert (P.ck.trace_pallas, P.tcc.get_ir_version) == before
    with pytest.raises(RuntimeError, match="boom"), P.pallas_for_tpu_compile():
        raise RuntimeError("boom")
    assert P.patched() == {"platform": False, "ir_version": False}
    with P.pallas_for_tpu_compile(active=False):
        assert P.patched() == {"platform": False, "ir_version": False}


@pytest.mark.xla
def test_each_fix_is_needed(xla_world) -> None:  # type: ignore[no-untyped-def]
    fx = FS.fixes(replace(SMALL, heads=2))
    assert "interpret mode" in fx.without_platform  # lowered on JAX's default (CPU) backend
    assert "nsupported version" in fx.without_ir_version  # Mosaic IR v8, libtpu reads <= 7
    assert fx.with_both.endswith("1 tpu_custom_call (the forward kernel)")
    assert P.patched() == {"platform": False, "ir_version": False}


@pytest.mark.xla
def test_flash_vs_plain_on_the_tpu_compiler(xla_world) -> None:  # type: ignore[no-untyped-def]
    views = {k: harness.views(C.AttentionCase(SMALL, k), ("formula", "tpu")) for k in F.KERNELS}
    for k, (formula, tpu) in views.items():
        assert formula[f"temp_bytes.{k}"] == F.formula_temp_bytes(SMALL, k)
        assert all(ok for ok, _ in tpu.checks.values()), tpu.checks
        assert f"temp_bytes.{k}" in tpu.differs  # recorded beside the formula, not compared
    flash, plain = (C.attention_row(SMALL, k, views[k][1]) for k in F.KERNELS)
    assert flash.fits and plain.fits and flash.topology == "v5e-8"
    assert flash.custom_calls == 3  # forward, dq, dk/dv
    assert flash.square_bytes == 0 and not any(b.square for b in flash.largest)
    heads, s = 16 // 8, 2048
    squares = {b.shape for b in plain.largest if b.square}
    assert f"f32[{heads},{s},{s}]" in squares  # the fp32 softmax of the 2 heads on one chip
    assert plain.square_bytes >= heads * s * s * 4
    assert flash.temp < plain.temp


def test_out_of_memory_is_a_row() -> None:
    msg = ("RESOURCE_EXHAUSTED: Allocation (size=68719476736) would exceed memory (size=17179869184) :: #a [shape = "
           "'bf16[32,32768,32768]{1,2,0:T(8,128)(2,1)}', space=hbm, size = 0x1, tag = 'output of fusion.7'] :: x")
    oom = parse_oom(msg)
    p = MemoryParams(seq=32768, **LLAMA3_8B_ATTENTION)
    row = F.memory_row(p, "plain", TpuCompile("v5e-1", 1, False, 0.5, None, None, None, oom))
    assert not row.fits and row.temp == 2 * 32 * 32768**2  # the one array: bf16 [32, s, s]
    assert row.square_bytes == row.temp and row.largest[0].shape == "bf16[32,32768,32768]"
    assert F.table([row])[0]["fits"] == "no: one array exceeds HBM"
    assert F.AttentionMemory.from_dict(row.as_dict()) == row  # the cache round trip


def test_seq_max_fit_search() -> None:
    limit = 23 * 1024  # fits(s) iff s <= limit: the search must land on it
    seen: list[int] = []

    def fits(s: int) -> bool:
        seen.append(s)
        return s <= limit

    fit = F.seq_max_fit(fits)
    assert fit.seq == limit and fit.probes[0] == (1024, True)
    assert len(seen) <= 2 * 5 + 2  # doubling to 32768, then bisection
    assert F.seq_max_fit(fits, start=8192).seq == limit  # from a closer first probe
    assert F.seq_max_fit(fits, start=65536).seq == limit  # from a first probe that fails: bisect below it
    assert F.seq_max_fit(fits, limit=4096).seq == 4096  # never probes past the limit
    assert F.seq_max_fit(lambda s: False).seq == 0
    with pytest.raises(ValueError, match="step=1000 must be a multiple of 1024"):
        F.seq_max_fit(fits, "flash", step=1000)


def _check(topology: str, fits: bool, total: float, planner_fits: bool, state: float, cap: float) -> PlannerCheck:
    cfg = dict(model="llama-3-8b", topology=topology, data=1, fsdp=8, tensor=1, global_batch=8, seq=8192,
               recompute="full")
    planner = {"params": state / 2, "optimizer": state / 2, "padding": 0.0, "activations": 1e9}
    return PlannerCheck(cfg, topology, 1.0, True, fits, planner_fits, False, {"flash": False, "no_flash": False},
                        planner, planner, int(cap), {"total": int(total)})


def test_flash_verdict_rules() -> None:
    compiled = {"a": FS.FlashVerdict("llama-3-8b", "v6e-8", [1, 8, 1], 8, 8192, "full", True, int(23e9), 0, 0,
                                     int(33e9), 4, 1.0)}
    rows = FS.flash_verdicts({
        "checked": _check("v6e-8", False, 40e9, True, 14e9, 33e9),  # compiled with flash: fits
        "state": _check("v5e-16", False, 90e9, False, 20e9, 16e9),  # parameters + state alone exceed HBM
        "fits anyway": _check("v6e-16", True, 20e9, True, 10e9, 33e9),  # fits without flash
        "other chip": _check("v5e-8", False, 40e9, False, 14e9, 16e9),  # the v6e-8 flash step needs 23 > 16 GB
        "open": _check("v6e-32", False, 40e9, True, 14e9, 33e9),  # none of the above
    }, compiled)
    by = {r["configuration"]: r for r in rows}
    assert [by[k]["status"] for k in by] == ["checked", "inferred", "inferred", "inferred", "unchecked"]
    assert [by[k]["agrees"] for k in by] == [True, True, True, True, None]
    assert by["other chip"]["why"].startswith("the same per-chip step compiled with flash for v6e-8")
