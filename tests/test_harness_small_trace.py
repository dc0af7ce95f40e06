"""The harness's TPU view from a small trace (``Case.small_trace``, ``harness.tpu``): notebook 06's scan step.

Oracles: at 8 chips, the view compiled directly (the graph traced on 8 devices) — the small-trace view must have
the same values and the same program (:func:`shardlab.profile.retarget.differences`: memory, collectives, program
text up to names); above 64 chips, where no direct trace exists, the topic's own formula (stacked-gradient bytes
per chip and the fsdp reduction) must agree with what the compiler built.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def scan(xla_world):  # type: ignore[no-untyped-def]
    from shardlab.core import harness
    from shardlab.profile import tpu
    from shardlab.xla_scan.case import ScanCase
    from shardlab.xla_scan.params import ScanParams

    tpu.check_backend()
    return harness, ScanCase, ScanParams


@pytest.mark.parametrize("shard_as", [True, False])
def test_small_trace_view_is_the_direct_view_at_8_chips(scan, shard_as) -> None:  # type: ignore[no-untyped-def]
    from shardlab.profile import retarget as R

    harness, ScanCase, ScanParams = scan
    case = ScanCase(ScanParams(mesh_fsdp=4, mesh_tensor=2), 4, shard_as=shard_as)
    small, trace_mesh, target_mesh = case.small_trace()
    assert (small.p.mesh_fsdp, trace_mesh, target_mesh) == (2, (2, 2), (4, 2))
    direct = harness.tpu(case, "v5e")
    via = harness.tpu(case, "v5e", small_trace=True)
    assert direct.ran and via.ran and via.detail.options["retarget"] == [[2, 2], [4, 2]]
    assert "retarget" not in direct.detail.options
    assert R.differences(direct.detail, via.detail) == {}
    assert via.values == direct.values and via.values  # every value the topic reads from the program
    # negative control: a trace left on its own mesh is another program
    wrong = harness.tpu(replace(case, p=replace(case.p, mesh_fsdp=2, mesh_tensor=4)), "v5e")
    assert R.differences(direct.detail, wrong.detail) != {}


def test_view_above_64_chips_compiles_from_the_small_trace(scan) -> None:  # type: ignore[no-untyped-def]
    """fsdp 64 × tensor 4 = 256 chips: skipped before (a trace needs one CPU device per chip); now compiled for
    v5e-256 from mesh (2, 4), and the formula's per-chip stacked-gradient bytes are the compiler's."""
    harness, ScanCase, ScanParams = scan
    p = ScanParams(mesh_fsdp=64, mesh_tensor=4, hidden=256, ffn=256, batch=64, seq=8)
    case = ScanCase(p, 4, shard_as=True)
    view = harness.tpu(case, "v5e")
    assert view.ran, view.skipped
    assert view.detail.topology == "v5e-256" and view.detail.num_chips == 256
    assert any("rewritten to (64, 4)" in n for n in view.notes), view.notes
    rows = {r["name"]: r for r in harness.compare([harness.formula(case), view])}
    assert rows["stacked_grads.bytes"]["checked_sources"] == ["formula", "tpu"] and rows["stacked_grads.bytes"]["agree"]
    assert all(r["agree"] for r in rows.values()), [r for r in rows.values() if not r["agree"]]


def test_a_case_without_a_small_trace_is_still_skipped_above_64(scan) -> None:  # type: ignore[no-untyped-def]
    harness, ScanCase, ScanParams = scan
    p = ScanParams(mesh_fsdp=64, mesh_tensor=4, hidden=256, ffn=256, batch=64, seq=8)
    case = ScanCase(p, 4, shard_as=True)

    class NoSmall(ScanCase):  # type: ignore[misc, valid-type]
        def small_trace(self):  # type: ignore[no-untyped-def]
            return None

    view = harness.tpu(NoSmall(case.p, case.layers, shard_as=True), "v5e")
    assert not view.ran and "one CPU device per chip" in view.skipped
    assert not harness.tpu(case, "v5e", small_trace=False).ran
