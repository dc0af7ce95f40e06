"""formulas/scan.py against independent oracles: torch.chunk of a real tensor, hand arithmetic, bad input."""

from __future__ import annotations

import pytest
import torch

from shardlab.formulas import scan as F


def _chunk_bytes(shape: tuple[int, ...], splits: tuple[int, ...]) -> int:
    """Oracle: cut a real tensor with torch.chunk along each dim; bytes of the (0, 0, ...) piece."""
    t = torch.zeros(shape, dtype=torch.float32)
    for dim, n in enumerate(splits):
        t = torch.chunk(t, n, dim=dim)[0]
    return t.numel() * t.element_size()


@pytest.mark.parametrize("fsdp,tensor", [(2, 4), (4, 2), (8, 1), (1, 8)])
def test_stacked_bytes_matches_chunked_tensor(fsdp: int, tensor: int) -> None:
    L, d_in, d_out = 3, 64, 128
    two = F.stacked_bytes(L, d_in, d_out, fsdp, tensor, "2d")
    one = F.stacked_bytes(L, d_in, d_out, fsdp, tensor, "1d")
    assert two.per_device_bytes == _chunk_bytes((L, d_in, d_out), (1, fsdp, tensor))
    assert one.per_device_bytes == _chunk_bytes((L, d_in, d_out), (1, 1, tensor))
    assert one.per_device_bytes == fsdp * two.per_device_bytes  # 1-D costs the fsdp factor
    assert two.total_bytes == L * d_in * d_out * 4


def test_uneven_dims_are_padded_like_xla() -> None:
    # d_in = 10 over fsdp = 4: XLA pads each tile to ceil(10/4) = 3 rows, so 3·8·4 bytes per layer
    assert F.stacked_bytes(1, 10, 8, fsdp=4, tensor=1, sharding="2d").per_device_bytes == 3 * 8 * 4


def test_seed_case_by_hand() -> None:
    # logical [126, 16384, 16384] bf16 = 126·16384·16384·2 = 67 645 734 912 B = 63 GiB
    c = F.seed_case(fsdp=64, tensor=4, dtype="bfloat16")
    assert c.total_bytes == 126 * 16384 * 16384 * 2 == 67_645_734_912
    # 1-D per chip is the HLO's per-device [126, 4K, 16K]: 126·4096·16384·2 = 16 911 433 728 B (15.75 GiB)
    assert c.one_d_shape == (126, 4096, 16384)
    assert c.one_d_per_chip_bytes == 126 * 4096 * 16384 * 2 == 16_911_433_728
    # 2-D per chip [126, 4096, 256]: 126·4096·256·2 = 264 241 152 B (252 MiB) = total / 256
    assert c.two_d_shape == (126, 4096, 256)
    assert c.two_d_per_chip_bytes == 67_645_734_912 // 256 == 264_241_152
    full_fsdp = F.seed_case(fsdp=256, tensor=1)
    assert full_fsdp.one_d_per_chip_bytes == full_fsdp.total_bytes  # all-reduced over fsdp = replicated


def test_shard_as_saving_ratio_is_fsdp() -> None:
    s = F.shard_as_saving(8, [(256, 1024), (1024, 256)], fsdp=4, tensor=2)
    assert s.ratio == 4.0
    assert s.on_bytes == 2 * _chunk_bytes((8, 256, 1024), (1, 4, 2))


def test_block_trace_transfer_terms() -> None:
    B, S, H, Fh = 8, 8, 128, 512
    off = F.block_trace_transfer(B, S, H, Fh, devices=8, placeholders=False)
    # forward: carry BSH + W_up HF + W_down FH; backward: grad carry BSH + saved x, u, g, W_up, W_down
    assert off.forward_elems == B * S * H + 2 * H * Fh
    assert off.backward_elems == 2 * B * S * H + 2 * B * S * Fh + 2 * H * Fh
    assert off.total_bytes == (off.forward_elems + off.backward_elems) * 4 * 8
    assert F.block_trace_transfer(B, S, H, Fh, devices=8).total_bytes == 0


