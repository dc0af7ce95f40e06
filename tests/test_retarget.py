"""Trace small, compile big (shardlab.profile.retarget): the sharding rewrite, what it refuses, and the compile.

Oracles: for the rewrite, torch_xla's own tile assignments — a mesh's ``mark_sharding`` on the target device count
writes exactly what the rewrite of the small trace's annotation must produce (checked by arithmetic here, and by the
compiles below); for the compile, **the direct compile**: the same notebook graph traced on as many CPU devices as
the slice has chips and compiled by the same XLA:TPU compiler. Exact, or it is not used: per-chip memory
(arguments, outputs, temporaries, aliased, peak), fits, every collective (op, dtype, shapes, bytes, replica groups —
hence the mesh axis —, operands, form) and the program text up to instruction names must all be equal. A negative
control shows the comparison can fail (a trace rewritten to the wrong mesh differs).
Each compile takes a few seconds; the first use of a 2- or 4-device helper process ~10 s.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shardlab.profile import retarget as R

pytestmark = pytest.mark.xla


# ------------------------------------------------------------------------------------------------- the rewrite
def _mesh_sharding(sizes: tuple[int, ...], spec: tuple[int | None, ...], rank: int) -> str:
    """What torch_xla writes for ``mark_sharding(t, mesh(sizes), spec)``, spec = mesh axis per tensor dim (the
    GSPMD rule, independent of the rewrite): tile dims = the named axes' sizes, the unnamed axes replicated in a last
    dim; devices = the mesh transposed to (named axes in dim order, then the rest)."""
    mesh = np.arange(int(np.prod(sizes))).reshape(sizes)
    named = [a for a in spec if a is not None]
    rest = [a for a in range(len(sizes)) if a not in named]
    dims = [sizes[a] if a is not None else 1 for a in spec]
    tail = " last_tile_dim_replicate" if rest and int(np.prod([sizes[a] for a in rest])) > 1 else ""
    if tail:
        dims.append(int(np.prod([sizes[a] for a in rest])))
    ids = mesh.transpose(named + rest).ravel()
    assert len(spec) == rank
    return "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, ids)) + tail + "}"


@pytest.mark.parametrize("small,big", [((2, 4), (16, 4)), ((2, 4), (64, 4)), ((2, 2), (8, 16)), ((2, 2, 2), (4, 8, 2))])
@pytest.mark.parametrize("spec", [(0, 1), (1, 0), (0, None), (None, 1), (1, None), (None, 0)])
def test_rewrite_matches_a_direct_annotation(small, big, spec) -> None:  # type: ignore[no-untyped-def]
    spec = tuple(a if a is None or a < len(small) else None for a in spec)
    got = R.retarget_sharding(_mesh_sharding(small, spec, 2), small, big)
    assert got == _mesh_sharding(big, spec, 2)


def test_iota_and_tuple_shardings() -> None:
    iota = "{devices=[4,2]<=[2,4]T(1,0)}"  # = mesh (2, 4) transposed: tensor on dim 0, fsdp on dim 1
    assert R.retarget_sharding(iota, (2, 4), (16, 4)) == _mesh_sharding((16, 4), (1, 0), 2)
    text = "{{replicated}, {unknown shard_as 3}, " + _mesh_sharding((2, 4), (0, 1), 2) + "}"
    assert R.retarget_sharding(text, (2, 4), (8, 4)) == \
        "{{replicated}, {unknown shard_as 3}, " + _mesh_sharding((8, 4), (0, 1), 2) + "}"


@pytest.mark.parametrize("text,small,big,why", [
    ("{maximal device=3}", (2, 4), (8, 4), r"places a tensor on one device"),
    ("{manual}", (2, 4), (8, 4), r"is manual"),
    ("{devices=[2,4]0,1,2,3,4,5,6,7 last_tile_dims={manual}}", (2, 4), (8, 4), r"is manual"),
    ("{devices=[2,4]0,2,1,3,4,5,6,7}", (2, 4), (8, 4), r"is not a permutation of the trace mesh \(2, 4\)"),
    ("{devices=[4]0,1,2,3}", (2, 4), (8, 4), r"spans 4 devices but the trace mesh \(2, 4\) has 8"),
    ("{replicated}", (1, 8), (4, 16), r"trace_mesh=\(1, 8\): every axis needs >= 2 devices"),
    ("{replicated}", (2, 4), (64,), r"has 2 axes but target_mesh=\(64,\) has 1"),
])
def test_refused_shardings_name_the_rule(text, small, big, why) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(R.RetargetError, match=why):
        R.retarget_sharding(text, small, big)


@pytest.mark.parametrize("line,why", [
    ('%c = f32[8]{0} custom-call(f32[8]{0} %a), custom_call_target="tpu_custom_call"', r"Pallas kernel"),
    ('%c = f32[2]{0} custom-call(f32[8]{0} %a), custom_call_target="SPMDFullToShardShape"', r"manual sharding"),
    ('%c = f32[8]{0} custom-call(f32[8]{0} %a), custom_call_target="MyKernel"', r"not known to be mesh-independent"),
    ("%r = f32[8]{0} all-reduce(f32[8]{0} %a), replica_groups={{0,1}}, to_apply=%add", r"all-reduce before partitio"),
    ("%p = u32[] partition-id()", r"partition-id before partitioning"),
    ('%0 = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64}>', r"all_gather before partitioning"),
    ('%1 = stablehlo.custom_call @tpu_custom_call(%arg0)', r"Pallas kernel"),
])
def test_mesh_bound_graphs_are_refused(line, why) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(R.RetargetError, match=why):
        R.retarget_module("HloModule m\nENTRY %e {\n  " + line + "\n}", (2, 4), (8, 4))


def test_normalise_is_up_to_names_only() -> None:
    a = "HloModule a\nENTRY %e {\n  %x.1 = f32[2]{0} parameter(0), metadata={op_name=\"x\"}\n  ROOT %y.7 = f32[2]{0} " \
        "add(%x.1, %x.1)\n}"
    b = a.replace("%x.1", "%p").replace("%y.7", "%q").replace("HloModule a", "HloModule b")
    assert R.same_graph(a, b)
    assert not R.same_graph(a, b.replace("add", "multiply"))


# ------------------------------------------------------------------------- compiles: small trace == direct
@pytest.fixture(scope="module")
def tpu(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.profile import tpu

    tpu.check_backend()
    return tpu


def _tp_mlp():  # type: ignore[no-untyped-def]
    """Notebook 02's Megatron MLP step at tp 8 (mesh (data 1, tensor 8)), traced at tp 2 on 2 devices."""
    from shardlab.tp.case import MlpCase
    from shardlab.tp.params import MlpParams

    p = MlpParams(tp=8)
    return MlpCase(p), MlpCase(replace(p, tp=2)), ((1, 2), (1, 8))


