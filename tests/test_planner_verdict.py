"""The planner checked by the XLA:TPU compiler (``shardlab.planner.verdict``) on a tiny Llama-shaped model.

Oracle: parameter arithmetic written out here (not the planner's formula): per layer q, k, v, o = 4·h² (kv heads =
heads), SwiGLU 3·h·ffn, two norms 2·h; embedding and LM head V·h each (V padded to 128·tensor), final norm h.
Every dim divides the mesh, so each chip holds total / chips parameters: 2 bytes each (bf16) in the arguments,
and 12 bytes each of fp32 optimizer state (master, exp_avg, exp_avg_sq). Donated, all 14 bytes per parameter are
aliased to the step's updates. Each compile takes a few seconds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.planner import PlanConfig
from shardlab.profile.result_files import save_results

pytestmark = pytest.mark.xla

TINY = {"layers": 2, "hidden": 256, "ffn": 512, "heads": 8, "kv_heads": 8, "vocab": 1000, "name": "tiny"}


@pytest.fixture(scope="module")
def pc(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.planner import verdict as planner_verdict
    from shardlab.profile import tpu

    tpu.check_backend()
    return planner_verdict


def tiny_params(tensor: int) -> tuple[int, int]:
    """(matrix parameters, norm parameters): matrices are split over fsdp·tensor, norms over fsdp only."""
    h, f, L = 256, 512, 2
    v = -(-1000 // (128 * tensor)) * 128 * tensor  # Megatron padding: 1024
    return L * (4 * h * h + 3 * h * f) + 2 * v * h, (2 * L + 1) * h


@pytest.mark.parametrize("mesh", [(1, 8, 1), (1, 2, 4)])
def test_compiler_state_bytes_match_arithmetic(pc, mesh) -> None:  # type: ignore[no-untyped-def]
    d, f, t = mesh
    r = pc.check(pc.VerdictCase(PlanConfig(TINY, "v5e-8", data=d, fsdp=f, tensor=t, global_batch=8, seq=64)))
    matrices, norms = tiny_params(t)
    per_chip = matrices // 8 + norms // f  # the norms are replicated over tensor: t times the planner's share
    assert r.topology == "v5e-8" and r.compiler_fits and r.planner_fits and r.planner_no_flash_fits
    assert r.donated and r.agrees() and r.agrees(flash=True)
    assert r.compiler["params"] == 2 * per_chip
    assert r.compiler["optimizer"] == 12 * per_chip
    # every parameter and its AdamW state updated in place (the small norm arrays padded to TPU tiles: < 1 %)
    assert 14 * per_chip <= r.compiler["alias"] < 1.01 * 14 * per_chip
    assert r.compiler["total"] == r.compiler["arguments"] + r.compiler["temp"] <= r.capacity_bytes
    rows = {row["term"]: row for row in r.rows()}
    assert rows["params"]["ratio"] == pytest.approx(1.0, abs=0.01)  # norms: (t - 1)·(2L+1)·h/8 bytes more
    assert rows["optimizer"]["ratio"] == pytest.approx(1.0, abs=0.01)


def test_not_donated_keeps_a_second_copy(pc) -> None:  # type: ignore[no-untyped-def]
    """Without donation nothing is aliased and the updated state is a second copy among the outputs."""
    r = pc.check(pc.VerdictCase(PlanConfig(TINY, "v5e-8", fsdp=8, global_batch=8, seq=64), donate=False))
    matrices, norms = tiny_params(1)
    per_chip = matrices // 8 + norms // 8
    assert not r.donated and r.compiler["alias"] == 0 and r.compiler["outputs"] >= 14 * per_chip


def test_bad_config_names_the_rule(pc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"does not equal the 8 chips of v5e-8"):
        pc.VerdictCase(PlanConfig(TINY, "v5e-8", data=1, fsdp=4, tensor=1))
    with pytest.raises(ValueError, match=r"fit_margin=-0.1 must be a number in"):
        pc.VerdictCase(PlanConfig(TINY, "v5e-8", fit_margin=-0.1))
    with pytest.raises(ValueError, match=r"recompute='selective' must be one of"):
        pc.VerdictCase(PlanConfig(TINY, recompute="selective"))
    with pytest.raises(ValueError, match=r"kv_heads=2 must both be divisible by tensor=4"):
        pc.VerdictCase(PlanConfig({**TINY, "kv_heads": 2}, "v5e-8", fsdp=2, tensor=4))
    with pytest.raises(ValueError, match=r"sequence_parallel=True: the traced step assumes"):
        pc.VerdictCase(PlanConfig(TINY, "v5e-8", sequence_parallel=True))


def test_matrix_helpers_record_and_cache(pc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The notebook's path on the tiny model: record (formula always, tpu when live), the agreement check, the
    frames, and the cache, whose planner side is recomputed on load."""
    from shardlab.profile import Recorder

    case = pc.VerdictCase(PlanConfig(TINY, "v5e-8", fsdp=8, global_batch=8, seq=64))
    results = pc.matrix({"tiny.v5e-8": case})
    rec = Recorder("t")
    pc.record_matrix(rec, results, live=True)
    v = {(m["name"], m["source"]): m["value"] for m in rec.data["measurements"]}
    r = results["tiny.v5e-8"]
    assert v[("planner.compiler.tiny.v5e-8.per_chip.bytes", "tpu")] == r.compiler["total"]
    assert v[("planner.compiler.tiny.v5e-8.per_chip.bytes", "formula")] == sum(r.planner_no_flash.values())
    assert [c["ok"] for c in rec.data["checks"]] == [True]
    frame = pc.verdict_frame(results)
    assert frame.loc["tiny.v5e-8", "agree"] and frame.loc["tiny.v5e-8", "compiler"] == "fits"
    assert list(pc.terms_frame(r).index)[-1] == "total (what the capacity check counts)"
    save_results(results, tmp_path / "m.json", command="test")
    back, source = pc.load_matrix(tmp_path / "m.json")
    assert back["tiny.v5e-8"].compiler == r.compiler and source == {"command": "test"}
    assert back["tiny.v5e-8"].planner_no_flash == r.planner_no_flash
    assert pc.matching(results, PlanConfig(TINY, "v5e-8", data=1, fsdp=8, tensor=1, global_batch=8, seq=64)) \
        == "tiny.v5e-8"


