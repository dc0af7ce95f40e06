"""Step time, tokens/s/chip, MFU and the dominant bound of an inspected step: the compiler's and the planner's.

Design note
-----------
The compiler's side prices the compiled per-chip program with :func:`shardlab.profile.step_time.step_time`
(Σ the kernels' ``estimated_cycles`` × loop trip counts over the chip's clock, ring β time of every collective on
the torus axes its group spans, the exposed part as the schedule overlaps it; step = compute + exposed). The
planner's side is its roofline: FLOPs / peak against wire bytes / ICI egress, perfect overlap
(``Plan.roofline``). Both MFUs use the same model FLOPs, MaxText's convention
(:func:`model_flops_of`: 6 × the matmul weights a token passes — every layer's 2-D weights, MoE experts scaled by
top-k / experts, plus the output projection; not the input embedding lookup — × tokens, plus causal attention
6 · seq · heads · head_dim per token and layer), so the two MFUs differ only by their step times.

A generation without a clock in ``data/hardware`` (v4: its compile writes no scheduler dump to read one from)
gets ``"no clock"`` instead of a number; an out-of-memory step has no program and gets no compiler time.

Shapes: everything is per step; ``*_s`` seconds per chip, ``tokens_per_s_per_chip`` = batch·seq / (step · chips).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardlab.formulas import hardware
from shardlab.profile import step_time as st
from shardlab.report.html import esc, table

if TYPE_CHECKING:  # (the result type is api's InspectResult; api imports this module, so it is not named here)
    from shardlab.inspect.config import InspectConfig, Layout

CONVENTION = ("MFU = model FLOPs / (step x chips x bf16 peak); model FLOPs: MaxText's convention, 6 x matmul "
              "weights per token (layers' 2-D weights, MoE experts x top-k/experts, output projection; not the "
              "input embedding) x tokens + causal attention 6·seq·heads·head_dim per token and layer")
OUTPUT_HEADS = ("lm_head", "embed_out")  # module paths of the output projection (tied: the embedding's 2nd holder)


def model_flops_of(lay: Layout, batch: int, seq: int) -> float:
    """One global step's model FLOPs for the layout's model (see the module note)."""
    c = lay.hf_config
    experts = getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or 0
    top_k = getattr(c, "num_experts_per_tok", None) or 0
    n = 0.0
    for p in lay.params:
        head = any(path in OUTPUT_HEADS for path, _ in p.holders)
        if head:
            n += p.numel
        elif p.layer is not None and len(p.shape) >= 2:
            share = top_k / experts if experts and top_k and ".experts" in p.name else 1.0
            n += p.numel * share  # [E, ...] or one expert's weights: top-k of E experts per token
    heads = getattr(c, "num_attention_heads", 0) or 0
    head_dim = getattr(c, "head_dim", None) or (c.hidden_size // heads if heads else 0)
    return st.model_flops(int(n), batch * seq, layers=lay.num_layers, seq=seq, attn_dim=heads * head_dim)


def time_summary(module: Any, cfg: InspectConfig, plan: Any, lay: Layout) -> dict[str, Any]:
    """The result's ``time`` entry: ``compiler`` and ``planner`` sides (each None when unavailable, with ``why``)."""
    chip, chips = hardware.slice_chips(cfg.topology)
    mf = model_flops_of(lay, cfg.batch, cfg.seq)
    tokens = cfg.batch * cfg.seq
    peak = chip.bf16_peak_flops_per_s
    out: dict[str, Any] = {"model_flops": mf, "tokens": tokens, "chips": chips, "peak_flops_per_s": peak,
                           "convention": CONVENTION, "compiler": None, "planner": None, "why": []}
    if module is None:
        out["why"].append("compiler: no program (out of memory)")
    else:
        try:
            st.clock_hz(cfg.topology)
        except ValueError as exc:  # no clock_hz for this generation
            out["why"].append(f"compiler: no clock ({exc})")
        else:
            t = st.step_time(module, cfg.topology, cfg.mesh_dict)
            out["compiler"] = {"step_s": t.step_s, "compute_s": t.compute_s, "comm_s": t.comm_s,
                               "exposed_comm_s": t.exposed_comm_s, "comm_by_axis": t.comm_by_axis,
                               "hbm_bound_s": t.hbm_bound_s(chip), "roofline_compute_s": t.roofline_compute_s,
                               "tokens_per_s_per_chip": tokens / (t.step_s * chips),
                               "mfu": t.mfu(mf, chips, chip), "bound": t.bound(chip),
                               "unknown_runs": t.unknown_runs, "unpriced": t.unpriced,
                               "unpriced_roofline_s": t.unpriced_roofline_s}
            if t.unpriced:
                out["why"].append(f"compiler: {len(t.unpriced)} Pallas kernel(s) (flash attention) carry no estimate "
                                  "from XLA:TPU: their time is missing from compute and step (a lower bound); "
                                  f"derived (roofline) for the flash kernels: +{t.unpriced_roofline_s:.4g} s "
                                  "(causal FLOPs / bf16 peak)")
    if plan is None:
        out["why"].append("planner: cannot model this run")
    else:
        rl = plan.roofline
        out["planner"] = {"step_s": rl.step_s, "compute_s": rl.compute_s, "comm_s": rl.comm_s,
                          "tokens_per_s_per_chip": tokens / (rl.step_s * chips),
                          "mfu": mf / (rl.step_s * chips * peak), "bound": rl.bound}
    return out


