# ruff: noqa: E501  (HLO lines are long by nature)
"""Memory order: peaks worked out by hand, the brute force against a naive set-based re-implementation of the
memory model written here, and the dynamic programme against the brute force on random graphs."""

from __future__ import annotations

import itertools
import random

import pytest

from shardlab.profile import order as O
from shardlab.profile.hlo import parse_hlo


def naive_peak(spec: dict, outputs: set[str], seq: tuple[str, ...]) -> int:
    """The memory model, written independently: sets of live tensor names, no bit masks, no helpers."""
    sizes = {t: b for _, (_, outs) in spec.items() for t, b in outs.items()}
    readers = {t: {k for k, (ins, _) in spec.items() if t in ins} for t in sizes}
    live: set[str] = set()
    ran: set[str] = set()
    top = 0
    for op in seq:
        ins, outs = spec[op]
        live |= set(outs)
        top = max(top, sum(sizes[t] for t in live))
        ran.add(op)
        live = {t for t in live if t in outputs or (readers[t] - ran)}
    return top


def random_spec(rng: random.Random, n: int) -> tuple[dict, set[str]]:
    spec: dict = {}
    for i in range(n):
        earlier = [f"t{j}" for j in range(i)]
        ins = rng.sample(earlier, k=min(len(earlier), rng.randint(0, 2)))
        spec[f"op{i}"] = (tuple(ins), {f"t{i}": rng.randint(0, 9)})
    return spec, {f"t{n - 1}"}


def test_roam_toy_by_hand() -> None:
    g = O.roam_toy()
    # V0-V1-V2-V3: V0 small + large = 11; V1 11 + expanded (6) = 17, frees small -> 16; V2 16 + shrunk (1) = 17
    # -> expanded + shrunk = 7; V3 7 + out = 8
    bad = O.peak(g, ("V0", "V1", "V2", "V3"))
    assert [s.during for s in bad.steps] == [11, 17, 17, 8]
    # V0-V2-V1-V3: V2 11 + 1 = 12, frees large -> small + shrunk = 2; V1 2 + 6 = 8 -> 7; V3 8
    good = O.peak(g, ("V0", "V2", "V1", "V3"))
    assert [s.during for s in good.steps] == [11, 12, 8, 8]
    assert (good.peak, bad.peak) == (12, 17)
    e = O.extremes(g)
    assert (e.best.peak, e.worst.peak, e.orders) == (12, 17, 2)
    assert e.ratio == pytest.approx(12 / 17)


def test_chain_and_symmetric_diamond() -> None:
    chain = O.graph({"A": ((), {"x": 4}), "B": (("x",), {"y": 2}), "C": (("y",), {"z": 1})}, outputs=("z",))
    # one order only: A 4; B 4 + 2 = 6; C 2 + 1 = 3
    assert O.peak(chain).peak == 6 and O.extremes(chain).orders == 1
    diamond = O.graph({"s": ((), {"x": 5}), "l": (("x",), {"p": 3}), "r": (("x",), {"q": 3}),
                       "j": (("p", "q"), {"o": 1})}, outputs=("o",))
    # both orders: x + p + q = 11 while the second branch runs: a symmetric diamond cannot gain from order
    e = O.extremes(diamond)
    assert (e.best.peak, e.worst.peak, e.orders, e.ratio) == (11, 11, 2, 1.0)


