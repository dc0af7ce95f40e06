"""The FSDP cases (shardlab.fsdp.case, shardlab.fsdp.train) through the harness, against independent oracles.

- Flat units: the formula view against numbers worked out by hand in the comments (torch.chunk sizes, the
  root unit's single all-gather, the ring model), and the ledger view (FlatUnit in a SimulatedWorld) against the
  formula view over several configurations (nested units, alignment, uneven world sizes, W = 1).
- Per-parameter FSDP: the CPU compiler view against the formula (exact; structural), and the TPU compiler view
  (XLA:TPU, compile-only) against ``GspmdCase.formula("tpu")`` on a grid of layer sizes and world sizes inside the
  domain ``tpu_rules_apply`` declares — the real compiler is the oracle of those rules. The default
  configuration's TPU numbers are also worked out by hand.
"""

from __future__ import annotations

import pytest
import torch_xla

from shardlab.core import harness
from shardlab.core.views import View
from shardlab.formulas import fsdp as ffsdp
from shardlab.fsdp.case import FlatCase, GspmdCase, designs_frame, flat_param_handle_check, step_operands
from shardlab.fsdp.params import FsdpGspmdParams, FsdpParams
from shardlab.profile import tpu as T


def _flat(world_size: int, layer_sizes: tuple[int, ...], batch: int, steps: int = 3, align: bool = False,
          **variant: object) -> FlatCase:
    p = FsdpParams(world_size=world_size, layer_sizes=layer_sizes, batch=batch, steps=steps, align=align)
    return FlatCase(p, **variant)  # type: ignore[arg-type]


def _gspmd(world_size: int, layer_sizes: tuple[int, ...], batch: int) -> GspmdCase:
    return GspmdCase(FsdpGspmdParams(world_size=world_size, layer_sizes=layer_sizes, batch=batch))


def test_flat_formula_worked_by_hand() -> None:
    f = harness.formula(_flat(8, (30, 50, 10), 64))
    # numels 1500 + 50 + 500 + 10 = 2060; c = ceil(2060/8) = 258; P = 8·258 = 2064
    assert (f["flat.numel"], f["flat.shard_numel"], f["flat.padded_numel"]) == (2060, 258, 2064)
    # the root unit: ONE all-gather of c·4 = 1032 B and one reduce-scatter of P·4 = 8256 B
    assert (f["step.all_gather.count"], f["step.all_gather.bytes"]) == (1, 1032)
    assert (f["step.reduce_scatter.count"], f["step.reduce_scatter.bytes"]) == (1, 8256)
    assert f["step.wire.bytes"] == 7 * 1032 + 7 / 8 * 8256  # ring: (W-1)·c·b + (W-1)/W·P·b = 14448
    assert f["memory.per_rank.bytes"] == 16 * 258  # fp32 param + grad + Adam m, v on the shard


def test_flat_formula_nested_units_by_hand() -> None:
    f = harness.formula(_flat(8, (30, 50, 10), 64, nested=True))
    # inner unit (Linear 0): 1550 -> c 194, gathers twice; root (Linear 1): 510 -> c 64, gathers once
    assert f["step.all_gather.count"] == 3 and f["step.all_gather.bytes"] == 2 * 194 * 4 + 64 * 4
    assert f["step.reduce_scatter.count"] == 2 and f["step.reduce_scatter.bytes"] == (1552 + 512) * 4
    assert f["flat.numel"] == 510  # the flat.* values describe the root unit


@pytest.mark.parametrize("case", [
    _flat(8, (30, 50, 10), 64, steps=2),
    _flat(3, (5, 7, 4, 3), 6, steps=2, align=True),
    _flat(4, (6, 10, 3), 8, steps=1, nested=True, optimizer="sgd"),
    _flat(1, (6, 10, 3), 4, steps=1),
])
def test_flat_ledger_equals_formula(case: FlatCase) -> None:
    f, led = harness.formula(case), harness.ledger(case)
    rows = harness.compare([f, led])
    assert all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]
    assert all(ok for ok, _ in led.checks.values()), {k: v for k, v in led.checks.items() if not v[0]}
    assert "parity.params_match_unsharded" in led.checks
    if case.p.world_size == 1:
        assert f["step.collective.bytes"] == 0 and len(led.detail["ledger"]) == 0


