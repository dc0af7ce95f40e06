"""Reference solutions of the notebooks' exercises (graded by ``shardlab.exercises``; never printed).

Each entry computes the expected answer with the library — or from what the notebook measured and passes in
(keyword arguments) — plus a hint that points at the idea without giving the number. The hand-written
answer keys in ``data/answers/`` are graded against these by the tests and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardlab.blocks import ring
from shardlab.blocks.tiles import sharding_string
from shardlab.case import Case
from shardlab.comm import SimulatedWorld
from shardlab.formulas import blocks as fblocks
from shardlab.formulas import fsdp as ffsdp
from shardlab.formulas import scan as fscan
from shardlab.formulas import tp as ftp
from shardlab.formulas import zero as fzero
from shardlab.formulas.common import reduction_dtype, wire_bytes
from shardlab.fsdp.flat_param import plan_flat_shards
from shardlab.levers import order
from shardlab.levers.combine import AlphaBeta, bucket_count, combining_saving_s
from shardlab.params import AttentionParams, BlocksParams, FsdpGspmdParams
from shardlab.tp.layers import vocab_range
from shardlab.views import View


def _toy_peaks(small: int, large: int, expanded: int, shrunk: int, out: int) -> tuple[int, int]:
    """Peaks of V0-V1-V2-V3 and V0-V2-V1-V3 for the memory-order toy with these sizes."""
    g = order.graph({"V0": ((), {"small": small, "large": large}), "V1": (("small",), {"expanded": expanded}),
                     "V2": (("large",), {"shrunk": shrunk}), "V3": (("expanded", "shrunk"), {"out": out})},
                    outputs=("out",))
    return order.peak(g, ("V0", "V1", "V2", "V3")).peak, order.peak(g, ("V0", "V2", "V1", "V3")).peak


def _saving_ms(alpha_s: float, beta_Bps: float, calls_before: int, calls_after: int) -> float:
    return combining_saving_s(AlphaBeta(alpha_s, beta_Bps, 1.0, 0.0, 0), calls_before, calls_after) * 1e3


MIB = 2**20
# 08 #5: (gradient sizes in bytes, cap, first bucket's limit): equal and uneven sizes, DDP's defaults, 0 limits
BUCKET_GRID = [([4 * MIB] * 24, 25 * MIB, MIB), ([4 * MIB] * 24, 25 * MIB, 25 * MIB), ([3, 5, 1, 9, 2], 6, 2),
               ([3, 5, 1, 9, 2], 6, 6), ([256 * 1024] * 8, MIB, MIB), ([7] * 10, 0, 0), ([1, 2, 3, 4, 5, 6], 4, 100),
               ([10], 5, 1)]


def _pytorch_buckets() -> list[list[list[int]]]:
    """08 #5's reference: PyTorch's own DDP bucket assignment on :data:`BUCKET_GRID` (uint8 tensors: a size is its
    bytes; limits [first, cap] as DDP passes them)."""
    return [dist._compute_bucket_assignment_by_size([torch.empty(b, dtype=torch.uint8) for b in sizes],
                                                     [first, cap])[0] for sizes, cap, first in BUCKET_GRID]


def _learner_buckets(fn: Callable[..., Any]) -> list[list[list[int]]]:
    """08 #5: the learner's ``fn(sizes, cap, first)`` on :data:`BUCKET_GRID`."""
    return [[[int(i) for i in b] for b in fn(list(sizes), cap, first)] for sizes, cap, first in BUCKET_GRID]


@dataclass(frozen=True)
class Solution:
    expected: Callable[..., Any]  # (**measured) -> the reference answer
    hint: str  # what to think about; never the answer itself
    rel_tol: float = 0.0  # numbers: accepted relative error (0: exact)
    run: Callable[[Callable[..., Any]], Any] | None = None  # a code exercise: runs the learner's function, returns
    #                                                          what is compared with `expected`


