"""Training programs for the FSDP unit: a per-rank FSDP run and its unsharded full-batch oracle.

Design note
-----------
``fsdp_rank_program(comm, cfg)`` is a module-level function so it pickles for ``DistributedWorld`` (gloo) as
well as running in ``SimulatedWorld``. Every rank builds the same model from ``cfg.seed``, wraps it in one
``FlatUnit`` (the root unit; with ``cfg.nested`` the first Linear is wrapped first as an inner unit, as
PyTorch's auto-wrap would), takes its rows of the global batch (``batch / W`` each) and trains ``cfg.steps``
steps with a mean-squared-error loss. ``reference_train(cfg)`` trains the same model unsharded on the full batch with
``torch.optim``. Why they agree: the mean loss over the global batch B is the average of the W per-rank
means over B/W rows, so the reduce-scattered gradient divided by W equals the full-batch gradient
(exactly up to float summation order), and SGD/Adam are elementwise, so updating shards = updating the whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from shardlab.comm import Comm
from shardlab.fsdp.flat_param import FlatShardPlan, module_params, plan_flat_shards_for
from shardlab.fsdp.unit import FlatUnit, ShardAdam, ShardSGD, unflatten

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class TrainConfig:
    layer_sizes: tuple[int, ...] = (16, 32, 8)  # widths: Linear(16, 32) -> tanh -> Linear(32, 8)
    batch: int = 8  # global batch, split evenly over ranks
    steps: int = 3
    lr: float = 0.05
    optimizer: str = "adam"  # "sgd" | "adam"
    use_orig_params: bool = False  # alignment padding like PyTorch's use_orig_params=True
    seed: int = 0
    tied: bool = False  # append a Linear tied to the first one's weight (a shared parameter)
    nested: bool = False  # wrap the first Linear as an inner (non-root) unit; the root unit keeps the rest

    def validate(self, world_size: int) -> None:
        if len(self.layer_sizes) < 2 or any(int(d) < 1 for d in self.layer_sizes):
            raise ValueError(f"layer_sizes={list(self.layer_sizes)} needs >= 2 widths, each >= 1")
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        if self.batch < 1 or self.batch % world_size:
            raise ValueError(f"batch={self.batch} is not divisible by world_size={world_size}")
        if self.steps < 1:
            raise ValueError(f"steps={self.steps} must be >= 1")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        if self.tied and self.layer_sizes[0] != self.layer_sizes[-1]:
            raise ValueError(f"tied=True needs layer_sizes[0] == layer_sizes[-1], got {list(self.layer_sizes)}")
        if self.nested and (self.tied or len(self.layer_sizes) < 3):
            raise ValueError(f"nested=True needs tied=False and >= 2 Linear layers (the root unit must own one), got "
                             f"layer_sizes={list(self.layer_sizes)}, tied={self.tied}")


class _Tied(nn.Module):
    """MLP followed by a head reusing the first layer's weight transposed (a shared parameter)."""

    def __init__(self, body: nn.Sequential) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(body[0].in_features, body[0].out_features, bias=False)
        self.head.weight = body[0].weight  # shared: flattened once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)  # (B, d_out) with d_out == d_in
        return torch.tanh(self.head(y))  # (B, d_in) @ (d_in, d_1) -> (B, d_1)


def make_model(cfg: TrainConfig) -> nn.Module:
    """Deterministic from cfg.seed with a LOCAL generator: SimulatedWorld ranks are threads, and a global
    ``torch.manual_seed`` per thread would interleave draws and give every rank a different model."""
    layers: list[nn.Module] = []
    sizes = [int(d) for d in cfg.layer_sizes]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))  # (B, a) @ (a, b) -> (B, b)
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    body = nn.Sequential(*layers)
    model = _Tied(body) if cfg.tied else body
    g = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for p in dict.fromkeys(model.parameters()):  # nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) init
            fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / fan_in**0.5)
    return model


def make_batch(cfg: TrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg.seed * 1000 + step + 1)
    x = torch.randn(cfg.batch, cfg.layer_sizes[0], generator=g)  # (B, d_in)
    model_out = cfg.layer_sizes[1] if cfg.tied else cfg.layer_sizes[-1]
    y = torch.randn(cfg.batch, model_out, generator=g)  # (B, d_out)
    return x, y


