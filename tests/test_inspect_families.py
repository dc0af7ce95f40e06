"""Every popular decoder family through ``inspect`` at tiny widths, from its ``transformers`` config class.

Cost (2-core reference machine): one compile per family not already compiled by ``test_inspect_compile`` (nine,
about 4-10 s each when the machine is quiet), a trace without compile of the other layer modes of the families
in :data:`FAST` (the rest are marked slow), and the refusals, which cost no trace.

Oracles: the per-chip parameter and optimizer bytes the compiler's program declares (``entry_computation_layout``)
against the plan's arithmetic; the collectives XLA:TPU emitted against what FSDP alone implies (all-gathers,
reduce-scatters and all-reduces on the fsdp axis, and no all-to-all or collective-permute: those would be the
compiler reshuffling a weight whose split does not match how the model slices it — the fused projections);
HF's own MoE code for the static MoE forms (``test_inspect_models``).
"""

from __future__ import annotations

import pytest

from shardlab.inspect.analysis import layout_bytes
from shardlab.inspect.config import InspectInputError, make_config
from shardlab.inspect.families import FAMILIES, tiny_family

pytestmark = pytest.mark.xla

COMPILED_ELSEWHERE = {"llama", "mistral", "mixtral", "gemma", "gpt2"}  # test_inspect_compile's presets
COMPILE = sorted(set(FAMILIES) - COMPILED_ELSEWHERE)
# Traced in every make test: the families whose other layer modes once crashed or need per-layer masks (Qwen2 /
# Qwen3 / Gemma 2: transformers 4.57 reads decoder_layer.attention_type; Gemma 2, gpt-oss: sliding and full layers
# alternate). The other families' other modes are marked slow (about 1 s each when the machine is quiet).
FAST = {"qwen2", "qwen3", "gemma2", "gpt_oss"}
TRACE = [pytest.param(t, mode, id=f"{t}-{mode}", marks=() if t in FAST else pytest.mark.slow)
         for t, f in sorted(FAMILIES.items()) for mode in f.layers if not (t in COMPILE and mode == f.layers[0])]


def tiny(model_type: str, layers: str, mesh: str = "fsdp=8", num_layers: int = 2):  # type: ignore[no-untyped-def]
    return make_config(tiny_family(model_type, num_layers), mesh=mesh, topology="v5e-8", batch=8, seq=64,
                       layers=layers, model_name=model_type)


@pytest.mark.parametrize("model_type", COMPILE)
def test_family_compiles_fits_and_fsdp_moves_nothing_else(model_type: str, xla_world) -> None:  # type: ignore
    from shardlab.inspect.api import run

    cfg = tiny(model_type, FAMILIES[model_type].layers[0])
    r = run(cfg)
    assert r.fits and r.exit_status == 0
    want = layout_bytes(cfg)
    assert r.row("parameters")["compiler"] == want["params"]
    assert r.row("optimizer state")["compiler"] == want["optimizer"]
    ops = {(c["axes"], c["op"]) for c in r.collectives if c["instructions"]}
    assert ("fsdp", "all-gather") in ops and ("fsdp", "reduce-scatter") in ops, ops
    moved = {op for _, op in ops} - {"all-gather", "reduce-scatter", "all-reduce"}
    if model_type in RESHUFFLES:  # measured and explained, not a weight's split: see RESHUFFLES
        assert moved, f"{model_type}: the reshuffles RESHUFFLES explains are gone: update it"
    else:
        assert not moved and {a for a, _ in ops} == {"fsdp"}, ops


# Families whose tiny step (FSDP 8) still holds all-to-alls / collective-permutes, and why (measured: the op
# names in the HLO metadata of each program's all-to-alls and permutes). Not a weight split on a fused dimension
# (those are gone, FUSED).
RESHUFFLES = {
    "gpt_oss": "HF's expert code (eval, off the CPU) repeats the tokens E times and views them [E, T, h]: the "
               "view folds the batch-split token dimension into the expert dimension, and the partitioner moves "
               "tokens around the bmm (all-to-alls on the concatenate / dot of the expert MLP, forward and backward)",
    "deepseek_v3": "six 4 KiB f32 all-to-alls in the AdamW update, resharding a broadcast scalar (the partitioner's "
                   "choice, op_name multiply/add in the update): no weight or activation of the model",
}


@pytest.mark.parametrize("model_type,layers", TRACE)
def test_family_traces_in_every_layer_mode_it_allows(model_type: str, layers: str, xla_world) -> None:  # type: ignore
    """Trace only (no compile): forward, HF's loss, backward and AdamW run through HF's own code in this layer
    mode, and the step has one output per trained tensor and kind (the analysis reads the kinds from them)."""
    from shardlab.inspect import step

    cfg = tiny(model_type, layers).validate()
    built = step.build(cfg)
    outs = built.outputs if hasattr(built, "outputs") else built[0]
    assert len(outs) == 1 + len(step.output_kinds(cfg))
    assert tuple(outs[0].shape) == ()  # the loss


