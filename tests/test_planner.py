"""Planner: composition checks against published statements and clear errors.

Oracles: ZeRO (Rajbhandari et al. 2020) — model state 16Ψ/N under stage 3 and ZeRO-3 communication = 1.5×
data parallelism (section 7.2); Megatron-LM (Shoeybi et al. 2019) — two all-reduces in the forward and two
in the backward of every layer; Narayanan et al. — 72·B·L·s·h²(1 + s/(6h) + V/(12hL)); pytorch/xla#8883 —
the per-device stacked gradient [126, 4K, 16K] of Llama 3.1 405B on v6e-256.
"""

from dataclasses import replace

import pytest

from shardlab import planner as P
from shardlab.formulas.scan import seed_case

GPT_SMALL = P.ModelConfig("gpt-test", layers=4, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=51200,
                          gated_mlp=False)


def test_errors_name_the_values():
    with pytest.raises(ValueError, match=r"data=2 × fsdp=2 × tensor=1 = 4 does not equal the 8 chips of v5e-8"):
        P.plan(P.PlanConfig("llama-3-8b", "v5e-8", data=2, fsdp=2, tensor=1))
    with pytest.raises(ValueError, match=r"unknown model preset 'llama-9b'"):
        P.plan(P.PlanConfig("llama-9b"))
    with pytest.raises(ValueError, match=r"unknown topology 'v9-8'"):
        P.plan(P.PlanConfig("llama-3-8b", "v9-8"))
    bad = P.ModelConfig("odd", 2, 1004, 4000, 4, 4, 1000)
    with pytest.raises(ValueError, match=r"hidden=1004 is not divisible by tensor=8"):
        P.plan(P.PlanConfig(bad, "v5e-8", fsdp=1, tensor=8))
    with pytest.raises(ValueError, match=r"global_batch=4 is not divisible by data × fsdp = 8"):
        P.plan(P.PlanConfig("llama-3-8b", "v5e-8", global_batch=4))
    with pytest.raises(ValueError, match=r"recompute='half'"):
        P.plan(P.PlanConfig("llama-3-8b", recompute="half"))


def test_model_state_is_zero3_16psi_over_n():
    p = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=8, tensor=1))
    assert p.memory["params"] + p.memory["grads"] + p.memory["optimizer"] == pytest.approx(16 * p.num_params / 8)
    p2 = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=2, tensor=4))
    assert p2.memory["params"] + p2.memory["grads"] + p2.memory["optimizer"] == pytest.approx(
        16 * p2.num_params / 8)


def test_zero3_sends_1_5x_data_parallel_except_the_root_unit():  # PyTorch FSDP1's flat units
    # ZeRO section 7.2.2: P_os+g+p communicates 3Ψ vs 2Ψ for DP (ring volumes, same (W-1)/W factor) — for every
    # unit PyTorch reshards after forward; the root unit (embedding, final norm, LM head) is all-gathered once
    # per step, so it moves 2Ψ_root like DP
    z3 = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=8, zero_stage=3, fsdp_rule="fsdp1"))
    dp = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=1, data=8))
    assert z3.memory["padding"] == 0  # every unit divides by 8: the ratio is exact
    h, V, L = GPT_SMALL.hidden, z3.padded_vocab, GPT_SMALL.layers
    psi_root = 2 * V * h + h  # embedding + LM head + final norm
    psi_layers = z3.num_params - psi_root
    assert z3.comm_wire_bytes / dp.comm_wire_bytes == pytest.approx((3 * psi_layers + 2 * psi_root)
                                                                   / (2 * z3.num_params), rel=1e-12)
    ag = [t for t in z3.comm if t.op == "all-gather"]
    assert [t.count for t in ag] == [2 * L, 1]  # layers: forward + backward; root: forward only


