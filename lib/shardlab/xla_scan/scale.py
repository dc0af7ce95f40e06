"""The 405B seed at full size: a scan over placeholder weights, compiled by the XLA:TPU compiler, shard_as off/on.

Design note
-----------
Llama 3.1 405B's decoder weights, stacked over its 126 layers, in torch's ``[out, in]`` layout and 2-D sharded
on a mesh (fsdp, tensor) — notation ``A[I_X, J_Y]``: dim I split over mesh axis X::

    q, gate, up   [L, out, in] -> [∅, out_tensor, in_fsdp]      q: [126, 16384, 16384]
    o, down       [L, out, in] -> [∅, out_fsdp, in_tensor]      o: [126, 16384, 16384]
    x             [b, s, h]    -> x[b_fsdp, s, h]               (the carry of the scan; layout "batch")
                               -> x[b_fsdp, s, h_tensor]        (layout "seed": torchprime's [fsdp, null, tensor])

One step is a forward + backward through ``torch_xla.experimental.scan`` of the block::

    qo:   h = x + silu(x · qᵀ) · oᵀ                             x·qᵀ: [b, s, h] · [h, h] -> [b, s, h_tensor]
    mlp:  h = h + (silu(h · gateᵀ) ⊙ (h · upᵀ)) · downᵀ          [b, s, h] -> [b, s, F_tensor] -> [b, s, h]

Weights and input are placeholders (``placeholder * 1`` carries the sharding annotation; a placeholder itself
cannot be annotated), so nothing is allocated: the graph is only lowered and handed to the TPU compiler.

Three switches decide whether ``shard_as`` matters (measured with libtpu 0.0.21, v6e-64, mesh 16 × 4):

``stacking``   ``"in_graph"`` — 126 per-layer weights are ``torch.stack``-ed inside the step (what
               ``scan_layers`` does) and the per-layer gradients are sliced back out; ``"held"`` — the
               weights are held stacked ``[L, ...]`` and the step returns the stacked gradient.
``update``     ``"none"`` — the step returns the gradients (torch_xla keeps ``.grad`` live); ``"sgd"`` —
               ``W - lr·dW`` in the same graph.
``layout``     the activations' sharding (:data:`shardlab.xla_scan.sharding.ACT_LAYOUTS`): ``"batch"`` — the
               residual stream x[b_fsdp, s, h]; ``"seed"`` — x[b_fsdp, s, h_tensor], as the seed ran, so the weight
               gradient ``dq = (dY)ᵀ · x`` has both result dims asking for tensor (the conflicting-axis matmul).

Without ``shard_as`` the per-layer gradient ``dq = (dY)ᵀ · x`` contracts the fsdp-sharded batch, is
all-reduced over fsdp and left 1-D (``[1, 4096, 16384]`` per chip), and the stacked gradient buffer the backward
scan writes it into takes that sharding: ``bf16[126, 4096, 16384]`` = 15.75 GiB per chip, per weight. With
``stacking="in_graph"`` that buffer is a temporary and the compile fails ("Used 36.56G of 31.25G hbm"); with
``"held"`` it is an output, which the compiler's capacity check does not count, so the compile succeeds with
31.5 GiB of outputs that no chip can hold. When an update ``W - lr·dW`` in the same graph ties the gradient to
the 2-D weight, sharding propagation carries the weight's sharding back into the loop: with held stacking off = on;
with in-graph stacking (the seed's real training step) both leave 2-D and fit, but off needs more temporaries.

:class:`SeedStepCase` holds notebook 06's parameters (``ScanParams``: h, F, b, s, the mesh) and the variant; the
harness's TPU view compiles its ``graph()``. At full size (:data:`FULL_SIZE`, 64 chips: v6e-64) a compile takes
15 s to 10 minutes on a 2-core host, depending on the case and the host's load, so notebook 06 reads the story's
compiles (:data:`CASES`) from ``data/scale/seed_405b.json`` (written by ``tools/scale_full_size.py seed``) unless it
runs with ``full_size=True``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
import torch_xla.distributed.spmd as xs  # imported after runtime.setup() (the notebooks' order)
from torch_xla.experimental.scan import scan

from shardlab import runtime
from shardlab.core import harness
from shardlab.core.case import Step
from shardlab.core.views import View
from shardlab.formulas import scan as FS
from shardlab.profile.placeholders import placeholder
from shardlab.profile.record import Recorder
from shardlab.profile.result_files import CompileResult, entry_layout, load_results, save_results
from shardlab.profile.tpu import TpuCompile
from shardlab.xla_scan.case import MeshCase
from shardlab.xla_scan.params import ScanParams
from shardlab.xla_scan.patches import shard_as_enabled
from shardlab.xla_scan.sharding import ACT_LAYOUTS, check_layout

# (out, in) per layer, as a function of (hidden, ffn); mesh axes of (out, in)
WEIGHTS: dict[str, tuple[str, str]] = {"q": ("hidden", "hidden"), "o": ("hidden", "hidden"),
                                       "gate": ("ffn", "hidden"), "up": ("ffn", "hidden"),
                                       "down": ("hidden", "ffn")}
SPECS: dict[str, tuple[str, str]] = {"q": ("tensor", "fsdp"), "o": ("fsdp", "tensor"),
                                     "gate": ("tensor", "fsdp"), "up": ("tensor", "fsdp"),
                                     "down": ("fsdp", "tensor")}
STACKINGS = ("in_graph", "held")
UPDATES = ("none", "sgd")
SGD_LR = 1e-3


@dataclass(frozen=True)
class SeedStepCase(MeshCase):
    """One step of the seed's block stack on ``p``'s mesh (sizes h, F, b, s from ``p``), compile-only."""

    layers: int = 126  # L (Llama 3.1 405B)
    weights: tuple[str, ...] = ("q", "o")  # which per-layer weights the block has (the seed: q_proj, o_proj)
    stacking: str = "in_graph"  # "in_graph" (scan_layers style) | "held" (pre-stacked [L, ...] parameters)
    update: str = "none"  # "none": the step returns the gradients | "sgd": W - lr·dW in the same graph
    shard_as: bool = True  # torch_xla's default; False = the monkeypatched pre-fix backward
    layout: str = "batch"  # the activations: "batch" x[b_fsdp, s, h] | "seed" x[b_fsdp, s, h_tensor]
    dtype: str = "bfloat16"  # type: ignore[assignment]  (a field here; Case reads it from p)

    SIZES: ClassVar[tuple[str, ...]] = ("hidden", "ffn", "batch", "seq", "mesh_fsdp", "mesh_tensor")

    def __post_init__(self) -> None:
        p = self.p
        for name, v in (("layers", self.layers), *((n, getattr(p, n)) for n in self.SIZES)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")
        unknown = [w for w in self.weights if w not in WEIGHTS]
        if not self.weights or unknown:
            raise ValueError(f"weights={self.weights!r}: give a non-empty subset of {tuple(WEIGHTS)}")
        if ("gate" in self.weights or "down" in self.weights) and "up" not in self.weights:
            raise ValueError(f"weights={self.weights!r}: an MLP needs 'up' (and 'down'; 'gate' makes it SwiGLU)")
        if ("up" in self.weights) != ("down" in self.weights):
            raise ValueError(f"weights={self.weights!r}: 'up' and 'down' come together")
        if ("q" in self.weights) != ("o" in self.weights):
            raise ValueError(f"weights={self.weights!r}: 'q' and 'o' come together")
        if self.stacking not in STACKINGS:
            raise ValueError(f"stacking={self.stacking!r} must be one of {STACKINGS}")
        if self.update not in UPDATES:
            raise ValueError(f"update={self.update!r} must be one of {UPDATES}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype={self.dtype!r} must be 'bfloat16' or 'float32'")
        check_layout(self.layout)
        rules = (("hidden", p.hidden, "fsdp", p.mesh_fsdp), ("hidden", p.hidden, "tensor", p.mesh_tensor),
                 ("batch", p.batch, "fsdp", p.mesh_fsdp))
        if "up" in self.weights:
            rules += (("ffn", p.ffn, "tensor", p.mesh_tensor),)
        for name, size, axis, n in rules:
            if size % n:
                raise ValueError(f"{name}={size} is not divisible by {axis}={n} (it is sharded over {axis})")

    @property
    def phase(self) -> str:
        layout = "" if self.layout == "batch" else f" layout={self.layout}"
        return f"seed {self.stacking} {self.update}{layout} shard_as={'on' if self.shard_as else 'off'}"

    @property
    def config(self) -> dict[str, Any]:
        """The configuration as the cached results store it."""
        return {"layers": self.layers, **{n: getattr(self.p, n) for n in self.SIZES}, "weights": list(self.weights),
                "stacking": self.stacking, "update": self.update, "shard_as": self.shard_as, "dtype": self.dtype,
                "layout": self.layout}

    def shape(self, weight: str) -> tuple[int, int]:
        """Per-layer ``(out, in)`` of ``weight``."""
        out_dim, in_dim = WEIGHTS[weight]
        return getattr(self.p, out_dim), getattr(self.p, in_dim)

    def graph(self) -> Step:
        """Trace one step of the seed stack on this process's device world; returns ``[loss, *outputs]``.

        Outputs are the weight gradients (``update="none"``; stacked ``[L, out, in]`` each, or L per-layer
        ``[out, in]`` with ``stacking="in_graph"``) or the updated weights (``update="sgd"``)."""
        p = self.p
        mesh = runtime.mesh((p.mesh_fsdp, p.mesh_tensor), ("fsdp", "tensor"))
        dt = getattr(torch, self.dtype)
        leaves: dict[str, list[torch.Tensor]] = {}
        stacked: dict[str, torch.Tensor] = {}
        for name in self.weights:
            if self.stacking == "held":
                leaf = placeholder((self.layers, *self.shape(name)), dt).requires_grad_(True)  # [L, out, in]
                w = leaf * 1  # a placeholder cannot carry an annotation; its product can
                xs.mark_sharding(w, mesh, (None, *SPECS[name]))
                leaves[name], stacked[name] = [leaf], w
            else:
                per_layer = []
                leaves[name] = []
                for _ in range(self.layers):
                    leaf = placeholder(self.shape(name), dt).requires_grad_(True)  # [out, in]
                    w = leaf * 1
                    xs.mark_sharding(w, mesh, SPECS[name])
                    leaves[name].append(leaf)
                    per_layer.append(w)
                stacked[name] = torch.stack(per_layer)  # [L, out, in], inside the graph (as scan_layers does)
        act = ACT_LAYOUTS[self.layout]["act_in"]
        x = placeholder((p.batch, p.seq, p.hidden), dt) * 1  # [b, s, h]
        xs.mark_sharding(x, mesh, act)
        with shard_as_enabled(self.shard_as):
            out, _ = scan(_block(mesh, act), x, stacked)  # [b, s, h]
            loss = out.float().pow(2).mean()
            loss.backward()
        flat = [leaf for name in self.weights for leaf in leaves[name]]
        if self.update == "sgd":
            return Step([loss, *[leaf - SGD_LR * leaf.grad for leaf in flat]])
        return Step([loss, *[leaf.grad for leaf in flat]])


def _block(mesh: xs.Mesh, act: tuple[str | None, ...]
           ) -> Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, None]]:
    """One layer; ``act`` is the residual stream's sharding (x[b_fsdp, s, h] or, the seed's, x[b_fsdp, s, h_tensor])."""
    def ann(t: torch.Tensor, spec: tuple[str | None, ...]) -> torch.Tensor:
        return xs.mark_sharding_with_gradients(t, mesh, spec)

    def step(carry: torch.Tensor, layer: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
        h = ann(carry, act)  # [b_fsdp, s, h] (or h_tensor)
        if "q" in layer:
            a = ann(torch.einsum("bsh,oh->bso", h, layer["q"]), ("fsdp", None, "tensor"))  # [b, s, h_tensor]
            h = h + torch.einsum("bsi,oi->bso", torch.nn.functional.silu(a), layer["o"])  # [b, s, h] (+ all-reduce)
            h = ann(h, act)
        if "up" in layer:
            u = ann(torch.einsum("bsh,fh->bsf", h, layer["up"]), ("fsdp", None, "tensor"))  # [b, s, F_tensor]
            if "gate" in layer:
                g = ann(torch.einsum("bsh,fh->bsf", h, layer["gate"]), ("fsdp", None, "tensor"))
                u = torch.nn.functional.silu(g) * u
            else:
                u = torch.nn.functional.gelu(u)
            h = h + torch.einsum("bsf,hf->bsh", u, layer["down"])  # [b, s, F_tensor] · [h, F_tensor] -> [b, s, h]
        return h, None

    return step


@dataclass
class SeedResult(CompileResult):
    """One compile of the seed stack, and how its gradients leave the step."""

    grad_shapes: dict[str, list[str]] = field(default_factory=dict)  # weight -> per-chip output shapes
    stacked_shapes: dict[str, int] = field(default_factory=dict)  # per-chip "[L, ...]" arrays -> occurrences


def stacked_shapes(text: str, layers: int) -> dict[str, int]:
    """Per-chip arrays with a leading ``layers`` dim in a TPU program (or an out-of-memory message), layouts
    dropped: ``{"bf16[126,4096,1024]": occurrences}``. The stacked weights, gradients and saved activations."""
    found: dict[str, int] = {}
    for dtype, dims in re.findall(rf"\b(bf16|f32|f16)\[({layers},[\d,]+)\]", text):
        key = f"{dtype}[{dims}]"
        found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def sharding_of(shape: str, case: SeedStepCase, weight: str = "q") -> str:
    """``"2-D"`` / ``"1-D"`` / ``""``: is a per-chip array (``"bf16[out, in]"``, or stacked ``"bf16[L, out, in]"``)
    one of ``weight``'s layers split over fsdp and tensor, as the weight is (either orientation), or over tensor only
    (all-reduced over fsdp), or neither (an activation, or a shape that matches both)?

    >>> FULL_SIZE.shape("q"), (FULL_SIZE.p.mesh_fsdp, FULL_SIZE.p.mesh_tensor)      # q on mesh (fsdp 16, tensor 4)
    ((16384, 16384), (16, 4))
    >>> sharding_of("bf16[126,4096,16384]", FULL_SIZE), sharding_of("bf16[1024,4096]", FULL_SIZE)
    ('1-D', '2-D')
    """
    dims = [int(d) for d in shape[shape.index("[") + 1:shape.index("]")].split(",") if d]
    if len(dims) == 3 and dims[0] == case.layers:
        dims = dims[1:]
    if len(dims) != 2:
        return ""
    out_dim, in_dim = case.shape(weight)
    f, t = case.p.mesh_fsdp, case.p.mesh_tensor
    two_d = {tuple(sorted((out_dim // t, in_dim // f))), tuple(sorted((out_dim // f, in_dim // t)))}
    one_d = {tuple(sorted((out_dim // t, in_dim))), tuple(sorted((out_dim, in_dim // t)))} if f > 1 else set()
    key = tuple(sorted(dims))
    if key in two_d and key not in one_d:
        return "2-D"
    if key in one_d and key not in two_d:
        return "1-D"
    return ""


def seed_result(case: SeedStepCase, c: TpuCompile) -> SeedResult:
    """One compile of ``case`` (the tpu view's detail) as the story's numbers."""
    res = SeedResult.read(case.config, c)
    if c.fits and c.hlo_text is not None:
        shapes = [str(a) for a in entry_layout(c.hlo_text)[1][1:]]  # [0] is the loss
        per = len(shapes) // len(case.weights)
        res.grad_shapes = {w: sorted(set(shapes[i * per:(i + 1) * per])) for i, w in enumerate(case.weights)}
        res.stacked_shapes = stacked_shapes(c.hlo_text, case.layers)
    elif c.oom is not None:
        res.stacked_shapes = stacked_shapes("\n".join(b.shape for b in c.oom.buffers), case.layers)
    return res


# The seed's sizes: 405B's q_proj and o_proj, 126 layers, b 16 x s 1024, mesh fsdp 16 x tensor 4, bf16. 64 chips
# (v6e-64): the [126, 4K, 16K] buffer depends on tensor = 4, not on the fsdp size.
FULL_SIZE = SeedStepCase(ScanParams(hidden=16384, ffn=53248, batch=16, seq=1024, mesh_fsdp=16, mesh_tensor=4),
                         layers=126)
GENERATION = "v6e"
# The story, case -> (stacking, update, layout, shard_as values): the seed, the contrasts that explain it, the
# seed's real training step and the seed's own activation layout
CASES: dict[str, tuple[str, str, str, tuple[bool, ...]]] = {
    "in_graph": ("in_graph", "none", "batch", (False, True)),  # scan_layers: per-layer weights stacked in the step
    "held": ("held", "none", "batch", (False,)),  # pre-stacked weights: the 1-D gradient stack is an output
    "update": ("held", "sgd", "batch", (False, True)),  # W - lr·dW in the same graph
    "in_graph_update": ("in_graph", "sgd", "batch", (False, True)),  # the seed's training step: stacking + update
    "seed_layout": ("in_graph", "none", "seed", (False, True)),  # activations [fsdp, None, tensor], as the seed
}


def story(base: SeedStepCase = FULL_SIZE, generation: str = GENERATION, cases: tuple[str, ...] = tuple(CASES)
          ) -> tuple[dict[str, SeedResult], str]:
    """Every compile of the seed story, XLA:TPU on a ``generation`` slice of ``base``'s fsdp·tensor chips (in a
    helper process when this one has another device count): ``({"in_graph.off": ..., "in_graph.on": ...,
    "held.off": ..., ...}, "")`` — one entry per case of :data:`CASES` and shard_as value (``base``'s stacking /
    update / layout / shard_as are replaced per case) — or ``({}, why)`` when the TPU view is skipped here."""
    unknown = [k for k in cases if k not in CASES]
    if unknown:
        raise ValueError(f"cases {unknown} are not among {tuple(CASES)}")
    out: dict[str, SeedResult] = {}
    for key in cases:
        stacking, update, layout, flags = CASES[key]
        for on in flags:
            case = replace(base, stacking=stacking, update=update, layout=layout, shard_as=on)
            view = harness.tpu(case, generation)
            if not view.ran:
                return {}, view.skipped or ""
            out[f"{key}.{'on' if on else 'off'}"] = seed_result(case, view.detail)
    return out, ""


def full_story(rec: Recorder, p: ScanParams) -> dict[str, SeedResult]:
    """The full-size story: compiled here and recorded (``scale.405b.*``) when ``p.full_size``, else read from the
    cache (a note says which compiles and when); either way checked against the formula: the out-of-memory compile's
    two largest buffers are two 1-D stacks ``[L, h/tensor, h]``."""
    full = _full_story(rec, p)
    r = full.get("in_graph.off")
    if r is not None and not r.fits and r.largest:  # the OOM's two largest buffers vs the formula's 1-D stack
        c = FULL_SIZE
        want = FS.stacked_bytes(c.layers, c.p.hidden, c.p.hidden, c.p.mesh_fsdp, c.p.mesh_tensor, "1d",
                                c.dtype).per_device_bytes
        got = [size for size, *_ in r.largest[:2]]
        rec.check("scale.405b: the two largest buffers of the out-of-memory compile are the formula's 1-D stacks",
                  got == [want, want], f"compiler {got} B; formula [L, h/tensor, h] in {c.dtype}: {want} B each")
    return full


def _full_story(rec: Recorder, p: ScanParams) -> dict[str, SeedResult]:
    """The compiles, live (recorded, their verdicts checked against the cache's) or cached (noted)."""
    if p.full_size:
        full, why = story()  # in a helper process with 64 CPU devices
        if why:
            raise RuntimeError(f"full_size=True, but the TPU view is skipped here: {why}")
        record_story(rec, "scale.405b", full, FULL_SIZE)
        cached, _ = load_story()
        verdicts = {k: (r.fits, r.runs) for k, r in full.items()}
        rec.check("scale.405b: every verdict the text below describes holds for this compiler",
                  all(verdicts[k] == (r.fits, r.runs) for k, r in cached.items() if k in verdicts), str(verdicts))
        print("compiled now")
        return full
    full, source = load_story()
    added = "; ".join(f"{', '.join(a['cases'])} added {a['measured']}" for a in source.get("added", []))
    about = (f"cached: {source['command']}, {source['measured']}, libtpu {source['versions']['libtpu']}"
             + (f" ({added})" if added else ""))
    rec.note("scale.405b", f"full-size compiles not run (full_size=False); the table shows the {about}")
    print(about)
    return full


def small_story(rec: Recorder, p: ScanParams) -> pd.DataFrame | None:
    """Every case of the story at the notebook's sizes (the seed's block, q and o in bf16, L = ``p.layers``: about
    a second per compile) on a v6e slice of fsdp·tensor chips (in a helper process if that is not this process's
    count), recorded as ``scale.small.*``; None when skipped."""
    case = SeedStepCase(p, layers=p.layers)
    small, why = story(case)
    if why:
        harness.record(rec, "scale.small", View.skip("tpu", why))
        return None
    record_story(rec, "scale.small", small, case)
    return story_frame(small, case, unit="KiB")


def grad_sharding(r: SeedResult, seed: SeedStepCase) -> dict[str, str]:
    """Per weight: how the gradient (or updated weight) leaves the step — "1-D", "2-D", or "" (not compiled)."""
    out = {}
    for w, shapes in r.grad_shapes.items():
        kinds = {sharding_of(sh, seed, w) for sh in shapes}
        out[w] = kinds.pop() if len(kinds) == 1 else "/".join(sorted(kinds))
    return out


def stacks(r: SeedResult, seed: SeedStepCase, kind: str) -> list[str]:
    """The stacked ``[L, ·, ·]`` per-chip arrays in the TPU program (or its out-of-memory list) that hold a weight's
    layers ``kind`` ("1-D": the all-reduced gradient stack; "2-D": the weights and 2-D gradient stacks)."""
    return [sh for sh in r.stacked_shapes if any(sharding_of(sh, seed, w) == kind for w in seed.weights)
            and sh.count(",") == 2]


def story_frame(results: dict[str, SeedResult], seed: SeedStepCase, unit: str = "GiB") -> pd.DataFrame:
    """One row per compile: verdicts, per-chip bytes (in ``unit``: GiB, MiB or KiB), how the gradients leave the
    step, the 1-D stacks in the program."""
    units = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}
    if unit not in units:
        raise ValueError(f"unit={unit!r} must be one of {tuple(units)}")
    rows = []
    for key, r in results.items():
        case, flag = key.rsplit(".", 1)
        stacking, update, layout, _ = CASES[case]

        def g(v: int | None) -> str:
            return "–" if v is None else f"{v / units[unit]:.2f}"

        b = unit
        rows.append({
            "case": case, "stacking": stacking, "update": {"none": "gradients out", "sgd": "W - lr·dW in the graph"}
            [update], "activations": ", ".join(str(a) for a in ACT_LAYOUTS[layout]["act_in"]),
            "shard_as": flag, "compiles (fits)": r.fits, "runs (outputs too)": r.runs,
            f"arguments {b}": g(r.argument_bytes), f"outputs {b}": g(r.output_bytes),
            f"temporaries {b}": g(r.temp_bytes if r.fits else r.program_bytes), f"peak {b}": g(r.peak_bytes),
            f"checked {b}": g(r.per_chip_bytes),
            "gradient out, per chip": ", ".join(sorted({sh for shapes in r.grad_shapes.values() for sh in shapes}))
            or "–",
            "sharding": ", ".join(f"{w} {k}" for w, k in grad_sharding(r, seed).items()) or "–",
            "1-D stacks in the program": ", ".join(stacks(r, seed, "1-D")) or "none",
            "2-D stacks in the program": ", ".join(stacks(r, seed, "2-D")) or "none",
            "compile s": round(r.compile_s, 1),
        })
    return pd.DataFrame(rows).set_index(["case", "shard_as"])


