"""Ledger (what the per-rank code actually issued) against the paper formulas in shardlab.formulas.tp, and the
same per-rank programs on gloo processes: identical ledgers, same results."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shardlab import models
from shardlab.blocks import ring
from shardlab.comm import DistributedWorld, SimulatedWorld
from shardlab.formulas import tp as ftp
from shardlab.tp.programs import attention_step, ce_step, embedding_step, mlp_step, transformer_layer_step

B, S, H, NH, FFN, V = 2, 8, 16, 4, 32, 50


def _x(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, S, H, generator=g, dtype=dtype), torch.randn(B, S, H, generator=g, dtype=dtype)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("backward,input_grad", [(False, True), (True, True), (True, False)])
def test_mlp_and_attention_ledger_match_formula(tp: int, backward: bool, input_grad: bool) -> None:
    x, go = _x()
    for step, dense in [(mlp_step, models.MLP(H, FFN)), (attention_step, models.Attention(H, NH))]:
        world = SimulatedWorld(tp)
        world.run(step, dense, x, go if backward else None, input_grad=input_grad)
        want = ftp.mlp_all_reduce(B, S, H, tp, "float32", backward=backward, input_requires_grad=input_grad)
        led = world.ledger
        assert (led.count("all_reduce"), led.payload_bytes("all_reduce")) == (want["count"], want["bytes"])
        assert led.count() == want["count"]  # nothing but those all-reduces
        assert led.count("all_reduce", "forward") == (1 if tp > 1 else 0)


@pytest.mark.parametrize("tp", [2, 4])
def test_transformer_layer_is_two_plus_two(tp: int) -> None:
    x, go = _x()
    world = SimulatedWorld(tp)
    world.run(transformer_layer_step, models.TransformerBlock(H, NH, FFN), x, go)  # LN, attention, LN, MLP
    assert [e.phase for e in world.ledger] == ["forward", "forward", "backward", "backward"]
    want = ftp.transformer_layer_all_reduce(B, S, H, tp)
    assert (world.ledger.count("all_reduce"), world.ledger.payload_bytes()) == (want["count"], want["bytes"])
    assert want["bytes"] == 4 * B * S * H * 4  # volume 4 b s h elements of 4 bytes


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_ledger_matches_formula(tp: int) -> None:
    """Megatron SP: per linear pair forward all-gather + reduce-scatter, backward all-gather (output grad),
    re-gather of the saved input shard, reduce-scatter (input grad)."""
    x, go = _x()
    world = SimulatedWorld(tp)
    world.run(mlp_step, models.MLP(H, FFN), x, go, sequence_parallel=True)
    want = ftp.sequence_parallel(B, S, H, tp, sp_params=H)  # b2 [h]: its gradient sum is the one all-reduce
    led = world.ledger
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert led.count(op) == want[f"{op}.count"] and led.payload_bytes(op) == want[f"{op}.bytes"]
    assert led.count("all_gather", "backward", tag="sp.regather") == want["all_gather.regather.count"] == 1
    # wire counted along the ring schedule (blocks.ring), not the ledger entries' model: tests the formula's factors
    activations = ring.ledger_wire_bytes(led, "all_gather") + ring.ledger_wire_bytes(led, "reduce_scatter")
    assert activations == pytest.approx(want["wire_bytes"])
    assert ring.ledger_wire_bytes(led, "all_reduce") == pytest.approx(want["all_reduce.wire_bytes"])
    # program order (rank arithmetic, not the formula): what Megatron's SP linear pair issues, then the bias sum
    assert [(e.phase, e.op, e.tag) for e in led] == [
        ("forward", "all_gather", "sp.gather"), ("forward", "reduce_scatter", "sp.reduce_scatter"),
        ("backward", "all_gather", "sp.reduce_scatter"), ("backward", "all_gather", "sp.regather"),
        ("backward", "reduce_scatter", "sp.gather"), ("backward", "all_reduce", "sp.grads"),
    ]
    # the plain TP MLP's two all-reduces move (p-1)/p·bsh·e less on the wire: exactly one all-gather of the shard
    plain = SimulatedWorld(tp)
    plain.run(mlp_step, models.MLP(H, FFN), x, go)
    full = B * S * H * 4
    assert ring.ledger_wire_bytes(plain.ledger) == pytest.approx(want["all_reduce_wire_bytes"])
    assert activations - ring.ledger_wire_bytes(plain.ledger) == pytest.approx((tp - 1) * full / tp)


@pytest.mark.parametrize("tp,vocab", [(2, 50), (4, 50), (4, 53)])
def test_embedding_and_ce_ledger_match_formula(tp: int, vocab: int) -> None:
    ids = torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(1))
    world = SimulatedWorld(tp)
    world.run(embedding_step, nn.Embedding(vocab, H), ids, _x()[1])
    want = ftp.embedding_all_reduce(B, S, H, tp)
    assert (world.ledger.count(), world.ledger.payload_bytes()) == (want["count"], want["bytes"])

    logits = torch.randn(B, S, vocab)
    for eps in (0.0, 0.1):
        world.run(ce_step, logits, ids, "vocab_parallel", eps)
        want = ftp.vocab_parallel_ce(B, S, tp, "float32", eps)
        assert (world.ledger.count("all_reduce"), world.ledger.payload_bytes()) == (want["count"], want["bytes"])
        assert ring.ledger_wire_bytes(world.ledger) == pytest.approx(want["wire_bytes"], rel=1e-12)  # ring schedule
    world.run(ce_step, logits, ids, "gather")
    want = ftp.gathered_logits(B, S, vocab, tp)
    assert (world.ledger.count("all_gather"), world.ledger.payload_bytes()) == (want["count"], want["bytes"])
    assert ring.ledger_wire_bytes(world.ledger) == pytest.approx(want["wire_bytes"], rel=1e-12)


# ---- gloo ---------------------------------------------------------------------------------------------------
def _mlp_then_ce(comm, dense, x, go, logits, target):
    """Both programs in one launch (spawning processes is the slow part)."""
    return mlp_step(comm, dense, x, go), ce_step(comm, logits, target, "vocab_parallel", 0.1)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_gloo_matches_simulated_for_mlp_and_ce(tp: int) -> None:
    x, go = _x(torch.float64)
    dense = models.MLP(H, FFN).double()
    logits = torch.randn(B, S, 53, dtype=torch.float64)  # uneven vocab: 53 over 2 / 4
    target = torch.randint(0, 53, (B, S))
    args = (dense, x, go, logits, target)
    sim = SimulatedWorld(tp)
    want = sim.run(_mlp_then_ce, *args)
    dist = DistributedWorld(tp)
    got = dist.run(_mlp_then_ce, *args)
    assert dist.ledger == sim.ledger
    assert sim.ledger.count("all_reduce", "forward") == 1 + 4  # MLP g + CE max/target/sumexp/smooth
    assert sim.ledger.count("all_reduce", "backward") == 1  # MLP f
    # gloo may add the ranks' contributions in another order than the simulated rank order: rounding only
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
