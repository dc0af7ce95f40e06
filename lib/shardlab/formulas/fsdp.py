"""FSDP (flat parameter, FULL_SHARD = ZeRO-3) per-step collectives and per-rank memory.

Design note
-----------
One FSDP unit holds a flat parameter of N elements (alignment padding included) padded to
P = W·c, c = ceil(N / W) (see ``shardlab.fsdp.flat_param``). One training step issues::

    forward   all-gather      payload c·b per rank  -> result P·b       (unshard params)
    backward  all-gather      payload c·b per rank  -> result P·b       (params were freed after forward)
    backward  reduce-scatter  payload P·b per rank  -> result c·b       (averaged gradient shard)

b = bytes per element. With W = 1 nothing is sharded and the step issues no collective (counts 0; the
ledger records none and the partitioner emits none). "Payload" is what one rank hands to the collective
(design.md "Bytes"); the ring model puts (W-1)·c·b on the wire per all-gather and (W-1)/W·P·b per
reduce-scatter, 3·(W-1)·c·b per step in total = the ZeRO-3 "3Ψ" (``formulas.zero.zero_comm``) with Ψ = P.

Persistent per-rank model state after a step with Adam: parameter shard c·b + gradient shard c·b +
optimizer state (exp_avg, exp_avg_sq in fp32) 2·c·4. For fp32 that is 16·c bytes — ZeRO-3's 16Ψ/N with
Ψ = P. Transient: the unsharded padded parameter (P·b) and its gradient (P·b) while a unit runs.
"""

from __future__ import annotations

from typing import NamedTuple

from shardlab.formulas.zero import padded_numel


class FlatStepComm(NamedTuple):
    all_gather_count: int
    all_gather_payload_bytes: int  # per call, per rank: the shard
    all_gather_result_bytes: int  # per call, per rank: the padded flat parameter
    reduce_scatter_count: int
    reduce_scatter_payload_bytes: int  # per call, per rank: the padded flat gradient
    reduce_scatter_result_bytes: int  # per call, per rank: the gradient shard

    @property
    def all_gather_bytes(self) -> int:
        """Total all-gather payload per rank per step."""
        return self.all_gather_count * self.all_gather_payload_bytes

    @property
    def reduce_scatter_bytes(self) -> int:
        return self.reduce_scatter_count * self.reduce_scatter_payload_bytes

    def wire_bytes(self, world_size: int) -> float:
        """Ring-model bytes sent per rank per step."""
        w = world_size
        return (
            self.all_gather_count * (w - 1) * self.all_gather_payload_bytes
            + self.reduce_scatter_count * (w - 1) / w * self.reduce_scatter_payload_bytes
        )


def flat_step_comm(flat_numel: int, world_size: int, elem_bytes: int = 4) -> FlatStepComm:
    """Collectives of one FULL_SHARD training step of one flat unit.

    >>> flat_step_comm(10, 4).all_gather_payload_bytes, flat_step_comm(10, 4).reduce_scatter_payload_bytes
    (12, 48)
    """
    if elem_bytes < 1:
        raise ValueError(f"elem_bytes={elem_bytes} must be >= 1")
    p = padded_numel(flat_numel, world_size)
    c = p // world_size
    n_ag, n_rs = (2, 1) if world_size > 1 else (0, 0)  # one rank holds everything: nothing to communicate
    return FlatStepComm(n_ag, c * elem_bytes, p * elem_bytes, n_rs, p * elem_bytes, c * elem_bytes)


class FlatRankMemory(NamedTuple):
    param_shard: int  # bytes, persistent
    grad_shard: int
    optimizer: int
    unsharded_param: int  # transient, while the unit runs
    unsharded_grad: int

    @property
    def persistent(self) -> int:
        return self.param_shard + self.grad_shard + self.optimizer

    @property
    def peak(self) -> int:
        return self.persistent + self.unsharded_param + self.unsharded_grad


OPTIMIZER_STATE_BYTES = {"sgd": 0, "adam": 8}
"""fp32 state bytes per element: SGD without momentum keeps none, Adam keeps exp_avg and exp_avg_sq."""


def flat_rank_memory(
    flat_numel: int, world_size: int, elem_bytes: int = 4, optimizer: str = "adam"
) -> FlatRankMemory:
    """Per-rank bytes of a FULL_SHARD flat unit (see the module note)."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r} must be one of {sorted(OPTIMIZER_STATE_BYTES)}")
    p = padded_numel(flat_numel, world_size)
    c = p // world_size
    b = elem_bytes
    return FlatRankMemory(c * b, c * b, c * OPTIMIZER_STATE_BYTES[optimizer], p * b, p * b)