def _seed_scan(shard_as: bool):  # type: ignore[no-untyped-def]
    """Notebook 06's seed block stack (scan over L 4 layers, fsdp 2 × tensor 4) with shard_as off / on, traced on
    fsdp 2 × tensor 2 (4 devices)."""
    from shardlab.xla_scan.params import ScanParams
    from shardlab.xla_scan.scale import SeedStepCase

    p = ScanParams()
    big = SeedStepCase(p, layers=4, shard_as=shard_as)
    return big, replace(big, p=replace(p, mesh_fsdp=2, mesh_tensor=2)), ((2, 2), (2, 4))


def _fsdp_tp_step():  # type: ignore[no-untyped-def]
    """Notebook 12's training step (a tiny Llama: embeddings, GQA attention, SwiGLU MLP, loss, backward, AdamW,
    donated) on mesh fsdp 4 × tensor 2, traced on fsdp 2 × tensor 2."""
    from shardlab.inspect.config import make_config, with_mesh

    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256}
    big = make_config("llama-3-8b", mesh="fsdp=4,tensor=2", topology="v5e-8", num_layers=2, seq=64, batch=8,
                      overrides=tiny).validate()
    small = replace(with_mesh(big, (("fsdp", 2), ("tensor", 2))), rules_mesh=big.mesh)  # as inspect traces small
    return big, small, ((2, 2), (4, 2))


