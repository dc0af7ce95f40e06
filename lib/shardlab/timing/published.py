"""Published training runs beside the step time the XLA:TPU compiler predicts for the same settings.

Design
------
MaxText publishes the MFU of four dense models trained on one v5e-256 (``configs/tpu/v5e/{16b,32b,64b,128b}.sh``
and the table in ``configs/tpu/v5e/README.md``: 61.10 / 66.86 / 59.90 / 56.06 %). Each script sets
``global_parameter_scale`` over ``base.yml``'s widths (emb 2048, 16 heads of 128, MLP 7168, 16 layers, vocab
32000, SwiGLU, RMSNorm, untied output): the scale's log2 is cycled over (heads and MLP) → emb → layers, so
scale 16 = emb 4096, 64 heads, MLP 28672, 32 layers. :func:`maxtext_widths` re-derives that rule (it is checked
against the published parameter counts by the test).

Each run becomes a Llama config for ``inspect``'s training step (:mod:`shardlab.inspect.step`: bf16 compute, fp32
AdamW master and state, scan over layers, full recompute), traced on a 2-device mesh and compiled for the 256 chips
(the pod-scale retarget), then priced by :func:`shardlab.profile.step_time.step_time`. What differs from the
published runs, and is stated beside every row:

- **attention**: HF's eager attention, not MaxText's flash kernel — the retarget refuses Pallas kernels (they are
  traced for per-device block shapes). Eager computes the full [s, s] score matrix where a causal flash kernel
  skips the upper half, so the compiled attention FLOPs are ~2x the model's;
- **libtpu flags**: the scripts' ``LIBTPU_INIT_ARGS`` (async collective fusion, data-parallel all-reduce
  optimisation, …) are not set: torch_xla's compile-only route takes no libtpu flags here;
- **128B**: its ``remat_policy=qkv_proj_offloaded`` (activations offloaded to host) and fused QKV / MLP are not
  expressible; it is compiled with full recompute on the published fsdp 16 x tensor 16 mesh;
- **weights**: MaxText's default ``weight_dtype`` is fp32, cast to bf16 for the matmuls; ``inspect`` keeps bf16
  weights with an fp32 master copy — the same matmul FLOPs, slightly different HBM traffic.

MFU uses MaxText's own convention (``calculate_tflops_training_per_device``): 6 x (layer matmul weights + the
output projection; not the input embedding) x tokens, plus causal attention 6·s·heads·head_dim per token and
layer, over (step time x peak) — :func:`maxtext_model_flops`.

**Depth and batch.** With eager attention the published steps do not fit a v5e chip (16B at 32 layers: 16.27 of
15.75 GiB). Each run is compiled at 2 and 4 layers (scan) and every term extrapolated along the line through the
two (:func:`full_or_extrapolated`; :func:`linearity` checks the 2 → 4 difference against the scanned body's own
estimate). Where even 2 layers do not fit at the published batch (32B: four f32 [256, 2048, 2048] score tensors),
the layer lines at 1 and 2 sequences per chip are extrapolated to the published batch along a second line — tested
on 16B, whose batch of 6 fits at 2 layers, from its compiles at 1 and 2 (:func:`batch_line_check`; at 3 and 4
sequences per chip the same 2-layer step does not fit: 18.00 and 23.67 GiB — the compiler's memory is not
monotonic in the batch). A run that does not compile either way (128B) has
no prediction and says why.

**Two v6e runs, flash kept** (:data:`V6E_RUNS`): torchprime's Llama 3 8B on a v6e-4 and MaxText's Llama 3.1 8B on
a v6e-8 (tpu-recipes). Small slices compile without the retarget, so torch_xla's Pallas flash kernel stays in the
program; it carries no compiler estimate, and each row's prediction adds its derived roofline
(:attr:`shardlab.profile.step_time.StepTime.unpriced_roofline_s`) to the measured compute and exposed
communication, kept as a separate column (:func:`v6e_rows`). What each program does not reproduce is stated in the
run's ``differs``.

The compiles take minutes each: ``tools/published_runs.py`` stores their results in
``data/time/published_runs.json``; notebook 13 reads that file unless ``full_size=True``.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.formulas import hardware

CACHE_FILE = Path(__file__).resolve().parents[3] / "data" / "time" / "published_runs.json"
SEQ = 2048
VOCAB = 32000
BASE = {"emb": 2048, "heads": 16, "head_dim": 128, "mlp": 7168, "layers": 16}  # MaxText base.yml
SOURCE = ("MaxText configs/tpu/v5e/README.md (1x v5e-256 row) and configs/tpu/v5e/{16b,32b,64b,128b}.sh, "
          "github.com/AI-Hypercomputer/maxtext @ e591f30")


@dataclass(frozen=True)
class PublishedRun:
    """One published MaxText run on a v5e-256: the script's settings and its published throughput."""

    key: str
    scale: int  # global_parameter_scale
    per_device_batch: int
    mesh: tuple[tuple[str, int], ...]
    remat: str  # the script's remat_policy
    mfu: float  # published, fraction
    tflops_per_chip: float  # published TFLOP/s/chip
    topology: str = "v5e-256"


