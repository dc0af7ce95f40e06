"""Reference solutions of notebook 07's exercises (graded by ``shardlab.core.exercises``; never printed).

Exercises 1-3 compute their answers with the formulas the planner composes; the hand-written key is
``data/answers/07_planner.json``. Exercise 4 is code: the learner writes ``answer()`` returning a
:class:`shardlab.planner.PlanConfig`; the grader plans it and compares what it is of (model, slice, batch,
sequence, recompute) and whether it fits with the task — any mesh that fits is right.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from shardlab.core.topics import Solution
from shardlab.formulas import activations, hardware, memory
from shardlab.planner import PlanConfig, model_from, plan

TASK_4 = ("llama-3-70b", "v6e-64", 16, 8192, "full")  # model, slice, global batch, sequence, recompute


def _llama_8b_selective_share(flash_attention: bool) -> float:
    """Share of one Llama 3 8B layer's stored activations that selective recompute drops (s 8192, b 1, t 1)."""
    t = activations.llama_activation_bytes_per_layer(8192, 1, 4096, 14336, 32, 8, flash_attention=flash_attention)
    return t.attention_core / t.total


def _plan_it(fn: Callable[[], Any]) -> list[Any]:
    """Run the learner's ``answer()``: what its plan is of, and whether the planner says it fits."""
    cfg = fn()
    if not isinstance(cfg, PlanConfig):
        raise ValueError(f"answer() returned {type(cfg).__name__}, not a PlanConfig")
    p = plan(cfg)
    return [model_from(cfg.model).name, cfg.topology, cfg.global_batch, cfg.seq, cfg.recompute, p.fits]


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "07_planner": {
        1: Solution(lambda: math.ceil(16 * memory.param_count(80, 8192, 28672, 64, 8, 128256).total
                                      / hardware.chip("v6e").hbm_usable_bytes),
                    "16 bytes per parameter spread over n chips must fit the HBM the compiler lets one program use "
                    "(31.25 GiB on v6e, not the published 32 GiB); count Llama 3 70B's parameters exactly (GQA, "
                    "SwiGLU, untied embedding and LM head) and round up"),
        2: Solution(lambda: memory.padded_vocab(128256, tp=4), "round 128256 up to a multiple of 128 × tensor"),
        3: Solution(lambda: (_llama_8b_selective_share(True), _llama_8b_selective_share(False)),
                    "selective recompute drops the attention core only: with flash attention that is a log-sum-exp "
                    "per token and head, without it the s × s softmax of every head; divide by the layer's total",
                    rel_tol=0.01),
        4: Solution(lambda: [*TASK_4, True],
                    "keep the task's model, slice, batch, sequence and recompute; the (fsdp 16, tensor 4) mesh is "
                    "'at risk' — which option of PlanConfig divides the activations kept between layers by the "
                    "tensor degree, or which mesh gathers a smaller LM head?",
                    run=_plan_it),
    },
}