def test_tp_all_reduces_per_layer():
    # Megatron-LM: 2 all-reduces forward + 2 backward per layer, each of the [b, s, h] activation
    p = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=1, data=1, tensor=8, global_batch=2, seq=256,
                            recompute="none"))
    layer = [t for t in p.comm if t.axis == "tensor" and t.what.startswith("layer")][0]
    assert layer.count == 4 * GPT_SMALL.layers
    assert layer.payload_bytes == 2 * 256 * 1024 * 2  # b · s · h · bf16
    assert layer.wire_bytes == layer.count * 2 * 7 / 8 * layer.payload_bytes
    full = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=1, tensor=8, global_batch=2, seq=256, recompute="full"))
    assert [t for t in full.comm if t.what.startswith("layer")][0].count == 6 * GPT_SMALL.layers


def test_flops_match_narayanan_formula():
    B, s = 16, 512
    p = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=8, global_batch=B, seq=s, recompute="none"))
    L, h, V = GPT_SMALL.layers, GPT_SMALL.hidden, p.padded_vocab
    assert p.flops.model == pytest.approx(72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L)), rel=1e-12)


def test_vocab_padding_and_verdicts():
    p = P.plan(P.PlanConfig("llama-3-70b", "v6e-256", data=1, fsdp=64, tensor=4, global_batch=64))
    assert p.padded_vocab == 128512 and p.padded_vocab % (128 * 4) == 0  # 128256 is not a multiple of 512
    big = P.plan(P.PlanConfig("llama-3.1-405b", "v5e-8", fsdp=8))
    # 405B params × 16 B / 8 chips = 812 GB per chip against the 15.75 GiB the TPU compiler allows per v5e chip
    assert not big.fits and "does not fit" in big.verdict and "15.75 GiB usable HBM" in big.verdict
    assert big.hbm_bytes == 15.75 * 2**30
    assert big.memory["optimizer"] == pytest.approx(12 * big.num_params / 8)


def test_seed_stacked_gradient_405b_v6e_256():
    # pytorch/xla#8883: per-device stacked gradient [126, 4K, 16K] (1-D: all-reduced over fsdp) on v6e-256
    c = seed_case(dtype="bfloat16")
    assert (c.fsdp, c.tensor) == (64, 4)
    assert c.one_d_per_chip_bytes == 126 * 4096 * 16384 * 2  # 16.9 GB
    assert c.two_d_per_chip_bytes == 126 * 4096 * (16384 // 64) * 2  # 264 MB
    f32 = seed_case(dtype="float32")
    assert not f32.one_d_fits and f32.two_d_fits  # 31.5 GiB > the 31.25 GiB a v6e program may use
    with pytest.raises(ValueError, match=r"fsdp=32 × tensor=4 = 128 does not tile the 256 chips of v6e-256"):
        seed_case(fsdp=32)


def test_sequence_parallel_moves_tp_bytes_plus_one_regather_per_pair():
    # Korthikanti et al. section 4.2.2: all-gather + reduce-scatter cost the bandwidth of the all-reduce; Megatron's
    # SP linear re-gathers its s/t input shard in the backward: + (t-1)/t·bsh·e per pair (2 per layer) and step
    kw = dict(fsdp=1, tensor=8, global_batch=2, seq=256)
    for r in ("none", "full"):
        tp = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", recompute=r, **kw))
        sp = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", recompute=r, sequence_parallel=True, **kw))
        layer_tp = sum(t.wire_bytes for t in tp.comm if t.what.startswith("layer"))
        layer_sp = sum(t.wire_bytes for t in sp.comm if t.what.startswith("layer"))
        x = 2 * 256 * 1024 * 2  # [b, s, h] bf16
        assert layer_sp == pytest.approx(layer_tp + 2 * GPT_SMALL.layers * 7 / 8 * x, rel=1e-12)
        # and SP shards the activations that TP alone replicates: eq. (4) < eq. (2)
        assert sp.memory["activations"] < tp.memory["activations"]


def test_activations_are_the_models_own_block():
    # Llama 3 8B (GQA kv=8, SwiGLU), flash attention, no recompute, tensor=1: L x the Llama formula, by hand
    p = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192, recompute="none"))
    s, h, ffn, a, kv, L = 8192, 4096, 14336, 32, 8, 32
    sbh = s * h
    per_layer = 2 * sbh * (1 + 1 + 2 * kv / a + 1 + 1 + 2) + 8 * s * ffn + 4 * a * s  # module note of activations
    assert p.memory["activations"] == pytest.approx(L * per_layer, rel=1e-12)
    assert any("SwiGLU" in n and "GQA 8 KV heads" in n and "flash" in n for n in p.notes)
    no_flash = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192, recompute="none",
                                   flash_attention=False))
    # each layer keeps the bf16 softmax 2as² instead of the log-sum-exp 4as; one layer's backward holds dP and dS too
    assert no_flash.memory["activations"] - p.memory["activations"] == pytest.approx(
        L * (2 * a * s * s - 4 * a * s) + 2 * 2 * a * s * s)


