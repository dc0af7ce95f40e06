"""The combining lever in four views: formula, ledger (hand-made buckets), CPU compiler, TPU compiler ± combiners.

Design
------
One configuration (:class:`shardlab.levers.programs.StepConfig`: L square layers, data parallel or FSDP, on
the process's n devices) answered the suite's way (``shardlab.views``), with value names
``<op>.{count,bytes,elements}`` (no phase: the step is always forward + backward):

- :func:`formula` — DP: L gradient all-reduces (payload: one [h, h] gradient each) + 1 all-reduce of the scalar
  loss (its mean over the batch shards). FSDP: L all-gathers (payload: the [h/n, h] shard), L reduce-scatters
  (payload: the full gradient), and the loss all-reduce. n = 1: nothing is sharded, no collective at all.
- :func:`compiler` — XLA:CPU (no combiner in torch_xla 2.9: one instruction per logical collective; its
  reduce-scatter is an all-reduce + dynamic-slice, counted as the reduce-scatter it is).
- :func:`tpu` — XLA:TPU, compile-only, for an n-chip slice; ``combiners=False`` disables
  :data:`COMBINER_PASSES`. XLA ignores an unknown pass name silently (measured: ``"no-such-pass"`` leaves the
  program unchanged), so a name is verified only by its effect — :func:`pass_effects` measures it per pass.
  Measured (libtpu 0.0.21): ``all-reduce-combiner`` alone undoes all the combining in both steps, FSDP's
  reduce-scatters included (the TPU reduces them as all-reduces, combines those, and only then turns them into
  a reduce-scatter fusion); ``reduce-scatter-combiner`` and ``all-gather-combiner`` change nothing here.
  A combined tuple collective is one instruction carrying k operands: ``count`` is then listed as differing
  (with the measured k) and ``operands`` is recorded instead.

Every view also carries ``reductions``: the logical gradient/loss reductions (reduce-scatters + all-reduces,
operands of tuple collectives counted). It is what must agree everywhere: the TPU compiler may legitimately
reduce an FSDP gradient with an all-reduce and keep its shard instead of a reduce-scatter (measured on a
4-chip slice with 16 KiB gradients), and may decompose a large reduce-scatter into a ring of
collective-permutes interleaved with the matmuls that produce it (measured at 2048² weights) — such per-op values
are listed as differing, with the measured reason.
"""

from __future__ import annotations

from typing import Any

from shardlab import runtime
from shardlab.levers.programs import StepConfig, train_step
from shardlab.views import View, collectives_view

COMBINER_PASSES = ("all-reduce-combiner", "all-gather-combiner", "reduce-scatter-combiner")
LOSS_BYTES = 4  # the loss is reduced in float32


def ops(cfg: StepConfig) -> tuple[str, ...]:
    return ("all_reduce",) if cfg.mode == "dp" else ("all_gather", "reduce_scatter", "all_reduce")


def _strip(view: View, phase: str) -> View:
    """Drop the ``<phase>.`` prefix collectives_view puts on every name."""
    cut = len(phase) + 1
    view.values = {k[cut:]: v for k, v in view.values.items()}
    view.units = {k[cut:]: v for k, v in view.units.items()}
    view.differs = {k[cut:]: v for k, v in view.differs.items()}
    return view


