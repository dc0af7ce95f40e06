"""Sharding strings: ``blocks.tiles`` predicts what torch_xla prints; the oracle is torch_xla itself
(``_get_xla_sharding_spec`` after ``mark_sharding`` on the 8-device world)."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.blocks import tiles

CASES = [
    ((8,), ("a",), ("a", None)),
    ((2, 4), ("a", "b"), ("a", "b")),
    ((2, 4), ("a", "b"), ("b", "a")),
    ((2, 4), ("a", "b"), (None, "b")),
    ((2, 4), ("a", "b"), ("b", None)),
    ((2, 4), ("a", "b"), ("a", None)),
    ((2, 4), ("a", "b"), (None, "a")),
    ((2, 4), ("a", "b"), (None, None)),
    ((1, 8), ("a", "b"), (None, "b")),
    ((4, 2), ("a", "b"), (None, "a")),
    ((2, 2, 2), ("a", "b", "c"), ("c", "a")),
    ((2, 2, 2), ("a", "b", "c"), ("c", None)),
    ((2, 4), ("a", "b"), (("a", "b"), None)),
    ((2, 4), ("a", "b"), (("b", "a"), None)),
]


@pytest.mark.xla
@pytest.mark.parametrize("mesh_shape,names,spec", CASES)
def test_prediction_matches_torch_xla(xla_world, mesh_shape, names, spec) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime

    t = torch.zeros(8, 8).to(runtime.device())
    xs.mark_sharding(t, runtime.mesh(mesh_shape, names), spec)
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == tiles.sharding_string(mesh_shape, names, spec)


@pytest.mark.xla
def test_custom_device_order_matches_torch_xla(xla_world) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime

    ids = [0, 2, 4, 6, 1, 3, 5, 7]
    t = torch.zeros(8, 8).to(runtime.device())
    xs.mark_sharding(t, xs.Mesh(np.array(ids), (2, 4), ("a", "b")), ("a", "b"))
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == tiles.sharding_string((2, 4), ("a", "b"), ("a", "b"), ids)


def test_read_back() -> None:
    s = tiles.sharding_string((2, 4), ("data", "model"), (None, "model"))
    d = tiles.tile_devices(s, 2)
    # mesh [[0,1,2,3],[4,5,6,7]]: column block j lives on device j (data 0) and j + 4 (data 1)
    assert d.shape == (1, 4, 2) and d[0].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert tiles.tile_devices("{devices=[2,4]0,1,2,3,4,5,6,7}", 2).shape == (2, 4, 1)
    assert tiles.tile_devices("{replicated}", 2, num_devices=4).reshape(-1).tolist() == [0, 1, 2, 3]
    own = tiles.owners((4, 8), d)
    assert own[0][0] == (0, 4) and own[3][7] == (3, 7) and own[2][2] == (1, 5)  # 8 columns / 4 tiles = 2 each


def test_uneven_owners_follow_xla_ceil_rule() -> None:
    d = tiles.tile_devices("{devices=[1,4]0,1,2,3}", 2)
    # 10 columns over 4 tiles: ceil(10 / 4) = 3 per tile, the last tile holds 1
    assert [o[0] for o in tiles.owners((1, 10), d)[0]] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


@pytest.mark.parametrize("call,msg", [
    (lambda: tiles.sharding_string((2, 4), ("a",), (None,)), "has 2 axes"),
    (lambda: tiles.sharding_string((2, 4), ("a", "b"), ("x", None)), "not in axis_names"),
    (lambda: tiles.sharding_string((2, 4), ("a", "b"), ("a", "a")), "twice"),
    (lambda: tiles.tile_devices("{devices=[2,2]0,1,2,3}", 3), "rank=3"),
    (lambda: tiles.tile_devices("{replicated}", 2), "pass num_devices"),
    (lambda: tiles.tile_devices("{maximal device=0}", 2), "is not of the form"),
])
def test_bad_input(call, msg: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=msg):
        call()