def test_peak_is_the_larger_of_two_phases():
    """Llama 3 8B on v6e-8 (fsdp 8, b 1 x s 8192 per chip, full recompute), by hand. Kept: 32 layer inputs 2sbh.
    Layer backward: the recomputed layer's activations (module note of formulas.activations) and, without flash,
    the softmax P plus dP and dS (3 x 2as²), and one layer's weights + gradient gathered (4 B per parameter).
    LM head: fp32 logits [s, 128256] and the gathered LM-head matrix + gradient [128256, 4096] x 4 B."""
    s, h, ffn, a, kv, L, V = 8192, 4096, 14336, 32, 8, 32, 128256
    sbh = s * h
    layer = 2 * sbh * (1 + 1 + 2 * kv / a + 1 + 1 + 2) + 8 * s * ffn  # without the attention core
    per_layer_params = 2 * h * h + 2 * h * kv * (h // a) + 3 * h * ffn + 2 * h
    kept = L * 2 * sbh
    state = 16 * (L * per_layer_params + 2 * V * h + h) / 8
    lm_head = 4 * s * V + 4 * V * h
    flash = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192))
    assert flash.peak_phase == "LM head"
    assert flash.phases["layer backward"] == pytest.approx(layer + 4 * a * s + 4 * per_layer_params)
    assert flash.memory_total == pytest.approx(state + kept + lm_head)
    assert (flash.memory["logits"], flash.memory["fsdp_gathered_unit"]) == (4 * s * V, 4 * V * h)  # vocab unit
    no_flash = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192, flash_attention=False))
    assert no_flash.peak_phase == "layer backward" and no_flash.memory["logits"] == 0
    assert no_flash.memory_total == pytest.approx(state + kept + layer + 3 * 2 * a * s * s + 4 * per_layer_params)
    assert any("peak in the layer backward" in n and "LM head needs" in n for n in no_flash.notes)


def test_fit_margin_and_at_risk():
    """The verdict: fits under (1 - fit_margin) x usable HBM, at risk up to the usable HBM, does not fit above."""
    p = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192, flash_attention=False))
    usable = 31.25 * 2**30
    assert p.hbm_bytes == usable and p.fit_limit_bytes == pytest.approx(0.9 * usable)
    share = p.memory_total / usable  # 0.994 by the terms above: within the margin
    assert 0.9 < share <= 1 and p.at_risk and not p.fits and p.verdict.startswith("at risk")
    loose = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8, global_batch=8, seq=8192, flash_attention=False,
                                fit_margin=0.0))
    assert loose.fits and not loose.at_risk and loose.memory_total == p.memory_total
    with pytest.raises(ValueError, match=r"fit_margin=1.5 must be a number in \[0, 1\)"):
        P.plan(P.PlanConfig("llama-3-8b", fit_margin=1.5))


