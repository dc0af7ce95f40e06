"""The order integer program against brute force over every topological order (levers.order.all_orders) and the
exact dynamic programme (levers.order.extremes), on random graphs with 0-byte operators and on parts of a graph;
the split solver against the unsplit optimum; the simulator against levers.order's."""

from __future__ import annotations

import random

import pytest

from shardlab.memory import ilp, roam
from shardlab.profile import order as O


def random_graph(rng: random.Random, n: int, zero: float = 0.3) -> O.Graph:
    spec = {}
    for i in range(n):
        earlier = [f"t{j}" for j in range(i)]
        ins = rng.sample(earlier, k=min(len(earlier), rng.randint(0, 2)))
        size = 0 if rng.random() < zero else rng.randint(1, 20)
        spec[f"op{i}"] = (ins, {f"t{i}": size})
    return O.graph(spec, outputs=[f"t{n - 1}"], name=f"random-{n}")


def test_roam_toy_ilp_finds_the_better_order() -> None:
    p = ilp.problem_from_graph(O.roam_toy())
    sol = ilp.solve(p)
    assert (sol.peak, sol.optimal, ilp.peak(p, p.ops)) == (12, True, 17)  # the module note's 12 vs 17 MB
    assert sol.order == ("V0", "V2", "V1", "V3")


@pytest.mark.parametrize("seed", range(12))
def test_ilp_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    g = random_graph(rng, rng.randint(4, 8))
    brute = O.all_orders(g)[0].peak  # every topological order simulated
    p = ilp.problem_from_graph(g)
    for reduce in (True, False):
        sol = ilp.solve(p, reduce=reduce)
        assert sol.optimal and sol.peak == brute, (reduce, sol.peak, brute)
        assert O.peak(g, sol.order).peak == brute  # the order is real: levers.order agrees


@pytest.mark.parametrize("seed", range(6))
def test_ilp_equals_exact_search_on_wider_graphs(seed: int) -> None:
    rng = random.Random(100 + seed)
    g = random_graph(rng, 14, zero=0.4)
    assert ilp.solve(ilp.problem_from_graph(g)).peak == O.extremes(g).best.peak


@pytest.mark.parametrize("seed", range(5))
def test_simulator_matches_levers_order(seed: int) -> None:
    rng = random.Random(seed)
    g = random_graph(rng, 12)
    p = ilp.problem_from_graph(g)
    order = ilp.greedy(p)
    assert ilp.simulate(p, order) == [s.during for s in O.peak(g, order).steps]


def test_reduction_keeps_the_optimum_and_shrinks() -> None:
    # x -> a (10 B) ; three in-place-like 0-byte ops hang off a; b reads a
    g = O.graph({"x": ((), {"a": 10}), "w1": (("a",), {"k1": 0}), "w2": (("k1",), {"k2": 0}),
                 "src": ((), {"z": 0}), "b": (("a", "k2"), {"o": 3})}, outputs=["o"])
    p = ilp.problem_from_graph(g)
    red = ilp.reduce_problem(p)
    assert red.prefix == ("src",) and red.members["x"] == ("x", "w1", "w2")
    assert red.problem.n == 2
    assert ilp.solve(p).peak == O.all_orders(g)[0].peak == 13


def test_part_problem_counts_what_crosses() -> None:
    # a (5) read by c; b (7) read by d, which comes after the part [b, c]: inside, a is resident, b is kept
    g = O.graph({"a": ((), {"a": 5}), "b": ((), {"b": 7}), "c": (("a",), {"c": 1}), "d": (("b", "c"), {"d": 2})},
                outputs=["d"])
    part = ilp.problem_from_graph(g, ("b", "c"), context=("a", "b", "c", "d"))
    by = {t.name: t for t in part.tensors}
    assert by["a"].producer is None and by["a"].consumers == (1,) and not by["a"].keep
    assert by["b"].keep and by["c"].keep
    # order b, c: during b: a + b = 12; during c: a + b + c = 13 (a still read by c)
    assert ilp.simulate(part, ("b", "c")) == [12, 13]


@pytest.mark.parametrize("seed", range(6))
def test_split_with_forced_cuts_only_is_exact(seed: int) -> None:
    """Forced cuts lose nothing: the split optimum equals the whole graph's (brute force)."""
    rng = random.Random(200 + seed)
    g = random_graph(rng, 9)
    base = g.order or tuple(o.name for o in g.ops)
    sp = roam.solve_split(g, base, max_ops=100, min_ops=1)
    assert sp.live_set_cuts == 0
    assert sp.peak == O.all_orders(g)[0].peak


def test_chain_is_cut_everywhere() -> None:
    g = O.graph({f"op{i}": ((f"t{i - 1}",) if i else (), {f"t{i}": i + 1}) for i in range(6)}, outputs=["t5"])
    parts = roam.split(g, [f"op{i}" for i in range(6)], max_ops=10, min_ops=1)
    # op0 waits for nothing: pinned to the part of its reader op1
    assert [p.ops for p in parts] == [("op0", "op1"), *((f"op{i}",) for i in range(2, 6))]
    assert [p.cut for p in parts] == ["forced"] * 4 + ["end"]


@pytest.mark.parametrize("seed", range(4))
def test_live_set_split_is_an_upper_bound(seed: int) -> None:
    rng = random.Random(300 + seed)
    g = random_graph(rng, 12)
    base = g.order or tuple(o.name for o in g.ops)
    sp = roam.solve_split(g, base, max_ops=4, min_ops=2)
    best = O.extremes(g).best.peak
    assert best <= sp.peak <= O.peak(g, base).peak
    O.peak(g, sp.order)  # a valid topological order of the whole graph (raises otherwise)


def test_bad_inputs_name_the_parameter() -> None:
    g = O.roam_toy()
    with pytest.raises(ValueError, match="max_ops=0"):
        roam.split(g, ("V0", "V1", "V2", "V3"), max_ops=0)
    with pytest.raises(ValueError, match="time_limit_s=0"):
        ilp.solve(ilp.problem_from_graph(g), time_limit_s=0)
    with pytest.raises(ValueError, match="runs before its predecessors"):
        ilp.simulate(ilp.problem_from_graph(g), ("V1", "V0", "V2", "V3"))
