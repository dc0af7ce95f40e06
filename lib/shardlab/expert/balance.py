"""The router's two losses at work: a few optimizer steps of the router with and without the load-balancing loss.

Design note
-----------
Drops come from a router that prefers some experts. A random router on zero-mean tokens prefers none in
expectation (its drops are the binomial noise of ``formulas.expert.expected_dropped_fraction``), and no loss on
the router removes noise. Real hidden states share a mean direction, and a router trained on the task alone
"rich-get-richer" collapses onto the experts it already likes (Shazeer et al. 2017; Switch §2.2). This module
shows both effects on notebook 11's layer:

    tokens      x + μ                     x [G, S, h] the notebook's tokens; μ [h] a shared offset, offset·N(0, 1)
    forward     GShard's einsums          mask, combine [G, S, E, C] (``moe.dispatch_tensors``), SwiGLU experts
    loss        ½‖y − target‖² / (G·S) + α·aux (+ β·z)   aux: ``moe.load_balancing_loss``, z: ``router_z_loss``
    optimizer   Adam on W_r only (the experts frozen: the router is what balancing acts on)

:func:`train_router` returns the dropped fraction (from the dispatch), the aux loss and the z-loss at every step.
Cheap: 30 steps of the default layer (8 groups of 128 tokens) take about half a second on one core.

Example::

    >>> from shardlab.expert.params import ExpertParams
    >>> h = train_router(ExpertParams(tokens=32, hidden=16, ffn=16), groups=2, alpha=1.0, steps=2)
    >>> sorted(h[0])
    ['aux', 'dropped', 'task', 'z']
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shardlab.expert.moe import (
    MoE,
    capacity,
    dispatch_tensors,
    inputs,
    layer,
    load_balancing_loss,
    router_logits,
    router_z_loss,
    top_k_gates,
)
from shardlab.expert.params import ExpertParams


def gshard_forward(x: torch.Tensor, moe: MoE, slots: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GShard's einsum layer on one process: x [G, S, h] -> (y [G, S, h], {"dropped", "aux", "z"})."""
    p = moe.p
    logits = router_logits(x, moe.router)  # [G, S, E]
    probs = logits.softmax(dim=-1)
    gates, experts = top_k_gates(probs, p.top_k, p.normalize)  # [G, S, k]
    d = dispatch_tensors(gates, experts, p.experts, slots)  # mask, combine [G, S, E, C]
    buf = torch.einsum("gsec,gsh->egch", d.mask.to(x.dtype), x)  # [E, G, C, h]
    act = F.silu(torch.einsum("egch,ehf->egcf", buf, moe.w1)) * torch.einsum("egch,ehf->egcf", buf, moe.w3)
    out = torch.einsum("egcf,efh->egch", act, moe.w2)  # [E, G, C, h]
    y = torch.einsum("gsec,egch->gsh", d.combine.to(x.dtype), out)  # [G, S, h]
    return y, {"dropped": 1 - d.kept.float().mean(), "aux": load_balancing_loss(probs, experts),
               "z": router_z_loss(logits)}


def train_router(p: ExpertParams, groups: int, alpha: float, steps: int = 30, offset: float = 0.5,
                 z_coef: float = 0.0, lr: float = 1e-2) -> list[dict[str, Any]]:
    """``steps`` Adam steps on the router of notebook 11's layer (tokens shifted by one shared offset); one row per
    step before its update: ``{"dropped", "aux", "z", "task"}``, the last row after the final update."""
    for name, value in (("alpha", alpha), ("offset", offset), ("z_coef", z_coef)):
        if value < 0:
            raise ValueError(f"{name}={value} must be >= 0")
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    moe = layer(p)
    for w in (moe.w1, moe.w3, moe.w2):
        w.requires_grad_(False)
    x, target = inputs(p, groups)
    mu = torch.randn(p.hidden, generator=torch.Generator().manual_seed(p.seed + 2)) * offset  # [h]
    x, target = (x + mu).reshape(groups, p.tokens, -1), target.reshape(groups, p.tokens, -1)  # [G, S, h]
    slots = capacity(p, p.tokens)
    opt = torch.optim.Adam([moe.router], lr=lr)
    rows = []
    for i in range(steps + 1):
        y, facts = gshard_forward(x, moe, slots)
        task = 0.5 * (y - target).pow(2).sum() / (groups * p.tokens)
        rows.append({k: float(v.detach()) for k, v in (*facts.items(), ("task", task))})
        if i == steps:
            break
        opt.zero_grad()
        (task + alpha * facts["aux"] + z_coef * facts["z"]).backward()
        opt.step()
    return rows