def test_viz_headless():
    # the figure has one stacked trace per memory category (+ the HBM marker); the explorer reports bad degrees
    from shardlab.core.explorer import build
    from shardlab.planner.explorers import EXPLORERS
    from shardlab.planner.figures import CATEGORY_ORDER, memory_figure, summary_frame

    p = P.plan(P.PlanConfig("llama-3-8b", "v6e-8"))
    fig = memory_figure([p, p])
    assert [t.name for t in fig.data] == [*CATEGORY_ORDER, "usable HBM per chip"]
    assert sum(t.y[0] for t in fig.data[:-1]) == pytest.approx(p.memory_total / 1e9)
    assert summary_frame(p)["verdict"][0] == p.verdict
    ex = build(EXPLORERS["07_planner"], P.PlanConfig("llama-3-8b", "v6e-8"))
    assert ex.update()["plan"].memory_total == p.memory_total and ex.error is None
    # the verdict in the status line, the summary row as the table, the stacked bars as the one figure
    assert ex.status.value == p.verdict and ex.table.value == summary_frame(p).to_html()
    assert [o["output_type"] for o in ex.out.outputs] == ["display_data"]
    assert ex.figure.to_dict() == memory_figure(p).to_dict()
    ex.pipeline.value = 2  # the other degrees are widgets too: 1 × 8 × 1 × 2 != 8 chips
    assert ex.plan is None and "pipeline=2" in ex.error
    ex.pipeline.value = 1
    ex.fsdp.value = 3  # observer calls update(): 1 × 3 × 1 != 8 chips
    assert ex.plan is None and "data=1 × fsdp=3 × tensor=1 = 3 does not equal the 8 chips of v6e-8" in ex.error


def test_custom_model_dict():
    m = P.model_from({"layers": 2, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 32000})
    assert m.name == "custom" and m.layers == 2
    p = P.plan(P.PlanConfig({"layers": 2, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 32000},
                            "v5e-8"))
    assert p.model == m
    with pytest.raises(ValueError, match=r"missing keys \['vocab'\], unknown keys \['hiden'\]"):
        P.model_from({"layers": 2, "hiden": 512, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8})
    with pytest.raises(ValueError, match=r"custom model: layers=0 must be a positive int"):
        P.model_from({"layers": 0, "hidden": 512, "ffn": 2048, "heads": 8, "kv_heads": 8, "vocab": 10})
    from shardlab.core.explorer import build
    from shardlab.planner.explorers import EXPLORERS

    ex = build(EXPLORERS["07_planner"], P.PlanConfig({"layers": 2, "hidden": 512, "ffn": 2048, "heads": 8,
                                                      "kv_heads": 8, "vocab": 32000}, "v5e-8"))
    assert ex.update()["plan"].model == m and "custom" in [label for label, _ in ex.model.options]


def test_step_comm_is_the_plans_comm_without_the_slice():
    cfg = P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=2, tensor=4, global_batch=4, seq=256)
    assert P.step_comm(cfg) == P.plan(cfg).comm
    # 2 tensor ranks: no slice has 2 chips, the terms exist anyway (Megatron: 2 + 2 all-reduces per layer)
    two = P.PlanConfig(GPT_SMALL, data=1, fsdp=1, tensor=2, global_batch=1, seq=64, recompute="none",
                       act_dtype="float32")
    layer = P.step_comm(two)[0]
    assert (layer.count, layer.payload_bytes) == (4 * GPT_SMALL.layers, 64 * 1024 * 4)
    assert layer.wire_bytes == layer.count * 2 * 1 / 2 * layer.payload_bytes
    with pytest.raises(ValueError, match=r"heads=16 is not divisible by tensor=3|hidden=1024 is not divisible"):
        P.step_comm(P.PlanConfig(GPT_SMALL, fsdp=1, tensor=3, global_batch=1))


