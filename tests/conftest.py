"""Shared fixtures.

- ``xla_world``: the process-wide 8-device CPU world (torch_xla allows one per process; every XLA test in
  this pytest process shares it).
- ``run_notebook(name, **params)``: execute ``notebooks/<name>.ipynb`` through papermill in a fresh kernel
  with ``results_dir`` in a temp dir (and, for a notebook with exercises, the answer key from
  ``data/answers/``), and return its record after asserting that the notebook finished and every in-notebook
  check passed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The TPU compile view (compile-only, libtpu) runs inside this process and in notebook kernels at the same time.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Set the XLA world up before any test runs (the FSDP tests need it).

    The autograd engine sizes its per-device ready queues at the FIRST backward of a process. A CPU backward
    before torch_xla has registered its device (test_comm, test_tp_*, test_fsdp_unit ...) makes every later
    XLA backward in the same process fail with "device_ready_queues_ ... INTERNAL ASSERT FAILED"
    (torch 2.9.0 / torch_xla 2.9.0; reproduced: CPU backward, then runtime.setup(), then an XLA backward).
    """
    from shardlab import runtime

    runtime.setup(num_devices=8)


@pytest.fixture(scope="session")
def xla_world() -> Any:
    from shardlab import runtime

    return runtime.setup(num_devices=8)


@pytest.fixture
def live_tpu_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every XLA:TPU compile of the test runs live, never served from the committed store
    (``shardlab.profile.tpu_store``): for tests about the compiler, and for a cache checked against a live compile.
    A compile worker gets the mode with each request."""
    monkeypatch.setenv("SHARDLAB_TPU_STORE", "off")


@pytest.fixture
def run_notebook(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    import papermill as pm

    from shardlab.profile import load_record

    def run(name: str, **params: Any) -> dict[str, Any]:
        from shardlab.core.answer_keys import load_key
        from shardlab.report.notebooks import read_parameters

        results = tmp_path / "results"
        params.setdefault("results_dir", str(results))
        declared, _ = read_parameters(NOTEBOOKS / f"{name}.ipynb")
        if "answers" in declared and "answers" not in params:
            params["answers"] = load_key(name)  # grade the hand-written answer key (exercise.<n>.answer_key)
        out = tmp_path / f"{name}.executed.ipynb"
        pm.execute_notebook(
            str(NOTEBOOKS / f"{name}.ipynb"), str(out), parameters=params, kernel_name="python3",
            cwd=str(NOTEBOOKS), progress_bar=False, start_timeout=300,
            execution_timeout=3600 if params.get("full_size") else 600,
        )
        record = load_record(Path(params["results_dir"]) / f"{name}.json")
        failed = [c for c in record["checks"] if not c["ok"]]
        assert not failed, f"{name}: failed checks {failed}"
        assert record["status"] == "passed", f"{name}: status {record['status']}"
        assert record["checks"], f"{name}: the notebook recorded no checks"
        return record

    return run
