"""FlashAttention on the TPU compiler: each of the two fixes is needed, both are undone after the block, the
flash program has its three custom calls and no s x s array while plain attention's s x s arrays have the shape
the heads per chip imply; the planner's terms by hand; an out-of-memory compile is a row; the longest-fit search
against a known threshold; notebook 07's flash verdicts classified by the stated rules."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from shardlab.core import harness
from shardlab.memory import case as C
from shardlab.memory import flash as F
from shardlab.memory import full_size as FS
from shardlab.memory import pallas_tpu as P
from shardlab.memory.params import LLAMA3_8B_ATTENTION, MemoryParams
from shardlab.planner.verdict import PlannerCheck
from shardlab.profile.result_files import entry_layout
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
        C.KernelAttentionCase(SMALL, "xformers")


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
    views = {k: harness.views(C.KernelAttentionCase(SMALL, k), ("formula", "tpu")) for k in F.KERNELS}
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
    # the outputs O, dQ [1, 2, s, 128] and dK, dV [1, 1, s, 128] bf16 per chip, by hand: not donated, so the
    # peak the chip must hold is arguments + these + temporaries, and a few MiB are far below a v5e chip
    for row in (flash, plain):
        assert 0 <= row.outputs - 2 * (2 * heads + 2 * 1) * s * 128 <= 512  # + the output tuple's table
        assert row.peak >= row.arguments + row.outputs + row.temp and row.holds
    # every s x s array plain attention writes is [k, s, s] of its dtype; among them the lowering's three f32
    # [heads, s, s] broadcasts (a scalar and two softmax row vectors, as an independent reading of the HLO found)
    one = {"f32": 4, "bf16": 2, "pred": 1}
    assert plain.squares and all(b % (one[k.split()[0]] * s * s) == 0 for k, b in plain.squares.items())
    assert plain.squares["f32 broadcast"] == 3 * 4 * heads * s * s
    assert sum(plain.squares.values()) >= plain.square_bytes and flash.squares == {}
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


def test_holds_means_the_peak_fits() -> None:
    """The compiler's check (arguments + temporaries) can pass while the peak (outputs too) is over the chip."""
    gib = 2**30
    row = F.AttentionMemory({"kernel": "flash", "seq": 1024}, "v5e-1", True, 14 * gib, gib, 2 * gib, 17 * gib, 1.0,
                            capacity=16 * gib)
    assert row.fits and not row.holds and F.table([row])[0]["fits"].startswith("no: peak 17.00 GiB")
    assert replace(row, peak=16 * gib).holds and not replace(row, fits=False, peak=gib).holds
    assert not replace(row, capacity=0, peak=gib).holds  # an old cached row without the capacity: not claimed