@pytest.mark.parametrize("model_type,why", [("deepseek_v3", "holds other parameters than layer 0"),
                                            ("gemma3_text", "different rotary embeddings")])
@pytest.mark.parametrize("layers", ["scan", "scan_layers"])
def test_families_a_scan_cannot_run_are_refused_before_tracing(model_type: str, why: str, layers: str) -> None:
    with pytest.raises(InspectInputError, match=f"layers='{layers}': .*{why}.*use layers='loop'"):
        tiny(model_type, layers, num_layers=3).validate()


def test_gemma2_alternates_windows_and_qwen2_has_none() -> None:
    """The per-layer windows the scans build their masks from are HF's own (its layer_types)."""
    from shardlab.inspect import models as M

    for t, want in (("gemma2", [32, None, 32]), ("qwen2", [None] * 3), ("mistral", [32] * 3),
                    ("gpt_oss", [32, None, 32])):
        c = M.load_config(tiny_family(t, 3))
        assert M.layer_windows(c, 3) == want, t
        if t != "mistral":  # Mistral's attention reads config.sliding_window at call time: one for all layers
            assert [M.build_meta(c).model.layers[i].self_attn.sliding_window for i in range(3)] == want, t


def test_flash_attention_leaves_no_seq_by_seq_array(xla_world) -> None:  # type: ignore[no-untyped-def]
    """attention='flash' at tiny widths, scanned: XLA:TPU compiles torch_xla's Pallas kernels (forward, dq, dkv) as
    custom calls, and no value of the program has the [s, s] trailing shape the eager scores have (oracle: HF's
    eager step of the same config traced, whose program holds them — read from its HLO before any compile)."""
    import torch_xla

    from shardlab.inspect import step
    from shardlab.profile import tpu

    s = 1024  # not a width of the tiny model (head 32, hidden 128, ffn 256, vocab 512): an [s, s] is attention's
    cfg = make_config(tiny_family("llama"), mesh="fsdp=8", topology="v5e-8", batch=8, seq=s, attention="flash",
                      model_name="llama").validate()
    with tpu.quiet_libtpu():
        c = tpu.compile_built(step.build(cfg), "v5e-8", donate=True, label="flash")
    assert c.fits
    shapes = [a for i in c.module.instructions.values() for a in i.shape]
    square = [str(a) for a in shapes if len(a.dims) >= 2 and tuple(a.dims[-2:]) == (s, s)]
    assert not square, square
    assert sum("tpu_custom_call" in line for line in c.hlo_text.splitlines() if "custom-call(" in line) >= 3
    eager = step.build(make_config(tiny_family("llama"), mesh="fsdp=8", topology="v5e-8", batch=8, seq=s,
                                   model_name="llama").validate())
    text = torch_xla._XLAC._get_xla_tensors_hlo(list(eager.outputs))
    assert f",{s},{s}]" in text  # the eager scores [b, a, s, s] (per device after partitioning: a, s, s remain)


def test_selective_partition_keeps_projections_and_recomputes_the_softmax() -> None:
    """On a toy layer through AOTAutograd (CPU): the forward saves the matmul outputs of the projections
    (``mm``) and not the softmax (recomputed in the backward), and the gradients equal autograd's."""
    import torch
    from functorch.compile import aot_function, make_boxed_func

    from shardlab.inspect.step import selective_partition

    saved: dict[str, list[str]] = {}

    def fw(gm, _inputs):  # type: ignore[no-untyped-def]
        out = next(n for n in gm.graph.nodes if n.op == "output")
        saved["fw"] = [str(a.target) for a in out.args[0][1:]]  # after the one forward output
        return make_boxed_func(gm.forward)

    def layer(x, w1, w2):  # type: ignore[no-untyped-def]
        h = x @ w1  # [t, d]: a projection
        return torch.softmax(h, dim=-1) @ w2

    torch.manual_seed(0)
    x, w1, w2 = (torch.randn(n, 8, requires_grad=True) for n in (6, 8, 8))  # [t, d], [d, d], [d, d]
    f = aot_function(layer, fw_compiler=fw, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                     partition_fn=selective_partition)
    out = f(x, w1, w2)
    got = torch.autograd.grad(out.sum(), (x, w1, w2))
    want = torch.autograd.grad(layer(x, w1, w2).sum(), (x, w1, w2))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert "aten.mm.default" in saved["fw"] and not any("softmax" in t for t in saved["fw"]), saved