def test_check_plan_compiles_a_planner_config_or_says_why(pc) -> None:  # type: ignore[no-untyped-def]
    r, why = pc.check_plan(PlanConfig(TINY, "v5e-8", fsdp=8, global_batch=8, seq=64))
    assert why == "" and r is not None and r.compiler_fits and r.agrees()
    none, why = pc.check_plan(PlanConfig(TINY, "v5e-8", fsdp=8, global_batch=8, seq=64, recompute="selective"))
    assert none is None and "recompute='selective' must be one of" in why
    # a slice with more chips than a torch_xla trace has CPU devices: the harness skips the TPU view, says why
    none, why = pc.check_plan(PlanConfig(TINY, "v5p-512", fsdp=256, global_batch=256, seq=64))  # 256 chips
    assert none is None and "v5p-512 has 256 chips" in why and "one CPU device per chip" in why, why


def test_cached_verdicts_render_from_data(pc) -> None:  # type: ignore[no-untyped-def]
    """The notebook's generated text comes from the cached compiles (no numbers pasted into prose): every cached
    total appears in it, and the held-out line names each held-out configuration with its ratio."""
    results, _ = pc.load_matrix()
    held, source = pc.load_holdout()
    assert set(held) == set(pc.HOLDOUT) and "holdout" in source["command"]
    text = pc.verdict_text(results, held)
    for k, r in results.items():
        if r.arguments_evaluated:
            assert f"{k} {r.total / 2**30:.2f} vs" in text
    for k, r in held.items():
        assert f"{k}: verdicts {'agree' if r.agrees() else 'DISAGREE'}" in text
        assert f"{r.total / sum(r.planner_no_flash.values()):.3f}" in text
    assert f"**{sum(r.agrees() for r in results.values())} of {len(results)}**" in text


def test_refuses_what_the_trace_does_not_do(pc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"pipeline=2: the traced step assumes"):
        pc.VerdictCase(PlanConfig(TINY, "v5e-8", fsdp=4, pipeline=2, global_batch=8, seq=64))
    with pytest.raises(ValueError, match=r"has 8 experts: the traced step is a dense Llama"):
        pc.VerdictCase(PlanConfig({**TINY, "experts": 8}, "v5e-8", fsdp=8, global_batch=8, seq=64))


@pytest.mark.slow
def test_gspmd_rule_is_the_compilers_fsdp_bytes(pc) -> None:  # type: ignore[no-untyped-def]
    """TPU plans priced per parameter, as GSPMD shards them. Oracle: XLA:TPU compiling 07's own verdict step
    (4-layer Llama, h 1024, ffn 2048, V 4096, fsdp 8 on v5e-8, recompute none; ~35 s): its all-gather and
    reduce-scatter bytes per chip and step (each collective x its loop's trip count) are the planner's "gspmd"
    rule's exactly; the FSDP1 flat-unit rule is off (it gathers the embedding and reduce-scatters its gradient,
    which the compiled step never does); the cache holds the same compile."""
    r = pc.rule_check(pc.rule_case("none"))
    for op in ("all-gather", "reduce-scatter"):
        assert r.gspmd[op] == r.compiler[op], op
        assert r.fsdp1[op] != r.compiler[op], op
    cached, _ = pc.load_rule()
    assert cached["none"].compiler == r.compiler


