"""Notebook 07's parameters: a plan (``PlanConfig``'s fields) and a small validation configuration.

Light: the planner is pure arithmetic; nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardlab import planner
from shardlab.core.params import NotebookParams, divisible
from shardlab.formulas.common import RECOMPUTE_POLICIES


@dataclass(frozen=True)
class PlannerParams(planner.PlanConfig, NotebookParams):
    """Notebook 07: a plan and a small validation configuration.

    The plan's fields — model, slice, degrees, recompute, batch and the planner's assumptions — are
    :class:`shardlab.planner.PlanConfig`'s, declared there once: ``planner.plan(p)`` plans these parameters. The plan
    is pure arithmetic, legal at any ``num_devices``. The validation runs at ``val_world`` ranks (the tensor degree
    of the Megatron MLP and layer, the data degree of the data-parallel and FSDP steps)."""

    NOTEBOOK: ClassVar[str] = "07_planner"
    POSITIVE = ("data", "fsdp", "tensor", "global_batch", "seq", "val_world", "val_tokens", "val_hidden", "val_ffn",
                "val_heads")
    FLAGS = ("full_size",)
    CHOICES = {"recompute": RECOMPUTE_POLICIES}
    SLICES = ("topology",)

    val_world: int = 8  # ranks of the validation configurations
    val_tokens: int = 64  # tokens (b = 1, s = val_tokens) of the validation MLP / layer / steps
    val_hidden: int = 128
    val_ffn: int = 512
    val_heads: int = 8  # heads of the validation transformer layer
    full_size: bool = False  # compile the presets' full training steps with XLA:TPU (tens of minutes); False: cached

    def checks(self) -> None:
        if not isinstance(self.model, str | dict):
            raise ValueError(f"model={self.model!r} must be a preset name or a dict of sizes")
        w = self.val_world
        divisible("val_ffn", self.val_ffn, "val_world", w, "the validation MLP splits its inner dimension")
        divisible("val_heads", self.val_heads, "val_world", w, "whole heads per rank in the validation layer")
        divisible("val_hidden", self.val_hidden, "val_heads", self.val_heads, "each head has hidden / heads "
                  "dimensions")
        divisible("val_hidden", self.val_hidden, "val_world", w, "the FSDP step shards the weights' hidden rows")
        divisible("val_tokens", self.val_tokens, "val_world", w, "data parallelism splits the tokens")
        planner.plan(self)  # the plan's own rules: degrees x slice, divisibility, known names, assumptions
