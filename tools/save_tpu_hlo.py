"""Regenerate the real XLA:TPU programs in ``tests/data/tpu_hlo/`` (unit-test inputs for the HLO parser).

Design: each file is the per-chip program ``shardlab.profile.tpu`` returns for one small graph from
``tests/tpu_programs.py`` on ``v5e-8`` (8 chips; this process holds an 8-device CPU world), plus one program
written directly in JAX (an explicit ``psum_scatter``: the native ``reduce-scatter`` instruction). The README
there says what each file contains. Compile-only; takes ~10 s.

Usage::

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 python tools/save_tpu_hlo.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tpu_hlo"
TOPOLOGY = "v5e-8"


def jax_reduce_scatter() -> str:
    """shard_map(psum_scatter) of a replicated f32[256, 256] over 8 chips."""
    import jax
    import numpy as np
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardlab.profile import tpu

    mesh = Mesh(np.array(tpu.topology_devices(TOPOLOGY)), ("d",))
    fn = shard_map(lambda x: jax.lax.psum_scatter(x, "d", scatter_dimension=0, tiled=True), mesh=mesh,
                   in_specs=P(None), out_specs=P("d"))
    arg = jax.ShapeDtypeStruct((256, 256), jax.numpy.float32, sharding=NamedSharding(mesh, P()))
    with tpu.quiet_libtpu():
        return jax.jit(fn).lower(arg).compile().as_text()


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from shardlab import runtime

    runtime.setup(num_devices=8)
    import tpu_programs as tp

    from shardlab.profile import tpu

    def save(name: str, outputs: list, **options: object) -> None:
        text = tpu.compile_tensors(outputs, TOPOLOGY, **options).hlo_text  # type: ignore[arg-type]
        assert text is not None
        (OUT / name).write_text(text)
        print(name, len(text))

    OUT.mkdir(parents=True, exist_ok=True)
    cfg = tp.MlpCfg()  # tokens 64, hidden 256, ffn 1024, f32
    save("mlp_bf16_v5e_8.txt", tp.megatron_mlp(tp.MlpCfg(dtype="bfloat16")))
    save("dp4_f32_v5e_8.txt", tp.data_parallel_step(cfg))
    save("dp4_f32_no_combiner_v5e_8.txt", tp.data_parallel_step(cfg), disable_passes=("all-reduce-combiner",))
    save("zero3_f32_v5e_8.txt", tp.zero3_step(cfg))
    save("roll_f32_v5e_8.txt", tp.roll_rows(cfg))
    save("scan_fsdp2_tp4_f32_v5e_8.txt", tp.scan_stack(cfg))
    from shardlab.levers import programs as P

    save("fsdp4_windowed_bf16_v5e_8.txt",  # notebook 08's overlap step
         P.train_step("fsdp", layers=4, batch=8192, hidden=2048, dtype="bfloat16", placeholders=True))
    (OUT / "jax_reduce_scatter_f32_v5e_8.txt").write_text(jax_reduce_scatter())


if __name__ == "__main__":
    main()