def test_the_notebook_parameters_are_the_plan_configuration():
    # notebook 07's parameters extend PlanConfig (declared once): planning them is planning the same PlanConfig
    from dataclasses import fields, replace

    from shardlab.core.explorer import explorer_for
    from shardlab.planner.params import PlannerParams

    nb = PlannerParams(topology="v5e-8", fsdp=4, data=2, recompute="selective", sequence_parallel=True).validate()
    assert isinstance(nb, P.PlanConfig)
    plain = P.PlanConfig(**{f.name: getattr(nb, f.name) for f in fields(P.PlanConfig)})
    assert P.plan(nb).memory == P.plan(plain).memory and P.plan(nb).comm == P.plan(plain).comm
    assert P.plan(nb).as_dict()["config"] == P.plan(plain).as_dict()["config"]  # the plan's fields only
    ex = explorer_for(nb)
    ex.tensor.value = 2  # the widgets change the degrees and keep the rest (sequence parallelism here)
    ex.fsdp.value = 2
    assert ex.error is None and ex.plan.config.sequence_parallel
    assert ex.plan.memory == P.plan(replace(plain, fsdp=2, tensor=2)).memory


@pytest.mark.parametrize("change,match", [
    (dict(sequence_parallel=1), r"sequence_parallel=1 must be True or False"),
    (dict(param_bytes=0), r"param_bytes=0 must be an integer >= 1"),
    (dict(optimizer_k=-1), r"optimizer_k=-1 must be a number >= 0"),
    (dict(act_dtype="fp8x"), r"dtype='fp8x' is unknown"),
])
def test_every_assumption_is_validated(change, match):
    with pytest.raises(ValueError, match=match):
        P.plan(P.PlanConfig("llama-3-8b", **change))


def test_gspmd_rule_by_hand():
    """fsdp_rule="gspmd" (what XLA:TPU compiles for 07's per-parameter annotations, measured in
    test_planner_verdict): each layer weight gathered twice, the RMSNorm weights in fp32; every layer gradient
    reduce-scattered once; the LM head + final norm gathered once and reduce-scattered; the embedding neither — two
    all-to-alls of the [b, s, h] activation instead. GPT_SMALL: h 1024, ffn 4096 GeLU, V 51200, fsdp 8, b 1, s 8192."""
    p = P.plan(P.PlanConfig(GPT_SMALL, "v5e-8", fsdp=8, global_batch=8, seq=8192))
    h, f, L, V = 1024, 4096, 4, 51200
    mats = 4 * h * h + 2 * h * f  # q, k, v, o + two MLP matrices
    ag = [t for t in p.comm if t.op == "all-gather"]
    assert [(t.count, t.payload_bytes) for t in ag] == [(2 * L, mats * 2 / 8 + 2 * h * 4 / 8),
                                                        (1, V * h * 2 / 8 + h * 4 / 8)]
    rs = [t for t in p.comm if t.op == "reduce-scatter"]
    assert [(t.count, t.payload_bytes) for t in rs] == [(L, (mats + 2 * h) * 2), (1, (V * h + h) * 2)]
    a2a = [t for t in p.comm if t.op == "all-to-all"]
    assert [(t.count, t.payload_bytes) for t in a2a] == [(2, 8192 * h * 2)]
    assert len(p.comm) == 5


def test_sequence_parallel_adds_the_norm_gradient_all_reduce():
    # Llama 3 8B, tensor 8 with SP: the 2 RMSNorm weights of 32 layers + the final norm act on s/t tokens, their
    # gradients (bf16) summed once per step over tensor: (32·2·4096 + 4096)·2 = 532,480 B (Korthikanti et al.'s
    # sequence parallelism: the norms' weight gradients are partial sums over the tensor group)
    sp = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=1, tensor=8, global_batch=1, sequence_parallel=True))
    norm = [t for t in sp.comm if "norm-weight" in t.what]
    assert [(t.op, t.count, t.payload_bytes) for t in norm] == [("all-reduce", 1, 532480)]
    plain = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=1, tensor=8, global_batch=1))
    assert not [t for t in plain.comm if "norm-weight" in t.what]