@pytest.mark.parametrize("call,match", [
    (lambda: F.stacked_bytes(0, 4, 4, 1, 1), "layers=0"),
    (lambda: F.stacked_bytes(1, 4, 4, 1, 1, sharding="3d"), "sharding='3d'"),
    (lambda: F.seed_case(fsdp=64, tensor=2), "does not tile the 256 chips of v6e-256"),
    (lambda: F.shard_as_saving(2, [], 2, 4), "weight_shapes is empty"),
    (lambda: F.block_trace_transfer(8, 8, 0, 4), "hidden=0"),
])
def test_bad_input_names_the_value(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------- per-device shapes
@pytest.mark.parametrize("fsdp,tensor", [(2, 4), (4, 2), (8, 1), (3, 5)])
@pytest.mark.parametrize("sharding", ["2d", "1d", "replicated"])
def test_per_device_shape_matches_chunked_tensor(fsdp: int, tensor: int, sharding: str) -> None:
    # oracle: cut a real [L, d_out, d_in] tensor (W_down-like: d_in over tensor, d_out over fsdp) with torch.chunk
    shape, axes = (3, 20, 12), (None, "tensor", "fsdp")
    kept = {"2d": {"fsdp": fsdp, "tensor": tensor}, "1d": {"tensor": tensor}, "replicated": {}}[sharding]
    splits = tuple(kept.get(a, 1) if a else 1 for a in axes)
    t = torch.zeros(shape)
    for dim, n in enumerate(splits):
        t = torch.chunk(t, n, dim=dim)[0]  # chunk's first piece is ceil(d / n) long, like XLA's padded tile
    assert F.per_device_shape(shape, axes, fsdp, tensor, sharding) == tuple(t.shape)


# ------------------------------------------------------------------------------------------ grad reduction
def test_grad_reduction_by_hand() -> None:
    # W_up [64, 256] and W_down [256, 64] on (fsdp 2, tensor 4): each partial gradient is 64·256/4 = 4096 values
    off = F.grad_reduction([(64, 256), (256, 64)], fsdp=2, tensor=4, shard_as=False)
    assert (off.op, off.count, off.operand_elements, off.result_elements) == ("all_reduce", 2, 8192, 8192)
    assert off.operand_bytes == 8192 * 4 and off.group_size == 2
    on = F.grad_reduction([(64, 256), (256, 64)], fsdp=2, tensor=4, shard_as=True)
    assert (on.op, on.operand_elements, on.result_elements) == ("reduce_scatter", 8192, 8192 // 2)
    with pytest.raises(ValueError, match="fsdp=1: the batch is not split"):
        F.grad_reduction([(64, 256)], fsdp=1, tensor=8, shard_as=False)


# ----------------------------------------------------------------------------------------- linear trap
def _contiguous_tiles(batch: int, seq: int, fsdp: int, tensor: int) -> int:
    """Oracle by enumeration: the merged index b·S + s of every device's (b, s) block; if every block is one
    contiguous run, the merged dim is tiled fsdp·tensor ways, else it keeps the batch split only (fsdp)."""
    for i in range(fsdp):
        for j in range(tensor):
            idx = sorted(b * seq + s for b in range(i * batch // fsdp, (i + 1) * batch // fsdp)
                         for s in range(j * seq // tensor, (j + 1) * seq // tensor))
            if idx != list(range(idx[0], idx[0] + len(idx))):
                return fsdp
    return fsdp * tensor


@pytest.mark.parametrize("batch,seq,fsdp,tensor", [(8, 16, 2, 4), (4, 16, 4, 2), (4, 8, 4, 2), (8, 8, 8, 1),
                                                   (4, 8, 1, 8), (2, 8, 2, 4), (16, 4, 4, 2), (6, 9, 3, 3)])
def test_flattened_rows_matches_enumeration(batch: int, seq: int, fsdp: int, tensor: int) -> None:
    f = F.flattened_rows(batch, seq, fsdp, tensor)
    tiles = _contiguous_tiles(batch, seq, fsdp, tensor)
    assert f.merged_tiles == tiles and f.keeps_both == (tiles == fsdp * tensor)
    assert f.rows_per_device == batch * seq // tiles
    assert f.einsum_rows_per_device == batch * seq // (fsdp * tensor)


def test_flattened_rows_rejects_an_unsplittable_size() -> None:
    with pytest.raises(ValueError, match="seq=6 is not divisible by tensor=4"):
        F.flattened_rows(8, 6, 2, 4)


def test_trace_transfer_count_is_the_fake_inputs() -> None:
    assert F.block_trace_transfer(2, 2, 8, 16, placeholders=False).transfers == 3 + 6
    assert F.block_trace_transfer(2, 2, 8, 16, placeholders=True).transfers == 0
