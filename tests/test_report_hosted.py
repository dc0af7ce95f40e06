"""The Colab/Kaggle setup cell: pins equal requirements.txt, no-op locally, the right install on hosted TPU.

The cell is executed for real with ``subprocess.run`` replaced by a recorder, so the hosted path is tested
without installing anything. Pins are re-read from requirements.txt here with a plain string match (an
independent reading, not the module's regex).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_module() -> Any:
    spec = importlib.util.spec_from_file_location("hosted_setup_cell", ROOT / "tools" / "hosted_setup_cell.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def requirement_pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        for pkg in ("torch", "torch_xla", "jax", "jaxlib", "torchax", "flax", "libtpu", "transformers"):
            if line.strip().startswith(f"{pkg}=="):
                out[pkg] = line.strip()
    return out


def run_cell(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(list(cmd)))
    for var in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "TPU_NAME",
                "TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "PJRT_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    exec(compile(load_module().CELL, "hosted-setup-cell", "exec"), {})
    return calls


def test_pins_match_requirements() -> None:
    assert sorted(load_module().pins()) == sorted(requirement_pins().values())


def test_cell_is_a_no_op_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cell(monkeypatch, {}) == []
    assert "PJRT_DEVICE" not in os.environ


def test_cell_on_kaggle_tpu_installs_tpu_wheels_and_sets_pjrt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run_cell(monkeypatch, {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "TPU_NAME": "local"})
    assert len(calls) == 1 and calls[0][1:4] == ["-m", "pip", "install"]
    pins = requirement_pins()
    assert pins["torch_xla"].replace("torch_xla==", "torch_xla[tpu]==") in calls[0]
    assert pins["torch"] in calls[0] and pins["jax"] in calls[0] and pins["torchax"] in calls[0]
    assert any(a.startswith("shardlab @ git+https://") for a in calls[0])
    assert os.environ["PJRT_DEVICE"] == "TPU"


def test_cell_on_colab_cpu_installs_plain_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run_cell(monkeypatch, {"COLAB_RELEASE_TAG": "release-colab"})
    assert requirement_pins()["torch_xla"] in calls[0]
    assert "PJRT_DEVICE" not in os.environ


def test_detection_helper_agrees() -> None:
    mod = load_module()
    assert mod.hosted_kind({}, {}) is None
    assert mod.hosted_kind({}, {"google.colab": object()}) == "colab"
    assert mod.hosted_kind({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, {}) == "kaggle"


def test_built_notebooks_carry_the_cell_after_parameters() -> None:
    cell = load_module().CELL.strip()
    built = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not built:
        pytest.skip("no notebooks built yet")
    for path in built:
        cells = json.loads(path.read_text())["cells"]
        assert "parameters" in cells[0]["metadata"].get("tags", []), path.name
        src = cells[1]["source"]
        assert ("".join(src) if isinstance(src, list) else src).strip() == cell, f"{path.name}: rebuild notebooks"


def test_badge_table_links_each_notebook() -> None:
    from shardlab.report.hosted import badge_table

    table = badge_table(["01_block_matrices", "05_fsdp_flat_params"], "octo/shardlab", "main").splitlines()
    assert table[0] == "| notebook | Colab | Kaggle |" and len(table) == 4
    assert "https://colab.research.google.com/github/octo/shardlab/blob/main/notebooks/05_fsdp_flat_params.ipynb" \
        in table[3]
    assert "kernels/welcome?src=https://github.com/octo/shardlab/blob/main/notebooks/01_block_matrices.ipynb" \
        in table[2]
    with pytest.raises(ValueError, match="owner/name"):
        badge_table(["01_block_matrices"], "shardlab")