def test_expected_order_root_and_nested() -> None:
    plain = _flat(2, (4, 6, 2), 2).expected_order()
    assert [(op, ph) for op, ph, _ in plain] == [("all_gather", "forward"), ("reduce_scatter", "backward")]
    nested = _flat(2, (4, 6, 2), 2, nested=True).expected_order()
    assert [(op, ph) for op, ph, _ in nested] == [
        ("all_gather", "forward"), ("all_gather", "forward"), ("all_gather", "backward"),
        ("reduce_scatter", "backward"), ("reduce_scatter", "backward")]


def test_flat_param_handle_check_agrees_with_pytorch() -> None:
    assert flat_param_handle_check(_flat(3, (5, 7, 4), 3, align=True)) == (True, [])


def test_gspmd_formula_tpu_by_hand() -> None:
    """W = 8, layers 30 -> 50 -> 10: W1 [50, 30], b1 [50], W2 [10, 50], b2 [10]."""
    case = _gspmd(8, (30, 50, 10), 64)
    cpu, tpu = case.formula("cpu"), case.formula("tpu")
    # CPU, f32 all-gathers of padded shards: forward 7·30 + 7 + 2·50 + 2 elements, backward W2 again (2·50)
    assert cpu["step.all_gather.bytes"] == 4 * (210 + 7 + 100 + 2 + 100) and cpu["step.all_gather.count"] == 5
    # TPU: weights in bf16 (2 B), biases as all-reduces of padded vectors 8·7 = 56 and 8·2 = 16 f32
    assert tpu["step.all_gather.bytes"] == 2 * (210 + 100 + 100) and tpu["step.all_gather.count"] == 3
    assert tpu["step.unshard_all_reduce.bytes"] == 4 * (56 + 16) and tpu["step.unshard_all_reduce.count"] == 2
    # gradients: the full f32 gradients on both, 4 of them
    assert cpu["step.reduce_scatter.bytes"] == tpu["step.reduce_scatter.bytes"] == 4 * 2060
    assert ffsdp.tpu_rules_apply(case.shapes(), 8) is None
    assert harness.formula(case).values == cpu.values  # the harness's formula view is the CPU compiler's


def test_tpu_rules_domain() -> None:
    assert "dimension of size 1" in ffsdp.tpu_rules_apply([(1, 16), (1,)], 2)
    assert "one row" in ffsdp.tpu_rules_apply([(13, 7), (2, 13)], 8)
    assert "dim-0" in ffsdp.tpu_rules_apply([(10, 50)], 8, rule="largest")
    assert ffsdp.tpu_rules_apply([(2, 2)], 1) is None
    # vectors: all-reduce of the padded vector below one 128-lane row per shard, all-gather from there on
    assert ffsdp.unshard_form((512,), 8, device_kind="tpu") == "all_reduce_padded"  # shards of 64
    assert ffsdp.unshard_form((512,), 4, device_kind="tpu") == "all_gather"  # shards of 128
    assert ffsdp.unshard_form((512,), 4, device_kind="cpu") == "all_gather"


@pytest.mark.xla
def test_compiler_view_matches_formula_and_skips(xla_world) -> None:  # type: ignore[no-untyped-def]
    case = _gspmd(4, (7, 13, 2), 8)
    f, h = harness.formula(case), harness.hlo(case)
    assert all(r["agree"] for r in harness.compare([f, h]))
    assert all(ok for ok, _ in h.checks.values()), h.checks
    assert "parity.hlo.sgd_step" in h.checks
    assert h["step.unshard_all_reduce.count"] == 3  # W2 [2, 13], b2 [2]: d = 2 <= 4 // 2; forward both, W2 again
    skipped = harness.hlo(_gspmd(3, (4, 6, 2), 6))
    assert not skipped.ran and "does not tile num_devices=8" in skipped.skipped
    assert not harness.tpu(_gspmd(3, (4, 6, 2), 6)).ran  # no 3-chip v5e slice