def _rows(tm: dict[str, Any]) -> list[list[str]]:
    c, p = tm.get("compiler") or {}, tm.get("planner") or {}
    no_c = "no clock" if any("no clock" in w for w in tm.get("why", [])) else "–"

    def sec(d: dict[str, Any], k: str, none: str = "–") -> str:
        return f"{d[k] * 1e3:.3f} ms" if d.get(k) is not None else none

    def ratio(k: str) -> str:
        return f"{c[k] / p[k]:.2f}" if c.get(k) and p.get(k) else "–"

    rows = [["step", sec(c, "step_s", no_c), sec(p, "step_s"), ratio("step_s")],
            ["compute", sec(c, "compute_s", no_c), sec(p, "compute_s"), ratio("compute_s")],
            ["communication (wire, all axes)", sec(c, "comm_s", no_c), sec(p, "comm_s"), ratio("comm_s")],
            ["exposed communication", sec(c, "exposed_comm_s", no_c), "– (perfect overlap)", "–"]]
    for axis, s in sorted((c.get("comm_by_axis") or {}).items()):
        rows.append([f"  wire on {axis}", f"{s * 1e3:.3f} ms", "–", "–"])
    rows += [["tokens / s / chip", f"{c['tokens_per_s_per_chip']:,.0f}" if c else no_c,
              f"{p['tokens_per_s_per_chip']:,.0f}" if p else "–", ratio("tokens_per_s_per_chip")],
             ["MFU", f"{100 * c['mfu']:.1f} %" if c else no_c, f"{100 * p['mfu']:.1f} %" if p else "–",
              ratio("mfu")],
             ["dominant bound", c.get("bound", no_c), p.get("bound", "–"), ""]]
    return rows


HEADERS = ["per step, per chip", "compiler", "planner", "ratio"]


def text_lines(r: Any, _table: Callable[[list[str], list[list[str]]], str]) -> list[str]:
    """The terminal section (empty when the result carries no time entry), tables drawn by ``_table``."""
    tm = getattr(r, "time", None)
    if not tm:
        return []
    lines = ["", "time per step (compiler: the program's kernel estimates and collectives; planner: its roofline)",
             _table(HEADERS, _rows(tm)), f"{tm['convention']}"]
    lines += [f"  {w}" for w in tm.get("why", [])]
    return lines


def html_section(r: Any) -> list[str]:
    tm = getattr(r, "time", None)
    if not tm:
        return []
    return ["<h2>Time per step</h2>", table(HEADERS, [[esc(x) for x in row] for row in _rows(tm)]),
            f"<p class='muted'>compiler: Σ the kernels' estimated cycles × loop trips over the chip's clock, each "
            f"collective's ring wire time on its torus axes, the exposed part as the schedule overlaps it; planner: "
            f"its roofline (perfect overlap). {esc(tm['convention'])}. "
            f"{esc('; '.join(tm.get('why', [])))}</p>"]
