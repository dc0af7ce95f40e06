"""The planner's terms checked at a small size: formula, ledger, CPU compiler and TPU compiler side by side.

Design
------
Notebook 07's validation section evaluates the planner's per-chip terms for one small configuration
(:class:`CheckConfig`; fp32, so 4 bytes per element on every backend) and compares each with what runs:

    part        what runs                                            the term (formula view)
    tp_mlp      Megatron MLP over tensor = world                     shardlab.tp.case.MlpCase: notebook 02's case
    tp_layer    attention + MLP (models.TransformerBlock, GSPMD      planner.step_comm of a one-layer model:
                annotations) over tensor = world                     2 all-reduces forward, 2 backward
    dp          tokens split over data = world, weights replicated   the gradient all-reduce of Ψ = 2·h·ffn,
                                                                     parameters: ZeRO stage 0
    fsdp        weights sharded over data = world (annotations)      parameters: ZeRO stage 3
    fsdp_units  FlatUnits in a SimulatedWorld: an inner unit          formulas.fsdp.flat_step_comm per unit,
                (resharded after forward) and the root unit          memory.model_state_bytes (flat padding)
                (not resharded), Adam, one step

Each view function returns a :class:`shardlab.views.View` with values named ``fwd_bwd.<op>.{count,bytes,
elements,wire_bytes}`` (wire: the ring model of ``formulas.common.wire_bytes``) and ``param.bytes`` /
``model_state.bytes``. The CPU compiler views run on a mesh (n / world, world) over the process's n devices and
are skipped with the reason when world does not tile n; the TPU views compile the same graph for an n-chip v5e
slice, or for a world-chip slice in a helper process when n < world (``shardlab.profile.tpu.compile_program``:
the graph builders are module-level functions of the config so the helper can import them). Parity with the
dense oracle (the same module on the CPU, no XLA) is part of the compiler and ledger views' ``checks``.
The FSDP parts call the library's FlatUnit rank program (``shardlab.fsdp.train``) and GSPMD annotations directly.

Example::

    cfg = CheckConfig(world=4, tokens=16, hidden=32, ffn=64, heads=4)
    record(rec, "planner.validate.dp", dp_formula(cfg), dp_compiler(cfg), dp_tpu(cfg))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from shardlab import models, runtime
from shardlab.comm import SimulatedWorld
from shardlab.formulas import memory
from shardlab.formulas.common import wire_bytes
from shardlab.formulas.fsdp import FlatStepComm, flat_step_comm
from shardlab.fsdp.train import TrainConfig, fsdp_rank_program, reference_train
from shardlab.params import MlpParams
from shardlab.planner import CommTerm, ModelConfig, PlanConfig, step_comm
from shardlab.tp import gspmd
from shardlab.tp.case import MlpCase
from shardlab.views import HLO_OP, View, collectives_view, ledger_view, traffic

PHASE = "fwd_bwd"  # every check runs one forward + backward step
DTYPE = "float32"
E = 4  # bytes per fp32 element
TOL = dict(rtol=1e-4, atol=1e-5)  # fp32 sums in another order (partitioned vs dense)


@dataclass(frozen=True)
class CheckConfig:
    """The small configuration: T = ``tokens`` tokens (b = 1, s = T) of width ``hidden``."""

    world: int = 8  # ranks: the tensor degree of tp_mlp / tp_layer, the data degree of dp / fsdp / fsdp_units
    tokens: int = 64
    hidden: int = 128
    ffn: int = 512
    heads: int = 8  # of the transformer layer
    seed: int = 0

    @classmethod
    def from_params(cls, p: Any) -> CheckConfig:
        """From notebook 07's parameters (``shardlab.params.PlannerParams``, which validates the sizes)."""
        return cls(p.val_world, p.val_tokens, p.val_hidden, p.val_ffn, p.val_heads, p.seed)

    @property
    def psi(self) -> int:
        """Parameters of the two MLP weight matrices A [h, ffn] and B [ffn, h] of the dp / fsdp steps."""
        return 2 * self.hidden * self.ffn