CASES = {"02 tp mlp": _tp_mlp, "06 scan shard_as on": lambda: _seed_scan(True),
         "06 scan shard_as off": lambda: _seed_scan(False), "12 fsdp x tp AdamW step": _fsdp_tp_step}


def _compile(tpu, case, **kw):  # type: ignore[no-untyped-def]
    from shardlab.core.case import build_graph
    from shardlab.inspect import step

    if hasattr(case, "graph"):
        return tpu.compile_program(build_graph, case, "v5e-8", **kw)
    return tpu.compile_program(step.build, case, "v5e-8", donate=case.donate, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_small_trace_compiles_to_the_direct_program(tpu, name) -> None:  # type: ignore[no-untyped-def]
    big, small, meshes = CASES[name]()
    direct = _compile(tpu, big)
    retargeted = _compile(tpu, small, retarget=meshes)
    assert direct.fits and retargeted.options["retarget"] == [list(m) for m in meshes]
    assert R.differences(direct, retargeted) == {}, name
    assert direct.memory.peak == retargeted.memory.peak and direct.count("all-reduce") == retargeted.count("all-reduce")
    print(f"{name}: peak {direct.memory.peak} B, {len(direct.module.collectives)} collectives, identical")


def test_the_comparison_can_fail(tpu) -> None:  # type: ignore[no-untyped-def]
    """Negative control: the 06 trace rewritten to the transposed mesh (fsdp 4 × tensor 2) is another program."""
    big, small, _ = _seed_scan(True)
    direct = _compile(tpu, big)
    other = _compile(tpu, small, retarget=((2, 2), (4, 2)))
    assert R.differences(direct, other)


def test_retarget_needs_the_trace_world(tpu) -> None:  # type: ignore[no-untyped-def]
    import tpu_programs as tp

    outs = tp.megatron_mlp(tp.MlpCfg())  # traced on this process's 8 devices
    with pytest.raises(ValueError, match=r"the trace mesh must span this process's 8 devices and the target mesh the "
                                         r"256 chips of 'v6e-256'"):
        tpu.compile_tensors(outs, "v6e-256", retarget=((2, 2), (64, 4)))


def test_inspect_traces_pod_slices_small(tpu) -> None:  # type: ignore[no-untyped-def]
    """inspect on a slice above 64 chips traces on the smallest mesh with the same axes, its rules resolved on the
    real mesh (the tiny model's FSDP rule picks other dims at fsdp 2 than at 256) — no compile here: the
    compile path is the one tested above. Cloud TPU's names count TensorCores for v5p (v5p-256 = 128 chips)."""
    from shardlab.inspect.api import trace_config
    from shardlab.inspect.config import make_config

    tiny = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256}
    for topology, mesh, chips, small, big in (("v6e-256", "fsdp=256", 256, (2,), (256,)),
                                              ("v5p-256", "fsdp=64,tensor=2", 128, (2, 2), (64, 2)),
                                              ("v5p:4x4x8", "fsdp=128", 128, (2,), (128,))):
        cfg = make_config("llama-3-8b", mesh=mesh, topology=topology, num_layers=2, seq=64, batch=chips,
                          overrides=tiny).validate()
        small_cfg, meshes = trace_config(cfg)
        assert cfg.chips == chips and meshes == (small, big) and small_cfg.chips == int(np.prod(small))
    v4 = make_config("llama-3-8b", mesh="fsdp=64", topology="v4-128", num_layers=2, seq=64, batch=64,
                     overrides=tiny).validate()
    assert v4.chips == 64 and trace_config(v4) is None  # 64 chips: traced directly, one CPU device per chip