@pytest.mark.xla
def test_tpu_before_hlo_of_a_two_program_case(xla_world) -> None:  # type: ignore[no-untyped-def]
    """The TPU compile of the backward program executes the forward first (``harness.build_program``); a later
    capture of that forward must still find its HLO (memoised by graph hash), and both views must be whole."""
    case = _gspmd(4, (9, 6, 3), 8)  # sizes no other test compiles
    t, h = harness.tpu(case), harness.hlo(case)
    assert t.ran and [c.label for c in t.parts] == ["step forward", "step backward"]
    assert len(h.parts) == 2 and all(c.module.collectives for c in h.parts)  # both programs captured
    assert all(r["agree"] for r in harness.compare([harness.formula(case), h]))
    assert all(ok for v in (t, h) for ok, _ in v.checks.values()), (t.checks, h.checks)


@pytest.mark.xla
def test_tpu_view_defaults(xla_world) -> None:  # type: ignore[no-untyped-def]
    case = _gspmd(8, (30, 50, 10), 64)
    t = harness.tpu(case)
    assert t.ran and all(ok for ok, _ in t.checks.values()), t.checks
    assert {n.removeprefix("tpu_formula.") for n in t.checks} == set(case.formula("tpu").values)
    # measured, independent of the formula code: one combined instruction carries the 4 gradient reductions,
    # and every weight gather is bf16
    assert (t["step.reduce_scatter.count"], t["step.reduce_scatter.operands"]) == (1, 4)
    moved = step_operands({name: c.module for name, c in zip(case.programs, t.parts, strict=True)})
    gathers = [m for m in moved if m.kind == "all_gather"]
    assert gathers and all(m.dtype == "bf16" for m in gathers)
    assert "combined" in t.differs["step.reduce_scatter.count"]
    assert "bf16" in t.differs["step.all_gather.bytes"]


