"""Reference solutions of notebook 12's exercises (graded by ``shardlab.core.exercises``; never printed).

Exercises 1 and 3 compute their answers with the plan's arithmetic (``analysis.layout_bytes``: the sharded shapes)
and the shapes the scanned step keeps, 2 with the planner's fit rule; the hand-written key is
``data/answers/12_your_model.json``. Exercise 4 is code: the learner writes a rules dict; the grader runs inspect's
own validation with ``strict=True`` (a 2-layer Llama 3 8B at tiny widths: the same parameter names and ranks) and
says "covered" only when it passes with the Megatron rules still splitting what they split without the rules.
"""

from __future__ import annotations

from typing import Any

from shardlab.core.topics import Solution
from shardlab.formulas import hardware
from shardlab.inspect.analysis import PARAM_BYTES, layout_bytes
from shardlab.inspect.config import InspectInputError, layout, make_config
from shardlab.inspect.models import config_dict, tiny_overrides
from shardlab.planner import PlanConfig

GIB = 1024**3
MESH_4 = "fsdp=16,tensor=4"  # exercise 3's and 4's mesh on v6e-64


def _optimizer_bytes() -> int:
    """1: AdamW's fp32 master, exp_avg, exp_avg_sq of Llama 3 8B per chip, FSDP over the 8 chips of v6e-8."""
    return layout_bytes(make_config("llama-3-8b", mesh="fsdp=8", topology="v6e-8", batch=8, seq=8192))["optimizer"]


def _fit_limit_gib() -> float:
    """2: the per-chip total under which the planner says "fits" on v6e."""
    return (1 - PlanConfig.fit_margin) * hardware.chip("v6e").hbm_usable_bytes / GIB


def _kept_inputs_bytes() -> int:
    """3: full recompute keeps each layer's input [L, b, s, h] (bf16) for the backward; b per chip is the batch over
    the batch axes, and the tensor axis does not split it (every tensor rank holds the whole activation)."""
    cfg = make_config("llama-3-8b", mesh=MESH_4, topology="v6e-64", batch=16, seq=8192)
    hf = cfg.hf_config()
    return hf.num_hidden_layers * (cfg.batch // cfg.batch_degree) * cfg.seq * hf.hidden_size * PARAM_BYTES


def _strict(rules: Any) -> str:
    """4: the learner's rules under ``strict=True`` — "covered", or what is wrong."""
    if not isinstance(rules, dict):
        return f"answer_4 is a {type(rules).__name__}, not a dict {{regex: spec}}"
    kw = dict(mesh=MESH_4, topology="v6e-64", batch=16, seq=64, num_layers=2,
              overrides=tiny_overrides(config_dict("llama-3-8b")))
    try:
        mine = layout(make_config("llama-3-8b", rules=rules, strict=True, **kw).validate())
    except InspectInputError as exc:
        return str(exc)
    plain = layout(make_config("llama-3-8b", **kw).validate())
    lost = [n for n, o in plain.origins.items() if o.startswith("megatron") and mine.origins[n] != o]
    return "covered" if not lost else f"your rules replace the Megatron rule of {lost[0]}"


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "12_your_model": {
        1: Solution(_optimizer_bytes, "AdamW keeps three fp32 numbers per parameter (master weight, exp_avg, "
                    "exp_avg_sq) and FSDP splits each over the fsdp axis; count Llama 3 8B's parameters exactly "
                    "(GQA: k and v are 1024 wide; untied embedding and LM head; RMSNorm weights)"),
        2: Solution(_fit_limit_gib, "the planner says 'fits' only under (1 - fit_margin) of what the compiler lets "
                    "one chip's program use — the capacity in the compiler's own messages, not the published HBM",
                    rel_tol=1e-3),
        3: Solution(_kept_inputs_bytes, "with full recompute the scan saves one [b, s, h] input per layer for the "
                    "backward; which mesh axes split b, and does the tensor axis split the activation between "
                    "layers at all?"),
        4: Solution(lambda: "covered", "strict wants a rule of yours or a Megatron rule on every parameter: read the "
                    "error for the first one not covered; a regex is matched with re.search, a spec has one entry "
                    "per dimension (None: not split), and your rules come first — do not take over q_proj & co.",
                    run=_strict),
    },
}