def _two_phase_all_reduce(fn: Callable[..., Any]) -> list[Any]:
    """00 #6: run the learner's ``fn(comm, x)`` on 4 ranks of a SimulatedWorld (x: 12 values per rank):
    [every rank returned the sum, the collectives it issued, its wire bytes (counted along the ring schedule) ==
    a ring all-reduce's]."""
    data = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))  # rank r hands in row r
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, data[comm.rank].clone()))
    ok = all(isinstance(o, torch.Tensor) and o.shape == (12,) and torch.allclose(o, data.sum(0), atol=1e-5)
             for o in out)
    ops = [e.op for e in world.ledger]
    ring_ops = all(op in ring.OPS for op in ops)
    return [ok, ops, ring_ops and ring.ledger_wire_bytes(world.ledger) == ring.wire_bytes("all_reduce", 12, 4, 4)]


def _row_parallel_forward(fn: Callable[..., Any]) -> list[Any]:
    """02 #4: run the learner's ``fn(comm, y_i, b_i, bias)`` on 4 ranks (y [6, 16], B [16, 8], b2 [8]; rank i holds
    columns 4i..4i+3 of y and the same rows of B): [every rank's z == y B + b2, the collectives issued, their payload
    bytes]."""
    g = torch.Generator().manual_seed(0)
    y, b, bias = torch.randn(6, 16, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, generator=g)
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, y[:, 4 * comm.rank:4 * comm.rank + 4].clone(),
                                    b[4 * comm.rank:4 * comm.rank + 4].clone(), bias.clone()))
    ok = all(isinstance(z, torch.Tensor) and z.shape == (6, 8) and torch.allclose(z, y @ b + bias, atol=1e-5)
             for z in out)
    return [ok, [e.op for e in world.ledger], world.ledger.payload_bytes()]


def _compiled(case: Case) -> View:
    """``case``'s XLA:CPU view when this process has its devices, else its XLA:TPU view (a code exercise graded by
    the compiler); ValueError when neither runs here."""
    # imported here: shardlab.solutions is imported before runtime.setup() (tests, exercises), and harness imports
    # torch_xla (so do the topic case modules the graders import)
    from shardlab import harness

    hlo = harness.hlo(case)
    tpu = hlo if hlo.ran else harness.tpu(case)
    if not tpu.ran:
        raise ValueError(f"no compiler can grade this here: {hlo.skipped}")
    return tpu


def _matmul_c_elements(spec: tuple[str | None, ...]) -> int:
    """01 #6: compile notebook 01's case 5 (defaults: A [64, 128], B [128, 64] on the (X 2, Y 4) mesh) with C
    annotated ``spec``; C's elements per device, from XLA:CPU when this process has the mesh, else XLA:TPU."""
    from shardlab.blocks.case import MatmulCase  # imports torch_xla: after runtime.setup() (see _compiled)

    return int(_compiled(MatmulCase(BlocksParams(), "5", ask=tuple(spec)))["case5.C.elements"])


def _attention_collectives(specs: dict[str, tuple[str | None, ...]]) -> list[int]:
    """03 #5: compile notebook 03's attention step (defaults, forward + backward) with the dense module's parameters
    annotated by ``specs``; [all-gathers, all-reduces (logical: a tuple all-reduce counts its operands)], from
    XLA:CPU when this process has tp devices, else XLA:TPU."""
    from shardlab.tp.case import AttentionCase  # imports torch_xla: after runtime.setup() (see _compiled)

    if not isinstance(specs, dict):
        raise ValueError(f"answer_5 must be a dict {{parameter name: spec}}, got {type(specs).__name__}")
    colls = _compiled(AttentionCase(AttentionParams(), specs={k: tuple(v) for k, v in specs.items()})
                      ).detail.module.collectives
    return [sum(c.op == "all-gather" for c in colls), sum(c.operands for c in colls if c.op == "all-reduce")]


VOCAB_GRID = [(v, p) for v in (8, 10, 1003, 50257, 128256) for p in (1, 2, 3, 4, 8) if v >= p]


def _vocab_ranges(fn: Callable[..., Any]) -> list[list[int]]:
    """04 #7: the learner's ``fn(V, rank, p)`` on :data:`VOCAB_GRID`, every rank: a list of [start, end]."""
    return [[int(x) for x in fn(v, r, p)] for v, p in VOCAB_GRID for r in range(p)]


def _measured(value: Any = None, what: str = "") -> Any:
    """A "predict it, then check" solution: the value the notebook measured and passed in."""
    if value is None:
        raise ValueError(f"this exercise is graded against a measurement ({what}) the notebook passes in; "
                         "none was given")
    return value