# ------------------------------------------------------------------ 07's held-out rows: live compile vs the cache
# The recompute-none row runs out of memory in XLA:TPU's second form ("Allocation (size=N) would exceed memory"):
# one array larger than the chip, no breakdown. Parsed as if the arguments had been evaluated, its program (the
# temporaries) came out None and 07's held-out line crashed on formatting it, while the cached row, recorded by
# hand from the message, had the array as the program. Oracle below: the compiler's own message (the text, not our
# numbers): its "size=" is the program's lower bound, and the arguments are absent from it.
ALLOC_OOM = ("RESOURCE_EXHAUSTED: Allocation (size=274877906944) would exceed memory (size=33822867456) :: "
             "#allocation364 [shape = 'f32[32,1,32,8192,8192]{3,4,2,1,0:T(8,128)}', space=hbm, size = 0x1, "
             "tag = 'output of broadcast.1391@{}'] :: more text the first line leaves out\nsecond line")


def test_one_array_out_of_memory_is_a_lower_bound_row(pc) -> None:  # type: ignore[no-untyped-def]
    from shardlab.profile.tpu import TpuCompile
    from shardlab.profile.tpu_memory import parse_oom

    oom = parse_oom(ALLOC_OOM)
    assert oom is not None and not oom.arguments_evaluated and oom.arguments is None
    assert oom.program == oom.used == 274877906944 and oom.capacity == 33822867456
    side = pc.compiler_side(TpuCompile("v6e-8", 8, False, 1.0, None, None, None, oom))
    assert side["compiler"] == {"arguments": None, "temp": 274877906944, "total": 274877906944,
                                "fragmentation": None}
    assert side["arguments_evaluated"] is False
    assert side["message"].startswith("RESOURCE_EXHAUSTED: Allocation (size=274877906944)")
    assert side["message"].endswith("tag = 'output of broadcast.1391@{}']")  # the verdict, not the trailing text
    assert side["largest"] == [(274877906944, "f32[32,1,32,8192,8192]{3,4,2,1,0:T(8,128)}", "broadcast.1391@{}")]


def test_holdout_text_renders_a_row_without_compiler_numbers(pc) -> None:  # type: ignore[no-untyped-def]
    """A row whose compiler gave no temporaries or total (an unparsed out of memory) renders with "–", not a crash:
    the line still names the row and its verdicts."""
    held, _ = pc.load_holdout()
    key, r = next(iter(held.items()))
    blank = replace(r, compiler={"arguments": None, "temp": None, "total": None}, compiler_fits=False,
                    arguments_evaluated=False)
    text = pc.holdout_text({key: blank})
    assert f"{key}: verdicts" in text and "total ≥ – vs" in text and "temporaries –)" in text


def test_cached_holdout_rows_are_what_the_code_makes_of_their_messages(pc) -> None:  # type: ignore[no-untyped-def]
    """Every cached out-of-memory row (held out and matrix): re-parsing the full message the cache keeps the first
    line of gives the same compiler numbers — the rows were not edited by hand. Failed on the recompute-none row as
    it was first cached (recorded by hand from the message: no ``fragmentation`` key, another label)."""
    from shardlab.profile.tpu import TpuCompile
    from shardlab.profile.tpu_memory import parse_oom

    (held, _), (matrix, _) = pc.load_holdout(), pc.load_matrix()
    one_array = 0
    for key, r in {**held, **matrix}.items():
        if r.compiler_fits or "would exceed memory" not in r.message:
            continue  # the capacity check's form keeps only its first line: the breakdown is not in the cache
        one_array += 1
        side = pc.compiler_side(TpuCompile(r.topology, 8, False, 1.0, None, None, None, parse_oom(r.message)))
        assert side["compiler"] == r.compiler, key
        assert side["arguments_evaluated"] == r.arguments_evaluated and side["message"] == r.message, key
        assert [tuple(x) for x in side["largest"]] == [tuple(x) for x in r.largest], key
    assert one_array >= 1  # the recompute-none held-out row


@pytest.mark.slow
@pytest.mark.full_size
@pytest.mark.parametrize("key", ["llama-3-8b.v6e-8.recompute-none"])
def test_cached_holdout_row_is_what_a_live_compile_gives(pc, key, live_tpu_compiles) -> None:  # type: ignore[no-untyped-def]
    """The cache must be what the code produces: recompile one held-out row (about 10 minutes on 2 cores) and
    compare every field a compile decides (verdict, bytes, message, largest arrays) with the cached row."""
    held, _ = pc.load_holdout()
    live = pc.check(pc.holdout_cases()[key])
    assert pc.compile_differences(live, held[key]) == {}
    pc.holdout_text({key: live})  # the line 07 prints renders
