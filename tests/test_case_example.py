"""The minimal case of ``shardlab.core.case``'s docstring, as real code run through the harness.

``RowCase`` below is the docstring's example, executed from the docstring (plus the helpers it names): a Megatron
row-parallel matmul x[m, k_model] · W[k_model, n]. Oracles: the dense product ``x @ W`` for the ledger's and the
compiler's results, and the four views must agree on the one all-reduce of the [m, n] partial sums (its count and bytes:
m · n · 4 for float32), which is counted here by hand, not taken from the formula under test.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass  # noqa: F401 - the docstring's example uses it
from typing import Any, ClassVar  # noqa: F401

import pytest
import torch

from shardlab.blocks.params import BlocksParams
from shardlab.core import case as case_module
from shardlab.core.case import Case, Checks, Program, Step  # noqa: F401 - the example's names
from shardlab.core.views import View, traffic  # noqa: F401 - the example's names
from shardlab.formulas import blocks as fblocks  # noqa: F401 - the example's names


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


# ---- the docstring's example (shardlab.core.case), executed from the docstring itself, plus a parity check -----
def _docstring_case() -> type:
    """The ``RowCase`` class block of ``shardlab.core.case``'s docstring, dedented and executed here (not copied:
    an edit to the docstring is what this test runs)."""
    doc = case_module.__doc__ or ""
    start = doc.index("    @dataclass(frozen=True)\n    class RowCase(Case):")
    end = doc.index("    views = harness.views(RowCase(p))")
    namespace = dict(globals())
    exec(textwrap.dedent(doc[start:end]), namespace)  # noqa: S102 - the example is the code under test
    return namespace["RowCase"]


class RowCase(_docstring_case()):  # type: ignore[misc]
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
