"""FlashAttention on the TPU compiler: each of the two fixes is needed, both are undone after the block, the
flash program has its three custom calls and no s x s array while plain attention's s x s arrays have the shape
the heads per chip imply; the planner's terms by hand; the longest-fit search against a known threshold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlab.memory import flash as F
from shardlab.memory import pallas_tpu as P

# 16 heads over 8 chips: 2 per chip (GQA 2:1); one compile each, in this process's 8-device world (v5e:2x4)
SMALL = F.AttentionConfig(seq=2048, heads=16, kv_heads=8, tensor=8)


def test_formula_is_the_planners_statement() -> None:
    a, s, b, t = 32, 8192, 1, 1
    assert F.formula_temp_bytes(F.AttentionConfig(kernel="plain", seq=s)) == 6 * a * s * s * b / t  # P, dP, dS
    assert F.formula_temp_bytes(F.AttentionConfig(kernel="flash", seq=s)) == 4 * a * s * b / t  # fp32 lse
    assert F.formula_temp_bytes(replace(SMALL, kernel="plain")) == 6 * 16 * 2048**2 / 8


def test_bad_config_names_the_parameter() -> None:
    with pytest.raises(ValueError, match="kernel='xformers'"):
        F.AttentionConfig(kernel="xformers").validate()
    with pytest.raises(ValueError, match="seq=1536"):
        F.AttentionConfig(seq=1536).validate()
    with pytest.raises(ValueError, match="tensor=3"):
        F.AttentionConfig(tensor=3).validate()


@pytest.mark.xla
def test_patches_are_scoped(xla_world) -> None:  # type: ignore[no-untyped-def]
    import jax._src.tpu_custom_call as tcc
    import torch_xla.experimental.custom_kernel as ck

    before = ck.trace_pallas, tcc.get_ir_version
    with P.pallas_for_tpu_compile():
        assert P.patched() == {"platform": True, "ir_version": True}
    assert (ck.trace_pallas, tcc.get_ir_version) == before
    with pytest.raises(RuntimeError, match="boom"), P.pallas_for_tpu_compile():
        raise RuntimeError("boom")
    assert P.patched() == {"platform": False, "ir_version": False}
    with P.pallas_for_tpu_compile(active=False):
        assert P.patched() == {"platform": False, "ir_version": False}


def _flash_graph(**fixes: bool) -> list:
    import torch
    from torch_xla.core.xla_builder import create_placeholder_tensor as ph
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v = (ph((1, 2, 512, 128), torch.bfloat16) for _ in range(3))
    with P.pallas_for_tpu_compile(**fixes):
        return [flash_attention(q, k, v, causal=True)]


@pytest.mark.xla
def test_each_fix_is_needed(xla_world) -> None:  # type: ignore[no-untyped-def]
    from shardlab.profile import tpu

    with pytest.raises(Exception, match="interpret mode"):  # lowered on JAX's default (CPU) backend
        _flash_graph(active=False)
    topo = tpu.topology_for(8)
    with pytest.raises(Exception, match="[Uu]nsupported version"):  # Mosaic IR v8, libtpu reads <= 7
        tpu.compile_tensors(_flash_graph(ir_version=False), topo)
    ok = tpu.compile_tensors(_flash_graph(), topo)
    assert ok.fits and ok.hlo_text is not None
    assert ok.hlo_text.count('custom_call_target="tpu_custom_call"') == 1  # the forward kernel


@pytest.mark.xla
def test_flash_vs_plain_on_the_tpu_compiler(xla_world) -> None:  # type: ignore[no-untyped-def]
    flash = F.measure(SMALL)
    plain = F.measure(replace(SMALL, kernel="plain"))
    assert flash.fits and plain.fits and flash.topology == "v5e:2x4"
    assert flash.custom_calls == 3  # forward, dq, dk/dv
    assert flash.square_bytes == 0 and not any(b.square for b in flash.largest)
    heads, s = 16 // 8, 2048
    squares = {b.shape for b in plain.largest if b.square}
    assert f"f32[{heads},{s},{s}]" in squares  # the fp32 softmax of the 2 heads on one chip
    assert plain.square_bytes >= heads * s * s * 4
    assert flash.temp < plain.temp


def test_seq_max_fit_search(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 23 * 1024  # fits(s) iff s <= limit: the search must land on it
    seen: list[int] = []

    def fake(cfg: F.AttentionConfig, k: int = 5) -> F.AttentionMemory:
        seen.append(cfg.seq)
        return F.AttentionMemory({}, "", cfg.seq <= limit, 0, None, None, None, 0.0)

    monkeypatch.setattr(F, "measure", fake)
    fit = F.seq_max_fit(SMALL)
    assert fit.seq == limit and fit.probes[0] == (1024, True)
    assert len(seen) <= 2 * 5 + 2  # doubling to 32768, then bisection
    assert F.seq_max_fit(SMALL, start=8192).seq == limit  # from a closer first probe
    assert F.seq_max_fit(SMALL, limit=4096).seq == 4096  # never probes past the limit