def test_seq_max_fit_by_criterion(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two searches over the same rows: the peak criterion lands where peak(s) = 3 MiB per token first exceeds the
    capacity, the check criterion where the checked bytes (2 MiB per token) do; the peaks of every probe kept."""
    mib = 2**20
    cap = 100_000 * mib

    def row(p, kernel):  # type: ignore[no-untyped-def]
        s = p.seq
        return F.AttentionMemory({"kernel": kernel, "seq": s}, "v5e-1", 2 * mib * s <= cap, 2 * mib * s, 0, mib * s,
                                 3 * mib * s, 1.0, capacity=cap)

    monkeypatch.setattr(C, "attention_row", row)
    peak = C.seq_max_fit(SMALL, "flash", start=8192)
    check = C.seq_max_fit(SMALL, "flash", start=8192, criterion="check")
    assert peak.seq == (cap // (3 * mib)) // 1024 * 1024 and check.seq == (cap // (2 * mib)) // 1024 * 1024
    assert peak.criterion == "peak" and check.criterion == "check"
    assert peak.peaks == {s: 3 * mib * s for s, _ in peak.probes}
    assert F.SeqFit.from_dict(peak.as_dict()) == peak  # the cache round trip (JSON keys are strings)
    with pytest.raises(ValueError, match="criterion='args' must be one of"):
        C.seq_max_fit(SMALL, "flash", criterion="args")


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


@pytest.mark.xla
@pytest.mark.slow
def test_flash_verdict_case_swaps_only_the_kernel(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Notebook 07's step with the flash kernel (what ``python -m shardlab.memory verdict`` compiles at Llama 3 8B):
    on a 2-layer Llama (hd 128, 1024 tokens) it compiles with four custom calls — the forward kernel, its recompute
    in the backward (full recompute), dq, dk/dv — and holds no [a, s, s] array, where the same plan without flash
    does; the parameters and optimizer state (the arguments) are the same bytes."""
    from shardlab.planner import PlanConfig
    from shardlab.planner.verdict import VerdictCase

    model = {"layers": 2, "hidden": 1024, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 1024, "name": "tiny-hd128"}
    plan = PlanConfig(model, "v5e-8", fsdp=8, global_batch=8, seq=1024)
    flash = FS.flash_verdict(plan)
    plain = harness.tpu(VerdictCase(plan), "v5e").detail
    assert flash.fits and flash.custom_calls == 4
    # [.., a, s, s] score-shaped arrays (8 heads on each chip; [1024, 1024] alone is also the embedding's shape)
    shapes = lambda text: set(re.findall(r"\[(?:\d+,)*8,1024,1024\]", text))  # noqa: E731
    compiled = harness.tpu(FS.FlashVerdictCase(plan), "v5e").detail  # the same compile (cached in-process)
    assert shapes(plain.hlo_text) and not shapes(compiled.hlo_text)
    # the same parameters and optimizer state (array arguments; the scalars torch_xla lifts differ by kernel)
    state = lambda text: sorted((a.dtype, a.dims) for a in entry_layout(text)[0] if a.dims)  # noqa: E731
    assert state(compiled.hlo_text) == state(plain.hlo_text)


def test_cached_full_size_results_obey_the_notebooks_rules() -> None:
    """Notebook 08b checks these only when it measures them (full_size=True); here the committed cache
    (``python -m shardlab.memory flash``) is held to the same rules, each against an independent prediction:
    flash's longest sequence is the sweep's linear peak (16k and 32k compiles) extrapolated to the capacity; plain's
    lies between the sweep's longest held length and shortest not held; the peak criterion is at most the compiler's
    check (the peak adds the outputs); and a row "holds" only with its peak within the capacity it records."""
    big, _ = FS.load_flash()
    flash = {r.config["seq"]: r for k, r in big.items() if k.startswith("flash.")}
    plain = {r.config["seq"]: r for k, r in big.items() if k.startswith("plain.")}
    s1, s2 = FS.SEQS[-2], FS.SEQS[-1]
    cap = flash[s2].capacity
    assert cap == int(15.75 * 2**30)  # v5e, as the compiler states it
    slope = (flash[s2].peak - flash[s1].peak) / (s2 - s1)
    predicted = int((cap - (flash[s2].peak - slope * s2)) // slope) // 1024 * 1024
    assert abs(big["fit.flash"].seq - predicted) <= 1024
    held = [s for s, r in plain.items() if r.holds]
    assert max(held) <= big["fit.plain"].seq < min(s for s in plain if s not in held)
    for k in F.KERNELS:
        assert big[f"fit.{k}"].criterion == "peak" and big[f"fit_check.{k}"].criterion == "check"
        assert big[f"fit.{k}"].seq <= big[f"fit_check.{k}"].seq
    # the compiler's check passes at its longest flash sequence while the peak there is over the chip
    check = big["fit_check.flash"]
    assert check.peaks[check.seq] > cap > big["fit.flash"].peaks[big["fit.flash"].seq]
    assert all(r.holds == (r.fits and r.peak <= cap) for r in (*flash.values(), *plain.values()))


def test_cached_70b_flash_verdict_on_v6e_64() -> None:
    """Notebook 07's Llama 3 70B step on v6e-64 (fsdp 16 × tensor 4, 16 × 8192 tokens) compiled with the flash
    kernel (cached: ``python -m shardlab.memory verdict-70b``, traced on 64 CPU devices). Oracles: the model's sizes
    (its parameters and AdamW state on a chip: 14 bytes per parameter, written out here), the capacity check's own
    rule (arguments + temporaries against the capacity), and the kernel's four custom calls (as the 8B step)."""
    from shardlab.planner import model_from
    from shardlab.planner.verdict import load_holdout, load_matrix

    compiled, source = FS.load_verdicts()
    v = compiled["llama-3-70b.v6e-64"]
    assert (v.model, v.topology, v.mesh, v.global_batch, v.seq, v.recompute) == (
        "llama-3-70b", "v6e-64", [1, 16, 4], 16, 8192, "full")
    assert any(a["rows"] == ["llama-3-70b.v6e-64"] and a["command"].endswith("verdict-70b") for a in source["added"])
    m = model_from("llama-3-70b")
    h, f, L, kv = m.hidden, m.ffn, m.layers, m.kv_heads * (m.hidden // m.heads)
    vocab = -(-m.vocab // (128 * 4)) * 128 * 4
    per_chip = (L * (2 * h * h + 2 * kv * h + 3 * h * f) + 2 * vocab * h) // 64 + (2 * L + 1) * h // 16
    assert v.fits is (v.total <= v.capacity)
    if v.fits:
        assert v.custom_calls == 4 and v.total == v.arguments + v.temp
        tokens = 2 * 8192 * 8  # tokens and labels, one int64 sequence per fsdp rank
        assert 14 * per_chip + tokens <= v.arguments < 14 * per_chip + tokens + 2**20  # + torch_xla's scalars
    # notebook 08b's table: the row is now checked by a compile, no longer open
    rows = {r["configuration"]: r for r in FS.flash_verdicts({**load_matrix()[0], **load_holdout()[0]}, compiled)}
    assert rows["llama-3-70b.v6e-64"]["status"] == "checked"
    assert rows["llama-3-70b.v6e-64"]["compiler with flash"] == ("fits" if v.fits else "no")
