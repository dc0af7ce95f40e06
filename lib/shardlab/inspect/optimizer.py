"""The optimizer's update of one weight, traced inside the step with its state as placeholders.

Design note
-----------
:func:`update` makes one placeholder per state tensor ``formulas.optimizers.state_tensors`` lists (the layout of
``torch.optim.AdamW`` / ``SGD`` / ``Adafactor``: the tensors those classes create on the first step), annotates each
with the weight's spec (Adafactor's factors: the reduced dimension unsplit), computes torch.optim's elementwise
update for one step and returns ``(kind, old placeholder, new value)`` for the weight and every state tensor: the
step outputs each new value and donates it into its old buffer, so the state is an entry argument of the compiled
program (read back by ``analysis.argument_kinds``) and the update's temporaries are in the program's.

The update is written out rather than calling ``torch.optim``: its single-tensor paths read step counts and norms
with ``.item()``, which would execute a placeholder. The arithmetic follows torch 2.9's ``_single_tensor_*``
functions at step 1 (step-dependent scalars are constants); Adafactor's norms stay tensors.

    adamw         m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr (m / (sqrt v + eps) + wd w)
    sgd           w -= lr (g + wd w)
    sgd-momentum  buf = mu buf + g;  w -= lr buf
    adafactor     r = lerp(r, mean(g^2, -1)); c = lerp(c, mean(g^2, -2)); v = r c / mean(r, -2);
                  u = g / sqrt(max(v, eps1^2));  w -= max(eps2, rms(w)) rho / max(1, rms(u) / d) u
                  (1-D: v = lerp(v, g^2))

fp32: the update runs on the fp32 master (the gradient cast up) and the new bf16 weight is its cast; bf16: it runs
on the bf16 weight with bf16 state.
"""

from __future__ import annotations

from typing import Any

import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (step imports this module after it)

from shardlab.formulas.optimizers import state_tensors
from shardlab.profile.placeholders import placeholder

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ADAMW = {"lr": 1e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1}
SGD = {"lr": 1e-2, "momentum": 0.9, "wd": 0.0}
ADAFACTOR = {"lr": 1e-2, "beta2_decay": -0.8, "d": 1.0, "eps2": 1e-3, "wd": 0.0}


def _spec(spec: tuple[Any, ...], reduced: int | None) -> tuple[Any, ...]:
    return spec if reduced is None else tuple(None if i == reduced else a for i, a in enumerate(spec))


def update(optimizer: str, precision: str, param: torch.Tensor, grad: torch.Tensor, spec: tuple[Any, ...],
           mesh: xs.Mesh) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``[(kind, old tensor, new value)]``: ``("param", param, new weight)`` then one per state tensor, in
    ``state_tensors`` order (the output order ``step.output_kinds`` reads)."""
    tensors = state_tensors(optimizer, precision, tuple(param.shape))
    raw = {t.name: placeholder(t.shape, DTYPES[t.dtype]) for t in tensors}
    old: dict[str, torch.Tensor] = {}
    for t in tensors:
        old[t.name] = raw[t.name] * 1  # a placeholder cannot carry an annotation; its product can
        xs.mark_sharding(old[t.name], mesh, _spec(spec, t.reduced))
    w = old["master"] if precision == "fp32" else param
    g = grad.to(w.dtype)
    new: dict[str, torch.Tensor] = {}
    if optimizer == "adamw":
        c = ADAMW
        m1 = c["b1"] * old["exp_avg"] + (1 - c["b1"]) * g
        m2 = c["b2"] * old["exp_avg_sq"] + (1 - c["b2"]) * g * g
        w = w - c["lr"] * (m1 / (m2.sqrt() + c["eps"]) + c["wd"] * w)
        new |= {"exp_avg": m1, "exp_avg_sq": m2}
    elif optimizer == "sgd":
        w = w - SGD["lr"] * (g + SGD["wd"] * w)
    elif optimizer == "sgd-momentum":
        buf = SGD["momentum"] * old["momentum_buffer"] + g
        w = w - SGD["lr"] * buf
        new["momentum_buffer"] = buf
    else:
        w = _adafactor(w, g, old, new)
    new_param = w.to(param.dtype)
    out = [("param", param, new_param)]
    out += [(t.name, raw[t.name], w if t.name == "master" else new[t.name]) for t in tensors]
    return out


def _adafactor(w: torch.Tensor, g: torch.Tensor, old: dict[str, torch.Tensor],
               new: dict[str, torch.Tensor]) -> torch.Tensor:
    """torch.optim.Adafactor's step 1 (``_single_tensor_adafactor``) on ``w`` (master or the bf16 weight)."""
    c, step = ADAFACTOR, 1.0
    eps1 = torch.finfo(w.dtype).eps
    beta = step ** c["beta2_decay"]  # one_minus_beta2_t
    rho = min(c["lr"], 1 / step ** 0.5)
    n = w.numel()
    alpha = torch.clamp(torch.linalg.vector_norm(w) / n ** 0.5, min=c["eps2"]) * rho
    if g.dim() > 1:
        row = old["row_var"] + beta * ((g * g).mean(dim=-1, keepdim=True) - old["row_var"])  # [..., rows, 1]
        col = old["col_var"] + beta * ((g * g).mean(dim=-2, keepdim=True) - old["col_var"])  # [..., 1, cols]
        var = (row @ col) / row.mean(dim=-2, keepdim=True).clamp(min=eps1)  # [..., rows, cols]
        new |= {"row_var": row, "col_var": col}
    else:
        var = old["variance"] + beta * (g * g - old["variance"])
        new["variance"] = var
    u = var.clamp(min=eps1 * eps1).rsqrt() * g
    denom = torch.clamp(torch.linalg.vector_norm(u) / (u.numel() ** 0.5 * c["d"]), min=1.0)
    return w * (1 - c["lr"] * c["wd"]) - (alpha / denom) * u