def test_comm_time_per_ici_axis():
    """The JAX scaling book's per-axis model: a group on one torus axis sends over one link's bidirectional
    bandwidth (v6e: 800 GB/s / 4 = 200 GB/s), one spanning both axes over two. v6e-8 is 2 x 4 with devices in
    2 x 2 host tiles (0 (0,0), 1 (1,0), 2 (0,1), 3 (1,1), 4 (0,2) ...): mesh (data 2, fsdp 4) puts fsdp's group
    {0, 1, 2, 3} on both axes and data's {0, 4} on the y axis only."""
    p = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", data=2, fsdp=4, global_batch=8))
    assert p.ici_axes == {"fsdp": 2, "data": 1}
    want = sum(t.wire_bytes / (400e9 if t.axis == "fsdp" else 200e9) for t in p.comm)
    assert p.roofline.comm_s == pytest.approx(want, rel=1e-12)
    full = P.plan(P.PlanConfig("llama-3-8b", "v6e-8", fsdp=8))  # one group over both axes: the chip's egress
    assert full.roofline.comm_s == pytest.approx(full.comm_wire_bytes / 400e9, rel=1e-12)


def test_pipeline_stage_memory_bubble_and_sends():
    """Llama 3 70B (80 layers, h 8192) on v6e-256, fsdp 16 x tensor 4 x pipeline 4, 16 microbatches of 1 sequence:
    full recompute keeps each layer's input, 2·s·h bytes per microbatch (replicated over tensor without SP); 1F1B
    holds p = 4 microbatches on the first stage, GPipe all m = 16 (Narayanan et al. 2021): the difference is
    (16 - 4) · 20 layers · 2 s h. The bubble is (p - 1)/m of the compute time; the middle stages send one
    activation forward and one gradient backward per microbatch on each side: 2m messages of [1, 8192, 8192] bf16."""
    kw = dict(fsdp=16, tensor=4, pipeline=4, global_batch=256, microbatches=16)
    one_f = P.plan(P.PlanConfig("llama-3-70b", "v6e-256", **kw))
    gpipe = P.plan(P.PlanConfig("llama-3-70b", "v6e-256", schedule="gpipe", **kw))
    s, h = 8192, 8192
    assert gpipe.stage == "last" and gpipe.peak_phase == "LM head"  # m in flight on every stage: the LM head's
    assert gpipe.memory["activations"] == 16 * 20 * 2 * s * h
    work = one_f.phases["layer backward"] - one_f.memory["fsdp_gathered_unit"]  # the recomputed layer's transients
    assert one_f.memory["activations"] == 4 * 20 * 2 * s * h + work
    assert one_f.stage == "first" and one_f.roofline.bubble_s == pytest.approx(3 / 16 * one_f.roofline.compute_s)
    gathers = [t for t in one_f.comm if t.axis == "fsdp" and t.op == "all-gather"]
    assert gathers[0].count == 16 * 2 * 20  # every microbatch gathers its stage's 20 layers, forward and backward
    sends = [t for t in one_f.comm if t.op == "send"]
    assert [(t.count, t.payload_bytes, t.wire_bytes) for t in sends] == [(32, s * h * 2, 32 * s * h * 2)]
    # a stage holds 20 of the 80 layers: the first stage's parameters are (20 layers + embedding) / tensor / fsdp
    pc = P.mem.param_count(80, 8192, 28672, 64, 8, 128512)
    assert one_f.memory["params"] == pytest.approx((20 * pc.per_layer + pc.embedding) / 4 / 16 * 2)
    with pytest.raises(ValueError, match=r"layers=80 is not divisible by pipeline × virtual = 6"):
        P.plan(P.PlanConfig("llama-3-70b", "v6e-256", fsdp=32, tensor=4, pipeline=2, virtual=3,
                            schedule="interleaved", global_batch=256, microbatches=8))