SOLUTIONS: dict[str, dict[int, Solution]] = {
    "00_welcome": {
        1: Solution(lambda steps=None: _measured(steps, "the ring trace's step count"),
                    "the ring all-reduce is a reduce-scatter followed by an all-gather; each phase moves one chunk "
                    "per rank per step until every rank has seen every chunk"),
        2: Solution(lambda sent=None: _measured(sent, "bytes rank 0 sent in the ring trace"),
                    "count the chunks one rank sends (one per step) and multiply by the chunk size: payload / W"),
        3: Solution(lambda sent=None: _measured(sent, "bytes rank 0 sent in the ring all-gather trace"),
                    "in an all-gather each rank must receive the W - 1 shards it does not have, and in a ring it "
                    "forwards as many as it receives"),
        4: Solution(lambda operand_bytes=None: _measured(operand_bytes, "the compiler's all-gather operand bytes"),
                    "the operand is what ONE device hands in — its own shard, not the gathered result"),
        5: Solution(lambda: sharding_string((2, 4), ("data", "model"), (None, "data")),
                    "one tile count per tensor dim, then the copies count; the device list is the mesh's id array "
                    "with the spec's axis first and the unnamed axis last, flattened"),
        6: Solution(lambda: [True, ["reduce_scatter", "all_gather"], True],
                    "reduce-scatter leaves each rank one block of the sum; which collective then hands every rank "
                    "every block? (and return a 1-D tensor of x's length)", run=_two_phase_all_reduce),
    },
    "01_block_matrices": {
        1: Solution(lambda: fblocks.row_split_all_reduce(16, 32, 4, "float32")["bytes"],
                    "the row rule adds full-size partial sums: how large is Y, and how many bytes is a float32?"),
        2: Solution(lambda: [fblocks.grid_all_reduce(16, 32, (2, 4))["group_size"],
                             8 // fblocks.grid_all_reduce(16, 32, (2, 4))["group_size"]],
                    "partial sums are added only along the mesh axis that splits k; answer [group size, groups]"),
        3: Solution(lambda: [fblocks.row_split_all_reduce(16, 32, 4, reduction_dtype("bfloat16", kind))["bytes"]
                             for kind in ("cpu", "tpu")],
                    "which element type does each compiler add the partial sums in? answer [XLA:CPU bytes, TPU bytes]"),
        4: Solution(lambda: sharding_string((2, 2), ("r", "c"), ("c", None)),
                    "W's rows follow the mesh axis c, its columns are not split, and the r axis holds copies: "
                    "tile counts, then the copies, then the device ids with c first"),
        5: Solution(lambda count=None: _measured(count, "the compiler's collective count for the column rule"),
                    "x is on every device already; does any output column block depend on another device's W?"),
        6: Solution(lambda: fblocks.sharded_matmul("5b", 64, 128, 32)["C.elements"],
                    "C is [M, M]: name a mesh axis for each of its two dims so that no device holds a copy another "
                    "device also holds — a tuple of two axis names", run=_matmul_c_elements),
    },
    "02_megatron_mlp": {
        1: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16")["bytes"],
                    "the forward all-reduce (g) sums the full activation [b, s, h]; payload = elements × bytes "
                    "per element, and tp does not appear"),
        2: Solution(lambda: ftp.mlp_all_reduce(1, 2048, 12288, 8, "bfloat16", backward=True,
                                               input_requires_grad=False)["count"],
                    "f's backward all-reduce sums the INPUT gradient — is there one to sum?"),
        3: Solution(lambda: 2,
                    "GeLU(a + b) ≠ GeLU(a) + GeLU(b): with A split by rows, where must the partial sums be added?"),
        4: Solution(lambda: [True, ["all_reduce"], 6 * 8 * 4],
                    "y_i B_i is a full-size partial sum: add the ranks' partials with one collective, and add the "
                    "bias once, after that sum (not on every rank before it)", run=_row_parallel_forward),
    },
    "08_compiler_levers": {
        1: Solution(lambda: _saving_ms(50e-6, 10e9, 32, 1),
                    "the bytes are the same before and after: which term of m·α + bytes/β changes?", rel_tol=1e-3),
        2: Solution(lambda: _toy_peaks(2, 8, 5, 1, 1),
                    "an operator's outputs exist while its inputs are still alive; a tensor dies after its last "
                    "reader — walk both orders step by step"),
        3: Solution(lambda: bucket_count(24, 4 * MIB, 25 * MIB, MIB),
                    "a bucket closes once it holds at least its limit, and the first bucket has its own, smaller "
                    "limit: how many 4 MiB gradients until >= 1 MiB, and then until >= 25 MiB?"),
        4: Solution(lambda: max(0.0, 30.0 - 20.0), "only the part of the transfer the window does not cover is exposed",
                    rel_tol=1e-9),
        5: Solution(_pytorch_buckets, "keep a running total of the open bucket; after adding a gradient, close the "
                    "bucket when the total is >= its limit (first for the first bucket, cap after); a last, partly "
                    "filled bucket still counts", run=_learner_buckets),
    },
    "03_megatron_attention": {
        1: Solution(lambda: [t for t in (1, 2, 3, 4, 6, 8, 12) if 12 % t == 0],
                    "each device must own whole heads: which degrees split 12 heads evenly?"),
        2: Solution(lambda: ftp.transformer_layer_all_reduce(8, 1024, 4096, 8, "bfloat16")["bytes"],
                    "count the all-reduces of one layer (attention and MLP, forward and backward); each carries "
                    "the whole activation [b, s, h] in bf16"),
        3: Solution(lambda: wire_bytes("all_reduce", ftp.transformer_layer_all_reduce(8, 1024, 4096, 8,
                                                                                     "bfloat16")["bytes"], 8),
                    "a ring all-reduce sends 2 (p - 1) / p of its payload per rank"),
        4: Solution(lambda: 4, "one g after the output projection, and one f per column-parallel input layer"),
        5: Solution(lambda: [0, ftp.attention_all_reduce(2, 8, 64, 4, backward=True)["count"]],
                    "a device must own whole heads: which dim of W_Q/W_K/W_V (nn.Linear layout [out, in]) holds the "
                    "heads, and which dim of W_O? Answer [all-gathers, all-reduces] must come out [0, 2]",
                    run=_attention_collectives),
    },
    "04_vocab_parallel_embedding_ce": {
        1: Solution(lambda: ftp.gathered_logits(1, 8192, 128256, 8, "bfloat16")["wire_bytes"],
                    "an all-gather hands over one padded shard [b·s, ceil(V/p)] and, in a ring, each rank sends "
                    "p - 1 shards"),
        2: Solution(lambda: [ftp.ce_wire_ratio(128256, 8), ftp.ce_wire_ratio(128256, 64)],
                    "divide the gathered wire bytes by the three all-reduces' 3 · 2 (p - 1)/p · b·s · e; what "
                    "is left of p?"),
        3: Solution(lambda: ftp.ce_logits_bytes(1, 8192, 128256, 8, "bfloat16")["gathered"],
                    "after the all-gather every device holds all p padded shards of the logits"),
        4: Solution(lambda: [next(r for r in range(8) if vocab_range(50257, r, 8)[0] <= 6283
                                  < vocab_range(50257, r, 8)[1]),
                             vocab_range(50257, 7, 8)[1] - vocab_range(50257, 7, 8)[0]],
                    "50257 = 8 · 6282 + 1: the first V mod p ranks own one row more"),
        5: Solution(lambda: 0, "the softmax needs only the max and the sum the forward already all-reduced"),
        6: Solution(lambda: ftp.output_layer_all_reduce(1, 8, 64, 8, backward=True)["count"],
                    "logits_i = f(x) E_i^T: what does f do in the backward?"),
        7: Solution(lambda: [list(vocab_range(v, r, p)) for v, p in VOCAB_GRID for r in range(p)],
                    "divmod(V, p) gives the base rows and the leftover; the first `leftover` ranks take one more, "
                    "and every range starts where the previous one ended", run=_vocab_ranges),
    },
    "06_scan_shard_as": {
        1: Solution(lambda: fscan.shard_as_saving(4, [(128, 512), (512, 128)], fsdp=8, tensor=1).ratio,
                    "the 1-D gradient keeps only the tensor split; how many fsdp devices now hold the same copy?"),
        2: Solution(lambda: fscan.seed_case(fsdp=16, tensor=16, dtype="bfloat16").one_d_per_chip_bytes / 2**30,
                    "the logical [126, 16384, 16384] bf16 array is 63 GiB; the 1-D gradient is split over tensor only",
                    rel_tol=0.01),
        3: Solution(lambda changed=None: changed or _reduction("off"),
                    "dW = xᵀ·dy sums over the batch: which mesh axis splits the batch, and what must the devices do "
                    "with their partial sums when nobody asks for a split result? Answer as '<collective> <axis>'"),
        4: Solution(lambda changed=None: changed or _reduction("on"),
                    "shard_as asks for dW split like W (H over fsdp): which collective sums partial results and "
                    "leaves each device only its share? Answer as '<collective> <axis>'"),
        5: Solution(lambda: fscan.flattened_rows(8, 8, fsdp=4, tensor=2).rows_per_device,
                    "is each device's (batch, seq) block one contiguous run of the merged B·S rows? If not, only the "
                    "batch split survives"),
        6: Solution(lambda: fscan.block_trace_transfer(8, 8, 128, 512, placeholders=False).transfers,
                    "count the fake inputs: the forward scan traces with a carry and one layer's weights, the backward "
                    "with a gradient carry and one slice of every tensor the block saved for its backward"),
        7: Solution(lambda: [True, ["reduce_scatter"]],
                    "each rank's xᵀ·dh is a partial sum over its own batch rows; which one collective adds the "
                    "partial sums and leaves each rank only its block of rows of dW? (return a [h/4, F] tensor)",
                    run=lambda fn: _shard_as_by_hand(fn)),
    },
    "05_fsdp_flat_params": {
        1: Solution(lambda: [r.numel_padded for r in plan_flat_shards([10], 4).ranks],
                    "c = ceil(n/N); torch.chunk hands out chunks of c until the elements run out — a list of N ints"),
        2: Solution(lambda: ffsdp.flat_numel([1500, 50, 500, 10], 8, align=4) - 2060,
                    "each parameter must start at a multiple of 4 float32 elements (16 bytes), and the total is "
                    "padded to a multiple of N; add up the pads"),
        3: Solution(lambda: fzero.zero_memory(7.5e9, 64, 3).total / 1e9,
                    "stage 3 divides all of (2 + 2 + K)·Ψ by N; GB = 1e9 bytes", rel_tol=1e-9),
        4: Solution(lambda: tuple(max((fzero.padding_waste(2060, w), w) for w in range(1, 17))[::-1]),
                    "waste = N·ceil(n/N) − n; try every N — answer as (N, waste)"),
        5: Solution(lambda: ffsdp.flat_step_comm(2060, 8, 4, root=True).wire_bytes(8),
                    "the root unit is not resharded after forward: count its all-gathers, then the ring model: "
                    "(N−1)·payload per all-gather, (N−1)/N·payload per reduce-scatter", rel_tol=1e-9),
        6: Solution(lambda: ffsdp.flat_step_comm(510, 8, root=True).all_gather_count
                    + ffsdp.flat_step_comm(1550, 8, root=False).all_gather_count,
                    "which unit is the root, and which unit frees its parameters after forward?"),
        7: Solution(lambda: _torch_flat_shards(),
                    "c = ceil(n/N) elements per rank; torch.chunk hands out chunks of c while elements remain (a "
                    "trailing rank may get none); pad every shard with zeros to c",
                    run=lambda fn: _flat_shards(fn)),
    },
    "05b_fsdp_gspmd": {
        1: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False]).all_gather_forward,
                    "dim 0 is split with torch.chunk and padded to ceil(d0/N) rows; an all-gather's payload is "
                    "the padded shard"),
        2: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False], device_kind="tpu").all_gather_forward,
                    "same rows; at the default mat-mul precision, what element type does the TPU matmul read?"),
        3: Solution(lambda: ffsdp.per_param_step_bytes([(50,)], 8, [False], device_kind="tpu")
                    .unshard_all_reduce_forward,
                    "a 50-element bias on 8 ranks has shards far shorter than a 128-lane row: which collective "
                    "replicates it on XLA:TPU, and over how many (padded) elements?"),
        4: Solution(lambda: ffsdp.per_param_step_bytes([(50, 30), (50,), (10, 50), (10,), (5, 10), (5,)], 8,
                                                       [False] * 6).reduce_scatter_count,
                    "one gradient reduction per parameter, whatever the compiler combines"),
        5: Solution(lambda: 4 * sum(ffsdp.per_param_shard(s, 2, 0)[1][0] * (s[1] if len(s) > 1 else 1)
                                    for s in [(50, 30), (50,)]),
                    "FSDP2 all-gathers all parameters of a unit in one call: sum the padded dim-0 shards of the "
                    "first Linear's weight [50, 30] and bias [50]"),
        6: Solution(lambda: ffsdp.per_param_step_bytes([(10, 50)], 8, [False]).all_gather_forward,
                    "FSDP2's rule: which dim of the weight is split over the fsdp axis, and which is left whole? "
                    "(a tuple with one entry per dim: a mesh axis name or None)",
                    run=lambda spec: _unshard_bytes(spec)),
    },
}