def _mesh_problem(world: int, n: int) -> str | None:
    return runtime.axis_problem(world, n, "val_world", "(n / val_world, val_world)")


def _wire(view: View, ops: Iterable[str], module: Any) -> View:
    """Add ``fwd_bwd.<op>.wire_bytes`` of a compiled program (ring model per collective, its own group size)."""
    for op in ops:
        mine = [c for c in module.collectives if c.op == HLO_OP[op]]
        view.add(f"{PHASE}.{op}.wire_bytes", sum(wire_bytes(op, c.operand_bytes, c.group_size) for c in mine),
                 "bytes")
    return view


def _group_check(view: View, module: Any, world: int) -> None:
    sizes = sorted({c.group_size for c in module.collectives})
    view.checks[f"{view.source}.group_size"] = (all(s == world for s in sizes),
                                                f"collective group sizes {sizes}, val_world={world}")


def only(view: View, *ops: str) -> View:
    """Add a check that the compiled program ``view`` issues no collective other than ``ops`` (HLO spelling)."""
    if view.ran and view.detail is not None and getattr(view.detail, "module", None) is not None:
        found = sorted({c.op for c in view.detail.module.collectives})
        view.checks[f"{view.source}.only_{'_'.join(o.replace('-', '_') for o in ops)}"] = (
            set(found) <= set(ops), f"collectives in the {view.source} program: {found or 'none'}")
    return view


def _compiler(build: Callable[[CheckConfig], list[torch.Tensor]], cfg: CheckConfig) -> Any:
    """The CPU capture of ``build(cfg)``, or the reason it cannot run in this process."""
    from shardlab.profile import capture_hlo

    problem = _mesh_problem(cfg.world, runtime.current().num_devices)
    return problem if problem else capture_hlo(build, cfg)


def _tpu(build: Callable[[CheckConfig], list[torch.Tensor]], cfg: CheckConfig) -> Any:
    """The XLA:TPU compile of ``build(cfg)`` (a TpuCompile), or the reason it cannot run (a str)."""
    from shardlab.profile import tpu as T

    fits = _mesh_problem(cfg.world, runtime.current().num_devices) is None
    topology, why = T.view_topology(cfg.world, fits)
    if topology is None:
        return why
    comp = T.compile_program(build, cfg, topology)
    if not comp.fits:
        return f"does not fit on {topology}: {comp.oom.message.splitlines()[0]}"
    return comp


def _compiled_view(source: str, got: Any, ops: tuple[str, ...], cfg: CheckConfig) -> View:
    if isinstance(got, str):
        return View.skip(source, got)
    view = _wire(collectives_view(source, got.module, PHASE, ops, DTYPE, detail=got), ops, got.module)
    _group_check(view, got.module, cfg.world)
    if source == "tpu":
        view.notes.append(f"XLA:TPU {got.topology}: {got.num_chips} chips, compiled in {got.compile_s:.2f} s")
    return view


# ------------------------------------------------------------------------------------------ tensor parallel
def mlp(cfg: CheckConfig) -> MlpCase:
    """The Megatron MLP of notebook 02 at this size (its formula / ledger / compiler / tpu views apply)."""
    return MlpCase(MlpParams(tp=cfg.world, batch=1, seq=cfg.tokens, hidden=cfg.hidden, ffn=cfg.ffn, dtype=DTYPE,
                             seed=cfg.seed))


def one_layer_model(cfg: CheckConfig) -> ModelConfig:
    """A one-layer GPT-style model (GeLU MLP, multi-head attention) of the validation sizes."""
    return ModelConfig("validation", layers=1, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads,
                       kv_heads=cfg.heads, vocab=1024, gated_mlp=False)


def layer_term(cfg: CheckConfig) -> CommTerm | None:
    """The planner's per-layer tensor-axis term for one layer at tensor = world (None when world = 1)."""
    terms = step_comm(PlanConfig(one_layer_model(cfg), data=1, fsdp=1, tensor=cfg.world, global_batch=1,
                                 seq=cfg.tokens, recompute="none", act_dtype=DTYPE))
    return next((t for t in terms if t.what.startswith("layer all-reduces")), None)


