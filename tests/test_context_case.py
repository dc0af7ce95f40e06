"""Notebook 10's parameters, the explorer's numbers and the exercises' grading: rules with their numbers, a small
ring's sends and work vs the closed forms worked out here, the hand-written answer key accepted and a naive merge
(exp of a log-sum-exp overflows float32) rejected."""

from __future__ import annotations

import pytest
import torch

from shardlab.context.balance import explore
from shardlab.context.params import ContextParams
from shardlab.context.solutions import SOLUTIONS
from shardlab.core.answer_keys import load_key
from shardlab.core.exercises import Exercises


@pytest.mark.parametrize(("bad", "message"), [
    (dict(cp=1), "cp=1 splits nothing"),
    (dict(seq=100), "seq=100 is not divisible by 2·cp = 16"),
    (dict(heads=7), "heads=7 is not divisible by kv_heads=2"),
    (dict(layout="striped"), "layout='striped' must be one of"),
    (dict(causal=1), "causal=1 must be True or False"),
    (dict(head_dim=0), "head_dim=0 must be a positive int"),
])
def test_params_rules(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContextParams(**bad).validate()


def test_defaults_are_legal() -> None:
    p = ContextParams().validate()
    assert (p.cp, p.seq % (2 * p.cp)) == (8, 0)


def test_explore_counts() -> None:
    """cp 4, s 32, hkv 2, d 8, f32: one block = 1·8·2·8·4 = 512 B; forward 6 sends, ring backward 6 + 8."""
    res = explore(cp=4, seq=32, kv_heads=2, head_dim=8, layout="contiguous", causal=True)
    assert res["ledger"] == res["formula"] == {"count": 20, "bytes": 20 * 512}
    assert res["allgather_payload"] == 512
    assert res["work"] == [36 + 64 * r for r in range(4)]  # c = 8: r·64 + 8·9/2
    assert res["max_over_mean"] == pytest.approx(228 / 132)
    zig = explore(cp=4, seq=32, kv_heads=2, head_dim=8, layout="zigzag", causal=True)
    assert zig["work"] == [7 * 16 + 2 * 10] * 4  # c = 4: 2cp − 1 full blocks and 2 diagonal ones
    with pytest.raises(ValueError, match="seq=32 is not divisible by the 6 chunks of the zigzag layout"):
        explore(cp=3, seq=32, kv_heads=2, head_dim=8, layout="zigzag", causal=True)


def test_answer_key_and_code_exercise() -> None:
    key = load_key("10_context_parallel")
    ex = Exercises("10_context_parallel", answers=key, solutions=SOLUTIONS)
    for n in (1, 2, 3, 5):
        assert "the injected answer key was graded" in ex.grade(n)
    assert ex.grade(4, 2, count=2) == "exercise 4: right"
    plain = Exercises("10_context_parallel", solutions=SOLUTIONS)
    assert plain.grade(1, 15 * 2 * 8192 * 8 * 128 * 2) == "exercise 1: right"

    def naive(o1, l1, o2, l2):  # type: ignore[no-untyped-def]  # right in exact arithmetic, overflows in float32
        a, b = torch.exp(l1).unsqueeze(-1), torch.exp(l2).unsqueeze(-1)
        return (o1 * a + o2 * b) / (a + b)

    assert plain.grade(5, naive).startswith("exercise 5: not quite")
    namespace: dict = {}
    exec(key["5"], namespace)
    assert plain.grade(5, namespace["answer"]) == "exercise 5: right"
