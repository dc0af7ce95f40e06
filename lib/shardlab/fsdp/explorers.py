"""Notebook 05's explorer, declared (:mod:`shardlab.core.explorer` builds it): layer widths (text), world size and
alignment; each change re-plans the flat parameter and redraws its buffer."""

from __future__ import annotations

from typing import Any

from shardlab.core.explorer import Explorer, Shown, Slider, Text, Toggle
from shardlab.fsdp.figures import flat_buffer_figure, parse_sizes
from shardlab.fsdp.flat_param import plan_flat_shards_for
from shardlab.fsdp.params import FsdpParams
from shardlab.fsdp.train import make_model


def _evaluate(_p: Any, v: dict[str, Any]) -> dict[str, Any]:
    model = make_model(FsdpParams(layer_sizes=v["layer_sizes"]))
    plan = plan_flat_shards_for(model, v["world_size"], use_orig_params=v["use_orig_params"])
    return {"plan": plan, "figure": flat_buffer_figure(plan, [n for n, _ in model.named_parameters()])}


def _show(res: dict[str, Any], _v: dict[str, Any]) -> Shown:
    plan = res["plan"]
    return Shown(True, f"n = {plan.flat_numel}, c = ceil(n/N) = {plan.shard_numel}, n_pad = {plan.padded_numel};"
                       f" padding = {plan.padding_numel} elements "
                       f"({100 * plan.padding_numel / plan.padded_numel:.1f}%)", figure=res["figure"])


EXPLORERS = {"05_fsdp_flat_params": Explorer(
    controls={"layer_sizes": Text(parse_sizes, lambda s: ", ".join(map(str, s)), "widths", "16, 32, 8"),
              "world_size": Slider(1, 16, label="world size", default=4),
              "use_orig_params": Toggle("use_orig_params (16-byte alignment)")},
    evaluate=_evaluate, show=_show)}