INNER = "0"  # with nested=True: the inner unit wraps submodule "0", the first Linear


class RankResult(NamedTuple):
    shard: torch.Tensor  # (c,) of the root unit after the last step
    losses: list[float]  # this rank's local loss per step
    persistent_bytes: dict[str, int]  # summed over this rank's units
    peak_unsharded_bytes: int  # of the root unit
    shapes: list[tuple[int, ...]]  # the root unit's parameters
    names: list[str]
    inner_shard: torch.Tensor | None = None  # (c_inner,) of the inner unit (nested=True)


def unit_plans(cfg: TrainConfig, world_size: int) -> dict[str, FlatShardPlan]:
    """The flat plan of each unit the rank program builds: {"": root} (+ {INNER: inner} with nested)."""
    model = make_model(cfg)
    inner = (model[int(INNER)],) if cfg.nested else ()
    plans = {"": plan_flat_shards_for(model, world_size, cfg.use_orig_params, ignored=inner)}
    if cfg.nested:
        plans[INNER] = plan_flat_shards_for(inner[0], world_size, cfg.use_orig_params)
    return plans


def fsdp_rank_program(comm: Comm, cfg: TrainConfig) -> RankResult:
    """One rank of FSDP training (runs under SimulatedWorld or DistributedWorld)."""
    cfg.validate(comm.world_size)
    model = make_model(cfg)
    units = []
    if cfg.nested:  # the inner unit first, then the root around everything (PyTorch's auto-wrap order)
        model[int(INNER)] = FlatUnit(model[int(INNER)], comm, use_orig_params=cfg.use_orig_params)
        units.append(model[int(INNER)])
    unit = FlatUnit(model, comm, use_orig_params=cfg.use_orig_params)
    units.insert(0, unit)
    opt_cls = ShardAdam if cfg.optimizer == "adam" else ShardSGD
    opts: list[ShardSGD | ShardAdam] = [opt_cls(u.shard, cfg.lr) for u in units]
    rows = cfg.batch // comm.world_size
    losses = []
    for step in range(cfg.steps):
        x, y = make_batch(cfg, step)
        xs, ys = x[comm.rank * rows : (comm.rank + 1) * rows], y[comm.rank * rows : (comm.rank + 1) * rows]
        for o in opts:
            o.zero_grad()
        loss = nn.functional.mse_loss(unit(xs), ys)  # mean over this rank's B/W rows
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    held: dict[str, int] = {}
    for u, o in zip(units, opts, strict=True):
        for k, v in u.persistent_bytes(o).items():
            held[k] = held.get(k, 0) + v
    inner_shard = units[1].shard.detach().clone() if cfg.nested else None
    return RankResult(unit.shard.detach().clone(), losses, held, unit.peak_unsharded_bytes, unit.shapes, unit.names,
                      inner_shard)


def gather_params(cfg: TrainConfig, results: list[RankResult]) -> list[torch.Tensor]:
    """Every parameter reassembled from all ranks' shards, in ``module_params(make_model(cfg))`` order."""
    plans = unit_plans(cfg, len(results))
    model = make_model(cfg)
    inner = (model[int(INNER)],) if cfg.nested else ()
    by_name = dict(zip([n for n, _ in module_params(model, inner)],
                       unflatten(plans[""], [r.shard for r in results], results[0].shapes), strict=True))
    if cfg.nested:
        inner_params = module_params(inner[0])
        shards = [r.inner_shard for r in results]
        assert all(s is not None for s in shards)
        parts = unflatten(plans[INNER], shards, [tuple(p.shape) for _, p in inner_params])  # type: ignore[arg-type]
        by_name.update({f"{INNER}.{n}": t for (n, _), t in zip(inner_params, parts, strict=True)})
    return [by_name[n] for n, _ in module_params(model)]


def reference_train(cfg: TrainConfig) -> tuple[list[torch.Tensor], list[float]]:
    """The oracle: the same model trained unsharded on the full batch with torch.optim."""
    model = make_model(cfg)
    params = list(dict.fromkeys(model.parameters()))  # registration order, shared once
    opt = (torch.optim.Adam(params, lr=cfg.lr) if cfg.optimizer == "adam" else torch.optim.SGD(params, lr=cfg.lr))
    losses = []
    for step in range(cfg.steps):
        x, y = make_batch(cfg, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for _, p in module_params(model)], losses