def _gib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**30:.2f} GiB"


def _buffers(r: SeedResult, n: int = 2) -> str:
    """The out-of-memory message's ``n`` largest buffers: "``bf16[...]`` 15.75 GiB (``broadcast(constant)``), ..."."""
    return ", ".join(f"`{shape.split('{')[0]}` {_gib(size)} (`{label.split(' = ')[-1].split(',')[0]}`)"
                     for size, shape, label in r.largest[:n])


def story_text(results: dict[str, SeedResult], seed: SeedStepCase) -> str:
    """The full-size story's numbers as Markdown, one bullet per case present in ``results`` — written from the
    compiles, so a refreshed cache cannot contradict the notebook's text."""
    def kinds(r: SeedResult) -> str:
        return ", ".join(f"{w} {k}" for w, k in grad_sharding(r, seed).items()) or "–"

    def shapes(r: SeedResult) -> str:
        return ", ".join(f"`{sh}`" for sh in sorted({sh for v in r.grad_shapes.values() for sh in v}))

    def ones(r: SeedResult) -> str:
        return ", ".join(f"`{sh}`" for sh in stacks(r, seed, "1-D")) or "none"

    def oom(r: SeedResult) -> str:
        return f"*\"{r.message.split('. ', 1)[-1]}\"* The two largest allocations: {_buffers(r)}"

    out = []
    off, on = results.get("in_graph.off"), results.get("in_graph.on")
    if off is not None:
        big = sum(size for size, *_ in off.largest[:2])
        out.append("* **in-graph, shard_as off** (the seed): " + (
            f"fits ({_gib(off.per_chip_bytes)} checked); gradients {kinds(off)}." if off.fits else
            f"{oom(off)} — together {_gib(big)}, over the chip's {_gib(off.capacity_bytes)}; 1-D stacks in the "
            f"program: {ones(off)}."))
    if on is not None and on.fits:
        out.append(f"* **in-graph, shard_as on**: fits — arguments {_gib(on.argument_bytes)} + temporaries "
                   f"{_gib(on.temp_bytes)} checked ({_gib(on.peak_bytes)} at the peak, outputs included); the "
                   f"per-layer gradients leave {kinds(on)}, {shapes(on)} per chip.")
    held = results.get("held.off")
    if held is not None:
        out.append(f"* **held, shard_as off**: the compile {'succeeds' if held.fits else 'fails'} with "
                   f"{_gib(held.output_bytes)} of outputs (gradients {shapes(held)}, {kinds(held)}); live at the "
                   f"peak {_gib(held.live_bytes)} of {_gib(held.capacity_bytes)}: "
                   f"{'it runs' if held.runs else 'it could not run'}.")
    u_off, u_on = results.get("update.off"), results.get("update.on")
    if u_off is not None and u_on is not None:
        same = (u_off.grad_shapes, u_off.temp_bytes, u_off.output_bytes) == (u_on.grad_shapes, u_on.temp_bytes,
                                                                           u_on.output_bytes)
        out.append(f"* **held + update, off / on**: {'the same program' if same else 'different programs'} — "
                   f"temporaries {_gib(u_off.temp_bytes)} / {_gib(u_on.temp_bytes)}, updated weights "
                   f"{kinds(u_off)} / {kinds(u_on)}.")
    g_off, g_on = results.get("in_graph_update.off"), results.get("in_graph_update.on")
    if g_off is not None and g_on is not None:
        diff = (g_off.temp_bytes or 0) - (g_on.temp_bytes or 0)
        out.append(f"* **in-graph + update, off / on** (the seed's training step): "
                   f"{'both fit' if g_off.fits and g_on.fits else f'fits: off {g_off.fits}, on {g_on.fits}'}; "
                   f"updated weights {kinds(g_off)} / {kinds(g_on)}; 1-D stacks {ones(g_off)} / {ones(g_on)}; "
                   f"temporaries {_gib(g_off.temp_bytes)} / {_gib(g_on.temp_bytes)}: without shard_as "
                   f"{_gib(abs(diff))} {'more' if diff >= 0 else 'less'} per chip.")
    l_off, l_on = results.get("seed_layout.off"), results.get("seed_layout.on")
    if l_off is not None:
        out.append("* **the seed's layout** (activations `[fsdp, None, tensor]`), **shard_as off**: " + (
            f"fits; gradients {kinds(l_off)}." if l_off.fits else f"{oom(l_off)}; 1-D stacks: {ones(l_off)}."))
    if l_on is not None and l_on.fits:
        out.append(f"* **the seed's layout, shard_as on**: fits — arguments {_gib(l_on.argument_bytes)} + "
                   f"temporaries {_gib(l_on.temp_bytes)} checked; gradients {kinds(l_on)}, {shapes(l_on)} per chip.")
    return "\n".join(out)


