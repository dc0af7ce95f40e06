"""A top-k routed mixture-of-experts layer: the router, capacity with token dropping, and the dense oracle.

Design note
-----------
GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021) semantics, SwiGLU experts (Mixtral):

    probs = softmax(x W_r)                       x [S, h], W_r [h, E]        -> [S, E]
    gates, experts = top_k(probs)                [S, k]; ``normalize``: gates / Σ gates (Mixtral, GShard top-2)
    Expert_e(x) = (silu(x W1_e) ∘ (x W3_e)) W2_e W1, W3 [h, f], W2 [f, h]: 3·h·f parameters per expert
    y_t = Σ_j gates[t, j] · Expert_{experts[t, j]}(x_t)      over the assignments that were kept

Tokens are split into G **groups** (GShard's dispatch groups; one per expert-parallel rank) and capacity is
counted per group: each expert takes at most C = ceil(capacity_factor · k · S / E) tokens of a group of S.
Assignments claim slots in priority order — every token's first choice (in token order), then every token's
second choice, … (GShard's top-2 order); an assignment that finds its expert full is **dropped** (it contributes
nothing; the residual connection outside the layer carries the token). ``dropless=True`` is the dropless variant:
every assignment is kept, and the expert-parallel code pads every expert's buffer to the largest load (its
all-to-all has equal chunks; MegaBlocks, Gale et al. 2023, avoids padding in the expert compute with block-sparse
kernels, Megatron-Core's dispatcher avoids it on the wire with variable all-to-all splits).

Router losses (the remedy for an unbalanced router, added to the training loss; both act on the router alone):

- :func:`load_balancing_loss` — Switch Transformer's auxiliary loss (Fedus et al. 2021, eq. 4–6)
  α·E·Σ_i f_i·P_i, f_i the fraction of tokens whose top-k picked expert i (Σ_i f_i = k; not differentiable),
  P_i the mean router probability of expert i (differentiable). Uniform routing gives α·k, its minimum over f
  at fixed P = 1/E; Mixtral's ``load_balancing_loss_func`` in transformers computes the same sum (α = 1).
- :func:`router_z_loss` — ST-MoE's router z-loss (Zoph et al. 2022, eq. 5) (1/T)·Σ_t (log Σ_e exp z_{t,e})²
  over the router logits z: it keeps the logits small, so the float32 softmax stays accurate.

Two independent implementations of the routing:

- :func:`route_loop` — Python loops over choices and tokens: the oracle's (``moe_reference`` loops over experts).
- :func:`dispatch_tensors` — GShard's vectorised form: one-hot assignments, a cumulative sum gives each its slot,
  the dispatch mask [G, S, E, C] (0/1) and the combine weights [G, S, E, C] (gates at the kept slots). The
  expert-parallel code (``shardlab.expert.parallel``) and the GSPMD graph (``shardlab.expert.gspmd``) use it:
  ``dispatched = einsum("gsec,gsh->egch")``, ``y = einsum("gsec,egch->gsh")``.

The layer's sizes and routing rule are notebook 11's parameters (:class:`shardlab.expert.params.ExpertParams`:
hidden, ffn, experts, top_k, capacity_factor, normalize); :class:`MoE` is built from them and keeps them as ``p``.

Example::

    >>> capacity(ExpertParams(experts=4, top_k=2, capacity_factor=1.0), tokens_per_group=6)  # ceil(1.0·2·6/4)
    3
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.expert.params import ExpertParams
from shardlab.formulas import expert as fexp


def capacity(p: ExpertParams, tokens_per_group: int) -> int:
    """Slots per expert per group: ceil(capacity_factor · k · S / E) (GShard's expert capacity)."""
    return fexp.capacity(tokens_per_group, p.experts, p.top_k, p.capacity_factor)


class MoE(nn.Module):
    """The layer's parameters, stacked per expert, built from ``p`` (hidden, ffn, experts). ``forward`` is the dense
    oracle (:func:`moe_reference`)."""

    def __init__(self, p: ExpertParams, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.p = p
        h, f, e = p.hidden, p.ffn, p.experts

        def init(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=generator) / math.sqrt(fan_in))

        self.router = init(h, e, fan_in=h)  # W_r [h, E]
        self.w1 = init(e, h, f, fan_in=h)  # gate projection  [E, h, f]
        self.w3 = init(e, h, f, fan_in=h)  # up projection    [E, h, f]
        self.w2 = init(e, f, h, fan_in=f)  # down projection  [E, f, h]

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        return moe_reference(x, self, groups).out


def layer(p: ExpertParams) -> MoE:
    """The notebook's layer: weights drawn under ``p.seed`` (the same for every view)."""
    return MoE(p, torch.Generator().manual_seed(p.seed))


def inputs(p: ExpertParams, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x and target [groups · S, h] (the step's loss is ½‖y − target‖², ``models.loss``), seeded: group g is
    rows g·S … (g+1)·S (the same for every view)."""
    g = torch.Generator().manual_seed(p.seed + 1)
    x = torch.randn(groups * p.tokens, p.hidden, generator=g)
    return x, torch.randn(groups * p.tokens, p.hidden, generator=g)


def expert_ffn(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU expert: (silu(x W1) ∘ (x W3)) W2.  x [n, h], W1/W3 [h, f], W2 [f, h] -> [n, h]."""
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def router_logits(x: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    """x W_r in at least float32: [..., h] x [h, E] -> [..., E]."""
    logits = x @ router
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def router_probs(x: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    """softmax(x W_r), in at least float32 (Switch keeps the router in float32): [..., h] x [h, E] -> [..., E]."""
    return torch.softmax(router_logits(x, router), dim=-1)


def top_k_gates(probs: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(gates [..., k], experts [..., k]) — the k largest probabilities, optionally renormalised."""
    gates, experts = probs.topk(k, dim=-1)
    if normalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates, experts


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Switch's auxiliary loss α·E·Σ_i f_i·P_i for probs [..., T, E] and top-k experts [..., T, k], computed per
    routing group (the leading dims) and averaged over the groups; a scalar."""
    e = probs.shape[-1]
    counts = F.one_hot(experts, e).to(probs.dtype).sum(dim=-2)  # [..., T, E]: 1 where the token picked expert e
    f = counts.mean(dim=-2)  # [..., E] fraction of tokens routed to each expert (Σ f = k)
    big_p = probs.mean(dim=-2)  # [..., E] mean router probability
    return alpha * e * (f * big_p).sum(dim=-1).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss: the mean over tokens of (logsumexp of the token's router logits)². logits [..., E]."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


# ------------------------------------------------------------------------------------------ oracle
@dataclass
class Routing:
    """What the router decided for one group, assignment by assignment."""

    capacity: int | None  # slots per expert (None: dropless)
    kept: list[tuple[int, int, int, int]] = field(default_factory=list)  # (token, choice, expert, slot)
    dropped: list[tuple[int, int, int]] = field(default_factory=list)  # (token, choice, expert)
    loads: list[int] = field(default_factory=list)  # assignments per expert (kept or not)


def route_loop(experts: torch.Tensor, num_experts: int, capacity: int | None) -> Routing:
    """Slots in priority order (choice 0 of every token, then choice 1, ...); a full expert drops the
    assignment. ``experts`` [S, k] (the top-k expert ids of each token)."""
    s, k = experts.shape
    routing = Routing(capacity, loads=[0] * num_experts)
    for j in range(k):
        for t in range(s):
            e = int(experts[t, j])
            routing.loads[e] += 1
            if capacity is None or routing.loads[e] <= capacity:
                routing.kept.append((t, j, e, routing.loads[e] - 1))
            else:
                routing.dropped.append((t, j, e))
    return routing


@dataclass
class Reference:
    out: torch.Tensor  # [T, h]
    routings: list[Routing]  # one per group
    aux: torch.Tensor  # Switch's load-balancing loss (α = 1), per group, averaged over the groups (a scalar)
    z: torch.Tensor  # ST-MoE's router z-loss over all tokens (a scalar)


def moe_reference(x: torch.Tensor, moe: MoE, groups: int = 1, dropless: bool = False) -> Reference:
    """The dense oracle: route each of ``groups`` equal token groups with :func:`route_loop` (``dropless``: no
    capacity, every assignment kept), then loop over the experts, each applied to the tokens it kept, weighted by
    their gates. x [T, h] -> [T, h]; also the router's two losses (equal groups: their mean is the mean over all
    tokens for the z-loss)."""
    p = moe.p
    t_all = x.shape[0]
    if t_all % groups:
        raise ValueError(f"tokens={t_all} is not divisible by groups={groups}")
    outs, routings, aux, z = [], [], [], []
    for xg in x.chunk(groups, dim=0):  # [S, h]
        logits = router_logits(xg, moe.router)  # [S, E]
        probs = torch.softmax(logits, dim=-1)
        gates, experts = top_k_gates(probs, p.top_k, p.normalize)  # [S, k]
        aux.append(load_balancing_loss(probs, experts))
        z.append(router_z_loss(logits))
        routing = route_loop(experts, p.experts, None if dropless else capacity(p, xg.shape[0]))
        y = torch.zeros_like(xg)
        for e in range(p.experts):
            mine = [(t, j) for t, j, ee, _ in routing.kept if ee == e]
            if not mine:
                continue
            tok = torch.tensor([t for t, _ in mine])
            gate = gates[tok, torch.tensor([j for _, j in mine])].to(x.dtype)  # [n]
            y = y.index_add(0, tok, gate[:, None] * expert_ffn(xg[tok], moe.w1[e], moe.w3[e], moe.w2[e]))
        outs.append(y)
        routings.append(routing)
    return Reference(torch.cat(outs, dim=0), routings, torch.stack(aux).mean(), torch.stack(z).mean())


# ------------------------------------------------------------------------------------------ GShard tensors
@dataclass
class Dispatch:
    """GShard's dispatch of G groups of S tokens to E experts with C slots each."""

    mask: torch.Tensor  # [G, S, E, C] 1 where token s occupies slot c of expert e
    combine: torch.Tensor  # [G, S, E, C] its gate there (differentiable in the router)
    loads: torch.Tensor  # [G, E] assignments per expert (kept or not)
    kept: torch.Tensor  # [G, S, k] True where the assignment got a slot
    capacity: int


def slot_positions(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For experts [G, S, k]: (one-hot [G, k·S, E] in priority order, slot [G, k·S] = how many earlier
    assignments of the group chose the same expert)."""
    g, s, k = experts.shape
    order = experts.transpose(1, 2).reshape(g, k * s)  # choice-major: all first choices, then all second ...
    onehot = (order.unsqueeze(-1) == torch.arange(num_experts, device=experts.device)).to(torch.int32)
    slot = ((torch.cumsum(onehot, dim=1) - 1) * onehot).sum(dim=-1)  # [G, k·S]
    return onehot, slot


def dispatch_tensors(gates: torch.Tensor, experts: torch.Tensor, num_experts: int, capacity: int) -> Dispatch:
    """Dispatch mask and combine weights from gates / experts [G, S, k] (slots claimed in priority order)."""
    g, s, k = experts.shape
    onehot, slot = slot_positions(experts, num_experts)  # [G, kS, E], [G, kS]
    keep = slot < capacity  # [G, kS]
    at = (slot.unsqueeze(-1) == torch.arange(capacity, device=slot.device)) & keep.unsqueeze(-1)  # [G, kS, C]
    place = onehot.unsqueeze(-1).to(gates.dtype) * at.unsqueeze(2).to(gates.dtype)  # [G, kS, E, C]
    place = place.reshape(g, k, s, num_experts, capacity)
    mask = place.sum(dim=1)  # [G, S, E, C] (a token takes distinct experts: entries stay 0/1)
    combine = (place * gates.transpose(1, 2).reshape(g, k, s, 1, 1)).sum(dim=1)
    return Dispatch(mask, combine, onehot.sum(dim=1), keep.reshape(g, k, s).transpose(1, 2), capacity)
