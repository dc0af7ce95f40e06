"""The minimal case of ``shardlab.core.case``'s docstring, as real code run through the harness.

``RowCase`` below is the docstring's example line for line (plus the two helpers it names): a Megatron row-parallel
matmul x[m, k_model] · W[k_model, n]. Oracles: the dense product ``x @ W`` for the ledger's and the compiler's
results, and the four views must agree on the one all-reduce of the [m, n] partial sums (its count and bytes:
m · n · 4 for float32), which is counted here by hand, not taken from the formula under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from shardlab.blocks.params import BlocksParams
from shardlab.core.case import Case, Checks, Program
from shardlab.core.views import View, traffic
from shardlab.formulas import blocks as fblocks


def operands(p: BlocksParams) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k], W [k, n] (float32, seeded)."""
    g = torch.Generator().manual_seed(p.seed)
    return torch.randn(p.m, p.k, generator=g), torch.randn(p.k, p.n, generator=g)


def row_rank(comm: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rank r multiplies its k-block of x's columns by the same block of W's rows, then sums over the ranks."""
    k = x.shape[1] // comm.world_size
    part = slice(comm.rank * k, (comm.rank + 1) * k)
    return comm.all_reduce(x[:, part] @ w[part])  # [m, n]


def on_mesh(p: BlocksParams) -> tuple[torch.Tensor, torch.Tensor]:
    """x and W on the XLA devices, k split over the mesh axis ``model`` (copies on the other)."""
    import torch_xla.distributed.spmd as xs

    from shardlab import runtime

    n = runtime.current().num_devices
    mesh = runtime.mesh((n // p.parts, p.parts), ("copies", "model"))
    x, w = (t.to(runtime.device()) for t in operands(p))
    xs.mark_sharding(x, mesh, (None, "model"))
    xs.mark_sharding(w, mesh, ("model", None))
    return x, w


# ---- the docstring's example (shardlab.core.case), verbatim, plus a parity check -----------------------------
@dataclass(frozen=True)
class RowCase(Case):
    p: BlocksParams
    size_name: ClassVar[str] = "parts"
    mesh_text: ClassVar[str] = "(copies, model) = (n / parts, parts)"

    def formula(self) -> View:
        f = fblocks.row_split_all_reduce(self.p.m, self.p.n, self.p.parts, self.p.dtype)
        return traffic(View("formula"), self.phase, {"all_reduce": f["count"]},
                       {"all_reduce": f["bytes"]}, self.p.dtype)

    def program(self) -> Program:
        return row_rank, operands(self.p)  # fn(comm, x, w) on every rank

    def oracle(self) -> torch.Tensor:
        x, w = operands(self.p)
        return x @ w

    def graph(self) -> list[torch.Tensor]:
        x, w = on_mesh(self.p)
        return [x @ w]

    def parity(self, source: str, got: Any, ref: torch.Tensor) -> Checks:
        results = got if source == "ledger" else got[:1]
        ok = all(torch.allclose(r.cpu(), ref, rtol=1e-4, atol=1e-4) for r in results)
        return {f"{source}.equals_dense": (ok, "x_r · W_r summed over the ranks == x @ W")}


@pytest.mark.xla
def test_the_docstring_case_runs_through_every_view(xla_world: Any) -> None:
    from shardlab.core import harness

    p = BlocksParams(parts=4).validate()
    views = harness.views(RowCase(p))  # formula, ledger, hlo, tpu (compile-only, v5e-8)
    assert all(v.ran for v in views), [v.skipped for v in views]
    by_source = {v.source: v for v in views}
    for source in ("formula", "ledger", "hlo", "tpu"):  # one all-reduce of the [m, n] float32 partial sums
        assert by_source[source]["step.all_reduce.count"] == 1, source
        assert by_source[source]["step.all_reduce.bytes"] == p.m * p.n * 4, source
    assert all(ok for v in views for ok, _ in v.checks.values()), [v.checks for v in views]
    assert all(row["agree"] for row in harness.compare(views))
