"""Megatron tensor parallelism, four views of one configuration: formula, ledger, CPU compiler, TPU compiler.

Design
------
A configuration dataclass (:class:`MlpConfig`, ...) fixes sizes, dtype, phase and the seed of the weights,
so every view computes the same step from the same numbers::

    formula(cfg)    the paper's algebra                       (shardlab.formulas.tp)
    ledger(cfg)     per-rank Megatron code in a SimulatedWorld (shardlab.tp.layers / programs)
    compiler(cfg)   the dense module with mark_sharding on the CPU devices; the HLO of XLA's partitioner
    tpu(cfg)        the same graph compiled by XLA:TPU for a TPU topology (compile-only)

Each returns a :class:`shardlab.views.View` whose values are named ``<phase>.<op>.{count,bytes,elements}``
(``phase`` = ``fwd`` or ``fwd_bwd``). The compiler view runs on a mesh (data = n / tp, tensor = tp) over the
process's n devices and is skipped (with the reason) when tp does not tile them; the TPU view compiles the
same mesh for an n-chip topology, or — when the process has fewer devices than tp — a (1, tp) mesh for a
tp-chip topology in a helper process (``shardlab.profile.tpu.compile_program``). Parity with the dense
oracle is part of the ledger and compiler views (``View.checks``).

Example::

    cfg = MlpConfig(tp=4, batch=2, seq=8, hidden=64, ffn=256)
    record(rec, "mlp", formula(cfg), ledger(cfg), compiler(cfg), tpu(cfg))
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import torch

from shardlab import models, runtime
from shardlab.comm import SimulatedWorld
from shardlab.formulas import tp as ftp
from shardlab.tp import gspmd
from shardlab.tp.programs import mlp_step
from shardlab.views import View, collectives_view, ledger_view, traffic

TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "bfloat16": dict(rtol=5e-2, atol=5e-2)}


@dataclass(frozen=True)
class MlpConfig:
    """One Megatron MLP step: Z = gelu(X A) B, A column-parallel, B row-parallel over tp ranks."""

    tp: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    dtype: str = "float32"
    backward: bool = True  # forward + backward of (out * grad_out).sum(), or forward only
    sequence_parallel: bool = False  # activations outside the MLP split along the sequence (Korthikanti et al.)
    seed: int = 0

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    @classmethod
    def from_params(cls, p: Any, **overrides: Any) -> MlpConfig:
        kw = dict(tp=p.tp, batch=p.batch, seq=p.seq, hidden=p.hidden, ffn=p.ffn, dtype=p.dtype, seed=p.seed)
        return cls(**{**kw, **overrides})


def mlp_inputs(cfg: MlpConfig) -> tuple[models.MLP, torch.Tensor, torch.Tensor | None]:
    """The dense oracle and its inputs, the same for every view: (MLP, x [b, s, h], grad_out [b, s, h])."""
    g = torch.Generator().manual_seed(cfg.seed)
    dt = getattr(torch, cfg.dtype)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        dense = models.MLP(cfg.hidden, cfg.ffn).to(dt)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt)  # [b, s, h]
    grad_out = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(dt) if cfg.backward else None
    return dense, x, grad_out


def dense_step(cfg: MlpConfig) -> dict[str, torch.Tensor]:
    """The oracle: output, input gradient and weight gradients of the unsharded module on the CPU."""
    dense, x, grad_out = mlp_inputs(cfg)
    x = x.clone().requires_grad_(cfg.backward)
    out = dense(x)
    res = {"out": out.detach()}
    if grad_out is not None:
        (out * grad_out).sum().backward()
        res |= {"grad_x": x.grad, "fc1.weight": dense.fc1.weight.grad, "fc2.weight": dense.fc2.weight.grad}
    return res


def _close(a: torch.Tensor, b: torch.Tensor, dtype: str) -> bool:
    return torch.allclose(a.float(), b.float(), **TOL[dtype])


# --------------------------------------------------------------------------------------------------- views
@singledispatch
def formula(cfg: Any) -> View:
    raise TypeError(f"no formula view for {type(cfg).__name__}")


@singledispatch
def ledger(cfg: Any) -> View:
    raise TypeError(f"no ledger view for {type(cfg).__name__}")


@singledispatch
def compiler(cfg: Any) -> View:
    raise TypeError(f"no compiler view for {type(cfg).__name__}")


@singledispatch
def build_graph(cfg: Any) -> list[torch.Tensor]:
    raise TypeError(f"no XLA graph for {type(cfg).__name__}")


@formula.register
def _(cfg: MlpConfig) -> View:
    if cfg.sequence_parallel:
        f = ftp.sequence_parallel(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
        ops = ("all_gather", "reduce_scatter")
        return traffic(View("formula", detail=f), cfg.phase, {op: f[f"{op}.count"] for op in ops},
                       {op: f[f"{op}.bytes"] for op in ops}, cfg.dtype, ops)
    f = ftp.mlp_all_reduce(cfg.batch, cfg.seq, cfg.hidden, cfg.tp, cfg.dtype, backward=cfg.backward)
    return traffic(View("formula", detail=f), cfg.phase, {"all_reduce": f["count"]}, {"all_reduce": f["bytes"]},
                   cfg.dtype)


@ledger.register
def _(cfg: MlpConfig) -> View:
    dense, x, grad_out = mlp_inputs(cfg)
    sim = SimulatedWorld(cfg.tp)
    ranks = sim.run(mlp_step, dense, x, grad_out, sequence_parallel=cfg.sequence_parallel)
    if cfg.sequence_parallel:  # outputs and input gradients are sequence shards: put them back together
        ranks = [dict(r, out=torch.cat([q["out"] for q in ranks], dim=1),
                      grad_x=torch.cat([q["grad_x"] for q in ranks], dim=1) if cfg.backward else None)
                 for r in ranks]
    ops = ("all_gather", "reduce_scatter") if cfg.sequence_parallel else ("all_reduce",)
    view = ledger_view(sim.ledger, cfg.phase, ops, detail={"ledger": sim.ledger, "ranks": ranks})
    ref, c = dense_step(cfg), cfg.ffn // cfg.tp
    view.checks["parity.ledger.output"] = (all(_close(r["out"], ref["out"], cfg.dtype) for r in ranks),
                                           "every rank's output == dense output")
    if cfg.backward:
        view.checks["parity.ledger.grad_input"] = (
            all(_close(r["grad_x"], ref["grad_x"], cfg.dtype) for r in ranks), "every rank's input gradient == dense")
        view.checks["parity.ledger.grad_weights"] = (
            all(_close(r["grads"]["fc1.weight"], ref["fc1.weight"][i * c:(i + 1) * c], cfg.dtype)
                and _close(r["grads"]["fc2.weight"], ref["fc2.weight"][:, i * c:(i + 1) * c], cfg.dtype)
                for i, r in enumerate(ranks)), "rank i's A_i, B_i gradients == dense slices")
    return view


def _mesh_problem(tp: int, n: int) -> str | None:
    if tp > n:
        return f"the mesh needs tp={tp} devices; this process has num_devices={n}"
    if n % tp:
        return f"tp={tp} does not tile num_devices={n} (mesh (data, tensor) = (n / tp, tp))"
    return None


@build_graph.register
def _(cfg: MlpConfig) -> list[torch.Tensor]:
    """The GSPMD step on the current world, NOT synced: [out, (input grad, *weight grads)]."""
    dense, x, grad_out = mlp_inputs(cfg)
    dev = runtime.device()
    mlp = gspmd.shard_mlp(dense.to(dev), gspmd.tensor_mesh(cfg.tp))  # created on CPU, moved, then annotated
    return gspmd.step(mlp, x.to(dev), grad_out.to(dev) if grad_out is not None else None)


@compiler.register
def _(cfg: MlpConfig) -> View:
    from shardlab.profile import capture_hlo

    world = runtime.current()
    problem = _mesh_problem(cfg.tp, world.num_devices)
    if problem:
        return View.skip("hlo", problem)
    cap = capture_hlo(build_graph, cfg)
    view = collectives_view("hlo", cap.module, cfg.phase, ("all_reduce",), cfg.dtype, detail=cap)
    ref = dense_step(cfg)
    view.checks["parity.hlo.output"] = (_close(cap.result[0].cpu(), ref["out"], cfg.dtype), "GSPMD output == dense")
    if cfg.backward:
        view.checks["parity.hlo.grad_input"] = (_close(cap.result[1].cpu(), ref["grad_x"], cfg.dtype),
                                                "GSPMD input gradient == dense")
    view.checks["hlo.group_size"] = (all(c.group_size == cfg.tp for c in cap.module.collectives),
                                     f"every collective runs within groups of tp={cfg.tp}")
    return view


def tpu(cfg: Any, generation: str = "v5e") -> View:
    """The same graph compiled by XLA:TPU (compile-only) — see the module docstring for the topology rule."""
    from shardlab.profile import tpu as T

    world = runtime.current()
    if world.kind == "tpu":
        return View.skip("tpu", "this process runs on a TPU: the hlo column is the TPU compiler's own program")
    chips = world.num_devices if _mesh_problem(cfg.tp, world.num_devices) is None else cfg.tp
    try:
        topology = T.topology_for(chips, generation)
    except ValueError as exc:
        return View.skip("tpu", str(exc))
    comp = T.compile_program(build_graph, cfg, topology)
    if not comp.fits:
        view = View("tpu", detail=comp)
        view.notes.append(f"does not fit on {topology}: {comp.oom.message.splitlines()[0]}")
        return view
    view = collectives_view("tpu", comp.module, cfg.phase, ("all_reduce",), cfg.dtype, detail=comp)
    view.notes.append(f"XLA:TPU {topology}: {comp.num_chips} chips, compiled in {comp.compile_s:.2f} s")
    return view


# ------------------------------------------------------------------------------------------ real processes
def gloo_run(cfg: MlpConfig) -> dict[str, Any]:
    """The ledger's per-rank program in ``tp`` real processes (torch.distributed, gloo): {ledger, ranks}."""
    from shardlab.comm import DistributedWorld

    dense, x, grad_out = mlp_inputs(cfg)
    world = DistributedWorld(cfg.tp)
    ranks = world.run(mlp_step, dense, x, grad_out, sequence_parallel=cfg.sequence_parallel)
    return {"ledger": world.ledger, "ranks": ranks}


def same_results(a: list[dict[str, Any]], b: list[dict[str, Any]], cfg: MlpConfig) -> bool:
    """Outputs and input gradients equal rank by rank (up to summation order: the dtype's tolerance)."""
    return all(_close(x["out"], y["out"], cfg.dtype)
               and (x["grad_x"] is None or _close(x["grad_x"], y["grad_x"], cfg.dtype))
               for x, y in zip(a, b, strict=True))
