"""Cases: one configuration a notebook shows, and what its topic alone knows about it.

Design
------
A notebook's parameter dataclass (:mod:`shardlab.core.params`) *is* its configuration, declared once. A **case**
is a small frozen dataclass that holds that object as ``p`` plus the variant it shows (forward or forward +
backward, a splitting rule, a schedule), and supplies only what its topic knows::

    formula()             the paper's algebra                              -> View("formula")
    program()             the per-rank function and its arguments          (run on `ranks` ranks by the harness)
    oracle()              the dense, unsharded result
    parity(src, got, ref) checks of a per-rank or compiled result against the oracle
    graph()               the sharded torch_xla graph (not synced), or a `profile.tpu.Step`
    read(view, module)    extra values and checks read from a compiled program (either compiler)
    devices, ops          how many devices the graph's mesh spans; which collectives to read

Two general variants: a per-rank program that runs in several independent groups of ``ranks`` ranks (the
other axis of a 2-D mesh) returns one ``(fn, args)`` per group from ``program()``; a step cut into several
graphs (FSDP's forward, then backward + update: only sharded parameters live between them) names them in
``programs`` and ``graph()`` *yields* each graph's outputs in turn — the harness executes each graph before it
asks for the next, compiles every one, and hands ``read`` / ``parity`` ``{program: ...}`` dicts.

Everything else is written once, in :mod:`shardlab.core.harness`: a topic adds its case classes in its own folder.
Cases pickle (the TPU view may build the graph in a helper process with another device count), so a case holds
plain values and its parameter object, never tensors.

A minimal case, the one a newcomer copies (a Megatron row-parallel matmul, x[m, k_model] · W[k_model, n]; the
helpers ``operands``, ``row_rank`` and ``on_mesh`` and this class are real code in ``tests/test_case_example.py``,
which executes this block from the docstring and runs it through the views)::

    @dataclass(frozen=True)
    class RowCase(Case):
        p: BlocksParams
        size_name: ClassVar[str] = "parts"
        mesh_text: ClassVar[str] = "(copies, model) = (n / parts, parts)"

        def formula(self) -> View:
            f = fblocks.row_split_all_reduce(self.p.m, self.p.n, self.p.parts, self.p.dtype)
            return traffic(View("formula"), self.phase, {"all_reduce": f["count"]},
                           {"all_reduce": f["bytes"]}, self.p.dtype)

        def program(self) -> Program:
            return row_rank, operands(self.p)  # fn(comm, x, w) on every rank

        def oracle(self) -> torch.Tensor:
            x, w = operands(self.p)
            return x @ w

        def graph(self) -> list[torch.Tensor]:
            x, w = on_mesh(self.p)
            return [x @ w]

    views = harness.views(RowCase(p))          # formula, ledger, hlo, tpu
    harness.record(rec, "blocks", *views)      # recorded, compared, a table to display
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from shardlab import runtime
from shardlab.comm.ledger import Ledger
from shardlab.core.views import View
from shardlab.profile.hlo import HloModule

if TYPE_CHECKING:
    import torch

    from shardlab.profile.tpu import Step

Checks = dict[str, tuple[bool, str]]
Program = tuple[Callable[..., Any], tuple[Any, ...]]  # (fn, args): fn(comm, *args) on every rank
Built: TypeAlias = "list[torch.Tensor] | Step"  # what a graph builds: its outputs, or outputs + donations


@dataclass(frozen=True)
class Case:
    """Base of every topic's cases. Subclasses declare ``p`` (their parameter dataclass) and variant fields."""

    # What the views are read for; subclasses override as class attributes or properties.
    ops: ClassVar[tuple[str, ...]] = ("all_reduce",)  # collectives read from the compiled programs
    size_name: ClassVar[str] = "tp"  # the parameter that sets `devices` (named in the skip message)
    mesh_text: ClassVar[str] = "(data, tensor) = (n / tp, tp)"  # how the mesh tiles n devices (skip message)
    cpu_reduce_scatter: ClassVar[bool] = False  # count XLA:CPU's all-reduce + dynamic-slice as a reduce-scatter
    programs: ClassVar[tuple[str, ...]] = ()  # a step cut into several graphs: their names, in order (see graph)

    p: Any

    # ---------------------------------------------------------------------------------------- identity
    @property
    def phase(self) -> str:
        """The prefix of every value name (``fwd`` / ``fwd_bwd`` / the rule ...)."""
        return "step"

    @property
    def dtype(self) -> str:
        return getattr(self.p, "dtype", "float32")

    @property
    def devices(self) -> int:
        """Devices the sharded graph's mesh spans on its own (the per-rank program runs on as many ranks)."""
        return int(getattr(self.p, self.size_name))

    @property
    def ranks(self) -> int:
        return self.devices

    def mesh_problem(self, num_devices: int) -> str | None:
        """Why the graph cannot be built on ``num_devices`` devices (the rule: ``devices`` must tile them)."""
        return runtime.axis_problem(self.devices, num_devices, self.size_name, self.mesh_text)

    def not_executable(self) -> str | None:
        """Why the graph cannot be executed here (placeholders: compile-only); the CPU compiler view is skipped."""
        return None

    def compile_options(self) -> dict[str, Any]:
        """Options of the XLA:TPU compile (``disable_passes``, ``donate``, ``label`` ...; see profile.tpu)."""
        return {}

    # ------------------------------------------------------------------------------ the topic's knowledge
    def formula(self) -> View:
        return View.skip("formula", f"{type(self).__name__} has no formula")

    def program(self) -> Program | list[Program] | None:
        """``(fn, args)``: ``fn(comm, *args)`` is the per-rank code the ledger runs on ``ranks`` ranks; a list of
        them: independent groups of ``ranks`` ranks each (their ledgers must be alike); None: no ledger view."""
        return None

    def oracle(self) -> Any:
        """The dense, unsharded result the per-rank and compiled results are checked against."""
        return None

    def parity(self, source: str, got: Any, ref: Any) -> Checks:
        """Checks of ``got`` — the ranks' results (``source == "ledger"``; a list per group for a grouped
        program) or the executed XLA:CPU program's outputs (``"hlo"``; ``{program: outputs}`` for a case with
        ``programs``) — against ``ref = oracle()``: ``{name: (ok, what was compared)}``."""
        return {}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        """Values or checks the ledger view adds beyond the collectives' count, bytes and elements."""
        return view

    def graph(self) -> Built | Iterator[Built]:
        """The sharded graph on the current world, NOT synced: a list of output tensors or a ``Step``. With
        ``programs``: a generator yielding each program's outputs in order (executed before the next is built)."""
        raise NotImplementedError(f"{type(self).__name__} has no XLA graph")

    def read(self, view: View, module: HloModule | dict[str, HloModule]) -> View:
        """Values and checks read from a compiled program (``view.source`` is ``hlo`` or ``tpu``); a case with
        ``programs`` gets ``{program: HloModule}``."""
        return view

    def small_trace(self) -> tuple[Case, tuple[int, ...], tuple[int, ...]] | None:
        """How this case's graph is traced on a few devices and compiled at its own size (trace small, compile big,
        :mod:`shardlab.profile.retarget`): ``(the case on the trace mesh — the same global shapes —, trace mesh,
        target mesh)``, both meshes in the graph's axis order; None (the default): the graph may depend on the
        mesh beyond its annotations, so its TPU view needs one CPU device per chip."""
        return None


def build_graph(case: Case) -> Built:
    """``case.graph()`` — the module-level builder the TPU compile pickles into a helper process."""
    return case.graph()