def _name(prefix: str, key: str) -> str:
    case, flag = key.rsplit(".", 1)
    return f"{prefix}.shard_as_{flag}" if case == "in_graph" else f"{prefix}.{case}.shard_as_{flag}"


def record_story(rec: Recorder, prefix: str, results: dict[str, SeedResult], seed: SeedStepCase) -> None:
    """Record every compile, source tpu: the seed itself (in-graph stacking) as ``<prefix>.shard_as_<off|on>``,
    the other cases as ``<prefix>.<case>.shard_as_<off|on>``, each ``.fits`` (1/0), ``.runs``, ``.per_chip.bytes``
    (what the capacity check counted: :attr:`SeedResult.per_chip_bytes`); and check the invariants that hold at
    any size: without shard_as and without an update the gradients leave 1-D and a 1-D stack is in the program
    (either layout); otherwise, when the program fits, they leave 2-D and none is; with held stacking and the
    update in the graph both programs are the same. (With in-graph stacking and the update, off and on are both
    2-D but not the same program at full size: their temporaries differ — recorded, not asserted equal.)"""
    for key, r in results.items():
        name = _name(prefix, key)
        r.record(rec, name)
        if r.fits:
            rec.measure(f"{name}.runs", int(r.runs), "1", "tpu")
    for key, r in results.items():
        case, flag = key.rsplit(".", 1)
        name, kinds, one_d = _name(prefix, key), set(grad_sharding(r, seed).values()), stacks(r, seed, "1-D")
        if CASES[case][1] == "none" and flag == "off":
            rec.check(f"{name}: gradients leave 1-D, a 1-D stack is in the program",
                      (kinds == {"1-D"} or not r.fits) and bool(one_d),
                      f"{grad_sharding(r, seed)}; 1-D stacks {one_d}; {r.message}")
        elif r.fits:
            rec.check(f"{name}: gradients leave 2-D, no 1-D stack in the program", kinds == {"2-D"} and not one_d,
                      f"{grad_sharding(r, seed)}; 1-D stacks {one_d}")
    off, on = results.get("update.off"), results.get("update.on")
    if off is not None and on is not None:
        same = (off.grad_shapes, off.argument_bytes, off.output_bytes, off.temp_bytes) == \
            (on.grad_shapes, on.argument_bytes, on.output_bytes, on.temp_bytes)
        rec.check(f"{prefix}.update: with held stacking and the update in the graph shard_as changes nothing", same,
                  f"off {off.grad_shapes} {off.per_chip_bytes} B; on {on.grad_shapes} {on.per_chip_bytes} B")


STORY_FILE = Path(__file__).resolve().parents[3] / "data" / "scale" / "seed_405b.json"


def save_story(results: dict[str, SeedResult], path: Path = STORY_FILE, **source: Any) -> None:
    """Write the full-size compiles (``source``: how and where they were measured) as the cached story."""
    save_results(results, path, **source)


def load_story(path: Path = STORY_FILE) -> tuple[dict[str, SeedResult], dict[str, Any]]:
    """The cached full-size compiles and how they were measured (``_source``)."""
    return load_results(path, SeedResult.from_dict, "run the notebook with full_size=True (or "
                        "tools/scale_full_size.py) to measure the full-size compiles")