def _reduction(tag: str) -> str:
    """The formula's answer (used when neither compiler view ran): the collective over fsdp that finishes dW."""
    op = fscan.grad_reduction([(128, 512)], fsdp=2, tensor=4, shard_as=tag == "on").op
    return f"{op.replace('_', '-')} fsdp"


# FLAT_CASES: (n, N) pairs graded by 05 #7 — even, uneven, an empty trailing rank (n 6, N 4), more ranks than elements
FLAT_CASES = ((10, 4), (6, 4), (2060, 8), (7, 3), (5, 8))


def _torch_flat_shards() -> list[list[list[float]]]:
    """05 #7's oracle: PyTorch FSDP1's own ``FlatParamHandle._get_shard`` of ``arange(1, n + 1)`` for every rank."""
    # imported here: torch.distributed.fsdp costs about a second to import (measured), and only this exercise needs it
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    return [[FlatParamHandle._get_shard(torch.arange(1.0, n + 1), r, w)[0].tolist() for r in range(w)]
            for n, w in FLAT_CASES]


def _flat_shards(fn: Callable[..., Any]) -> list[list[list[float]]]:
    """05 #7: the learner's ``fn(flat, rank, world_size)`` for every rank of every case of :data:`FLAT_CASES`."""
    return [[[float(v) for v in fn(torch.arange(1.0, n + 1), r, w)] for r in range(w)] for n, w in FLAT_CASES]


