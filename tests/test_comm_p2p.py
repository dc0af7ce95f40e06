"""shardlab.comm point-to-point (send / recv) and all_to_all: values from rank arithmetic, an all-to-all checked
against the chunk transpose written out element by element, ledger rows against the byte rules (a send's wire
bytes = its payload, a recv's 0, an all-to-all's (W − 1)/W of its input), the pairing check, errors, and
SimulatedWorld vs real gloo processes (identical ledgers and results)."""

from __future__ import annotations

import pytest
import torch

from shardlab.comm import (
    CollectiveMismatch,
    DistributedWorld,
    Ledger,
    LedgerEntry,
    RankError,
    SimulatedWorld,
    ledger_problem,
    phase_scope,
)
from shardlab.formulas.common import wire_bytes

F32 = 4  # bytes per float32 element


# ---- send / recv -----------------------------------------------------------------------------------
@pytest.mark.parametrize("w", [2, 3, 4])
def test_ring_shift_receives_the_previous_rank(w: int) -> None:
    def shift(c):
        c.send(torch.ones(2, 3) * c.rank, (c.rank + 1) % c.world_size, tag="act")
        return c.recv((2, 3), torch.float32, (c.rank - 1) % c.world_size, tag="act")

    world = SimulatedWorld(w)
    outs = world.run(shift)
    for r, out in enumerate(outs):
        assert torch.equal(out, torch.full((2, 3), float((r - 1) % w)))  # ones * (rank - 1)
    for r, led in enumerate(world.ledgers):
        send, recv = led
        assert (send.op, send.peer, send.payload_bytes, send.wire_bytes) == ("send", (r + 1) % w, 6 * F32, 6 * F32)
        assert (recv.op, recv.peer, recv.payload_bytes, recv.wire_bytes) == ("recv", (r - 1) % w, 6 * F32, 0.0)
        assert (send.shape, recv.shape, send.tag, send.phase) == ((2, 3), (2, 3), "act", "forward")


def test_messages_of_one_pair_arrive_in_send_order() -> None:
    def fn(c):
        if c.rank == 0:
            for k in range(5):  # five buffered sends before the receiver asks for any
                c.send(torch.tensor([float(k)]), 1)
            return None
        return [c.recv((1,), torch.float32, 0).item() for _ in range(5)]

    assert SimulatedWorld(2).run(fn)[1] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_send_copies_its_input() -> None:
    def fn(c):
        if c.rank == 0:
            x = torch.ones(3)
            c.send(x, 1)
            x.add_(41)  # the sender reuses its buffer right away: buffered-send semantics
            return x
        return c.recv((3,), torch.float32, 0)

    sent, got = SimulatedWorld(2).run(fn)
    assert torch.equal(sent, torch.full((3,), 42.0)) and torch.equal(got, torch.ones(3))


def test_collectives_between_p2p_rows_are_still_checked_rank_to_rank() -> None:
    def fn(c):
        if c.rank == 0:
            c.send(torch.ones(2), 1)
        else:
            c.recv((2,), torch.float32, 0)
        return c.all_reduce(torch.ones(1) * c.rank)  # seq 1 on both ranks, after one p2p row each

    world = SimulatedWorld(2)
    assert all(torch.equal(o, torch.ones(1)) for o in world.run(fn))
    assert [e.op for e in world.ledgers[0]] == ["send", "all_reduce"]
    assert [e.op for e in world.ledgers[1]] == ["recv", "all_reduce"]


def test_phase_scope_labels_p2p_rows() -> None:
    def fn(c):
        if c.rank == 0:
            c.send(torch.ones(1), 1)
            with phase_scope("backward"):
                c.send(torch.ones(1), 1)
        else:
            c.recv((1,), torch.float32, 0)
            with phase_scope("backward"):
                c.recv((1,), torch.float32, 0)

    world = SimulatedWorld(2)
    world.run(fn)
    assert [e.phase for e in world.ledgers[0]] == ["forward", "backward"]
    assert [e.phase for e in world.ledgers[1]] == ["forward", "backward"]
    with pytest.raises(ValueError, match="phase='bwd'"):
        with phase_scope("bwd"):
            pass


# ---- all_to_all ------------------------------------------------------------------------------------
@pytest.mark.parametrize("w", [2, 3, 4])
def test_all_to_all_is_the_chunk_transpose(w: int) -> None:
    c_len = 2  # elements per chunk
    world = SimulatedWorld(w)
    # rank r holds x_r[k] = 100 r + k, k < w * c_len
    outs = world.run(lambda c: c.all_to_all(torch.arange(float(w * c_len)) + 100 * c.rank))
    for j, out in enumerate(outs):
        # rank j, position i * c_len + t  <-  rank i's element j * c_len + t  =  100 i + j c_len + t
        expected = torch.tensor([100.0 * i + j * c_len + t for i in range(w) for t in range(c_len)])
        assert torch.equal(out, expected)
    (e,) = world.ledger
    payload = w * c_len * F32  # the full input
    assert (e.op, e.dim, e.payload_bytes) == ("all_to_all", 0, payload)
    assert e.wire_bytes == pytest.approx((w - 1) / w * payload)


@pytest.mark.parametrize("dim", [1, -1])
def test_all_to_all_on_another_dim_matches_dim_zero_after_a_transpose(dim: int) -> None:
    w = 4

    def fn(c):
        x = torch.arange(3.0 * 2 * w).reshape(3, 2 * w) + 1000 * c.rank  # [3, 2w]
        return c.all_to_all(x, dim=dim), c.all_to_all(x.t().contiguous(), dim=0)

    for along_dim, along_zero in SimulatedWorld(w).run(fn):
        assert torch.equal(along_dim, along_zero.t())


