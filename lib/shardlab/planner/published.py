"""Notebook 07's reproductions: the published figures the planner's formulas must give, and the seed case's
stacked gradient against the XLA:TPU compiler's buffers.

Design note: the notebook explains each figure in prose; these functions evaluate the formulas, record them
(``planner.zero.*``, ``planner.korthikanti.*``, ``planner.vocab.padded``, ``planner.stacked_grad.*``) with one check
per published number, and return a table to display. Oracles are the papers' printed numbers (ZeRO Figure 1;
Korthikanti et al. 2022, sections 4 and 6; Narayanan et al. 2021's 34 days) and, for the seed case, the buffers the
compiler reported in notebook 06's cached full-size compiles.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from shardlab.formulas import activations, flops, hardware, memory
from shardlab.formulas.scan import SeedCase, seed_case
from shardlab.planner import Plan
from shardlab.profile.hlo_text import parse_shape
from shardlab.profile.record import Recorder

GB = 1e9
ZERO_FIGURE_1_GB = (120, 31.4, 16.6, 1.9)  # Ψ = 7.5B, N = 64, K = 12: stages 0-3
SELECTIVE_FLOPS = {"gpt3": dict(seq=2048, hidden=12288, layers=96, vocab=51200, published=2.7),
                   "mtnlg": dict(seq=2048, hidden=20480, layers=105, vocab=51200, published=1.6)}


def published(rec: Recorder) -> pd.DataFrame:
    """Every published figure next to the formula's value, recorded and checked."""
    rows: list[dict[str, Any]] = []

    def row(figure: str, paper: Any, ours: Any, name: str, ok: bool, detail: str = "") -> None:
        rec.check(name, ok, detail)
        rows.append({"figure": figure, "paper": paper, "formula": ours, "agrees": ok})

    for stage, gb in enumerate(ZERO_FIGURE_1_GB):
        b = memory.model_state_bytes(int(7.5e9), fsdp=64, stage=stage).total
        rec.measure(f"planner.zero.stage{stage}.bytes", b, "bytes", "formula")
        row(f"ZeRO Fig. 1, stage {stage} (GB per device)", gb, round(b / GB, 3),
            f"planner.zero.stage{stage}: rounds to the paper's {gb} GB", round(b / GB, 1) == gb, f"{b / GB:.3f} GB")
    ratio = activations.attention_score_ratio(heads=96, seq=2048, hidden=12288)
    saving = activations.selective_recompute_saving(heads=96, seq=2048, hidden=12288)
    vpad = memory.padded_vocab(50257, tp=8)
    rec.measure("planner.korthikanti.gpt3.attention_ratio", ratio, "1", "formula")
    rec.measure("planner.vocab.padded", vpad, "tokens", "formula")
    row("Korthikanti, GPT-3 5as/h", 80, ratio, "planner.korthikanti.gpt3: 5as/h = 80", ratio == 80)
    row("Korthikanti, selective recompute saves", "70 %", f"{saving:.1%}",
        "planner.korthikanti.gpt3: selective recompute saves 70 %", round(saving, 2) == 0.70, f"{saving:.4f}")
    row("Megatron vocabulary padding, 50257 at tensor 8", 51200, vpad,
        "planner.vocab: 50257 -> 51200 (multiple of 128 x 8)", vpad == 51200)
    for name, m in SELECTIVE_FLOPS.items():
        sizes = {k: v for k, v in m.items() if k != "published"}
        paper = flops.selective_recompute_overhead(**sizes, count="paper")
        ours = flops.selective_recompute_overhead(**sizes, count="forward_only")
        rec.measure(f"planner.korthikanti.{name}.selective_flops.paper", paper, "1", "formula")
        rec.measure(f"planner.korthikanti.{name}.selective_flops.forward_only", ours, "1", "formula")
        row(f"Korthikanti, {name} selective recompute FLOPs (paper's formula)", f"{m['published']} %",
            f"{100 * paper:.2f} %", f"planner.korthikanti.{name}: the paper's formula gives the published "
            f"{m['published']} %", round(100 * paper, 1) == m["published"], f"{100 * paper:.3f} %")
        row(f"Korthikanti, {name}: the forward-only count", "a third of it", f"{100 * ours:.2f} %",
            f"planner.korthikanti.{name}: the forward-only count is a third of the paper's overhead",
            math.isclose(paper, 3 * ours, rel_tol=1e-9), f"{paper:.6f} vs 3 × {ours:.6f}")
    days = flops.training_days(flops.gpt_hardware_flops(1, 2048, 96, 12288, 51200, "full") * 300e9 / 2048,
                               1024, 140e12)  # GPT-3 on 300B tokens, 1024 GPUs at 140 TFLOP/s
    row("Narayanan, GPT-3 training days", "~34", round(days, 1), "planner.flops.gpt3: ~34 days (within 3 %)",
        abs(days - 34) / 34 < 0.03, f"{days:.2f} days")
    return pd.DataFrame(rows).set_index("figure")


