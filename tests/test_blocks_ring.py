"""The ring schedule (``shardlab.blocks.ring``) against independent oracles.

- values: the dense sum / concatenation in float64 (exact up to summation order; the inputs are small ints, so
  every float64 sum here is exact and compared with ==);
- bytes: counted from the schedule's definition in the comments below, never through ``wire_bytes``:
  in the reduce-scatter phase rank r sends every chunk except chunk r (it keeps that one), in the all-gather
  phase every chunk except chunk r + 1 (it receives that one last), so with chunk sizes c_0..c_{W-1}:
  all-reduce sends (n − c_r) + (n − c_{r+1}) elements, reduce-scatter n − c_r, all-gather n − c_{r+1}.
"""

from __future__ import annotations

import pytest
import torch

from shardlab.blocks import ring, split_sizes
from shardlab.comm import SimulatedWorld
from shardlab.formulas.common import ring_steps, ring_time_s, wire_bytes


def _ints(w: int, n: int) -> list[torch.Tensor]:
    return [torch.arange(n, dtype=torch.float64) * (r + 1) + r for r in range(w)]  # rank arithmetic


@pytest.mark.parametrize("w", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [8, 13])
def test_all_reduce_values_bytes_and_steps(w: int, n: int) -> None:
    if n < w:
        pytest.skip("fewer elements than ranks")
    inputs = _ints(w, n)
    t = ring.simulate("all_reduce", inputs)
    dense = torch.stack(inputs).sum(0)
    assert all(torch.equal(r, dense) for r in t.results)
    assert t.steps == 2 * (w - 1)
    c = split_sizes(n, w)
    for r in range(w):
        assert t.sent_bytes(r) == ((n - c[r]) + (n - c[(r + 1) % w])) * 8 if w > 1 else t.sent_bytes(r) == 0
    assert all(h == frozenset(range(w)) for row in t.held[-1] for h in row)  # every copy holds every rank


@pytest.mark.parametrize("w", [2, 4, 8])
def test_even_chunks_give_the_ring_formula(w: int) -> None:
    n = 16 * w
    t = ring.simulate("all_reduce", _ints(w, n))
    assert {t.sent_bytes(r) for r in range(w)} == {2 * (w - 1) * (n // w) * 8}  # 2(W-1) chunks of n/W
    assert t.sent_bytes(0) == wire_bytes("all_reduce", n * 8, w)  # the formula the notebooks use agrees


@pytest.mark.parametrize("w,n", [(4, 8), (3, 10)])
def test_reduce_scatter_and_all_gather(w: int, n: int) -> None:
    inputs = _ints(w, n)
    c = split_sizes(n, w)
    rs = ring.simulate("reduce_scatter", inputs)
    dense = torch.stack(inputs).sum(0)
    assert [r.tolist() for r in rs.results] == [b.tolist() for b in torch.split(dense, c)]
    assert rs.steps == w - 1 and [rs.sent_bytes(r) for r in range(w)] == [(n - c[r]) * 8 for r in range(w)]
    shards = [torch.full((c[r],), float(r), dtype=torch.float64) for r in range(w)]
    ag = ring.simulate("all_gather", shards)
    assert all(torch.equal(r, torch.cat(shards)) for r in ag.results)
    assert [ag.sent_bytes(r) for r in range(w)] == [(n - c[(r + 1) % w]) * 8 for r in range(w)]


def test_every_send_goes_to_the_next_rank_one_chunk_per_step() -> None:
    t = ring.simulate("all_reduce", _ints(4, 8))
    assert all(s.dst == (s.src + 1) % 4 for s in t.sends)
    for step in range(1, t.steps + 1):
        assert sorted(s.src for s in t.sends_at(step)) == [0, 1, 2, 3]
    assert [t.phase_of(s) for s in range(1, 7)] == ["reduce-scatter"] * 3 + ["all-gather"] * 3


@pytest.mark.parametrize("op,inputs,msg", [
    ("broadcast", [torch.ones(2)], "op='broadcast' is not one of"),
    ("all_reduce", [], "at least one rank"),
    ("all_reduce", [torch.ones(2, 2)], "must be 1-D"),
    ("all_reduce", [torch.ones(4), torch.ones(5)], "the same length"),
])
def test_bad_input(op: str, inputs: list[torch.Tensor], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ring.simulate(op, inputs)


@pytest.mark.parametrize("op", ring.OPS)
@pytest.mark.parametrize("w, n", [(1, 5), (2, 8), (3, 13), (4, 10), (8, 5), (8, 64)])
def test_data_free_wire_bytes_is_the_mean_of_what_the_simulation_sent(op: str, w: int, n: int) -> None:
    """``ring.wire_bytes`` walks the schedule without data: it must equal the mean over ranks of the bytes the
    data-carrying simulation sent (uneven chunks make ranks differ by whole elements)."""
    inputs = [torch.zeros(n)] * w  # all_gather: n is each rank's shard
    if op != "all_gather" and n < w:
        pytest.skip("simulate needs a chunk per rank")
    t = ring.simulate(op, inputs)
    assert ring.wire_bytes(op, n, w, 4) == pytest.approx(sum(t.sent_bytes(r) for r in range(w)) / w, rel=1e-12)


def test_ring_steps_from_the_simulation() -> None:
    for w in (1, 2, 3, 8):
        for op in ring.OPS:
            n = 8 if op == "all_gather" else 16
            assert ring.simulate(op, [torch.zeros(n)] * w).steps == ring_steps(op, w)
    # α–β by hand: 2(p−1) = 14 steps of 10 µs + 2·7/8·4096 B at 1 GB/s = 140 µs + 7.168 µs
    assert ring_time_s("all_reduce", 4096, 8, 1e-5, 1e9) == pytest.approx(140e-6 + 7168e-9)


def test_ledger_wire_bytes_counts_the_schedule_not_the_entries() -> None:
    """A SimulatedWorld ledger priced along the schedule: all-reduce of 10 floats over 4 ranks (chunks 3, 3, 2, 2:
    the ranks send 56, 60, 64, 60 bytes, mean 60), an all-gather of 3-float shards ((4 − 1)·12 = 36 bytes)."""
    world = SimulatedWorld(4)
    world.run(lambda comm: (comm.all_reduce(torch.ones(10)), comm.all_gather(torch.ones(3))))
    assert ring.ledger_wire_bytes(world.ledger, "all_reduce") == 60.0
    assert ring.ledger_wire_bytes(world.ledger, "all_gather") == 36.0
    assert ring.ledger_wire_bytes(world.ledger) == 96.0
    world.run(lambda comm: comm.all_to_all(torch.ones(4)))
    with pytest.raises(ValueError, match="prices"):
        ring.ledger_wire_bytes(world.ledger)