def layer_formula(cfg: CheckConfig) -> View:
    t = layer_term(cfg)
    count, payload, wire = (t.count, t.count * t.payload_bytes, t.wire_bytes) if t else (0, 0, 0.0)
    view = traffic(View("formula", detail=t), PHASE, {"all_reduce": count}, {"all_reduce": payload}, DTYPE)
    view.add(f"{PHASE}.all_reduce.wire_bytes", wire, "bytes")
    return view


def _layer_inputs(cfg: CheckConfig) -> tuple[models.TransformerBlock, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        block = models.TransformerBlock(cfg.hidden, cfg.heads, cfg.ffn)
    x = torch.randn(1, cfg.tokens, cfg.hidden, generator=g)  # [b=1, s=T, h]
    return block, x, torch.randn(1, cfg.tokens, cfg.hidden, generator=g)  # grad_out [1, T, h]


def build_layer(cfg: CheckConfig) -> list[torch.Tensor]:
    """The GSPMD layer step on the current world, NOT synced: [out, input grad, *parameter grads]."""
    block, x, grad_out = _layer_inputs(cfg)
    dev = runtime.device()
    block = block.to(dev)  # created on the CPU, moved, then annotated
    mesh = gspmd.tensor_mesh(cfg.world)
    gspmd.shard_attention(block.attn, mesh)
    gspmd.shard_mlp(block.mlp, mesh)
    return gspmd.step(block, x.to(dev), grad_out.to(dev))


def layer_compiler(cfg: CheckConfig) -> View:
    got = _compiler(build_layer, cfg)
    view = only(_compiled_view("hlo", got, ("all_reduce",), cfg), "all-reduce")
    if view.ran:
        block, x, _ = _layer_inputs(cfg)
        view.checks["parity.hlo.output"] = (torch.allclose(got.result[0].cpu(), block(x).detach(), **TOL),
                                            "GSPMD layer output == dense layer output")
    return view


def layer_tpu(cfg: CheckConfig) -> View:
    return only(_compiled_view("tpu", _tpu(build_layer, cfg), ("all_reduce",), cfg), "all-reduce")


# ------------------------------------------------------------------------------------ data parallel and FSDP
def _mlp_tensors(cfg: CheckConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.tokens, cfg.hidden, generator=g)  # [T, h]
    a = torch.randn(cfg.hidden, cfg.ffn, generator=g) / cfg.hidden**0.5  # A [h, ffn]
    b = torch.randn(cfg.ffn, cfg.hidden, generator=g) / cfg.ffn**0.5  # B [ffn, h]
    return x, a, b


def _mlp_grads(cfg: CheckConfig, weight_spec: tuple[str | None, str | None]) -> list[torch.Tensor]:
    """Weight gradients of sum(gelu(x A) B) with x split over `data` and the weights annotated ``weight_spec``."""
    import torch_xla.distributed.spmd as xs

    n = runtime.current().num_devices
    mesh = runtime.mesh((n // cfg.world, cfg.world), ("replica", "data"))
    dev = runtime.device()
    x, a, b = (t.to(dev) for t in _mlp_tensors(cfg))
    xs.mark_sharding(x, mesh, ("data", None))  # x[T_data, h]: T / world tokens per device
    for w in (a, b):
        xs.mark_sharding(w, mesh, weight_spec)
        w.requires_grad_(True)
    y = F.gelu(x @ a) @ b  # [T/world, h] @ [h, ffn] @ [ffn, h] -> [T/world, h] per device
    return list(torch.autograd.grad(y.sum(), (a, b)))  # partial sums over each device's tokens


def build_dp(cfg: CheckConfig) -> list[torch.Tensor]:
    """Data parallel: replicated weights, so each weight gradient is all-reduced over `data`."""
    return _mlp_grads(cfg, (None, None))


def build_fsdp(cfg: CheckConfig) -> list[torch.Tensor]:
    """ZeRO-3 by annotation: both weights sharded by rows over `data`; the partitioner picks the collectives."""
    return _mlp_grads(cfg, ("data", None))


def _dense_grads(cfg: CheckConfig) -> list[torch.Tensor]:
    x, a, b = _mlp_tensors(cfg)
    a.requires_grad_(True)
    b.requires_grad_(True)
    return list(torch.autograd.grad((F.gelu(x @ a) @ b).sum(), (a, b)))


def _input_bytes(cfg: CheckConfig) -> int:
    return cfg.tokens // cfg.world * cfg.hidden * E  # x[T_data, h] per device


def dp_formula(cfg: CheckConfig) -> View:
    """Each weight gradient all-reduced once (2 collectives; the planner buckets them into one term of the same
    bytes): payload = the ZeRO stage-0 gradient term Ψ·4; parameters per device = x's shard + Ψ·4."""
    st = memory.model_state_bytes(cfg.psi, fsdp=1, stage=0, param_bytes=E, grad_bytes=E)
    count = 2 if cfg.world > 1 else 0
    view = traffic(View("formula", detail=st), PHASE, {"all_reduce": count},
                   {"all_reduce": int(st.grads) if count else 0}, DTYPE)
    view.add(f"{PHASE}.all_reduce.wire_bytes", wire_bytes("all_reduce", st.grads, cfg.world) if count else 0.0,
             "bytes")
    view.add("param.bytes", _input_bytes(cfg) + int(st.params), "bytes")
    return view


def _grad_parity(view: View, got: Any, cfg: CheckConfig, what: str) -> None:
    """Check the captured step's gradients (``got.result``) against the unsharded computation's."""
    view.checks["parity.hlo.grads"] = (all(torch.allclose(g.cpu(), r, **TOL)
                                           for g, r in zip(got.result, _dense_grads(cfg), strict=True)), what)


def dp_compiler(cfg: CheckConfig) -> View:
    got = _compiler(build_dp, cfg)
    view = only(_compiled_view("hlo", got, ("all_reduce",), cfg), "all-reduce")
    if view.ran:
        view.add("param.bytes", got.module.buffers.parameter, "bytes")
        _grad_parity(view, got, cfg, "all-reduced weight gradients == dense gradients")
    return view


def dp_tpu(cfg: CheckConfig) -> View:
    return only(_compiled_view("tpu", _tpu(build_dp, cfg), ("all_reduce",), cfg), "all-reduce")


def fsdp_formula(cfg: CheckConfig) -> View:
    """Parameters per device under ZeRO-3 over world ranks: x's shard + Ψ·4 / world."""
    st = memory.model_state_bytes(cfg.psi, fsdp=cfg.world, stage=3, param_bytes=E, grad_bytes=E)
    view = View("formula", detail=st)
    view.add("param.bytes", _input_bytes(cfg) + int(st.params), "bytes")
    return view


def fsdp_compiler(cfg: CheckConfig) -> View:
    got = _compiler(build_fsdp, cfg)
    if isinstance(got, str):
        return View.skip("hlo", got)
    view = View("hlo", detail=got)
    view.add("param.bytes", got.module.buffers.parameter, "bytes")
    _grad_parity(view, got, cfg, "weight gradients == dense gradients")
    return view


def fsdp_tpu(cfg: CheckConfig) -> View:
    """The TPU program of the annotated step: its collectives and memory (``detail``); no values to compare."""
    got = _tpu(build_fsdp, cfg)
    if isinstance(got, str):
        return View.skip("tpu", got)
    view = View("tpu", detail=got)
    view.notes.append(f"XLA:TPU {got.topology}: {got.num_chips} chips, compiled in {got.compile_s:.2f} s")
    return view


def collectives_frame(views: Mapping[str, View]) -> Any:
    """The collectives each compiled program chose, side by side: ``{label: hlo or tpu view}`` -> DataFrame."""
    import pandas as pd

    rows = []
    for label, v in views.items():
        if not v.ran or getattr(v.detail, "module", None) is None:
            continue
        for c in v.detail.module.collectives:
            rows.append({"program": label, "op": c.op, "dtype": c.dtype, "operands": c.operands,
                         "per-device operand shapes": " ".join(str(list(s)) for s in c.operand_shapes),
                         "operand bytes": c.operand_bytes, "group": c.group_size})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ FSDP units
def units_config(cfg: CheckConfig) -> TrainConfig:
    """Linear(h, ffn) -> tanh -> Linear(ffn, h + 1) (an uneven numel, so the flat units pad), trained one step
    with Adam; the first Linear is an inner FSDP unit, the root unit holds the second."""
    return TrainConfig(layer_sizes=(cfg.hidden, cfg.ffn, cfg.hidden + 1), batch=cfg.tokens, steps=1,
                       optimizer="adam", nested=True, seed=cfg.seed)


def unit_numels(cfg: CheckConfig) -> tuple[int, int]:
    """(inner, root) parameter counts: weights + biases of Linear(h, ffn) and Linear(ffn, h + 1)."""
    h, f = cfg.hidden, cfg.ffn
    return h * f + f, f * (h + 1) + h + 1


def units_formula(cfg: CheckConfig) -> View:
    """flat_step_comm per unit (the inner unit is resharded after forward: all-gathered in forward and again in
    backward; the root unit once) and the padded ZeRO-3 model state, fp32 Adam (4 + 4 + 8 bytes per element)."""
    inner, root = unit_numels(cfg)
    w = cfg.world
    units: list[FlatStepComm] = [flat_step_comm(inner, w, E), flat_step_comm(root, w, E, root=True)]
    state = memory.model_state_bytes(inner + root, fsdp=w, stage=3, param_bytes=E, grad_bytes=E, k=8,
                                     flat_units=[inner, root])
    counts = {"all_gather": sum(u.all_gather_count for u in units),
              "reduce_scatter": sum(u.reduce_scatter_count for u in units)}
    payload = {"all_gather": sum(u.all_gather_bytes for u in units),
               "reduce_scatter": sum(u.reduce_scatter_bytes for u in units)}
    view = traffic(View("formula", detail={"units": units, "state": state}), PHASE, counts, payload, DTYPE,
                   ("all_gather", "reduce_scatter"))
    view.add(f"{PHASE}.wire_bytes", sum(u.wire_bytes(w) for u in units), "bytes")
    view.add("model_state.bytes", state.total, "bytes")
    return view


def units_ledger(cfg: CheckConfig) -> View:
    """The FlatUnit rank program (shardlab.fsdp.train) on world simulated ranks: its ledger and held bytes."""
    tc = units_config(cfg)
    sim = SimulatedWorld(cfg.world)
    ranks = sim.run(fsdp_rank_program, tc)
    view = ledger_view(sim.ledger, PHASE, ("all_gather", "reduce_scatter"), detail={"ledger": sim.ledger,
                                                                                    "ranks": ranks})
    view.add(f"{PHASE}.wire_bytes", sim.ledger.wire_bytes(), "bytes")
    view.add("model_state.bytes", sum(ranks[0].persistent_bytes.values()), "bytes")
    # Training parity of this rank program with unsharded torch.optim is notebook 05's subject (and its tests'):
    # here one Adam step, lr·g/(|g| + eps), would turn summation-order noise in near-zero gradients into
    # differences of up to lr, so only the loss before any update is compared.
    ref_loss = reference_train(dataclasses.replace(tc, steps=1))[1][0]
    mean = sum(r.losses[0] for r in ranks) / cfg.world  # mean of per-rank means over T / world rows each
    view.checks["parity.ledger.loss"] = (abs(mean - ref_loss) <= 1e-5 * abs(ref_loss),
                                         f"mean of the ranks' losses {mean:.6f} == full-batch loss {ref_loss:.6f}")
    return view