RUNS: dict[str, PublishedRun] = {
    "16b": PublishedRun("16b", 16, 6, (("fsdp", 256),), "full", 0.6110, 120),
    "32b": PublishedRun("32b", 32, 4, (("fsdp", 256),), "full", 0.6686, 132),
    "64b": PublishedRun("64b", 64, 2, (("fsdp", 256),), "full", 0.5990, 118),
    "128b": PublishedRun("128b", 128, 1, (("fsdp", 16), ("tensor", 16)), "qkv_proj_offloaded", 0.5606, 110),
}


def maxtext_widths(scale: int) -> dict[str, int]:
    """The model widths MaxText derives from ``global_parameter_scale`` (a power of two): its log2 is dealt round
    robin to (heads and MLP), emb, layers — each receiving a doubling per round.

    >>> maxtext_widths(16)
    {'emb': 4096, 'heads': 64, 'head_dim': 128, 'mlp': 28672, 'layers': 32}
    >>> maxtext_widths(1) == BASE
    True
    """
    k = int(math.log2(scale))
    if 2 ** k != scale:
        raise ValueError(f"scale={scale}: MaxText's global_parameter_scale must be a power of two")
    doublings = {"heads": 0, "emb": 0, "layers": 0}
    for i in range(k):
        doublings[("heads", "emb", "layers")[i % 3]] += 1
    return {"emb": BASE["emb"] << doublings["emb"], "heads": BASE["heads"] << doublings["heads"],
            "head_dim": BASE["head_dim"], "mlp": BASE["mlp"] << doublings["heads"],
            "layers": BASE["layers"] << doublings["layers"]}


def hf_config(key: str) -> dict[str, Any]:
    """The run's model as a Hugging Face Llama config (MaxText's llama2 decoder block: SwiGLU, RMSNorm, RoPE,
    untied output projection, no biases)."""
    w = maxtext_widths(RUNS[key].scale)
    return {"model_type": "llama", "hidden_size": w["emb"], "intermediate_size": w["mlp"],
            "num_attention_heads": w["heads"], "num_key_value_heads": w["heads"], "head_dim": w["head_dim"],
            "num_hidden_layers": w["layers"], "vocab_size": VOCAB, "max_position_embeddings": SEQ,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 10000.0,
            "attention_bias": False, "mlp_bias": False}


def matmul_params(key: str) -> int:
    """Weights MaxText's 6·N counts: every layer's q, k, v, o and the three MLP matrices, plus the output
    projection (the input embedding is a lookup, not a matmul)."""
    w = maxtext_widths(RUNS[key].scale)
    attn = w["emb"] * w["heads"] * w["head_dim"] * 4
    mlp = 3 * w["emb"] * w["mlp"]
    return w["layers"] * (attn + mlp) + w["emb"] * VOCAB


def maxtext_model_flops(key: str, layers: int | None = None) -> float:
    """Training FLOPs of one global step under MaxText's convention (see the module note); ``layers`` replaces the
    published layer count (for the scan-linearity route)."""
    from shardlab.profile.step_time import model_flops

    run, w = RUNS[key], maxtext_widths(RUNS[key].scale)
    n_layers = layers or w["layers"]
    per_layer = w["emb"] * w["heads"] * w["head_dim"] * 4 + 3 * w["emb"] * w["mlp"]
    tokens = run.per_device_batch * chips(key) * SEQ
    return model_flops(n_layers * per_layer + w["emb"] * VOCAB, tokens, layers=n_layers, seq=SEQ,
                       attn_dim=w["heads"] * w["head_dim"])