def test_context_ring_and_allgather_sends():
    """Llama 3 8B at 128K tokens, context 8 ring (Liu et al.): per layer and step, forward 2(cp - 1) K/V block
    sends, backward 2(cp - 1) + 2cp (K/V again, dK/dV home), + the recomputed forward's 2(cp - 1); a block is
    b·(s/cp)·kv·hd·e = 16384·8·128·2 bytes. All-gather CP: 2 gathers of that shard forward (and again under
    recompute), 2 reduce-scatters of the full b·s·kv·hd·e backward."""
    kw = dict(fsdp=8, context=8, global_batch=8, seq=131072)
    ring = P.plan(P.PlanConfig("llama-3-8b", "v6e-64", **kw))
    block = 16384 * 8 * 128 * 2
    sends = [t for t in ring.comm if t.axis == "context" and t.op == "send"]
    assert [(t.count, t.payload_bytes) for t in sends] == [(32 * (14 + 30 + 14), block)]
    # context ranks hold the same weights and see other tokens: their gradient shards are all-reduced over context
    grads = [t for t in ring.comm if t.axis == "context" and t.op == "all-reduce"]
    assert [(t.count, t.payload_bytes) for t in grads] == [(1, 8_030_261_248 * 2 / 8)]
    ag = P.plan(P.PlanConfig("llama-3-8b", "v6e-64", context_method="allgather", **kw))
    got = [(t.op, t.count, t.payload_bytes) for t in ag.comm if t.axis == "context" and t.op != "all-reduce"]
    assert got == [("all-gather", 32 * 4, block), ("reduce-scatter", 32 * 2, 8 * block)]
    with pytest.raises(ValueError, match=r"context=8 needs flash_attention=True"):
        P.plan(P.PlanConfig("llama-3-8b", "v6e-64", flash_attention=False, **kw))


def test_expert_all_to_alls_and_expert_memory():
    """Mixtral 8x7B (8 experts of 3·4096·14336, top 2) on v6e-64, fsdp 8 x expert 8: per MoE layer forward two
    all-to-alls (dispatch, combine), two backward, two more for the recomputed forward, each of the full dispatch
    buffer E·C·h·e with C = ceil(1.25·2·8192/8) = 2560: 8·2560·4096·2 = (T/n)·k·cf·h·e (GShard; the tokens of one
    device). Each chip keeps E/ep = 1 expert per layer: params = (dense + experts/8)/fsdp·2 bytes."""
    p = P.plan(P.PlanConfig("mixtral-8x7b", "v6e-64", fsdp=8, expert=8, global_batch=64))
    a2a = [t for t in p.comm if t.axis == "expert" and t.op == "all-to-all"]
    assert [(t.op, t.count, t.payload_bytes) for t in a2a] == [("all-to-all", 32 * 6, 8192 * 2 * 1.25 * 4096 * 2)]
    h, f, L = 4096, 14336, 32
    experts = L * 8 * 3 * h * f
    assert p.memory["params"] == pytest.approx((46_702_792_704 - experts + experts / 8) / 8 * 2)
    with pytest.raises(ValueError, match=r"expert=8 needs a mixture-of-experts model"):
        P.plan(P.PlanConfig("llama-3-8b", "v6e-64", fsdp=8, expert=8, global_batch=64))


def test_moe_hardware_flops_count_the_capacity_slots():
    """Mixtral at S = b·s = 8192 tokens per chip: C = ceil(1.25·2·8192/8) = 2560 slots per expert, E·C = 1.25·k·S
    expert rows run per group; the hardware count adds the empty quarter of the experts' matmuls (fwd + bwd +
    full recompute's forward again: 4 passes), the model count does not. A dense twin (E = 0) gives the rest."""
    cfg = P.PlanConfig("mixtral-8x7b", "v6e-64", fsdp=64, global_batch=64, recompute="full")
    moe = P.plan(cfg)
    m = moe.model
    experts_fwd = 2 * 64 * 8192 * m.layers * 2 * 3 * 4096 * 14336  # tokens · layers · k · SwiGLU 3·h·f, 2 per MAC
    assert moe.flops.hardware - (moe.flops.model + moe.flops.recompute) == pytest.approx(0.25 * experts_fwd * 4,
                                                                                         rel=1e-12)
    none = P.plan(replace(cfg, recompute="none"))
    assert none.flops.hardware - none.flops.model == pytest.approx(0.25 * experts_fwd * 3, rel=1e-12)
