"""Step time read from the compiled XLA:TPU program, each term against an oracle that does not come from it.

- compute: a bf16 matmul's kernel estimate against its FLOP roofline (2·m·n·k / chips / the published bf16 peak,
  arithmetic written here); a scanned stack against the same stack unrolled (the trip count must multiply the
  loop body's kernels, or the scan would cost one layer);
- communication: an all-gather's wire time against the ring model worked out by hand from the published ICI
  figure and the slice's torus (v6e-8 is 2 x 4: a group of 8 spans both axes);
- the clock: the figure in data/hardware against the compiler's own scheduler dump (a JAX-only child process);
- mesh axes: a collective over the "tensor" axis of a (data, tensor) mesh is priced on "tensor".
Sizes are small: each compile takes about a second.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def env(xla_world):  # type: ignore[no-untyped-def]
    import torch
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime
    from shardlab.profile import step_time, tpu

    return torch, xs, runtime, step_time, tpu


def _matmul(env, m: int, k: int, n: int, spec_b: tuple):  # type: ignore[no-untyped-def]
    torch, xs, runtime, _, _ = env
    mesh = runtime.mesh((8,), ("fsdp",))
    a = torch.zeros(m, k, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(a, mesh, ("fsdp", None))
    b = torch.zeros(k, n, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(b, mesh, spec_b)
    return a @ b


@pytest.mark.parametrize("topology,peak", [("v5e-8", 197e12), ("v6e-8", 918e12)])
def test_matmul_estimate_tracks_the_flop_roofline(env, topology: str, peak: float) -> None:  # type: ignore[no-untyped-def]
    _, _, _, st, tpu = env
    m = k = n = 8192  # per chip [1024, 8192] @ [8192, 8192]: compute-bound on both (FLOPs/peak > bytes/HBM BW)
    out = tpu.compile_tensors([_matmul(env, m, k, n, (None, None))], topology)  # rows split: no collective
    t = st.step_time(out.module, topology)
    flops = 2 * m * k * n // 8  # per chip
    assert sum(kk.flops * kk.runs for kk in t.kernels) == flops  # the dot's FLOPs read from the program
    assert t.collectives == [] and t.step_s == t.compute_s
    ratio = t.compute_s / (flops / peak)
    assert 1.0 <= ratio <= 1.3, ratio  # measured 1.04 (v5e) and 1.19 (v6e): never faster than the MXU peak


def test_scan_multiplies_the_loop_body(env) -> None:  # type: ignore[no-untyped-def]
    torch, xs, runtime, st, tpu = env
    from torch_xla.experimental.scan import scan

    h = 1024
    mesh = runtime.mesh((8,), ("fsdp",))

    def priced(layers: int):  # type: ignore[no-untyped-def]
        x = torch.zeros(2048, h, dtype=torch.bfloat16).to(runtime.device())
        xs.mark_sharding(x, mesh, ("fsdp", None))
        w = torch.zeros(layers, h, h, dtype=torch.bfloat16).to(runtime.device())
        out, _ = scan(lambda c, wi: (torch.tanh(c @ wi), None), x, w)  # [2048, h] per layer
        return st.step_time(tpu.compile_tensors([out], "v6e-8").module, "v6e-8")

    six, twelve = priced(6), priced(12)
    for layers, t in ((6, six), (12, twelve)):
        assert t.unknown_runs == []
        assert max(k.runs for k in t.kernels) == layers  # the body's kernels run once per layer
        assert sum(k.flops * k.runs for k in t.kernels) == layers * 2 * (2048 // 8) * h * h  # per chip, by hand
    body = sum(k.cycles for k in six.kernels if k.runs == 6) / six.clock_hz  # one iteration
    assert twelve.compute_s - six.compute_s == pytest.approx(6 * body, rel=1e-9)  # six more iterations
    assert 1.6 < twelve.compute_s / six.compute_s <= 2.0  # the loop dominates; a fixed prologue/epilogue


def test_all_gather_wire_time_by_hand(env) -> None:  # type: ignore[no-untyped-def]
    _, _, _, st, tpu = env
    out = tpu.compile_tensors([_matmul(env, 1024, 8192, 8192, ("fsdp", None))], "v6e-8")
    t = st.step_time(out.module, "v6e-8", {"fsdp": 8})
    gathers = [c for c in t.collectives if c.op == "all-gather"]
    assert len(gathers) == 1
    shard = 8192 // 8 * 8192 * 2  # one chip's [1024, 8192] bf16 block of b
    # v6e: 800 GB/s bidirectional per chip over 4 links = 200 GB/s a link; a 2x4 slice's group of 8 spans both
    # torus axes: two bidirectional rings, 2 x 200 GB/s out of each chip; 7 shards to receive.
    assert gathers[0].torus_axes == 2 and gathers[0].mesh_axes == "fsdp"
    assert gathers[0].seconds == pytest.approx(7 * shard / (2 * 200e9), rel=1e-12)
    assert t.comm_by_axis == {"fsdp": pytest.approx(gathers[0].seconds)}
    assert t.compute_s <= t.step_s <= t.serial_s


def test_collective_priced_on_its_mesh_axis(env) -> None:  # type: ignore[no-untyped-def]
    torch, xs, runtime, st, tpu = env
    mesh = runtime.mesh((2, 4), ("data", "tensor"))
    x = torch.zeros(256, 1024, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(x, mesh, ("data", "tensor"))
    w = torch.zeros(1024, 512, dtype=torch.bfloat16).to(runtime.device())
    xs.mark_sharding(w, mesh, ("tensor", None))  # row-parallel: partial sums over "tensor" -> all-reduce
    out = tpu.compile_tensors([x @ w], "v5e-8")
    t = st.step_time(out.module, "v5e-8", {"data": 2, "tensor": 4})
    assert {c.mesh_axes for c in t.collectives} == {"tensor"}
    assert all(c.group_size == 4 for c in t.collectives)


@pytest.mark.parametrize("topology", ["v5e-8", "v6e-8"])
def test_clock_is_the_schedulers(env, topology: str) -> None:  # type: ignore[no-untyped-def]
    from shardlab.formulas import hardware
    from shardlab.profile.schedule import schedule_stats

    _, _, _, st, _ = env
    stats = schedule_stats([_matmul(env, 1024, 8192, 8192, ("fsdp", None))], topology)
    assert stats is not None  # the all-gather makes the scheduler write its dump
    data = json.loads((hardware.hardware_dir() / f"{topology.split('-')[0]}.json").read_text())
    assert stats.cycles_per_microsecond * 1e6 == data["clock_hz"] == st.clock_hz(topology)
    assert stats.total_cycles > 0 and set(stats.wasted_cycles) >= {"all_gather"}


def test_parse_schedule_reads_the_entry_block() -> None:
    from shardlab.profile.schedule import parse_schedule

    text = ("computation_schedules {\n scheduler_statistics {\n all_gather_wasted_cycles: 5\n total_cycles: 9\n }\n"
            "}\ncomputation_schedules {\n scheduler_statistics {\n all_gather_wasted_cycles: 1500\n"
            " all_reduce_wasted_cycles: 3000\n total_wasted_cycles: 4500\n total_cycles: 6000\n }\n"
            " cycles_per_microsecond: 1500\n}\n")
    s = parse_schedule(text)
    assert (s.cycles_per_microsecond, s.total_cycles) == (1500, 6000.0)
    assert s.wasted_cycles == {"all_gather": 1500.0, "all_reduce": 3000.0}
    assert s.exposed_comm_s == pytest.approx(3e-6) and s.total_s == pytest.approx(4e-6)
    with pytest.raises(ValueError, match="scheduler_statistics"):
        parse_schedule("nothing")


def test_flash_kernels_get_a_derived_roofline(env) -> None:  # type: ignore[no-untyped-def]
    """torch_xla's Pallas flash kernels carry no estimate: each gets causal FLOPs / bf16 peak, apart from compute.
    Oracle, by hand: per layer a causal forward is 2 matmuls (q·kᵀ, p·v) of 2·b·h·s²·d, halved by the mask —
    4·b·h·s²·d/2 — run twice under full recompute (forward, then again in the backward), the dq kernel 3 matmuls
    (6·b·h·s²·d/2) and the dk/dv kernel 4 (8·b·h·s²·d/2); kv heads repeated to the query heads; v6e 918 TFLOP/s."""
    from shardlab.inspect import step
    from shardlab.inspect.config import make_config

    _, _, _, st, tpu = env
    layers, batch, s, heads, d = 2, 8, 512, 4, 32
    cfg = make_config("llama-3-8b", mesh="fsdp=8", topology="v6e-8", batch=batch, seq=s, num_layers=layers,
                      attention="flash", overrides={"hidden_size": heads * d, "intermediate_size": 256,
                                                    "num_attention_heads": heads, "num_key_value_heads": 2,
                                                    "vocab_size": 512}).validate()
    with tpu.quiet_libtpu():
        c = tpu.compile_built(step.build(cfg), "v6e-8", donate=True, label="flash")
    t = st.step_time(c.module, "v6e-8", {"fsdp": 8})
    b = batch // 8  # per chip
    per_layer = (2 * 4 + 6 + 8) * b * heads * s * s * d / 2
    assert len(t.unpriced) == 4 and t.unpriced_flash == {"forward": 2 * layers, "dq": layers, "dkv": layers}
    assert t.unpriced_roofline_s == pytest.approx(layers * per_layer / 918e12, rel=1e-12)
    assert t.predicted_s == pytest.approx(t.step_s + t.unpriced_roofline_s) and t.step_s == t.compute_s + \
        t.exposed_comm_s  # the derived term is not mixed into the measured compute


def test_flash_kind_from_shapes() -> None:
    from shardlab.profile.hlo_text import Array
    from shardlab.profile.step_time import flash_kind

    q, st_ = Array("bf16", (2, 32, 8192, 128)), Array("f32", (2, 32, 8192, 128))
    assert flash_kind([q, q, q], [q, st_, st_]) == "forward"
    assert flash_kind([q, q, q, st_, st_, q, st_], [q]) == "dq"
    assert flash_kind([q, q, q, st_, st_, q, st_], [q, q]) == "dkv"
    assert flash_kind([Array("f32", (8,))], [q]) is None