def test_outputs_and_external_inputs() -> None:
    g = O.Graph((O.Op("f", ("w",), (("y", 3),)), O.Op("g", ("y", "w"), (("z", 2),))), frozenset({"z"}),
                external={"w": 100})
    assert O.peak(g).peak == 5  # w is never counted; y (3) + z (2)
    g2 = O.Graph(g.ops, g.outputs, g.external, count_outputs=False)
    assert O.peak(g2).peak == 3  # the output z is not counted either


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_matches_naive_model_and_dp(seed: int) -> None:
    rng = random.Random(seed)
    spec, outs = random_spec(rng, rng.randint(3, 7))
    g = O.graph(spec, outputs=outs)
    profiles = O.all_orders(g)
    naive = {p.order: naive_peak(spec, outs, p.order) for p in profiles}
    assert {p.order: p.peak for p in profiles} == naive
    # every permutation that respects the edges is listed, and only those
    names = list(spec)
    legal = [perm for perm in itertools.permutations(names)
             if all(perm.index(o) > perm.index(f"op{t[1:]}") for o in perm for t in spec[o][0])]
    assert sorted(p.order for p in profiles) == sorted(legal)
    e = O.extremes(g)
    assert (e.best.peak, e.worst.peak, e.orders) == (min(naive.values()), max(naive.values()), len(legal))


def test_limits_are_clear() -> None:
    wide = O.graph({f"op{i}": ((), {f"t{i}": 1}) for i in range(11)}, outputs=[f"t{i}" for i in range(11)])
    with pytest.raises(ValueError, match="11 operators; the brute force .* limited to max_ops=10"):
        O.all_orders(wide)
    with pytest.raises(ValueError, match="more than max_orders=5"):
        O.all_orders(O.graph({f"op{i}": ((), {f"t{i}": 1}) for i in range(4)}), max_orders=5)
    with pytest.raises(ValueError, match="more than max_states=3"):
        O.extremes(wide, max_states=3)
    e = O.extremes(wide)  # 11 independent operators: 11! orders, 2^11 sets, one peak (everything is kept)
    assert (e.orders, e.states, e.best.peak, e.worst.peak) == (39916800, 2048, 11, 11)


def test_bad_graphs_and_orders() -> None:
    with pytest.raises(ValueError, match="reads 'nope'"):
        O.graph({"a": (("nope",), {"x": 1})})
    with pytest.raises(ValueError, match="written twice"):
        O.graph({"a": ((), {"x": 1}), "b": ((), {"x": 1})})
    g = O.roam_toy()
    with pytest.raises(ValueError, match="'V1' runs before its producers \\['V0'\\]"):
        O.peak(g, ("V1", "V0", "V2", "V3"))
    with pytest.raises(ValueError, match="missing \\['V3'\\]"):
        O.peak(g, ("V0", "V1", "V2"))
    cyc = O.Graph((O.Op("a", ("y",), (("x", 1),)), O.Op("b", ("x",), (("y", 1),))))
    with pytest.raises(ValueError, match="cycle"):
        O.extremes(cyc)


HLO = """HloModule m, is_scheduled=true, num_partitions=1

ENTRY %main (p0: f32[4,8], p1: f32[8,16]) -> (f32[4,16], f32[]) {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,16]{1,0} parameter(1)
  %c = f32[] constant(0)
  %big = f32[4,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %small = f32[4,8]{1,0} negate(%p0)
  %bc = f32[64]{0} bitcast(%big)
  %r = f32[] reduce(%bc, %c), dimensions={0}, to_apply=%add
  %s = f32[4,8]{1,0} add(%small, %small)
  ROOT %t = (f32[4,16]{1,0}, f32[]) tuple(%big, %r)
}
"""


def test_graph_from_hlo_by_hand() -> None:
    g = O.graph_from_hlo(parse_hlo(HLO))
    assert [o.name for o in g.ops] == ["big", "small", "r", "s"]  # bitcast and tuple folded away
    assert g.order == ("big", "small", "r", "s")  # the schedule (is_scheduled=true)
    assert dict(g.external) == {"p0": 128, "p1": 512, "c": 4}
    assert g.ops[2].inputs == ("big", "c")  # the bitcast's buffer is big's
    assert g.outputs == {"big", "r"}
    # outputs (big 256 B, r 4 B) not counted: small 128 lives until s; s 128 -> peak 256 while s runs
    assert O.peak(g).peak == 256
    # counted: while s runs big 256 + small 128 + r 4 + s 128
    assert O.peak(O.Graph(g.ops, g.outputs, g.external, count_outputs=True)).peak == 256 + 128 + 4 + 128