def stacked_grad(rec: Recorder, story: dict[str, Any]) -> tuple[SeedCase, pd.DataFrame]:
    """The seed's stacked gradient by formula, recorded, and checked against notebook 06's full-size compiles
    (``xla_scan.scale.load_story()``: in-graph stacking, shard_as off — out of memory, its largest buffer the 1-D
    stack — and on — the 2-D stack among its arrays, at the compile's mesh)."""
    seed = seed_case(dtype="bfloat16")
    rec.measure("planner.stacked_grad.per_chip.bytes.1d", seed.one_d_per_chip_bytes, "bytes", "formula")
    rec.measure("planner.stacked_grad.per_chip.bytes.2d", seed.two_d_per_chip_bytes, "bytes", "formula")
    rec.check("planner.stacked_grad: 1-D per chip is [126, 4K, 16K] bf16",
              seed.one_d_per_chip_bytes == 126 * 4096 * 16384 * 2)
    off, on = story["in_graph.off"], story["in_graph.on"]
    f, t = on.config["mesh_fsdp"], on.config["mesh_tensor"]
    mesh = seed_case(fsdp=f, tensor=t, topology=f"v6e-{f * t}")
    one, one_shape = off.largest[0][0], off.largest[0][1]
    two = max(parse_shape(s)[0].nbytes for s in on.stacked_shapes)  # the largest [126, ...] array with shard_as
    rec.check("planner.stacked_grad: the formula's 1-D bytes = the compiler's largest buffer without shard_as",
              one == seed.one_d_per_chip_bytes == mesh.one_d_per_chip_bytes,
              f"{one:,} B ({one_shape}) vs {seed.one_d_per_chip_bytes:,} B")
    rec.check("planner.stacked_grad: the formula's 2-D bytes = the compiler's stacked gradient with shard_as",
              two == mesh.two_d_per_chip_bytes, f"{two:,} B vs {mesh.two_d_per_chip_bytes:,} B (fsdp {f})")
    hbm = hardware.chip("v6e").hbm_usable_bytes
    frame = pd.DataFrame([
        {"gradient stack": "1-D, seed mesh (fsdp 64 × tensor 4)", "formula GiB": seed.one_d_per_chip_bytes / 2**30,
         "compiler GiB": one / 2**30, "of usable HBM": seed.one_d_per_chip_bytes / hbm},
        {"gradient stack": "2-D, seed mesh (fsdp 64 × tensor 4)", "formula GiB": seed.two_d_per_chip_bytes / 2**30,
         "compiler GiB": None, "of usable HBM": seed.two_d_per_chip_bytes / hbm},
        {"gradient stack": f"2-D, compiled mesh (fsdp {f} × tensor {t})", "formula GiB":
         mesh.two_d_per_chip_bytes / 2**30, "compiler GiB": two / 2**30, "of usable HBM": two / hbm},
    ]).set_index("gradient stack")
    return seed, frame.round(3)


def record_plan(rec: Recorder, prefix: str, plan: Plan) -> None:
    """A plan's headline numbers as formula values: ``<prefix>.memory.per_chip.bytes``, ``.step.comm.bytes``
    (payload), ``.step.comm.wire_bytes``, ``.step.flops`` (hardware), ``.step.roofline_s``, ``.step.mfu_bound``."""
    rec.measure(f"{prefix}.memory.per_chip.bytes", plan.memory_total, "bytes", "formula")
    rec.measure(f"{prefix}.step.comm.bytes", plan.comm_payload_bytes, "bytes", "formula")
    rec.measure(f"{prefix}.step.comm.wire_bytes", plan.comm_wire_bytes, "bytes", "formula")
    rec.measure(f"{prefix}.step.flops", plan.flops.hardware, "FLOP", "formula")
    rec.measure(f"{prefix}.step.roofline_s", plan.roofline.step_s, "s", "formula")
    rec.measure(f"{prefix}.step.mfu_bound", plan.mfu, "1", "formula")