def test_all_to_all_errors_and_world_size_one() -> None:
    with pytest.raises(RankError, match="all_to_all: size 5 along dim=0 is not divisible by world_size=2"):
        SimulatedWorld(2).run(lambda c: c.all_to_all(torch.ones(5)))
    world = SimulatedWorld(1)
    x = torch.randn(4)
    (out,) = world.run(lambda c: c.all_to_all(x))
    assert out is x and len(world.ledger) == 0


# ---- the pairing check and errors ------------------------------------------------------------------
def test_ledger_problem_pairs_sends_with_recvs() -> None:
    def row(op: str, peer: int, shape=(2,)) -> LedgerEntry:
        return LedgerEntry(0, op, 2, "float32", shape, 8, 8.0 if op == "send" else 0.0, "forward", peer=peer)

    assert ledger_problem([Ledger([row("send", 1)]), Ledger([row("recv", 0)])]) is None
    assert "received 0" in ledger_problem([Ledger([row("send", 1)]), Ledger([])])
    assert "expected float32 (3,)" in ledger_problem([Ledger([row("send", 1)]), Ledger([row("recv", 0, (3,))])])
    ar = LedgerEntry(0, "all_reduce", 2, "float32", (2,), 8, 8.0, "forward")
    assert "collective rows differ" in ledger_problem([Ledger([ar]), Ledger([])])


def test_a_send_nobody_receives_fails_the_run() -> None:
    def fn(c):
        if c.rank == 0:
            c.send(torch.ones(2), 1)

    with pytest.raises(CollectiveMismatch, match="rank 0 sent 1 tensor\\(s\\) to rank 1 but rank 1 received 0"):
        SimulatedWorld(2).run(fn)


def test_recv_of_the_wrong_shape_names_both() -> None:
    def fn(c):
        if c.rank == 0:
            c.send(torch.ones(2, 3), 1)
        else:
            c.recv((3, 2), torch.float32, 0)

    with pytest.raises(CollectiveMismatch, match=r"expected torch.float32 \(3, 2\) but rank 0 sent torch.float32 "
                                                 r"\(2, 3\)"):
        SimulatedWorld(2).run(fn)


def test_bad_peers_are_refused() -> None:
    for fn, msg in [
        (lambda c: c.send(torch.ones(1), c.rank), r"send: dst=\d is this rank itself"),
        (lambda c: c.recv((1,), torch.float32, 2), r"recv: src=2 is not in \[0, world_size=2\)"),
        (lambda c: c.send(torch.ones(1), -1), r"send: dst=-1 is not in"),
    ]:
        with pytest.raises(RankError, match=msg):
            SimulatedWorld(2).run(fn)
    with pytest.raises(ValueError, match="send: dst=0 is this rank itself"):  # no bypass at world size 1
        SimulatedWorld(1).run(lambda c: c.send(torch.ones(1), 0))


def test_a_failed_sender_releases_the_receiver() -> None:
    def fn(c):
        if c.rank == 0:
            raise ValueError("sender died on purpose")
        return c.recv((1,), torch.float32, 0)

    with pytest.raises(RankError, match="rank 0 failed: ValueError: sender died on purpose"):
        SimulatedWorld(2, timeout_s=30).run(fn)


def test_wire_bytes_rules_for_the_new_ops() -> None:
    assert wire_bytes("send", 100, 4) == 100.0  # the whole tensor goes to one peer
    assert wire_bytes("recv", 100, 4) == 0.0  # counted once, on the sender
    assert wire_bytes("all_to_all", 100, 4) == 75.0  # 3/4: one chunk stays home


# ---- gloo: the same program in real processes ------------------------------------------------------
def _p2p_tour(comm):
    """Buffered sends piling up on one pair, a 1.2 MB message, a ring, and all_to_all on two dims."""
    w, r = comm.world_size, comm.rank
    nxt, prv = (r + 1) % w, (r - 1) % w
    for k in range(3):
        comm.send(torch.ones(4, 5) * (10 * r + k), nxt, tag=f"k{k}")
    got = [comm.recv((4, 5), torch.float32, prv) for _ in range(3)]
    comm.send(torch.arange(300_000.0) + r, nxt)
    big = comm.recv((300_000,), torch.float32, prv)
    with phase_scope("backward"):
        comm.send(torch.ones(2, dtype=torch.float64) * r, prv)
        back = comm.recv((2,), torch.float64, nxt)
    a0 = comm.all_to_all(torch.arange(2.0 * w * 3).reshape(2 * w, 3) + 100 * r, dim=0)
    a1 = comm.all_to_all(torch.arange(3.0 * 2 * w).reshape(3, 2 * w) + 100 * r, dim=1)
    return {"got": torch.stack(got), "big": big, "back": back, "a0": a0, "a1": a1}


@pytest.mark.slow  # real processes (~2-5 s), like test_comm's gloo tests
def test_gloo_matches_simulated_p2p_and_all_to_all() -> None:
    w = 3
    sim = SimulatedWorld(w)
    expected = sim.run(_p2p_tour)
    gloo = DistributedWorld(w)
    got = gloo.run(_p2p_tour)
    for r in range(w):
        for k in expected[r]:
            assert torch.equal(got[r][k], expected[r][k]), (r, k)  # pure data movement: exact
        assert torch.equal(expected[r]["got"][:, 0, 0], torch.tensor([10.0 * ((r - 1) % w) + k for k in range(3)]))
    assert gloo.ledgers == sim.ledgers
    assert [e.op for e in gloo.ledger] == ["send"] * 3 + ["recv"] * 3 + ["send", "recv"] * 2 + ["all_to_all"] * 2
