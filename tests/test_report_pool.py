"""Shared kernels for sweep points, and the compile-cache guard that keeps every point's measurements valid.

Oracles: which points may share a compiled graph follows from how the fake notebooks are built (a graph
depends on ``n``, never on ``tag``), and a fresh kernel's namespace is empty by construction; nothing is
taken from the pool's own output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fakes import fake_notebook

from shardlab.report import sweep as sw
from shardlab.report.notebooks import find_notebooks

# Fails if any name of an earlier notebook survived into this run (the kernel is shared between points).
CLEAN_BODY = '''\
from shardlab.profile.record import Recorder
assert "leftover" not in globals(), "a name of the previous point survived"
leftover = size
rec = Recorder(NAME, params=dict(size=size), results_dir=results_dir)
rec.agree("fake.collective.count", "count", formula=size, ledger=size)
if size == fail_at:
    raise ValueError(f"size={size} fails on purpose")
rec.close()
'''

# One XLA graph whose shape depends on n only: two points with the same n compile the same graph. The random
# draw on the device must equal a fresh kernel's (the prologue restarts the XLA RNG); the kernel's starting state
# is recorded to check the fresh-kernel constants the prologue relies on.
XLA_BODY = '''\
from shardlab import runtime
world = runtime.setup(num_devices=num_devices)
import torch
import torch_xla
import torch_xla.core.xla_model as xm
from shardlab.profile.record import Recorder
from shardlab.report.execute import TORCH_FRESH_STATE
rec = Recorder(NAME, params=dict(n=n, tag=tag), results_dir=results_dir, world=world)
rec.measure("fake.start.xla_rng", xm.get_rng_state(), "1", "metrics")
rec.measure("fake.dump_dir", world.dump_dir, "1", "metrics")
rec.measure("fake.start.torch_state", {f: str(getattr(torch, f)()) for f in TORCH_FRESH_STATE}, "1", "metrics")
y = (torch.ones(n, device=torch_xla.device()) * 3 + 1).sum().cpu()   # [n] -> scalar: 4 * n
rec.agree("fake.sum", "1", formula=4 * n, hlo=int(y))
rec.measure("fake.random_sum", float(torch.randn(n, device=torch_xla.device()).sum().cpu()), "1", "hlo")
rec.close()
'''


def _meta(point: sw.Point) -> dict:
    return json.loads((point.dir / "point.json").read_text())


@pytest.mark.notebook
def test_points_share_one_kernel_and_each_starts_clean(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha", body=CLEAN_BODY, extra_params="fail_at = 0\n").parent)
    res = sw.run_sweep(nb["01_alpha"], {"size": [1, 2, 3]}, tmp_path / "sweep", jobs=1, timeout_s=120,
                       render=False)
    assert [p.status for p in res.points] == ["passed"] * 3
    assert [p.kernel_run for p in res.points] == [1, 2, 3] and res.kernels == 1
    assert [_meta(p)["xla"]["CachedCompile"] for p in res.points] == [0, 0, 0]   # no torch_xla: nothing cached
    assert (tmp_path / "sweep" / "kernels" / "worker-1.log").exists()
    # each point's log holds its own run only
    assert "points/size=2" not in (res.points[0].dir / "papermill.log").read_text()
    assert "points/size=2" in (res.points[1].dir / "papermill.log").read_text()


@pytest.mark.notebook
def test_a_failure_in_a_shared_kernel_is_decided_in_a_fresh_one(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha", body=CLEAN_BODY, extra_params="fail_at = 0\n").parent)
    res = sw.run_sweep(nb["01_alpha"], {"size": [1, 2]}, tmp_path / "sweep", base={"fail_at": 2}, jobs=1,
                       timeout_s=120, render=False)
    ok, bad = res.points
    assert ok.status == "passed" and ok.kernel_run == 1
    assert bad.status == "failed" and "size=2 fails on purpose" in bad.message
    assert bad.kernel_run == 1 and bad.rerun.startswith("failed in a shared kernel")    # the fresh run decided
    assert _meta(bad)["rerun"] == bad.rerun


def _value(point: sw.Point, name: str) -> object:
    return next(m["value"] for m in (point.record or {})["measurements"] if m["name"] == name)


@pytest.mark.notebook
@pytest.mark.xla
@pytest.mark.slow
def test_a_point_served_from_the_compile_cache_is_rerun_in_a_fresh_kernel(tmp_path: Path) -> None:
    from shardlab.report.execute import TORCH_FRESH_STATE, XLA_FRESH_RNG_STATE

    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_xla", body=XLA_BODY, extra_params="n = 4\ntag = 'a'\n").parent)
    nb1 = nb["01_xla"]
    # same n: the second point's graphs were compiled by the first -> caught by the counters, re-run fresh
    same = sw.run_sweep(nb1, {"tag": ["a", "b"]}, tmp_path / "same", num_devices=1, jobs=1, timeout_s=300,
                        render=False)
    assert [p.status for p in same.points] == ["passed", "passed"]
    first, second = (_meta(p) for p in same.points)
    assert first["kernel_run"] == 1 and first["xla"]["CachedCompile"] == 0 and first["xla"]["UncachedCompile"] >= 1
    assert second["kernel_run"] == 1 and "served from torch_xla's cache" in second["rerun"]
    assert second["xla"]["CachedCompile"] == 0 and second["xla"]["UncachedCompile"] == first["xla"]["UncachedCompile"]
    assert same.kernels == 2
    # what a fresh kernel starts with is what the prologue restores / compares against
    assert _value(same.points[0], "fake.start.xla_rng") == XLA_FRESH_RNG_STATE
    # kernels end politely: their atexit handlers removed runtime.setup's HLO dump directories
    assert not any(Path(str(_value(p, "fake.dump_dir"))).exists() for p in same.points)
    assert _value(same.points[0], "fake.start.torch_state") == TORCH_FRESH_STATE
    # different n: different graphs -> the second point is accepted from the shared kernel, with its own compiles
    diff = sw.run_sweep(nb1, {"n": [4, 8]}, tmp_path / "diff", num_devices=1, jobs=1, timeout_s=300, render=False)
    a, b = (_meta(p) for p in diff.points)
    assert b["kernel_run"] == 2 and b["rerun"] == "" and b["xla"]["CachedCompile"] == 0
    assert b["xla"]["UncachedCompile"] == a["xla"]["UncachedCompile"]               # compiled all of its graphs
    assert {p.values["n"]: _value(p, "fake.sum") for p in diff.points} == {4: 16, 8: 32}    # 4 * n
    assert _value(diff.points[1], "fake.start.xla_rng") == XLA_FRESH_RNG_STATE          # restarted by the prologue
    assert diff.kernels == 1
    # the shared kernel's n=8 point equals n=8 run alone in a fresh kernel, random draw included
    alone = sw.run_sweep(nb1, {"n": [8]}, tmp_path / "alone", num_devices=1, jobs=1, timeout_s=300, render=False)
    assert alone.points[0].kernel_run == 1
    assert _value(alone.points[0], "fake.random_sum") == _value(diff.points[1], "fake.random_sum")


# Leaves torch's default dtype changed on the first point; a later point of the same kernel must not be accepted.
DTYPE_BODY = '''\
import torch
from shardlab.profile.record import Recorder
if size == 1:
    torch.set_default_dtype(torch.float64)
rec = Recorder(NAME, params=dict(size=size), results_dir=results_dir)
rec.measure("fake.dtype", str(torch.get_default_dtype()), "1", "ledger")
rec.close()
'''


@pytest.mark.notebook
def test_torch_state_left_by_a_previous_point_is_not_accepted(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha", body=DTYPE_BODY).parent)["01_alpha"]
    res = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "sweep", jobs=1, timeout_s=120, render=False)
    second = res.points[1]
    assert "torch.get_default_dtype() = torch.float64 (a fresh kernel: torch.float32)" in second.rerun
    assert second.kernel_run == 1 and _value(second, "fake.dtype") == "torch.float32"    # as in a fresh kernel


@pytest.mark.notebook
def test_device_counts_never_share_a_kernel(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha").parent)["01_alpha"]
    res = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "sweep", num_devices=[1, 2], jobs=1, timeout_s=120,
                       render=False)
    runs = {(p.values["num_devices"], p.values["size"]): p.kernel_run for p in res.points}
    assert runs == {(1, 1): 1, (1, 2): 2, (2, 1): 1, (2, 2): 2} and res.kernels == 2
    assert sorted(set(res.frame["num_devices"])) == [1, 2]


def test_cache_guard_rules(tmp_path: Path) -> None:
    from shardlab.report.execute import Execution, Failure
    from shardlab.report.pool import Task, cache_guard

    task = Task("p", "01_alpha", tmp_path / "in.ipynb", tmp_path / "out.ipynb", tmp_path / "log",
                {"results_dir": str(tmp_path)}, tmp_path, reuse=True)

    def guard(totals: dict | None, kernel_run: int = 2, ok: bool = True) -> str:
        xla = tmp_path / "01_alpha.xla.json"
        xla.unlink(missing_ok=True)
        if totals is not None:
            xla.write_text(json.dumps(totals))
        ex = Execution("01_alpha", task.executed, task.log, {}, 1.0, 0 if ok else 1,
                       None if ok else Failure("error", "ValueError: no"), kernel_run)
        return cache_guard(task, ex)

    assert guard({"CachedCompile": 5}, kernel_run=1) == ""                  # a fresh kernel is the reference
    assert guard({"CachedCompile": 0, "UncachedCompile": 3}) == ""
    assert "2 compile(s)" in guard({"CachedCompile": 2, "UncachedCompile": 1})
    assert "no compile counters" in guard(None)
    assert "failed in a shared kernel (ValueError: no)" == guard({"CachedCompile": 0}, ok=False)
    assert guard({"CachedCompile": 0, "TpuCachedCompile": 0}) == ""
    assert "1 TPU compile(s)" in guard({"CachedCompile": 0, "TpuCachedCompile": 1})
    assert "does not count its hits" in guard({"CachedCompile": 0, "TpuCachedCompile": None})


# Stands in for the TPU compiler view: a module of that name with (or without) a hit counter, bumped per run.
TPU_BODY = '''\
import sys, types
from shardlab.profile.record import Recorder
tpu = sys.modules.setdefault("shardlab.profile.tpu", types.ModuleType("shardlab.profile.tpu"))
if counted:
    tpu.CACHE_HITS = getattr(tpu, "CACHE_HITS", 0) + hits
rec = Recorder(NAME, params=dict(size=size), results_dir=results_dir)
rec.close()
'''


@pytest.mark.notebook
def test_the_tpu_views_cache_is_guarded_too(tmp_path: Path) -> None:
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha", body=TPU_BODY, extra_params="counted = True\nhits = 0\n")
                        .parent)["01_alpha"]
    clean = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "clean", jobs=1, timeout_s=120, render=False)
    assert [p.kernel_run for p in clean.points] == [1, 2] and _meta(clean.points[1])["xla"]["TpuCachedCompile"] == 0
    hit = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "hit", base={"hits": 1}, jobs=1, timeout_s=120, render=False)
    assert "1 TPU compile(s)" in hit.points[1].rerun and hit.points[1].kernel_run == 1
    blind = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "blind", base={"counted": False}, jobs=1, timeout_s=120,
                         render=False)
    assert "does not count its hits" in blind.points[1].rerun and blind.points[1].status == "passed"


# Starts multiprocessing's resource tracker (as gloo ranks do) and leaves a file from an atexit handler.
MP_BODY = '''\
import atexit, multiprocessing
from pathlib import Path
from shardlab.profile.record import Recorder
queue = multiprocessing.get_context("spawn").Queue()
atexit.register(Path(results_dir, f"atexit-{size}").write_text, "ran")
rec = Recorder(NAME, params=dict(size=size), results_dir=results_dir)
rec.close()
'''


@pytest.mark.notebook
def test_kernels_that_used_multiprocessing_still_exit_politely(tmp_path: Path) -> None:
    """Without the epilogue stopping multiprocessing's helpers the kernel hangs on shutdown until killed,
    and its atexit handlers (runtime.setup's HLO dump cleanup among them) never run."""
    nbs = tmp_path / "nbs"
    nb = find_notebooks(fake_notebook(nbs, "01_alpha", body=MP_BODY).parent)["01_alpha"]
    res = sw.run_sweep(nb, {"size": [1, 2]}, tmp_path / "sweep", jobs=1, timeout_s=120, render=False)
    assert [p.status for p in res.points] == ["passed", "passed"] and res.kernels == 1
    for p in res.points:                         # one shared kernel, shut down once at the end of the pool
        assert (p.dir / "records" / f"atexit-{p.values['size']}").read_text() == "ran"
