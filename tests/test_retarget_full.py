"""Trace small, compile big at full size (``make test-full``): the 64-chip compiles traced on 8 devices must equal
the direct 64-device compiles.

Oracle: the direct compile (the graph traced on 64 CPU devices, one per chip, in a helper process), compared with
:func:`shardlab.profile.retarget.differences` — fits, per-chip memory, every collective, the program text up to
instruction names. Minutes per compile on a 2-core host (``tools/retarget_full_size.py compare`` prints the same).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.xla, pytest.mark.full_size]


@pytest.mark.parametrize("shard_as", [False, True])
def test_seed_405b_on_v6e_64_from_8_devices(xla_world, shard_as) -> None:  # type: ignore[no-untyped-def]
    """Notebook 06's full-size seed (126 layers, q/o [16384, 16384], fsdp 16 × tensor 4): off does not fit, on fits,
    and both ways agree on everything."""
    from shardlab.core.case import build_graph
    from shardlab.profile import retarget as R
    from shardlab.profile import tpu
    from shardlab.xla_scan.pod import pod_case

    direct = tpu.compile_program(build_graph, pod_case(64, shard_as), "v6e-64")
    small = tpu.compile_program(build_graph, pod_case(64, shard_as, trace=True), "v6e-64", retarget=((2, 4), (16, 4)))
    assert direct.fits is shard_as
    assert R.differences(direct, small) == {}


def test_llama_3_8b_on_v6e_64_from_8_devices(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Notebook 12's full-size step (Llama 3 8B, AdamW, donated) on fsdp 16 × tensor 4, as inspect traces it small."""
    from dataclasses import replace

    from shardlab.inspect import step
    from shardlab.inspect.config import make_config
    from shardlab.profile import retarget as R
    from shardlab.profile import tpu

    big = make_config("llama-3-8b", mesh="fsdp=16,tensor=4", topology="v6e-64", batch=16, seq=2048).validate()
    small = replace(big, mesh=(("fsdp", 2), ("tensor", 4)), rules_mesh=big.mesh)
    direct = tpu.compile_program(step.build, big, "v6e-64", donate=big.donate)
    retargeted = tpu.compile_program(step.build, small, "v6e-64", donate=big.donate, retarget=((2, 4), (16, 4)))
    assert R.differences(direct, retargeted) == {}
