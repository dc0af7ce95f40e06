"""The seed stack builder (``shardlab.xla_scan.scale``) compiled by the XLA:TPU compiler at a small size.

Oracle: sharding arithmetic, independent of the code under test. On mesh (fsdp 2, tensor 4) a weight q [out, in]
sharded q[out_tensor, in_fsdp] holds [out/4, in/2] per chip (2-D); a gradient all-reduced over fsdp keeps only
the tensor split, [out/4, in] (1-D). Stacked over L layers both get a leading L. The same graph run by the CPU
partitioner (notebook 06) shows 1-D without shard_as and 2-D with it; these tests pin the TPU compiler to that.
Each compile takes about a second.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.xla_scan.params import ScanParams

pytestmark = pytest.mark.xla

L, H, F = 4, 256, 512
SMALL = ScanParams(hidden=H, ffn=F, batch=8, seq=8, mesh_fsdp=2, mesh_tensor=4)


@pytest.fixture(scope="module")
def scale(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.profile import tpu
    from shardlab.xla_scan import scale

    tpu.check_backend()
    return scale


def off_on(scale, case):  # type: ignore[no-untyped-def]
    """The same step compiled for a v5e slice with shard_as off and on (the harness's TPU view)."""
    from shardlab.core import harness

    out = {}
    for tag, flag in (("off", False), ("on", True)):
        c = replace(case, shard_as=flag)
        view = harness.tpu(c, "v5e")
        assert view.ran, view.skipped
        out[tag] = scale.seed_result(c, view.detail)
    return out


def test_validate_names_the_rule(scale) -> None:  # type: ignore[no-untyped-def]
    full = scale.FULL_SIZE
    with pytest.raises(ValueError, match=r"hidden=100 is not divisible by fsdp=16"):
        replace(full, p=replace(full.p, hidden=100))
    with pytest.raises(ValueError, match=r"'q' and 'o' come together"):
        replace(full, weights=("q",))
    with pytest.raises(ValueError, match=r"stacking='loop' must be one of"):
        replace(full, stacking="loop")
    with pytest.raises(ValueError, match=r"layout='rows' must be one of"):
        replace(full, layout="rows")
    # a mesh of 3 chips: no TPU slice has that many, so the story is skipped with the reason (nothing compiles)
    three = scale.SeedStepCase(ScanParams(hidden=48, ffn=96, batch=3, seq=8, mesh_fsdp=3, mesh_tensor=1), layers=2)
    assert three.devices == 3
    results, why = scale.story(three)
    assert results == {} and "no 'v6e' topology with num_chips=3" in why


def test_gradient_sharding_off_vs_on_held(scale) -> None:  # type: ignore[no-untyped-def]
    res = off_on(scale, scale.SeedStepCase(SMALL, layers=L, stacking="held", dtype="float32"))
    # q [H, H] on (tensor, fsdp): 2-D [L, H/4, H/2]; 1-D (all-reduced over fsdp) [L, H/4, H]
    # o [H, H] on (fsdp, tensor): 2-D [L, H/2, H/4]; 1-D [L, H, H/4]
    assert res["on"].grad_shapes == {"q": [f"f32[{L},64,128]"], "o": [f"f32[{L},128,64]"]}
    assert res["off"].grad_shapes == {"q": [f"f32[{L},64,256]"], "o": [f"f32[{L},256,64]"]}
    # the gradient outputs: 2·L·(H/4)·(H/2)·4 B on, twice that off (fsdp = 2); the rest is the f32 loss,
    # which the TPU pads to a tile (plus the output tuple's table): under 4 KiB
    on_grads = 2 * L * 64 * 128 * 4
    assert 0 < res["on"].output_bytes - on_grads < 4096
    assert res["off"].output_bytes - 2 * on_grads == res["on"].output_bytes - on_grads
    assert res["off"].fits and res["on"].fits and res["on"].runs


def test_gradient_sharding_off_vs_on_in_graph(scale) -> None:  # type: ignore[no-untyped-def]
    """Per-layer weights stacked inside the step: L per-layer gradients [H, H] come out. Off: 1-D, one dim whole
    (H/4 x H). On: 2-D, H·H/8 elements per chip — the compiler is free to orient the split (it returns them with
    fsdp and tensor swapped relative to the weight), so compare the sorted per-chip dims."""
    res = off_on(scale, scale.SeedStepCase(SMALL, layers=L, stacking="in_graph", dtype="float32"))

    def dims(shapes: list[str]) -> set[tuple[int, ...]]:
        return {tuple(sorted(int(d) for d in s[s.index("[") + 1:-1].split(","))) for s in shapes}

    for w in ("q", "o"):
        assert dims(res["on"].grad_shapes[w]) == {(64, 128)}  # (H/4, H/2) in some order
        assert dims(res["off"].grad_shapes[w]) == {(64, 256)}  # (H/4, H)


def test_update_in_the_graph_pins_the_gradient(scale) -> None:  # type: ignore[no-untyped-def]
    """w - lr·g in the same graph: propagation carries the weight's 2-D sharding into the backward loop, so the
    program is the same with and without shard_as (the updated weights come out 2-D, [L, H/4, H/2])."""
    res = off_on(scale, scale.SeedStepCase(SMALL, layers=L, stacking="held", update="sgd", dtype="float32"))
    for r in res.values():
        assert r.grad_shapes == {"q": [f"f32[{L},64,128]"], "o": [f"f32[{L},128,64]"]}
    assert res["off"].temp_bytes == res["on"].temp_bytes


def test_outputs_are_not_in_the_compilers_check(scale) -> None:  # type: ignore[no-untyped-def]
    r = scale.SeedResult({}, "v6e-64", True, 1.0, argument_bytes=2, output_bytes=10, temp_bytes=3,
                         capacity_bytes=12)
    assert r.live_bytes == 15 and not r.runs  # compiled, but 2 + 10 + 3 > 12: the outputs do not fit
    assert replace(r, output_bytes=1).runs


def test_sharding_of_reads_the_mesh_split(xla_world) -> None:  # type: ignore[no-untyped-def]
    from shardlab.xla_scan.scale import SeedStepCase, sharding_of

    case = SeedStepCase(SMALL, layers=4)
    # q [256, 256] on (fsdp 2, tensor 4): 2-D is [64, 128] (either order), 1-D [64, 256]; activations are neither
    assert [sharding_of(s, case) for s in ("f32[4,64,128]", "f32[128,64]", "f32[4,64,256]", "f32[256,64]",
                                          "f32[4,1,8,64]", "f32[4,8,64]")] == ["2-D", "2-D", "1-D", "1-D", "", ""]


def test_story_small_records_the_invariants(scale) -> None:  # type: ignore[no-untyped-def]
    """Every case of the seed story at a small size (bf16 like the seed), recorded: the names the notebook
    records and the checks it makes, which must pass. Oracle for the per-chip bytes: the checked total is
    arguments + checked temporaries; with the update in the graph both programs are identical."""
    from shardlab.profile import Recorder

    cfg = scale.SeedStepCase(SMALL, layers=L)  # bf16, q and o: the small story's case
    assert (cfg.layers, cfg.dtype, cfg.weights) == (L, "bfloat16", ("q", "o"))
    res, why = scale.story(cfg)  # this process's 8 devices: a v6e-8 slice
    assert why == "" and {r.topology for r in res.values()} == {"v6e-8"}
    assert list(res) == ["in_graph.off", "in_graph.on", "held.off", "update.off", "update.on", "in_graph_update.off",
                         "in_graph_update.on", "seed_layout.off", "seed_layout.on"]
    rec = Recorder("t")
    scale.record_story(rec, "scale.small", res, cfg)  # raises if a check fails
    v = {(m["name"], m["source"]): m["value"] for m in rec.data["measurements"]}
    for key, name in (("in_graph.off", "scale.small.shard_as_off"), ("held.off", "scale.small.held.shard_as_off")):
        r = res[key]
        assert v[(name + ".fits", "tpu")] == 1 and v[(name + ".per_chip.bytes", "tpu")] == r.per_chip_bytes
        assert r.per_chip_bytes == r.argument_bytes + r.temp_bytes
    # off: 1-D per-layer gradients [H/4, H] (H/4 · H elements); on: 2-D, half of that (fsdp = 2)
    assert scale.grad_sharding(res["in_graph.off"], cfg) == {"q": "1-D", "o": "1-D"}
    assert scale.grad_sharding(res["in_graph.on"], cfg) == {"q": "2-D", "o": "2-D"}
    assert res["held.off"].grad_shapes == {"q": [f"bf16[{L},64,256]"], "o": [f"bf16[{L},256,64]"]}
    assert scale.stacks(res["held.off"], cfg, "1-D") and not scale.stacks(res["in_graph.on"], cfg, "1-D")
    assert res["update.off"].peak_bytes == res["update.on"].peak_bytes
    # the seed's training step (in-graph stacking + update): updated weights 2-D [H/4, H/2] either way (any order)
    for flag in ("off", "on"):
        assert {tuple(sorted(int(d) for d in sh[sh.index("[") + 1:-1].split(",")))
                for v in res[f"in_graph_update.{flag}"].grad_shapes.values() for sh in v} == {(64, 128)}
    # the seed's layout: off 1-D (H/4 x H per layer), on 2-D
    assert scale.grad_sharding(res["seed_layout.off"], cfg) == {"q": "1-D", "o": "1-D"}
    assert scale.grad_sharding(res["seed_layout.on"], cfg) == {"q": "2-D", "o": "2-D"}
    frame = scale.story_frame(res, cfg)
    assert frame.loc[("held", "off"), "sharding"] == "q 1-D, o 1-D"
    assert frame.loc[("seed_layout", "off"), "activations"] == "fsdp, None, tensor"


def test_story_text_from_the_cached_compiles(scale) -> None:  # type: ignore[no-untyped-def]
    """The notebook's numbers are written from the cache: every case of the cached story has its bullet, with the
    numbers recomputed here by hand from the cached fields (and the seed's buffers from the shapes)."""
    full, _ = scale.load_story()
    text = scale.story_text(full, scale.FULL_SIZE)
    assert set(full) == {f"{k}.{f}" for k, (*_, flags) in scale.CASES.items() for f in
                         ("on" if x else "off" for x in flags)}, sorted(full)
    # the seed: two bf16 [126, 16384/4, 16384] stacks of 126·4096·16384·2 B = 15.75 GiB each
    assert f"{126 * 4096 * 16384 * 2 / 2**30:.2f} GiB" in text and "Used 36.56G of 31.25G" in text
    off, on = full["in_graph_update.off"], full["in_graph_update.on"]
    assert off.fits and on.fits
    assert f"without shard_as {(off.temp_bytes - on.temp_bytes) / 2**30:.2f} GiB more" in text
    assert f"temporaries {on.temp_bytes / 2**30:.2f} GiB" in text
    assert "the seed's layout" in text and text.count("\n") == len(full) - 3  # in-graph / update / layout pairs
    assert "bf16[126,16384,4096]" in text  # the seed layout's 1-D stacks


def test_story_cache_round_trips(scale, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = scale.SeedResult({"layers": 2}, "v6e-64", False, 3.0, used_bytes=7, largest=[(5, "bf16[2,4]", "x")],
                         message="RESOURCE_EXHAUSTED: ...")
    scale.save_story({"in_graph.off": r}, tmp_path / "s.json", command="test")
    back, source = scale.load_story(tmp_path / "s.json")
    assert back["in_graph.off"] == r and source == {"command": "test"}
    with pytest.raises(FileNotFoundError, match="full_size=True"):
        scale.load_story(tmp_path / "missing.json")