def _unshard_bytes(spec: tuple[str | None, ...]) -> int:
    """05b #6: compile the unshard of the default MLP's weight W_2 [10, 50] annotated ``spec`` on the mesh (fsdp 8,
    replica); the bytes one device hands to the collectives that replicate it (XLA:CPU here, else XLA:TPU)."""
    from shardlab.fsdp.case import UnshardCase  # imports torch_xla: after runtime.setup() (see _compiled)

    case = UnshardCase(FsdpGspmdParams(), (10, 50), tuple(spec))
    view = _compiled(case)
    return int(sum(view.get(f"unshard.{op}.bytes", 0) for op in case.ops))


def _shard_as_by_hand(fn: Callable[..., Any]) -> list[Any]:
    """06 #7: run the learner's ``fn(comm, x, dh)`` on 4 fsdp ranks, rank r holding rows [8r, 8r + 8) of x [32, 16]
    and dh [32, 24] (h 16, F 24): [every rank returned rows [4r, 4r + 4) of the dense dW = xᵀ·dh, the collectives
    it issued]."""
    g = torch.Generator().manual_seed(0)
    x, dh = torch.randn(32, 16, generator=g), torch.randn(32, 24, generator=g)
    dense = x.T @ dh  # [h, F]
    world = SimulatedWorld(4)
    out = world.run(lambda comm: fn(comm, x[8 * comm.rank:8 * comm.rank + 8].clone(),
                                    dh[8 * comm.rank:8 * comm.rank + 8].clone()))
    ok = all(isinstance(o, torch.Tensor) and o.shape == (4, 24) and torch.allclose(o, dense[4 * r:4 * r + 4], atol=1e-4)
             for r, o in enumerate(out))
    return [ok, [e.op for e in world.ledger]]