@pytest.mark.xla
def test_tpu_compile_keeps_annotated_parameter_and_output_shardings(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Regression for shardlab.profile.tpu: with sharding propagation allowed on every parameter and output, XLA:TPU
    replicated the FSDP-sharded weights of this forward graph (each used only through a replicated copy: no
    all-gather at all) and returned the backward graph's updated parameters and gradients replicated. torch_xla's
    own XLA:CPU program of the same graphs (the oracle) keeps both sharded; so must the TPU compile."""
    case = _gspmd(8, (30, 50, 10), 64)
    fwd = harness.build_program((case, 0))
    _, free_params, _ = T.pin_shardings(torch_xla._XLAC._get_xla_tensors_hlo_proto(fwd),
                                        [torch_xla._XLAC._get_xla_sharding_spec(t) for t in fwd])
    assert not any(free_params)  # x, y and every parameter carry their annotation
    assert T.compile_tensors(fwd, "v5e-8").count("all-gather") >= 1
    del fwd  # pending, never-synced tensors: the next graph's forward sync would compile them too
    bwd = T.compile_tensors(harness.build_program((case, 1)), "v5e-8")
    result = next(line for line in bwd.hlo_text.splitlines() if line.startswith("ENTRY")).split("->")[1]
    # per chip: W1 [50, 30] -> [7, 30], b1 -> [7], W2 [10, 50] -> [2, 50], b2 -> [2]; params and grads
    assert result.count("[7,30]") == 2 and result.count("[2,50]") == 2 and "[50,30]" not in result


# Inside tpu_rules_apply's domain (every dim > 1, weight shards of >= 2 rows), measured on v5e-8 with the
# mesh (W, 8 / W): the TPU formula must equal the compiler. (30, 50, 10) at W = 2 is left out: there XLA:TPU
# reshards one gradient with a collective-permute (another algorithm; the view then says so).
TPU_GRID = [((30, 50, 10), 4), ((5, 3, 11, 4), 2), ((19, 7, 17), 2), ((19, 7, 17), 4), ((256, 512, 128), 2),
            ((256, 512, 128), 4), ((256, 512, 128), 8), ((64, 128, 32), 2), ((64, 128, 32), 8)]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize(("layer_sizes", "world_size"), TPU_GRID)
def test_tpu_formula_equals_tpu_compiler(xla_world, layer_sizes, world_size) -> None:  # type: ignore[no-untyped-def]
    case = _gspmd(world_size, layer_sizes, 16)
    assert ffsdp.tpu_rules_apply(case.shapes(), world_size) is None
    t = harness.tpu(case)
    assert t.checks and all(ok for ok, _ in t.checks.values()), {k: v for k, v in t.checks.items() if not v[0]}
    # independent of the formula: the gradient reduction moves every full f32 gradient once
    pairs = zip(layer_sizes[:-1], layer_sizes[1:], strict=True)
    assert t["step.reduce_scatter.bytes"] == 4 * sum(i * o + o for i, o in pairs)


@pytest.mark.xla
def test_tpu_view_outside_the_domain_is_a_note(xla_world) -> None:  # type: ignore[no-untyped-def]
    t = harness.tpu(_gspmd(8, (7, 13, 2), 8))
    assert t.ran and not any(n.startswith("tpu_formula.") for n in t.checks)
    assert any("not compared" in n and "one row" in n for n in t.notes)


def test_designs_frame_flat_columns() -> None:
    frame = designs_frame(_flat(8, (30, 50, 10), 64), {"skipped": View.skip("hlo", "no devices")})
    assert list(frame["flat unit, root (FSDP1)"]) == [1032, 0, 8256, 9288]
    assert list(frame["flat unit, not root (FSDP1)"]) == [1032, 1032, 8256, 10320]
    assert "skipped" not in frame


@pytest.mark.xla
@pytest.mark.parametrize("spec,nbytes", [
    (("fsdp", None), 2 * 50 * 4),  # FSDP2's rule: ceil(10/8) = 2 rows x 50, f32 — the padded dim-0 shard
    ((None, "fsdp"), 10 * 7 * 4),  # columns instead: ceil(50/8) = 7 columns x 10 rows
    ((None, None), 0),  # replicated already: nothing to gather
])
def test_unshard_case_moves_the_annotated_shard(xla_world, spec, nbytes) -> None:  # type: ignore[no-untyped-def]
    from shardlab.fsdp.case import UnshardCase

    view = harness.hlo(UnshardCase(FsdpGspmdParams(), (10, 50), spec))
    assert view.ran, view.skipped
    assert view["unshard.all_gather.bytes"] + view["unshard.all_reduce.bytes"] == nbytes


def test_unshard_case_rejects_a_bad_spec() -> None:
    from shardlab.fsdp.case import UnshardCase

    for spec in (("fsdp",), ("data", None), ("fsdp", "fsdp")):
        with pytest.raises(ValueError, match="must name one entry per dim of the parameter"):
            UnshardCase(FsdpGspmdParams(), (10, 50), spec)


def test_code_exercises_grade_by_running() -> None:
    """05 #7 (FSDP1's shard by hand, against PyTorch's FlatParamHandle) and 05b #6 (FSDP2's annotation): a right
    answer passes, a plausible wrong one gets the hint."""
    import torch

    from shardlab.core.exercises import Exercises

    def chunk_rule(flat, rank, world_size):  # type: ignore[no-untyped-def]
        c = -(-flat.numel() // world_size)
        shard = flat[rank * c:(rank + 1) * c]
        return torch.cat([shard, flat.new_zeros(c - shard.numel())])

    def even_split(flat, rank, world_size):  # type: ignore[no-untyped-def]  # tensor_split: 3, 3, 2, 2 — not FSDP1's
        return torch.tensor_split(flat, world_size)[rank]

    ex = Exercises("05_fsdp_flat_params")
    assert ex.grade(7, chunk_rule) == "exercise 7: right"
    assert ex.grade(7, even_split).startswith("exercise 7: not quite")
