"""Vocab-parallel cross-entropy against torch.nn.functional.cross_entropy on the full logits (the oracle),
including label smoothing, ignore_index and vocab sizes not divisible by tp; gradients included.

float64: the parallel code reduces over the vocab in pieces (per rank, then all-reduce), so it agrees with
torch to rounding only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardlab.comm import SimulatedWorld
from shardlab.tp import gathered_cross_entropy, vocab_parallel_cross_entropy, vocab_range
from shardlab.tp.programs import ce_step

B, S = 2, 5
TOL = dict(rtol=1e-10, atol=1e-12)


def oracle(logits, target, eps=0.0, ignore=-100):
    z = logits.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(
        z.flatten(0, 1), target.flatten(), reduction="none", label_smoothing=eps, ignore_index=ignore
    ).view_as(target)
    loss.sum().backward()
    return loss.detach(), z.grad


def make(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S, vocab, dtype=torch.float64, generator=g) * 3
    target = torch.randint(0, vocab, (B, S), generator=g)
    target[0, 0], target[1, -1] = 0, vocab - 1  # first and last row of the table
    return logits, target


@pytest.mark.parametrize("method", ["vocab_parallel", "gather"])
@pytest.mark.parametrize("tp,vocab", [(1, 12), (2, 12), (4, 12), (4, 13), (4, 50), (2, 7)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_matches_torch_cross_entropy(method: str, tp: int, vocab: int, eps: float) -> None:
    logits, target = make(vocab)
    target[1, 1] = -100  # ignored position
    loss, grad = oracle(logits, target, eps)
    res = SimulatedWorld(tp).run(ce_step, logits, target, method, eps)
    for r, rr in enumerate(res):
        start, end = vocab_range(vocab, r, tp)
        torch.testing.assert_close(rr["loss"], loss, **TOL)
        torch.testing.assert_close(rr["grad_logits"], grad[..., start:end], **TOL)
        assert torch.equal(rr["loss"], res[0]["loss"])  # bit-identical on every rank
    assert float(res[0]["loss"][1, 1]) == 0.0


def test_custom_ignore_index_and_all_ignored_rows() -> None:
    logits, target = make(9, seed=3)
    target[0] = 4  # a whole row of the ignored label
    loss, grad = oracle(logits, target, 0.2, ignore=4)
    for r, rr in enumerate(SimulatedWorld(3).run(ce_step, logits, target, "vocab_parallel", 0.2, 4)):
        s, e = vocab_range(9, r, 3)
        torch.testing.assert_close(rr["loss"], loss, **TOL)
        torch.testing.assert_close(rr["grad_logits"], grad[..., s:e], **TOL)


@pytest.mark.parametrize("eps,count", [(0.0, 3), (0.1, 4)])
def test_communicates_b_times_s_values_only(eps: float, count: int) -> None:
    vocab, tp = 50, 4
    logits, target = make(vocab)
    world = SimulatedWorld(tp)
    world.run(ce_step, logits, target, "vocab_parallel", eps)
    led = world.ledger
    assert led.count() == count == led.count("all_reduce", "forward")  # backward needs no communication
    assert all(e.shape == (B, S) for e in led)  # b*s values, never b*s*V
    assert [e.reduce_op for e in led][0] == "max"

    world.run(ce_step, logits, target, "gather", eps)
    (ag,) = world.ledger
    assert (ag.op, ag.shape) == ("all_gather", (B, S, 13))  # padded to ceil(50/4) = 13


def test_bad_input_names_the_values() -> None:
    logits, target = make(10)
    bad = target.clone()
    bad[0, 1] = 10
    with pytest.raises(Exception, match=r"labels \[10\] are outside \[0, vocab=10\) and are not ignore_index=-100"):
        SimulatedWorld(2).run(ce_step, logits, bad)

    def wrong_shard(c):  # every rank passes 4 columns, but vocab_range(10, r, 2) has 5
        return vocab_parallel_cross_entropy(logits[..., :4], target, c, vocab=10)

    with pytest.raises(Exception, match=r"holds 4 logits columns but vocab_range\(10, \d, 2\) = \(\d, \d+\) has 5"):
        SimulatedWorld(2).run(wrong_shard)
    with pytest.raises(Exception, match="label_smoothing=1.5"):
        SimulatedWorld(2).run(ce_step, logits, target, "vocab_parallel", 1.5)


def _uneven_call(comm, logits, target, fn, vocab):
    """One rank of a caller that slices its own shard of an uneven vocab and may omit `vocab=`."""
    start, end = vocab_range(logits.shape[-1], comm.rank, comm.world_size)
    kw = {} if vocab is None else {"vocab": vocab}
    return fn(logits[..., start:end], target, comm, 0.1, -100, **kw)


@pytest.mark.parametrize("fn", [vocab_parallel_cross_entropy, gathered_cross_entropy])
def test_uneven_vocab_1003_over_4_never_silently_wrong(fn) -> None:
    """V = 1003 over tp = 4 (shards 251/251/251/250), label smoothing 0.1, ignore_index -100.

    Oracle: torch's dense F.cross_entropy on the full logits. With vocab= every rank matches it; without, no rank
    can know V from its own width (ranks 0-2 would guess 1004, rank 3 1000), so the call must be rejected — before
    the fix it returned losses off by up to 0.6 nats and different on rank 3."""
    vocab, tp = 1003, 4
    logits, target = make(vocab, seed=7)
    target[0, 2] = -100
    loss, _ = oracle(logits, target, eps=0.1, ignore=-100)
    res = SimulatedWorld(tp).run(_uneven_call, logits, target, fn, vocab)
    for r in res:
        torch.testing.assert_close(r, loss, **TOL)
    with pytest.raises(Exception, match=r"vocab= \(the global vocabulary size\) is required: rank \d holds 25[01]"):
        SimulatedWorld(tp).run(_uneven_call, logits, target, fn, None)
