"""The XLA:TPU compile view (compile-only, libtpu): topologies, the torch_xla -> TPU path against an independent
JAX program, collective combining, reduce-scatter, out-of-memory as data, the worker path, quiet libtpu.

Oracles: the Megatron algebra (one all-reduce of [tokens, h] forward, one backward), byte counts by arithmetic
in the comments, and the same MLP written directly in JAX and compiled by the same compiler for the same chips.
Sizes are small: each compile takes well under a second (the worker start takes ~5-10 s, once).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import tpu_programs as tp

pytestmark = [pytest.mark.xla, pytest.mark.usefixtures("live_tpu_compiles")]  # about the compiler: no store
GiB = 2**30


@pytest.fixture(scope="module")
def tpu(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.profile import tpu

    tpu.check_backend()
    return tpu




def test_backend_pins_and_private_names(tpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert tpu.check_backend() == tpu.PINS == {"jax": "0.7.1", "jaxlib": "0.7.1", "libtpu": "0.0.21"}
    b = tpu._backend()
    for name in ("get_compile_options", "hlo_to_stablehlo", "XlaComputation", "DeviceList", "get_topology_desc"):
        assert callable(getattr(b, name)), name  # the private jax._src names this module relies on
    monkeypatch.setattr(tpu, "_installed", lambda d: None if d == "libtpu" else tpu.PINS[d])
    with pytest.raises(RuntimeError, match=r"libtpu==0.0.21.*libtpu not installed.*make test"):
        tpu.check_backend()


def test_topologies(tpu) -> None:  # type: ignore[no-untyped-def]
    for gen in ("v5e", "v6e"):
        for chips in (1, 2, 4, 8, 64, 128, 256):
            assert tpu.TOPOLOGIES[tpu.topology_for(chips, gen)].chips == chips
    assert tpu.topology_for(8) == tpu.DEFAULT_TOPOLOGY == "v5e-8"
    assert tpu.topology_for(256, "v6e") == "v6e-256"
    assert tpu.topology_for(128, "v5p") == "v5p-256" and tpu.topology_for(64, "v4") == "v4-128"
    with pytest.raises(ValueError, match=r"num_chips=3.*\[1, 2, 4, 8, 16, 32, 64, 128, 256\]"):
        tpu.topology_for(3)
    for name, topo in tpu.TOPOLOGIES.items():  # libtpu agrees with our chip counts (1- and 2-chip need bounds)
        t0 = time.perf_counter()
        devices = tpu.topology_devices(name)
        assert len(devices) == topo.chips, name
        # one device per chip (v4 needs libtpu's megacore config: by default it lists each TensorCore)
        assert len({tuple(d.coords) for d in devices}) == topo.chips, name
        kind = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}[topo.generation]
        assert devices[0].device_kind == kind, name
        # the torus extents are the coordinates' ranges
        assert tuple(max(d.coords[a] for d in devices) + 1 for a in range(len(topo.extents))) == topo.extents, name
        print(f"{name}: {len(devices)} chips described in {time.perf_counter() - t0:.3f} s")
    assert tpu.TOPOLOGIES["v5e-8"].hbm_bytes == int(15.75 * GiB)
    assert tpu.TOPOLOGIES["v6e-8"].hbm_bytes == int(31.25 * GiB)
    assert tpu.TOPOLOGIES["v4-8"].hbm_bytes == int(30.75 * GiB)


def test_catalogue_every_generation(tpu) -> None:  # type: ignore[no-untyped-def]
    """Every generation, chips and Cloud TPU names: the oracle is data/hardware's published slice table (Cloud
    TPU's own names and chip counts, e.g. v5p-8 = 2x2x1 = 4 chips), independent of the catalogue's shapes."""
    from shardlab.formulas import hardware

    assert {t.generation for t in tpu.TOPOLOGIES.values()} == {"v4", "v5e", "v5p", "v6e"}
    for profile in hardware.chips().values():
        for name, chips in profile.slices.items():
            assert tpu.get_topology(name).chips == chips, name  # every published slice compiles, same chips
    assert {(n, t.libtpu_name, t.chips) for n, t in tpu.TOPOLOGIES.items() if n in ("v5p-256", "v4-128", "v6e-256")} \
        == {("v5p-256", "v5p:4x4x8", 128), ("v4-128", "v4:4x4x4", 64), ("v6e-256", "v6e:16x16", 256)}
    # wraparound: the pod's full edge (16) on v5e / v6e, whole 4x4x4 cubes on v4 / v5p
    wraps = {n: t.wrap for n, t in tpu.TOPOLOGIES.items()}
    assert wraps["v6e-256"] == (True, True) and wraps["v6e-128"] == (False, True) and wraps["v6e-64"] == (False, False)
    assert wraps["v5p-64"] == (False,) * 3 and wraps["v5p-128"] == (True,) * 3 and wraps["v4-256"] == (True,) * 3
    assert max(t.chips for t in tpu.TOPOLOGIES.values() if t.generation in ("v5e", "v6e")) == 256  # one pod


def test_slice_names_one_form(tpu) -> None:  # type: ignore[no-untyped-def]
    """One name per slice (Cloud TPU's accelerator type); libtpu's generation:shape is accepted only by the boundary
    parser. v4 / v5p names count TensorCores, v5e / v6e chips."""
    assert [(t.name, t.shape, t.libtpu_name) for t in (tpu.TOPOLOGIES["v5e-8"], tpu.TOPOLOGIES["v6e-256"])] == \
        [("v5e-8", "2x4", "v5e:2x4"), ("v6e-256", "16x16", "v6e:16x16")]
    assert all(name == f"{t.generation}-{t.chips * (2 if t.generation in ('v4', 'v5p') else 1)}"
               for name, t in tpu.TOPOLOGIES.items())
    assert tpu.parse_slice("v5e:2x4") == tpu.parse_slice("v5e-8") == "v5e-8"
    assert tpu.parse_slice("v6e:8x8") == "v6e-64" and tpu.parse_slice("v5e:1x2") == "v5e-2"
    assert tpu.parse_slice("v5p:4x4x8") == tpu.parse_slice("v5p-256") == "v5p-256"
    assert tpu.parse_slice("v4:4x4x4") == tpu.parse_slice("v4-128") == "v4-128"
    assert tpu.parse_slice("v5litepod-16") == "v5e-16"  # Cloud TPU's API name for v5e
    bad = {"v5e:3x3": "v5e has no single-slice shape '3x3'", "v7x-8": "unknown generation 'v7x'",
           "v5e": "expected generation-number", 8: "a slice name is a string",
           "v5-8": "'v5' is ambiguous: say v5e .* or v5p", "v5p-4": "v5p has no slice with N = 4 \\(TensorCores\\)",
           "v5p-7": "counts TensorCores \\(2 per chip\\), so N must be even", "v6e-512": "larger than the largest "
           "single slice v6e-256", "v6e:4x2": "no single-slice shape '4x2'", "v6e-3": "v6e has no slice with N = 3"}
    for text, why in bad.items():
        with pytest.raises(ValueError, match=r"tiny_topology=.* is not a known TPU slice; known slices: v5e-1, "
                                             r"v5e-2, v5e-4, v5e-8, .*v6e-256, v5p-8, .*v4-8192\. Why: .*" + why +
                                             r".*TensorCores, two per chip.*multi-slice .* out of scope"):
            tpu.parse_slice(text, "tiny_topology")


def test_view_topology_rule(tpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The rule every notebook's tpu view follows (8-device CPU world here)."""
    assert tpu.view_topology(8, True) == ("v5e-8", "this process's devices")
    assert tpu.view_topology(4, False, "v6e") == ("v6e-4", "a helper process with 4 devices")
    topology, why = tpu.view_topology(3, False)
    assert topology is None and "num_chips=3" in why
    topology, why = tpu.view_topology(256, False, "v6e")  # a catalogue slice, but one CPU device per chip is too many
    assert topology is None and "v6e-256 has 256 chips" in why and "at most 64" in why
    monkeypatch.setattr(tpu.importlib.util, "find_spec", lambda name: None)
    assert tpu.view_topology(8, True) == (None, tpu.NOT_INSTALLED)


def test_unknown_topology_and_wrong_world(tpu) -> None:  # type: ignore[no-untyped-def]
    outs = tp.megatron_mlp(tp.MlpCfg())
    with pytest.raises(ValueError, match=r"topology='v5e-3' has no compile-only topology; known: v5e-1, .*v5e-8"):
        tpu.compile_tensors(outs, "v5e-3")
    with pytest.raises(ValueError, match=r"topology='v5e:2x4' is libtpu's generation:shape form; .*'v5e-8'.*"
                                         r"parse_slice"):
        tpu.compile_tensors(outs, "v5e:2x4")  # inside the suite: the generation-chips name only
    with pytest.raises(ValueError, match=r"4 chips but this process's world has num_devices=8.*compile_program"):
        tpu.compile_tensors(outs, "v5e-4")


def _jax_megatron_mlp(tpu, cfg: tp.MlpCfg, topology: str):  # type: ignore[no-untyped-def]
    """The same MLP step written in JAX: y = gelu(x @ W1) @ W2 and the VJP of y.sum() (cotangent ones), with
    x replicated, W1 by columns, W2 by rows on a mesh of the topology's chips; compiled by JAX's own path
    (Shardy partitioner, JAX's default; torch_xla forces GSPMD) for the same compile-only devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardlab.profile.hlo import parse_hlo

    mesh = Mesh(np.array(tpu.topology_devices(topology)), ("model",))
    dt = getattr(jnp, cfg.dtype)

    def step(x, w1, w2):  # type: ignore[no-untyped-def]
        y, vjp = jax.vjp(lambda x, w1, w2: jax.nn.gelu(x @ w1, approximate=False) @ w2, x, w1, w2)
        return (y, *vjp(jnp.ones_like(y)))

    specs = [((cfg.tokens, cfg.hidden), P()), ((cfg.hidden, cfg.ffn), P(None, "model")),
             ((cfg.ffn, cfg.hidden), P("model", None))]
    args = [jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec)) for shape, spec in specs]
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", True)
    try:
        with tpu.quiet_libtpu():
            compiled = jax.jit(step).lower(*args).compile()
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)
    return parse_hlo(compiled.as_text())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_megatron_mlp_matches_jax_oracle(tpu, dtype: str) -> None:  # type: ignore[no-untyped-def]
    cfg = tp.MlpCfg(dtype=dtype)  # tokens 64, h 256, ffn 1024, tp 8 on v5e-8
    out = tpu.compile_tensors(tp.megatron_mlp(cfg), "v5e-8", label="mlp")
    assert out.fits and out.num_chips == 8 and out.module is not None and out.memory is not None
    oracle = _jax_megatron_mlp(tpu, cfg, "v5e-8")
    assert out.module.summary() == oracle.summary()
    assert sorted((c.op, c.dtype, c.operands, c.group_size) for c in out.module.collectives) == \
        sorted((c.op, c.dtype, c.operands, c.group_size) for c in oracle.collectives)
    # Megatron: y [64, 256] all-reduced forward, dx [64, 256] backward; the TPU combines both into one tuple
    # all-reduce, in the tensors' own dtype (bf16 stays bf16 on TPU; XLA:CPU reduces bf16 in f32).
    item = 4 if dtype == "float32" else 2
    (ar,) = out.module.collectives
    assert (ar.op, ar.operands, ar.group_size, ar.dtype) == ("all-reduce", 2, 8, "f32" if item == 4 else "bf16")
    assert out.bytes("all-reduce") == 2 * 64 * 256 * item
    assert out.compile_s > 0 and out.cost["flops"] > 0
    assert out.memory.argument == (64 * 256 + 2 * 256 * 1024 // 8) * item  # x + W1 and W2 shards
    print(f"mlp {dtype} tp 8: TPU compile {out.compile_s:.2f} s")


def test_all_reduce_combiner(tpu) -> None:  # type: ignore[no-untyped-def]
    outs = tp.data_parallel_step(tp.MlpCfg())  # 4 weight gradients of [256, 256] f32
    combined = tpu.compile_tensors(outs, "v5e-8")
    split = tpu.compile_tensors(outs, "v5e-8", disable_passes=("all-reduce-combiner",))
    assert combined.count("all-reduce") == 1 and combined.module.collectives[0].operands == 4
    assert split.count("all-reduce") == 4 and {c.operands for c in split.module.collectives} == {1}
    assert combined.bytes("all-reduce") == split.bytes("all-reduce") == 4 * 256 * 256 * 4
    assert split.options == {"disable_passes": ["all-reduce-combiner"], "debug_options": {}}
    hits = tpu.CACHE_HITS
    again = tpu.compile_tensors(tp.data_parallel_step(tp.MlpCfg()), "v5e-8")
    assert again.cached and not combined.cached and again.hlo_text == combined.hlo_text
    assert tpu.CACHE_HITS == hits + 1  # the report's shared kernels read this counter


def test_reduce_scatter_and_compiler_flags(tpu) -> None:  # type: ignore[no-untyped-def]
    outs = tp.zero3_step(tp.MlpCfg())  # 2 weights [256, 256] f32, sharded by rows over 8 chips
    out = tpu.compile_tensors(outs, "v5e-8")
    # gradients: one combined reduce-scatter of 2 x [256, 256] f32 -> 2 x [32, 256]
    assert out.count("reduce-scatter") == 1 and out.count("all-reduce") == 0
    assert out.bytes("reduce-scatter") == 2 * 256 * 256 * 4
    assert out.bytes("reduce-scatter", "result") == 2 * 32 * 256 * 4
    # weights: two all-gathers of [32, 256] shards, moved in bf16 (default mat-mul precision feeds the MXU bf16)
    assert out.count("all-gather") == 2 and out.bytes("all-gather") == 2 * 32 * 256 * 2
    # a TPU flag: without the all-reduce-scatter fusion the TPU keeps all-reduce (+ dynamic-slice), like CPU
    flag = tpu.compile_tensors(outs, "v5e-8", debug_options={"xla_tpu_enable_all_reduce_scatter_fusion": False})
    assert flag.count("reduce-scatter") == 0 and flag.count("all-reduce") == 1
    with pytest.raises(Exception, match="No such compile option"):
        tpu.compile_tensors(outs, "v5e-8", debug_options={"xla_no_such_flag": True})


def test_out_of_memory_is_data(tpu) -> None:  # type: ignore[no-untyped-def]
    out = tpu.compile_tensors(tp.big_temporary(), "v5e-8", label="big")
    assert not out.fits and out.hlo_text is None and out.module is None and out.memory is None
    oom = out.oom
    assert oom.capacity == int(15.75 * GiB) and oom.used > oom.capacity and oom.exceeded > 0
    top = oom.buffers[0]  # the 16 GiB hidden activation [2^17, 32768] f32
    assert top.size == 16 * GiB and top.shape.startswith("f32[131072,32768]") and "fusion" in top.label
    assert "Ran out of memory in memory space hbm" in oom.message
    with pytest.raises(ValueError, match="did not fit on v5e-8"):
        out.count("all-reduce")


def test_capacity_counts_arguments_not_outputs(tpu) -> None:  # type: ignore[no-untyped-def]
    """Measured behaviour of this compiler: 16 GiB of arguments do not fit a v5e chip (15.75 GiB usable) but do
    fit v6e (31.25 GiB); 1 GiB of arguments + 16 GiB of outputs compiles on v5e although the outputs exceed
    the chip: the compile-time check counts arguments + temporaries + reserved, not outputs."""
    args16 = tp.big_argument(16)
    v5e, v6e = tpu.compile_tensors(args16, "v5e-8"), tpu.compile_tensors(args16, "v6e-8")
    assert not v5e.fits and v5e.oom.breakdown["arguments"] == 16 * GiB
    assert v6e.fits and v6e.memory.argument >= 16 * GiB and v6e.memory.capacity == int(31.25 * GiB)
    outs = tpu.compile_tensors(tp.many_outputs(16), "v5e-8")
    assert outs.fits and outs.memory.output >= 16 * GiB > outs.memory.capacity


def test_worker_path(tpu) -> None:  # type: ignore[no-untyped-def]
    """A 4-chip program from this 8-device process: built and compiled in a worker with 4 devices."""
    from shardlab.profile import tpu_worker

    t0 = time.perf_counter()
    out = tpu.compile_program(tp.megatron_mlp, tp.MlpCfg(), "v5e-4", label="mlp tp4")
    first = time.perf_counter() - t0
    assert out.fits and out.num_chips == 4 and out.label == "mlp tp4"
    (ar,) = out.module.collectives
    assert (ar.op, ar.operands, ar.group_size) == ("all-reduce", 2, 4)
    assert out.bytes("all-reduce") == 2 * 64 * 256 * 4  # y and dx, [64, 256] f32
    t0 = time.perf_counter()
    hits = tpu.CACHE_HITS
    again = tpu.compile_program(tp.megatron_mlp, tp.MlpCfg(), "v5e-4")
    assert again.cached and again.hlo_text == out.hlo_text and tpu.CACHE_HITS == hits + 1  # the worker's cache
    print(f"worker start {tpu_worker.worker_for(4).start_s:.1f} s, first request {first:.1f} s, "
          f"cached request {time.perf_counter() - t0:.2f} s")
    here = tpu.compile_program(tp.megatron_mlp, tp.MlpCfg(), "v5e-8")  # 8 chips: in this process
    assert here.num_chips == 8 and here.module.collectives[0].group_size == 8

    def local(cfg):  # type: ignore[no-untyped-def]
        return tp.megatron_mlp(cfg)

    with pytest.raises(ValueError, match="module-level function"):
        tpu.compile_program(local, tp.MlpCfg(), "v5e-4")


def test_libtpu_noise_is_filtered(tpu, capfd) -> None:  # type: ignore[no-untyped-def]
    # In a fresh process libtpu's first use prints its no-TPU warnings to fd 2; through this module it is quiet.
    code = ("import sys; from shardlab.profile import tpu; "
            "tpu.topology_devices('v5e-1') if sys.argv[1] == 'quiet' else "
            "__import__('jax.experimental.topologies').experimental.topologies.get_topology_desc('v5e:2x2', 'tpu')")
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    raw, quiet = (subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env,
                                 timeout=120) for mode in ("raw", "quiet"))
    assert raw.returncode == quiet.returncode == 0, quiet.stderr
    assert "TPU_WORKER_HOSTNAMES" in raw.stderr  # the oracle: the noise is real without the filter
    assert "TPU" not in quiet.stderr + quiet.stdout and "InitGoogle" not in quiet.stderr
    capfd.readouterr()
    out = tpu.compile_tensors(tp.megatron_mlp(tp.MlpCfg(tokens=32)), "v5e-8")  # a fresh compile
    assert out.fits and not out.cached
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    with tpu.quiet_libtpu():  # anything that is not known noise is passed on
        os.write(2, b"WARNING: Logging before InitGoogle() is written to STDERR\na real problem\n")
    assert capfd.readouterr().err == "a real problem\n"


def test_annotated_parameters_keep_their_sharding(tpu) -> None:  # type: ignore[no-untyped-def]
    """A parameter torch_xla laid out keeps that sharding in the TPU program — as on a real TPU, where the data
    already sits that way. Measured before the fix: with propagation to every parameter allowed, an UNEVEN sharding
    (x [8, 1003] by columns over 8 chips) was replaced by a replicated argument and the all-gather the graph asks
    for disappeared. Oracle: ceil(1003 / 8) = 126 columns per chip -> the all-gather hands over 8 * 126 * 4 bytes."""
    import torch
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime

    mesh = runtime.mesh(8, "model")
    x = torch.randn(8, 1003).to("xla")
    xs.mark_sharding(x, mesh, (None, "model"))
    full = x * 1.0
    xs.mark_sharding(full, mesh, (None, None))  # replicate: an all-gather of the column shards
    out = tpu.compile_tensors([full.exp().sum(dim=-1)], "v5e-8")
    assert out.count("all-gather") == 1 and out.bytes("all-gather") == 8 * 126 * 4
    assert out.memory.argument < 8 * 1003 * 4  # the argument is the shard (tile-padded), not the whole x
    assert tpu.parameter_propagation("ENTRY %e {\n %p = f32[2]{0} parameter(0)\n}", 1) == [True]  # placeholder


def test_donation_aliases_updates_into_their_inputs(tpu) -> None:  # type: ignore[no-untyped-def]
    """A momentum step whose new W and m are donated into W's and m's buffers, as torch_xla's in-place update does.
    Oracle: W and m [1024, 512] f32 sharded by rows over 8 chips hold 128 · 512 · 4 B each per chip, so the alias is
    2 · 262144 B; without donation nothing is aliased and the updated state is a second copy in the outputs."""
    shard = 1024 // 8 * 512 * 4
    step = tp.momentum_update(tp.UpdateCfg())
    plain = tpu.compile_tensors(step.outputs, "v5e-8")
    donated = tpu.compile_tensors(step.outputs, "v5e-8", donate=step.donate)
    assert plain.memory.alias == 0 and "donated" not in plain.options
    assert donated.memory.alias == 2 * shard and [o for o, _ in donated.options["donated"]] == [1, 2]
    assert plain.memory.output == donated.memory.output >= 2 * shard  # listed either way; aliased when donated
    assert donated.memory.peak < plain.memory.peak  # the outputs no longer need their own buffers
    for m in (plain.memory, donated.memory):
        assert m.peak == m.argument + m.output - m.alias + m.checked_temp and m.fits and m.runs
    # the same through compile_program: a builder returning a Step, in this process (8 chips) and in a 4-chip worker
    again = tpu.compile_program(tp.momentum_update, tp.UpdateCfg(), "v5e-8")
    assert again.cached and again.memory.alias == 2 * shard
    assert tpu.compile_program(tp.momentum_update, tp.UpdateCfg(), "v5e-8", donate=False).memory.alias == 0
    four = tpu.compile_program(tp.momentum_update, tp.UpdateCfg(), "v5e-4")
    assert four.memory.alias == 2 * (1024 // 4 * 512 * 4)


def test_donation_errors_name_the_rule(tpu) -> None:  # type: ignore[no-untyped-def]
    step = tp.momentum_update(tp.UpdateCfg(rows=256, cols=128))
    w, m = step.donate[1], step.donate[2]
    product = w * 1
    with pytest.raises(ValueError, match=r"donate=\{1: \.\.\.\}: the input is not a parameter of the graph"):
        tpu.compile_tensors(step.outputs, "v5e-8", donate={1: product})
    with pytest.raises(ValueError, match=r"output 0 is torch.float32\[\] but the donated input is "
                                         r"torch.float32\[256, 128\]"):
        tpu.compile_tensors(step.outputs, "v5e-8", donate={0: w})
    with pytest.raises(ValueError, match=r"output index 3 is out of range \(there are 3 outputs\)"):
        tpu.compile_tensors(step.outputs, "v5e-8", donate={3: w})
    with pytest.raises(ValueError, match=r"already donated to output 1"):
        tpu.compile_tensors(step.outputs, "v5e-8", donate={1: m, 2: m})


def test_checked_memory_is_what_the_capacity_check_counts(tpu) -> None:  # type: ignore[no-untyped-def]
    """One v6e chip (31.25 GiB = 32000 MiB usable): an argument of A MiB, a 512 MiB bf16 argument, and its row sort
    (a 512 MiB temporary). Oracle: arithmetic on those sizes. 32000 - 1024 - 16 MiB of argument compiles, and the
    checked bytes are arguments + the 512 MiB temporary; 32 MiB more fails although the arguments alone
    (31504 MiB) are under the capacity — the temporary is counted, the reserved 258 MiB is not (it would not fit)."""
    MiB = 2**20
    ok = tpu.compile_program(tp.sort_temporary, 32000 - 1024 - 16, "v6e-1")
    m = ok.memory
    assert ok.fits and m.argument >= (32000 - 512 - 16) * MiB
    assert 512 * MiB <= m.checked_temp < 513 * MiB and m.temp == 512 * MiB  # temp_size agrees here (small program)
    assert 0 < m.capacity - m.checked < 17 * MiB and m.fits and m.runs
    over = tpu.compile_program(tp.sort_temporary, 32000 - 1024 + 16, "v6e-1")
    oom = over.oom
    assert not over.fits and oom.capacity == 32000 * MiB
    assert oom.arguments == pytest.approx((32000 - 512 + 16) * MiB, abs=0.006 * GiB)  # printed as "30.77G"
    assert oom.arguments < oom.capacity and oom.program == 512 * MiB and oom.fragmentation == 0


def test_oom_arguments_not_evaluated(tpu) -> None:  # type: ignore[no-untyped-def]
    """When the program alone exceeds the HBM the compiler lists "arguments 0B": not evaluated, so None."""
    big = tpu.compile_tensors(tp.big_temporary(), "v5e-8")  # a 16 GiB temporary > 15.75 GiB
    assert big.oom.breakdown["arguments"] == 0 and big.oom.arguments is None and big.oom.outputs is None
    assert big.oom.program > big.oom.capacity and "Ran out of memory" in big.oom.first_line
    args16 = tpu.compile_tensors(tp.big_argument(16), "v5e-8")  # the arguments alone are over: evaluated
    assert args16.oom.arguments == 16 * GiB


def test_parse_oom_reads_the_listed_sizes() -> None:
    from shardlab.profile.tpu_memory import parse_oom

    text = "\n".join([
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 33.92G of "
        "31.25G hbm. Exceeded hbm capacity by 2.68G.", "", "Total hbm usage >= 34.18G:",
        "    reserved        260.03M ", "    program          19.55G ", "    arguments        14.38G ", "",
        "Output size 14.38G; shares 14.38G with arguments.", "", "Program hbm requirement 19.55G:",
        "    global           977.0K", "    scoped            3.56M",
        "    HLO temp         19.54G (100.0% utilization: Unpadded (10.12G) Padded (10.12G), 48.2% fragmentation "
        "(9.42G))", ""])
    oom = parse_oom(text)
    assert oom is not None and oom.used == round(33.92 * GiB) and oom.capacity == round(31.25 * GiB)
    assert oom.arguments == round(14.38 * GiB) and oom.program == round(19.55 * GiB)
    assert oom.outputs == oom.shared_with_arguments == round(14.38 * GiB)  # donated: the outputs are the arguments
    assert oom.fragmentation == round(9.42 * GiB) and oom.breakdown["reserved"] == round(260.03 * 2**20)
