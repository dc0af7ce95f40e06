"""Cases: one configuration a notebook shows, and what its topic alone knows about it.

Design
------
A notebook's parameter dataclass (:mod:`shardlab.core.params`) *is* its configuration, declared once. A **case**
is a small frozen dataclass that holds that object as ``p`` plus the variant it shows (forward or forward +
backward, a splitting rule, a schedule), and supplies only what its topic knows::

    formula()             the paper's algebra                              -> View("formula")
    program()             the per-rank function and its arguments          -> [(fn, args)], one per group
                          (the harness runs each on `ranks` simulated ranks, or gloo processes; [] = no ledger)
    reference_program()   the same step through the framework's own API    -> (fn, args) or None; gloo runs only
    oracle()              the dense, unsharded result
    parity(src, got, ref) checks of a per-rank or compiled result against the oracle
    graph()               the sharded torch_xla graph, not synced          -> Step(outputs[, donations])
    read(view, module)    extra values and checks read from a compiled program (either compiler)
    devices, ops          how many devices the graph's mesh spans; which collectives to read
    unavailable(source)   why this variant has no view from ``source``     -> a reason (the view is skipped) or None
    value_name(name)      how a value is named in every view (default: as built, ``<phase>.<op>.count``)

Each hook returns one declared type: the harness never asks what it got. Two general variants: a per-rank program
that runs in several independent groups of ``ranks`` ranks (the other axis of a 2-D mesh) returns one
``(fn, args)`` per group and declares ``grouped`` (``parity`` / ``ledger_extra`` then get one list of rank results
per group); a step cut into several graphs (FSDP's forward, then backward + update: only sharded parameters live
between them) names them in ``programs`` and overrides ``graphs()``, a generator yielding each graph's ``Step`` in
turn — the harness executes each graph before it asks for the next, compiles every one, and hands ``read`` /
``parity`` ``{program: ...}`` dicts.

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

        def program(self) -> list[Program]:
            return [(row_rank, operands(self.p))]  # fn(comm, x, w) on every rank of one group

        def oracle(self) -> torch.Tensor:
            x, w = operands(self.p)
            return x @ w

        def graph(self) -> Step:
            x, w = on_mesh(self.p)
            return Step([x @ w])

    views = harness.views(RowCase(p))          # formula, ledger, hlo, tpu
    harness.record(rec, "blocks", *views)      # recorded, compared, a table to display
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from shardlab import runtime
from shardlab.comm.ledger import Ledger
from shardlab.core.views import View
from shardlab.profile.hlo import HloModule
from shardlab.profile.tpu import Step

Checks = dict[str, tuple[bool, str]]
Program = tuple[Callable[..., Any], tuple[Any, ...]]  # (fn, args): fn(comm, *args) on every rank


@dataclass(frozen=True)
class Case:
    """Base of every topic's cases. Subclasses declare ``p`` (their parameter dataclass) and variant fields."""

    # What the views are read for; subclasses override as class attributes or properties.
    ops: ClassVar[tuple[str, ...]] = ("all_reduce",)  # collectives read from the compiled programs
    size_name: ClassVar[str] = "tp"  # the parameter that sets `devices` (named in the skip message)
    mesh_text: ClassVar[str] = "(data, tensor) = (n / tp, tp)"  # how the mesh tiles n devices (skip message)
    cpu_reduce_scatter: ClassVar[bool] = False  # count XLA:CPU's all-reduce + dynamic-slice as a reduce-scatter
    programs: ClassVar[tuple[str, ...]] = ()  # a step cut into several graphs: their names, in order (see graphs)

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

    def unavailable(self, source: str) -> str | None:
        """Why this variant has no ``source`` view (formula, ledger, hlo, tpu) at all: the harness skips that view
        with the reason, before any work (a variant the topic cannot build never reaches a hook)."""
        return None

    def value_name(self, name: str) -> str:
        """The name a value has in every view of this case (a topic whose records drop the phase overrides it)."""
        return name

    @property
    def grouped(self) -> bool:
        """True when ``program()`` runs independent groups: ``parity`` / ``ledger_extra`` get a list per group."""
        return False

    def compile_options(self) -> dict[str, Any]:
        """Options of the XLA:TPU compile (``disable_passes``, ``donate``, ``label`` ...; see profile.tpu)."""
        return {}

    # ------------------------------------------------------------------------------ the topic's knowledge
    def formula(self) -> View:
        return View.skip("formula", f"{type(self).__name__} has no formula")

    def program(self) -> list[Program]:
        """``[(fn, args)]``: ``fn(comm, *args)`` is the per-rank code the ledger runs on ``ranks`` ranks; several:
        independent groups of ``ranks`` ranks each (their ledgers must be alike; declare ``grouped``); []: no
        per-rank program, no ledger view."""
        return []

    def reference_program(self) -> Program | None:
        """``(fn, args)``: the same per-rank step written with the framework's own implementation (PyTorch's
        pipelining, say), which only real processes can run: :func:`shardlab.core.harness.gloo` runs it right after
        ``program()`` in the same gloo processes and returns each rank's result as the run's ``reference``. None
        (the default): the case has none."""
        return None

    def oracle(self) -> Any:
        """The dense, unsharded result the per-rank and compiled results are checked against."""
        return None

    def parity(self, source: str, got: Any, ref: Any) -> Checks:
        """Checks of ``got`` — the ranks' results (``source == "ledger"``; a list per group when ``grouped``) or
        the executed XLA:CPU program's outputs (``"hlo"``; ``{program: outputs}`` for a case with ``programs``) —
        against ``ref = oracle()``: ``{name: (ok, what was compared)}``."""
        return {}

    def ledger_extra(self, view: View, ledger: Ledger, results: list[Any]) -> View:
        """Values or checks the ledger view adds beyond the collectives' count, bytes and elements."""
        return view

    def graph(self) -> Step:
        """The sharded graph on the current world, NOT synced: ``Step(outputs)``, with ``donate`` when outputs
        update inputs in place."""
        raise NotImplementedError(f"{type(self).__name__} has no XLA graph")

    def graphs(self) -> Iterator[Step]:
        """Each program's graph in order (one per name in ``programs``; each is executed before the next is
        built). A case of one program yields ``graph()``."""
        yield self.graph()

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


def build_graph(case: Case) -> Step:
    """``case.graph()`` — the module-level builder the TPU compile pickles into a helper process."""
    return case.graph()