def formula(cfg: StepConfig, devices: int) -> View:
    """The algebra of one step on ``devices`` ranks (see the module note)."""
    cfg.validate(devices)
    g, e = cfg.grad_bytes, cfg.grad_bytes // (cfg.hidden * cfg.hidden)
    L, h = cfg.layers, cfg.hidden
    view = View("formula", detail={"grad_bytes": g})
    sharded = devices > 1
    rows = {"all_reduce": (1, LOSS_BYTES, 1)} if cfg.mode == "fsdp" else \
        {"all_reduce": (L + 1, L * g + LOSS_BYTES, L * h * h + 1)}
    if cfg.mode == "fsdp":
        rows |= {"all_gather": (L, L * g // devices, L * h * h // devices), "reduce_scatter": (L, L * g, L * h * h)}
    for op in ops(cfg):
        count, nbytes, elems = rows[op] if sharded else (0, 0, 0)
        view.add(f"{op}.count", count, "count")
        view.add(f"{op}.bytes", nbytes, "bytes")
        view.add(f"{op}.elements", elems, "elements")
    view.add("reductions", (L + 1) if sharded else 0, "count")
    view.notes.append(f"{cfg.mode}: L={L} gradients of {g} bytes ({e} B per element) over {devices} devices")
    return view


def compiler(cfg: StepConfig) -> View:
    """XLA:CPU's partitioned program of the step on this process's devices."""
    from shardlab.profile import capture_hlo

    cap = capture_hlo(train_step, cfg)
    view = _strip(collectives_view("hlo", cap.module, cfg.mode, ops(cfg), cfg.dtype, cpu_reduce_scatter=True,
                                   detail=cap), cfg.mode)
    view.add("reductions", sum(view.get(f"{op}.count", 0) for op in ("reduce_scatter", "all_reduce")), "count")
    return view


def tpu(cfg: StepConfig, generation: str = "v5e", combiners: bool = True) -> View:
    """XLA:TPU's program of the step for a slice with this process's device count (compile-only)."""
    from shardlab.profile import tpu as T

    world = runtime.current()
    topology, why = T.view_topology(world.num_devices, True, generation)
    if topology is None:
        return View.skip("tpu", why)
    comp = T.compile_program(train_step, cfg, topology, disable_passes=() if combiners else COMBINER_PASSES,
                             label=f"{cfg.mode} step, combiners {'on' if combiners else 'off'}")
    view = _strip(collectives_view("tpu", comp.module, cfg.mode, ops(cfg), cfg.dtype, detail=comp), cfg.mode)
    view.add("reductions", sum(logical(view, op) or 0 for op in ("reduce_scatter", "all_reduce")
                               if f"{op}.count" in view.values), "count")
    colls = comp.module.collectives
    view.add("instructions", len(colls), "count")
    view.add("operands", sum(getattr(c, "operands", 1) for c in colls), "operands")
    expect = formula(cfg, world.num_devices)
    permutes = sum(c.op == "collective-permute" for c in colls)
    for op in ops(cfg):
        if logical(view, op) == expect[f"{op}.count"]:
            continue
        if permutes:
            why = (f"the tpu compiler decomposed collectives into {permutes} collective-permutes interleaved with "
                   "the matmuls (a ring it overlaps with compute)")
        elif op in ("reduce_scatter", "all_reduce"):
            why = (f"the tpu compiler reduced {expect['reduce_scatter.count'] - logical(view, 'reduce_scatter')} "
                   "FSDP gradient(s) with an all-reduce (each chip keeps its shard) instead of a reduce-scatter")
        else:
            why = f"the tpu program has {logical(view, op)} {op.replace('_', '-')}(s) (formula: " \
                  f"{expect[f'{op}.count']})"
        for q in ("count", "bytes", "elements", "operands"):
            if f"{op}.{q}" in view.values:
                view.differs[f"{op}.{q}"] = why
    if permutes:
        view.differs["reductions"] = f"decomposed into {permutes} collective-permutes"
    if not combiners:  # a separate set of names: the same program with the passes disabled
        view.values = {f"{k}.combiner_off": v for k, v in view.values.items()}
        view.units = {f"{k}.combiner_off": v for k, v in view.units.items()}
        view.differs = {f"{k}.combiner_off": v for k, v in view.differs.items()}
    view.notes.append(f"XLA:TPU {topology}, combiners {'on' if combiners else 'off'}: compiled in "
                      f"{comp.compile_s:.2f} s")
    return view


def pass_effects(cfg: StepConfig, generation: str = "v5e",
                 passes: tuple[str, ...] = (*COMBINER_PASSES, "no-such-pass")) -> Any:
    """Collective instructions (and operands) of the TPU program with each pass disabled on its own — a pass
    name is verified when disabling it changes the program. Returns a DataFrame and the compiles."""
    import pandas as pd

    from shardlab.profile import tpu as T

    topology = T.topology_for(runtime.current().num_devices, generation)
    rows, comps = [], []
    for disabled in ((), *((q,) for q in passes)):
        comp = T.compile_program(train_step, cfg, topology, disable_passes=disabled,
                                 label=f"{cfg.mode} step without {disabled or 'nothing'}")
        comps.append(comp)
        row: dict[str, Any] = {"disabled": disabled[0] if disabled else "(none)"}
        for op, s in sorted(comp.module.summary().items()):
            row[op] = f"{s['count']}" if s["count"] == s["operands"] else f"{s['count']} (carrying {s['operands']})"
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("disabled").fillna("0")
    base = frame.iloc[0]
    frame["changes the program"] = [not r.equals(base) for _, r in frame.iterrows()]
    return frame, comps


def logical(view: View, op: str) -> int:
    """Logical collectives ``op`` in a compiler view: its operands when combined, else its count."""
    suffix = ".combiner_off" if any(k.endswith(".combiner_off") for k in view.values) else ""
    return view.get(f"{op}.operands{suffix}", view.get(f"{op}.count{suffix}", 0))


def summary(views: dict[str, View], cfg: StepConfig) -> Any:
    """One row per collective kind: count (and operands) per program, off vs on."""
    import pandas as pd

    rows = []
    for op in ops(cfg):
        row: dict[str, Any] = {"collective": op.replace("_", "-")}
        for label, v in views.items():
            if not v.ran:
                continue
            suffix = ".combiner_off" if label.endswith("combiners off") else ""
            count = v.get(f"{op}.count{suffix}")
            operands = v.get(f"{op}.operands{suffix}", count)
            row[label] = f"{count}" if operands == count else f"{count} (carrying {operands})"
        rows.append(row)
    return pd.DataFrame(rows)