def chips(key: str) -> int:
    return math.prod(n for _, n in RUNS[key].mesh)


def result_key(key: str, layers: int | None, batch: int | None = None) -> str:
    """Cache names: ``16b`` (as published), ``16b.L2`` (2 layers), ``32b.L2.b2`` (2 layers, 2 sequences per chip)."""
    name = key if layers is None else f"{key}.L{layers}"
    return name if batch is None or batch == RUNS[key].per_device_batch else f"{name}.b{batch}"


def entries(cache: dict[str, Any], key: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The cached shallow compiles of run ``key`` that fit: (layers, per-chip batch) -> result."""
    out = {}
    for name, v in cache.items():
        m = re.fullmatch(rf"{re.escape(key)}\.L(\d+)(?:\.b(\d+))?", name)
        if m and v.get("step"):
            out[(int(m.group(1)), int(m.group(2) or RUNS[key].per_device_batch))] = v
    return out


def compile_run(key: str, num_layers: int | None = None, per_device_batch: int | None = None
                ) -> tuple[dict[str, Any], str | None]:
    """Compile run ``key`` for its slice through ``inspect``'s step (trace small, compile big) and price it, at
    ``num_layers`` / ``per_device_batch`` instead of the published ones when given. Returns (result dict, the
    compiled per-chip program text or None when it does not fit)."""
    from shardlab.inspect import step
    from shardlab.inspect.api import trace_config
    from shardlab.inspect.config import make_config
    from shardlab.profile import tpu

    run = RUNS[key]
    cfg = make_config(hf_config(key), model_name=f"maxtext-{key}", mesh=dict(run.mesh), topology=run.topology,
                      batch=(per_device_batch or run.per_device_batch) * chips(key), seq=SEQ, recompute="full",
                      layers="scan", attention="eager", num_layers=num_layers)
    cfg.validate()
    small = trace_config(cfg)
    t0 = time.time()
    if small is None:
        compiled = tpu.compile_program(step.build, cfg, run.topology, donate=cfg.donate, label=f"maxtext-{key}")
    else:
        compiled = tpu.compile_program(step.build, small[0], run.topology, donate=cfg.donate,
                                       label=f"maxtext-{key}", retarget=small[1])
    wall = time.time() - t0
    out: dict[str, Any] = {"run": key, "topology": run.topology, "mesh": dict(run.mesh), "layers": num_layers,
                           "per_device_batch": per_device_batch or run.per_device_batch,
                           "fits": compiled.fits, "compile_s": compiled.compile_s, "wall_s": wall,
                           "oom": compiled.oom.first_line if compiled.oom else "",
                           "oom_message": compiled.oom.message[:3000] if compiled.oom else ""}
    if compiled.memory is not None:
        out["peak_bytes"] = getattr(compiled.memory, "peak_bytes", None)
    if compiled.module is None:
        return out, None
    out.update(price(compiled.module, key))
    out["program_flops"] = float(compiled.cost.get("flops", 0.0))
    return out, compiled.hlo_text


def price(module: Any, key: str) -> dict[str, Any]:
    """The compiled program of run ``key`` priced: the step's terms, its bound, one execution of the scanned
    body(ies) split into matmul-bound kernels (FLOPs / peak ≥ bytes / HBM), the attention's [s, s] kernels and the
    rest, each beside its roofline; the costliest kernels; every collective."""
    from shardlab.profile.step_time import step_time

    run = RUNS[key]
    chip = hardware.slice_chips(run.topology)[0]
    t = step_time(module, run.topology, dict(run.mesh))
    out: dict[str, Any] = {"step": t.as_dict(), "hbm_bound_s": t.hbm_bound_s(chip), "bound": t.bound(chip)}
    body = [k for k in t.kernels if k.runs > 1]
    out["loop_body_s"] = sum(k.cycles for k in body) / t.clock_hz  # one execution of the scanned body(ies)
    out["loop_runs"] = sorted({k.runs for k in body})
    split: dict[str, list[float]] = {"matmul": [0.0, 0.0], "attention [s, s]": [0.0, 0.0], "other": [0.0, 0.0]}
    for k in body:
        square = any(i.shape and len(i.shape[0].dims) >= 2 and tuple(i.shape[0].dims[-2:]) == (SEQ, SEQ)
                     for i in module.executed(k.name))
        part = "attention [s, s]" if square else "matmul" if k.bound(chip) == "compute" else "other"
        split[part][0] += k.cycles / t.clock_hz
        split[part][1] += k.roofline_s(chip) / k.runs
    out["body_split"] = {name: {"estimate_s": v[0], "roofline_s": v[1]} for name, v in split.items()}
    out["kernels_top"] = [{"name": k.name, "s": k.seconds(t.clock_hz), "runs": k.runs, "flops": k.flops,
                           "bytes": k.bytes} for k in sorted(t.kernels, key=lambda k: -k.seconds(t.clock_hz))[:8]]
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}  # the collectives, by (op, axes, group, runs, async)
    for c in t.collectives:
        g = groups.setdefault((c.op, c.mesh_axes, c.group_size, c.runs, c.async_), {
            "op": c.op, "axes": c.mesh_axes, "group": c.group_size, "runs": c.runs, "async": c.async_,
            "count": 0, "wire_bytes": 0, "s": 0.0, "exposed_s": 0.0})
        g["count"] += 1
        g["wire_bytes"] += c.wire_bytes
        g["s"] += c.seconds
        g["exposed_s"] += c.exposed_s
    out["collectives"] = list(groups.values())
    return out


def reprice(hlo_dir: Path, path: Path = CACHE_FILE) -> list[str]:
    """Re-price every cached result whose compiled program was kept (``<name>.hlo.txt.gz`` in ``hlo_dir``) with
    today's :func:`price`, without recompiling. Returns the names updated."""
    import gzip

    from shardlab.profile.hlo import parse_hlo

    data, done = load(path), []
    for name, res in data.items():
        f = hlo_dir / f"{name}.hlo.txt.gz"
        if res.get("fits") and f.exists():
            with gzip.open(f, "rt") as fh:
                res.update(price(parse_hlo(fh.read()), res["run"]))
            done.append(name)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return done


def load(path: Path = CACHE_FILE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def store(name: str, result: dict[str, Any], path: Path = CACHE_FILE) -> None:
    """Merge one result into the cache file (other runs kept)."""
    data = load(path)
    data[name] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------------ the table
TIME_FIELDS = ("compute_s", "comm_s", "exposed_comm_s", "step_s")


def _along_layers(e: dict[tuple[int, int], dict[str, Any]], batch: int, layers: int
                  ) -> tuple[dict[str, float], tuple[int, int]] | None:
    depths = sorted(d for d, b in e if b == batch)
    if len(depths) < 2:
        return None
    a, c = depths[0], depths[-1]
    lo, hi = e[(a, batch)], e[(c, batch)]
    attn = "attention [s, s]"
    values = {f: (lo["step"][f], hi["step"][f]) for f in TIME_FIELDS}
    if lo.get("body_split") and hi.get("body_split"):  # per layer: the same at both depths
        values["attention_per_layer_s"] = (lo["body_split"][attn]["estimate_s"], hi["body_split"][attn]["estimate_s"])
    out = {f: v[0] + (v[1] - v[0]) * (layers - a) / (c - a) for f, v in values.items()}
    if "attention_per_layer_s" in values:
        out["attention_per_layer_s"] = values["attention_per_layer_s"][1]
        mm = hi["body_split"]["matmul"]
        out["matmul_efficiency"] = mm["roofline_s"] / mm["estimate_s"]  # roofline / the compiler's estimate
    return out, (a, c)


def full_or_extrapolated(cache: dict[str, Any], key: str) -> tuple[dict[str, float], str] | None:
    """The run's step terms (seconds per chip): compiled as published when cached; else extrapolated from shallower
    scanned compiles by the linearity of the scanned layer body — every term affine in the layer count, two depths
    give the line; and when the published per-chip batch does not fit even at 2 layers (eager attention's [s, s]
    tensors), along a second line through two smaller per-chip batches (every kernel's work grows with the tokens;
    FSDP's collectives do not). None when none of it is cached."""
    run = RUNS[key]
    layers = maxtext_widths(run.scale)["layers"]
    full = cache.get(key)
    if full and full.get("step"):
        return {f: full["step"][f] for f in TIME_FIELDS}, f"compiled at {layers} layers"
    e = entries(cache, key)
    got = _along_layers(e, run.per_device_batch, layers)
    if got is not None:
        return got[0], f"extrapolated from {got[1][0]} and {got[1][1]} layers (scan)"
    lines = {b: _along_layers(e, b, layers) for b in sorted({b for _, b in e})}
    lines = {b: v for b, v in lines.items() if v is not None}
    if len(lines) < 2:
        return None
    b0, b1 = min(lines), max(lines)
    t0, t1 = lines[b0][0], lines[b1][0]
    terms = {f: t0[f] + (t1[f] - t0[f]) * (run.per_device_batch - b0) / (b1 - b0) for f in t0 if f in t1}
    if "matmul_efficiency" in t1:  # a ratio, not a time: the larger batch's
        terms["matmul_efficiency"] = t1["matmul_efficiency"]
    terms["exposed_comm_s"] = max(0.0, terms["exposed_comm_s"])
    terms["step_s"] = terms["compute_s"] + terms["exposed_comm_s"]
    return terms, (f"extrapolated from {lines[b0][1][0]} and {lines[b0][1][1]} layers (scan) at {b0} and {b1} "
                   f"sequences per chip ({run.per_device_batch} needs more HBM than a chip has, even at 2 layers)")


def causal_attention_s(key: str) -> float:
    """One layer's causal attention per chip at the bf16 roofline, as a flash kernel would run it: the score and
    value matmuls (4·s·heads·head_dim FLOPs per token forward, half of it masked) run forward, recomputed and
    backward (2x): 4 x 2·s·heads·head_dim x tokens per chip / peak."""
    run, w = RUNS[key], maxtext_widths(RUNS[key].scale)
    chip, n = hardware.slice_chips(run.topology)
    tokens = run.per_device_batch * chips(key) * SEQ / n * (math.prod(k for a, k in run.mesh if a == "tensor") or 1)
    heads = w["heads"] / (math.prod(k for a, k in run.mesh if a == "tensor") or 1)
    return 4 * 2 * SEQ * heads * w["head_dim"] * tokens / chip.bf16_peak_flops_per_s


def _deepest(cache: dict[str, Any], key: str) -> dict[str, Any]:
    """The deepest, largest-batch shallow compile of ``key`` (its bound stands for the run's)."""
    e = entries(cache, key)
    return e[max(e, key=lambda lb: (lb[1], lb[0]))] if e else {}


def _oom_short(message: str) -> str:
    """The compiler's out-of-memory line, shortened: "Used 24.83G of 15.75G hbm" or the allocation it refused."""
    m = re.search(r"Used [\d.]+\w? of [\d.]+\w? hbm", message) or re.search(
        r"Allocation \(size=(\d+)\).*?shape = '([^']+)'", message)
    if m is None:
        return message[:80]
    return m.group(0) if m.lastindex is None else f"one {m.group(2)} of {int(m.group(1)) / 2**30:.0f} GiB"


def table_rows(cache: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per published run: predicted step, tokens/s/chip, MFU beside the published MFU and their ratio."""
    rows = []
    for key, run in RUNS.items():
        got = full_or_extrapolated(cache, key)
        chip, n = hardware.slice_chips(run.topology)
        mf = maxtext_model_flops(key)
        published_step = mf / (run.mfu * n * chip.bf16_peak_flops_per_s)
        row: dict[str, Any] = {"run": key, "params (B)": round(matmul_params(key) / 1e9, 1),
                               "mesh": " x ".join(f"{a} {k}" for a, k in run.mesh),
                               "batch / chip": run.per_device_batch, "published MFU": run.mfu,
                               "published step (s)": published_step}
        if got is None:
            failed = [(name, v) for name, v in sorted(cache.items()) if v.get("run") == key and not v.get("fits")]
            how = "not compiled" if not failed else "does not fit: " + "; ".join(
                f"{v.get('layers') or 'all'} layers, {v.get('per_device_batch', run.per_device_batch)} per chip: "
                f"{_oom_short(v.get('oom', ''))}" for _, v in failed)
            row.update({"how": how, "predicted step (s)": None, "predicted MFU": None, "ratio": None})
        else:
            terms, how = got
            full = cache.get(key) if (cache.get(key) or {}).get("step") else None
            row.update({"how": how, "compute (s)": terms["compute_s"], "wire (s)": terms["comm_s"],
                        "exposed (s)": terms["exposed_comm_s"], "predicted step (s)": terms["step_s"],
                        "tokens / s / chip": run.per_device_batch * SEQ / terms["step_s"],
                        "predicted MFU": mf / (terms["step_s"] * n * chip.bf16_peak_flops_per_s),
                        "bound": (full or _deepest(cache, key)).get("bound")})
            row["ratio"] = row["predicted MFU"] / run.mfu
            if "attention_per_layer_s" in terms:  # what-if: the eager [s, s] kernels as a causal kernel at roofline
                w = maxtext_widths(run.scale)
                step = terms["step_s"] - w["layers"] * (terms["attention_per_layer_s"] - causal_attention_s(key))
                row["attention [s, s] per layer (s)"] = terms["attention_per_layer_s"]
                row["step, causal attention at roofline (s)"] = step
                row["ratio, causal attention at roofline"] = mf / (step * n * chip.bf16_peak_flops_per_s) / run.mfu
                row["why"] = (f"eager [s, s] kernels {w['layers'] * terms['attention_per_layer_s']:.1f} s of the step "
                              f"(a causal kernel at its FLOP roofline: {w['layers'] * causal_attention_s(key):.1f} s); "
                              f"exposed communication {terms['exposed_comm_s']:.2f} s (the gradients' all-reduces run "
                              "synchronously in the layer loop); the matmul kernels at "
                              f"{100 * terms.get('matmul_efficiency', float('nan')):.0f} % of peak by the compiler's "
                              "estimate")
        rows.append(row)
    return rows


def linearity(cache: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per run and per-chip batch compiled at two depths a < b: (compute(b) − compute(a), (b − a) × one execution
    of the scanned body(ies)). Nearly equal: the depth also changes work outside the loop — the optimizer's update
    of the stacked [L, ...] weights — which the line through the two depths carries too (measured: 0.17 % on 16B)."""
    out = {}
    for key in RUNS:
        e = entries(cache, key)
        for batch in sorted({b for _, b in e}):
            depths = sorted(d for d, b in e if b == batch)
            if len(depths) >= 2:
                lo, hi = e[(depths[0], batch)], e[(depths[-1], batch)]
                name = key if batch == RUNS[key].per_device_batch else f"{key}.b{batch}"
                out[name] = (hi["step"]["compute_s"] - lo["step"]["compute_s"],
                             (depths[-1] - depths[0]) * lo["loop_body_s"])
    return out


def batch_line_check(cache: dict[str, Any], key: str = "16b", layers: int = 2) -> dict[str, Any] | None:
    """The batch line tested where the published batch does fit: run ``key`` at ``layers`` compiled at two smaller
    per-chip batches, each term extrapolated to the published batch, beside the compile at that batch. None until
    the three compiles are cached."""
    e, run = entries(cache, key), RUNS[key]
    small = sorted(b for d, b in e if d == layers and b < run.per_device_batch)
    if len(small) < 2 or (layers, run.per_device_batch) not in e:
        return None
    b0, b1 = small[0], small[-1]
    lo, hi, real = (e[(layers, b)]["step"] for b in (b0, b1, run.per_device_batch))
    line = {f: lo[f] + (hi[f] - lo[f]) * (run.per_device_batch - b0) / (b1 - b0) for f in TIME_FIELDS}
    line["exposed_comm_s"] = max(0.0, line["exposed_comm_s"])
    line["step_s"] = line["compute_s"] + line["exposed_comm_s"]
    return {"run": key, "layers": layers, "from batches": (b0, b1), "to batch": run.per_device_batch,
            **{f"{f} (line)": line[f] for f in TIME_FIELDS}, **{f"{f} (compiled)": real[f] for f in TIME_FIELDS},
            "step error": line["step_s"] / real["step_s"] - 1}


# ------------------------------------------------------------------------------------------------ v6e runs
# Two published Llama 8B runs on Trillium (v6e) slices small enough to compile as published (no retarget), so the
# Pallas flash kernel is kept. XLA:TPU gives it no estimate: each row's predicted step adds the kernels' derived
# roofline (``StepTime.unpriced_roofline_s``: causal attention FLOPs / bf16 peak, a lower bound) to the measured
# compute and the exposed communication — the three terms are kept apart in the row.
LLAMA_8B = {"layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128,
            "vocab": 128256}  # Llama 3 / 3.1 8B (config.json; 3.1 differs only in rope scaling and context length)


@dataclass(frozen=True)
class PublishedV6eRun:
    """One published Llama 8B training step on a v6e slice, and inspect's settings for it."""

    key: str
    source: str
    topology: str
    mesh: tuple[tuple[str, int], ...]
    batch: int  # global sequences per step
    seq: int
    optimizer: str  # inspect's --optimizer
    optimizer_dtype: str  # inspect's --optimizer-dtype
    recompute: str  # inspect's --recompute
    published_step_s: float
    published_mfu: float | None  # as published (None: not published)
    differs: str  # what inspect's program does not reproduce

    @property
    def chips(self) -> int:
        return math.prod(n for _, n in self.mesh)


V6E_RUNS: dict[str, PublishedV6eRun] = {
    "torchprime_8b_v6e4": PublishedV6eRun(
        "torchprime_8b_v6e4", "torchprime e2e_testing/step_time_bounds.yaml (llama-3-8b, v6e-4: mean step)",
        "v6e-4", (("fsdp", 4),), 8, 8192, "adafactor", "bf16", "full", 2.7352, None,
        "the same program family (torch_xla, flash, scan, full remat, Adafactor on bf16 weights); torchprime's "
        "libtpu flags and its own scan / remat wrappers are not reproduced"),
    "maxtext_8b_v6e8": PublishedV6eRun(
        "maxtext_8b_v6e8", "tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md (step, MFU)",
        "v6e-8", (("fsdp", 8),), 24, 8192, "adamw", "fp32", "offload", 3.443, 0.450,
        "MaxText (JAX) keeps fp32 weights and AdamW state (its default weight_dtype is float32; the recipe's own "
        "override, if any, not checked); inspect keeps bf16 weights, an fp32 master and fp32 state. "
        "The recipe's remat offloads more of each layer's activations to host; inspect's offload keeps only the "
        "layer inputs on host and recomputes the rest. MaxText's own kernels, sharding annotations and libtpu "
        "flags are not reproduced"),
}


def llama8b_matmul_params() -> int:
    """Weights the 6·N convention counts: every layer's q, k, v, o and MLP matrices, plus the output projection."""
    w = LLAMA_8B
    attn = w["hidden"] * w["head_dim"] * (2 * w["heads"] + 2 * w["kv_heads"])
    return w["layers"] * (attn + 3 * w["hidden"] * w["ffn"]) + w["hidden"] * w["vocab"]


def v6e_model_flops(key: str, causal: bool = True) -> float:
    """Training FLOPs of one global step of run ``key`` (6·N·tokens + attention; see ``step_time.model_flops``)."""
    from shardlab.profile.step_time import model_flops

    run, w = V6E_RUNS[key], LLAMA_8B
    return model_flops(llama8b_matmul_params(), run.batch * run.seq, layers=w["layers"], seq=run.seq,
                       attn_dim=w["heads"] * w["head_dim"], causal=causal)


def compile_v6e(key: str) -> dict[str, Any]:
    """Compile run ``key`` with ``inspect`` as published (Llama 3 8B preset, flash attention, scanned layers) and
    price it: the result stored in the cache (numbers only, no program). Sets up this process's device world with
    one CPU device per chip (so one v6e run per process)."""
    from shardlab import runtime

    run = V6E_RUNS[key]
    runtime.setup(num_devices=run.chips)
    from shardlab.inspect import step
    from shardlab.inspect.api import run as inspect_run
    from shardlab.inspect.config import make_config
    from shardlab.profile import tpu

    cfg = make_config("llama-3-8b", mesh=dict(run.mesh), topology=run.topology, batch=run.batch, seq=run.seq,
                      attention="flash", layers="scan", recompute=run.recompute, optimizer=run.optimizer,
                      optimizer_dtype=run.optimizer_dtype)
    t0 = time.time()
    with tpu.quiet_libtpu():
        r = inspect_run(cfg)
    module = None
    if r.fits:
        with tpu.quiet_libtpu():
            module = tpu.compile_built(step.build(cfg), cfg.topology, label=key).module  # the compile cache's
    out = v6e_result(key, r.fits, r.totals, r.compile_s, r.oom_message, module)
    out["wall_s"] = time.time() - t0
    return out


def v6e_result(key: str, fits: bool, totals: dict[str, int], compile_s: float, oom_message: str,
               module: Any | None) -> dict[str, Any]:
    """The cached result of run ``key`` from inspect's memory totals and the compiled per-chip program (priced by
    :func:`shardlab.profile.step_time.step_time`; None when it does not fit)."""
    from shardlab.profile.step_time import step_time

    run = V6E_RUNS[key]
    out: dict[str, Any] = {"run": key, "topology": run.topology, "mesh": dict(run.mesh), "fits": fits,
                           "checked_gib": totals["checked"] / 2**30, "peak_gib": totals["peak"] / 2**30,
                           "capacity_gib": totals["capacity"] / 2**30,
                           "compile_s": compile_s, "oom": oom_message[:3000] if not fits else ""}
    if module is not None:
        chip = hardware.slice_chips(run.topology)[0]
        t = step_time(module, run.topology, dict(run.mesh))
        out.update({"step": t.as_dict(), "hbm_bound_s": t.hbm_bound_s(chip), "bound": t.bound(chip)})
    return out


def v6e_rows(cache: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per published v6e run: measured compute + exposed communication + the flash kernels' derived
    roofline = predicted step, beside the published step; ratio = published / predicted (= predicted MFU over
    published MFU, as the v5e rows)."""
    rows = []
    for key, run in V6E_RUNS.items():
        chip, n = hardware.slice_chips(run.topology)
        row: dict[str, Any] = {"run": key, "slice": run.topology,
                               "mesh": " x ".join(f"{a} {k}" for a, k in run.mesh),
                               "batch / chip": run.batch / n, "published step (s)": run.published_step_s,
                               "published MFU": run.published_mfu}
        res = cache.get(key)
        if not res or not res.get("fits") or not res.get("step"):
            how = "not compiled" if not res else f"does not fit: {_oom_short(res.get('oom', ''))}"
            row.update({"how": how, "predicted step (s)": None, "ratio": None, "why": run.differs})
            rows.append(row)
            continue
        st = res["step"]
        predicted = st["step_s"] + st["unpriced_roofline_s"]
        mf = v6e_model_flops(key)
        row.update({"how": "compiled as published", "compute (s)": st["compute_s"],
                    "exposed (s)": st["exposed_comm_s"], "flash, derived roofline (s)": st["unpriced_roofline_s"],
                    "predicted step (s)": predicted, "ratio": run.published_step_s / predicted,
                    "predicted MFU": mf / (predicted * n * chip.bf16_peak_flops_per_s),
                    "bound": res.get("bound"),
                    # the verdict rests on the peak (arguments + outputs not donated + temporaries), beside what
                    # the compiler's capacity check counts
                    "HBM peak / checked (GiB)": f"{res['peak_gib']:.2f} / {res['checked_gib']:.2f} of "
                                                f"{res['capacity_gib']:.2f}"})
        row["why"] = (f"compiler's kernels {st['compute_s']:.2f} s ({res.get('hbm_bound_s', float('nan')):.2f} s "
                      f"of it in HBM-bound kernels), exposed communication {st['exposed_comm_s']:.3f} s, flash "
                      f"kernels {st['unpriced_roofline_s']:.2f} s at their FLOP roofline (a lower bound: the "
                      f"compiler gives no estimate); {run.differs}")
        rows.append(row)
    return rows
