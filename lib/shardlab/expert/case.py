"""Expert parallelism as a case: one MoE layer's step through the four views (notebook 11).

Design
------
:class:`MoECase` holds the notebook's :class:`~shardlab.expert.params.ExpertParams` ``p`` (which is the layer's
configuration) and its variant: ``backward`` (forward + backward of ½‖y − target‖², ``models.loss``: the
output gradient depends on y, as in training; or forward alone) and ``dropless`` (no capacity: the per-rank code
pads every buffer to the largest load; ledger and formula only — a static XLA program cannot have a
data-dependent buffer size). Every device and every rank routes its own group of
S = ``p.tokens`` tokens; the compared configuration has ``data · ep`` groups, ``data`` = n / ep on this process's
n devices when ep tiles them (the compiled mesh (data, expert)), else 1 (the TPU view then compiles an ep-chip
slice in a helper process). Values, named ``<phase>.<...>`` (``value_name`` drops the phase of the step, so the
record prefix ``ep`` gives names such as ``ep.all_to_all.bytes``)::

    formula   <phase>.all_to_all.{count,bytes,elements}  2 forward + 2 backward, E·C·h·e each (formulas.expert)
              fwd.all_to_all.*                           the forward's two (with backward)
              expert_params.per_chip.bytes               (E / ep) · 3·h·f·e
              dropped.fraction                           Σ max(0, L − C) / (G·S·k) for this routing's loads L
              grad_sync.all_reduce.*                     the replicated router's gradient over all devices, and
                                                         with a data axis the three expert gradients over it
    ledger    moe_step on ep ranks, one SimulatedWorld per data group; parity with the dense oracle (outputs,
              input, router and expert gradients); the same values except grad_sync (the per-rank code leaves
              the data-parallel gradient sum out)
    hlo, tpu  gspmd.step (GShard's einsums, experts on the `expert` axis): the all-to-alls, the expert weights
              among the program's parameters, grad_sync; the XLA:CPU outputs against the oracle; XLA:TPU's
              all-to-alls' form (synchronous or start / done), operands (combined?) and element type

Example::

    case = MoECase(ExpertParams(ep=4))
    harness.record(rec, "ep", *harness.views(case))      # ep.all_to_all.count, ep.all_to_all.bytes, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import torch

from shardlab import runtime
from shardlab.comm import Ledger
from shardlab.core import harness
from shardlab.core.case import Case, Checks, Program, Step
from shardlab.core.views import View, collectives_view, traffic
from shardlab.expert import gspmd  # imports torch_xla: expert.case is imported after runtime.setup()
from shardlab.expert.drops import drop_table, route_groups
from shardlab.expert.moe import MoE, capacity, inputs, layer, moe_reference
from shardlab.expert.parallel import moe_step
from shardlab.expert.params import ExpertParams
from shardlab.formulas import expert as fexp
from shardlab.models import loss
from shardlab.profile.hlo import HloModule

DTYPE = "float32"  # the layer's element type in every view (the router runs in float32 anyway)
TOL = dict(rtol=1e-4, atol=1e-4)  # float32, the same sums in another order (measured <= 4e-5)
WEIGHTS = ("w1", "w3", "w2")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), **TOL)


@dataclass(frozen=True)
class MoECase(Case):
    """One MoE layer over ep ranks / an (data, expert) mesh, through the four views (see the module note)."""

    p: ExpertParams
    backward: bool = True
    dropless: bool = False

    size_name: ClassVar[str] = "ep"
    mesh_text: ClassVar[str] = "(data, expert) = (n / ep, ep)"

    @property
    def grouped(self) -> bool:
        return True  # one group of ep ranks per data index (program); parity sees a list per group

    @property
    def phase(self) -> str:
        return "fwd_bwd" if self.backward else "fwd"

    def value_name(self, name: str) -> str:
        """Values are named without the step's phase (``all_to_all.count``, ...): the notebook records each step
        under its own prefix."""
        return name.removeprefix(f"{self.phase}.")

    @property
    def ops(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("all_to_all", "all_reduce") if self.dropless else ("all_to_all",)  # dropless: agree on C first

    @property
    def data(self) -> int:
        """Data-parallel groups of ep ranks the views compare (see the module note)."""
        n = runtime.current().num_devices
        return 1 if self.dropless or self.mesh_problem(n) else n // self.p.ep

    @property
    def groups(self) -> int:
        return self.data * self.p.ep

    def tensors(self) -> tuple[MoE, torch.Tensor, torch.Tensor | None]:
        """The seeded layer, x and target [groups · S, h] (target None without backward)."""
        x, target = inputs(self.p, self.groups)
        return layer(self.p), x, target if self.backward else None

    def loads(self) -> list[list[int]]:
        """loads[g][e]: assignments of group g to expert e chosen by the router (kept or not)."""
        moe, x, _ = self.tensors()
        return route_groups(x, moe, self.groups)[2]

    def slots(self) -> int:
        """C: the capacity, or for the dropless layer the largest load of any expert in any group."""
        return max(max(row) for row in self.loads()) if self.dropless else capacity(self.p, self.p.tokens)

    # ---------------------------------------------------------------------------------------------- formula
    def formula(self) -> View:
        p, c = self.p, self.slots()
        a2a = {bw: fexp.all_to_all(p.tokens, p.hidden, p.experts, p.top_k, p.capacity_factor, p.ep, DTYPE,
                                   backward=bw, slots=c) for bw in (False, self.backward)}
        counts, sizes = {"all_to_all": a2a[self.backward]["count"]}, {"all_to_all": a2a[self.backward]["bytes"]}
        if self.dropless and p.ep > 1:  # one all-reduce (max) of a float32 scalar agrees on C
            counts["all_reduce"], sizes["all_reduce"] = 1, 4
        view = traffic(View("formula", detail=a2a), self.phase, counts, sizes, DTYPE, self.ops)
        if self.backward:
            traffic(view, "fwd", {"all_to_all": a2a[False]["count"]}, {"all_to_all": a2a[False]["bytes"]}, DTYPE,
                    ("all_to_all",))
            if not self.dropless:
                weights = fexp.expert_params_per_chip(p.experts, p.ep, p.hidden, p.ffn, DTYPE) // 3
                router = (self.groups > 1, p.hidden * p.experts * 4)  # over all devices
                experts = [(self.data > 1, weights)] * 3  # W1, W3, W2 over the data axis
                sync = [b for on, b in (router, *experts) if on]
                traffic(view, "grad_sync", {"all_reduce": len(sync)}, {"all_reduce": sum(sync)}, DTYPE)
        view.add("expert_params.per_chip.bytes", fexp.expert_params_per_chip(p.experts, p.ep, p.hidden, p.ffn, DTYPE),
                 "bytes")
        view.add("dropped.fraction", fexp.dropped_from_loads(self.loads(), c) / (self.groups * p.tokens * p.top_k),
                 "fraction")
        return view

    # ----------------------------------------------------------------------------------------------- ledger
    def program(self) -> list[Program]:
        """moe_step on ep ranks for each data group (its ep · S tokens)."""
        moe, x, target = self.tensors()
        rows = self.p.ep * self.p.tokens
        return [(moe_step, (moe, x[d * rows:(d + 1) * rows], None if target is None else
                            target[d * rows:(d + 1) * rows], self.dropless)) for d in range(self.data)]

    def oracle(self) -> dict[str, Any]:
        """The dense layer (loops over experts), one routing group per device / rank: output, gradients of the
        input, the router and the stacked experts, and the assignments dropped."""
        moe, x, target = self.tensors()
        x = x.clone().requires_grad_(self.backward)
        ref = moe_reference(x, moe, self.groups, self.dropless)
        out = {"out": ref.out.detach(), "dropped": sum(len(r.dropped) for r in ref.routings)}
        if self.backward:
            loss(ref.out, target).backward()
            out |= {"grad_x": x.grad, "router": moe.router.grad, **{w: getattr(moe, w).grad for w in WEIGHTS}}
        return out

    def parity(self, source: str, got: Any, ref: dict[str, Any]) -> Checks:
        if source == "hlo":  # [y, dx, dW_r, dW1, dW3, dW2] or [y]
            checks = {"parity.hlo.output": (close(got[0], ref["out"]), "GSPMD output == dense layer (the same "
                                            "assignments kept: a dropped one would remove a whole gate · expert term)")}
            if self.backward:
                names = ("grad_x", "router", *WEIGHTS)
                checks["parity.hlo.grads"] = (all(close(g, ref[n]) for g, n in zip(got[1:6], names, strict=True)),
                                              "GSPMD gradients of x, W_r, W1, W3, W2 == dense")
            return checks
        ranks = [r for group in got for r in group]  # group-major, rank order: the tokens' order
        dropped = sum(r["dropped"] for r in ranks)
        checks = {"parity.ledger.output": (close(torch.cat([r["out"] for r in ranks]), ref["out"]),
                                           "the ranks' outputs, concatenated == dense layer"),
                  "parity.ledger.dropped": (dropped == ref["dropped"], f"the ranks dropped {dropped} assignments, "
                                            f"the dense layer's loops {ref['dropped']}")}
        if self.backward:
            experts = {w: sum(torch.cat([r["grads"][w] for r in group]) for group in got) for w in WEIGHTS}
            checks["parity.ledger.grad_input"] = (close(torch.cat([r["grad_x"] for r in ranks]), ref["grad_x"]),
                                                  "the ranks' input gradients == dense")
            checks["parity.ledger.grad_router"] = (close(sum(r["grad_router"] for r in ranks), ref["router"]),
                                                   "router gradient summed over every rank == dense")
            checks["parity.ledger.grad_experts"] = (
                all(close(experts[w], ref[w]) for w in WEIGHTS),
                f"expert e's gradients on rank e // (E/ep), summed over the {self.data} data group(s) == dense")
        return checks

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        p = self.p
        ranks = [r for group in results for r in group]
        if self.backward:
            rows = ledger.select("all_to_all", "forward")
            view.add("fwd.all_to_all.count", len(rows), "count")
            view.add("fwd.all_to_all.bytes", rows.payload_bytes(), "bytes")
            view.add("fwd.all_to_all.elements", rows.payload_bytes() // 4, "elements")
        per_rank = {r["expert_bytes"] for r in ranks}
        view.checks["ledger.expert_bytes_alike"] = (len(per_rank) == 1, f"every rank holds {sorted(per_rank)} bytes")
        view.add("expert_params.per_chip.bytes", max(per_rank), "bytes")
        view.add("dropped.fraction", sum(r["dropped"] for r in ranks) / (self.groups * p.tokens * p.top_k), "fraction")
        return view

    # ------------------------------------------------------------------------------------------- compilers
    def unavailable(self, source: str) -> str | None:
        if self.dropless and source in ("hlo", "tpu"):
            return "the dropless layer sizes its buffers by the largest load: no static XLA program"
        return None

    def graph(self) -> Step:
        if self.dropless:
            raise ValueError(self.unavailable("hlo"))
        return Step(gspmd.step(self.p, self.backward))

    def read(self, view: View, module: HloModule) -> View:
        p, src, a2a = self.p, view.source, gspmd.all_to_all_traffic(module)
        view.checks[f"{src}.all_to_all_groups"] = (a2a["group_sizes"] in ([p.ep], []),
                                                    f"every all-to-all runs within the ep={p.ep} devices of an "
                                                    f"expert group: {a2a['group_sizes']}")
        view.checks[f"{src}.no_all_gather"] = (not any(c.op == "all-gather" for c in module.collectives),
                                               "nothing is gathered: tokens travel only by all-to-all")
        view.add("expert_params.per_chip.bytes", gspmd.expert_weight_bytes(module, p), "bytes")
        if self.backward:
            sync = collectives_view(src, module, "grad_sync", ("all_reduce",), DTYPE)
            view.values |= sync.values
            view.units |= sync.units
            view.differs |= sync.differs
        bytes_name = f"{self.phase}.all_to_all.bytes"
        view.notes.append(f"{'XLA:TPU' if src == 'tpu' else 'XLA:CPU'}: {compiler_story(module)}")
        if src == "tpu":
            view.add(f"{self.phase}.all_to_all.async", a2a["async"], "count")
            if bytes_name in view.differs:
                view.differs[bytes_name] = (f"XLA:TPU moves the tokens in {'/'.join(a2a['dtypes'])}: each "
                                            "all-to-all's result feeds matmuls, which it runs on bf16 inputs at the "
                                            "default precision, so it converts before the transfer; elements agree")
        return view


# ------------------------------------------------------------------------------------------------- reading
def collective_frame(module: HloModule) -> pd.DataFrame:
    """Every collective of a compiled program: op, element type, form (sync, start / done ...), the logical
    collectives it carries (> 1: combined; XLA:CPU's tuple all-to-all, one chunk per destination, is one), group
    size, the bytes one device hands over and the operand shapes."""
    return pd.DataFrame([{"op": c.op, "dtype": c.dtype, "form": c.form, "async": c.async_,
                          "collectives": c.operands, "group": c.group_size,
                          "operand_bytes": c.operand_bytes, "shapes": c.operand_shapes}
                         for c in module.collectives])


def compiler_story(module: HloModule) -> str:
    """One line: what the compiler did with the all-to-alls and the gradient all-reduces (read from the program)."""
    a2a = gspmd.all_to_all_traffic(module)
    ars = [c for c in module.collectives if c.op == "all-reduce"]
    combined = "none combined" if a2a["operands"] == a2a["count"] else f"{a2a['operands']} in {a2a['count']}"
    sync = "all synchronous" if a2a["async"] == 0 else f"{a2a['async']} asynchronous (start / done)"
    text = (f"all-to-alls: {a2a['count']} ({'/'.join(a2a['dtypes']) or '-'}, groups of "
            f"{'/'.join(map(str, a2a['group_sizes'])) or '-'}), {sync}, {combined}")
    if ars:
        text += (f"; all-reduces: {len(ars)} instruction(s) carrying {sum(c.operands for c in ars)} gradient(s) "
                 f"({sum(c.async_ for c in ars)} asynchronous)")
    return text


def async_windows(module: HloModule) -> list[int]:
    """For every asynchronous all-to-all: how many instructions the scheduler placed between its start and its
    done (work that may overlap the transfer)."""
    out = []
    for c in module.collectives:
        if c.op == "all-to-all" and c.async_:
            order = module.computations[c.computation]
            out.append(order.index(c.done) - order.index(c.start) - 1)
    return out


# ------------------------------------------------------------------------------------- gloo and drop table
def identical(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Outputs and gradients equal bit for bit rank by rank (an all-to-all moves values, it never adds them)."""
    def same(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return all(same(x[n], y[n]) for x, y in zip(a, b, strict=True) for n in ("out", "grad_x", "grad_router"))


def drops(case: MoECase) -> list[dict[str, Any]]:
    """The drop table for the case's routing (its groups of S tokens) at every ``p.drop_factors`` capacity factor."""
    moe, x, _ = case.tensors()
    return drop_table(x, moe, case.groups, case.p.drop_factors)


def explore(q: ExpertParams) -> dict[str, Any]:
    """What the explorer shows for parameters ``q`` (validated here): one forward through formula and ledger —
    capacity, the dispatch all-to-all's payload and wire bytes per device, dropped fractions (formula, measured,
    uniform routing), expert weights per chip, and the first group's dispatch loads."""
    case = MoECase(q.validate(), backward=False)
    f, led = harness.formula(case), harness.ledger(case)
    first = led.detail["ranks"][0]
    c = first[0]["capacity"]
    return {"capacity": c, "formula": f["all_to_all.bytes"], "ledger": led["all_to_all.bytes"],
            "wire": led.detail["ledger"].wire_bytes("all_to_all"),
            "dropped": f["dropped.fraction"], "measured": led["dropped.fraction"],
            "uniform": fexp.expected_dropped_fraction(q.tokens, q.experts, q.top_k, c),
            "expert_bytes": f["expert_params.per_chip.bytes"], "loads": [r["loads"] for r in first],
            "parity": all(ok for ok, _ in led.checks.values())}
