"""Every committed notebook is built from its source, outputs cleared, one parameters cell first."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_notebooks_in_sync_with_sources() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "build_notebooks.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_notebooks_clean_and_parameterised() -> None:
    notebooks = sorted([*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"),  # NN_name and NNx_name (05b_...)
                        *(ROOT / "notebooks").glob("[0-9][0-9][a-z]_*.ipynb")])
    assert notebooks, "no notebooks"
    for path in notebooks:
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0]["metadata"].get("tags", []), f"{path.name}: first code cell not 'parameters'"
        tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: {len(tagged)} parameters cells"
        params = "".join(code[0]["source"])
        for name in ("num_devices", "results_dir"):
            assert f"{name} =" in params, f"{path.name}: parameters cell lacks {name}"
        assert all(not c["outputs"] and c["execution_count"] is None for c in code), f"{path.name}: outputs"
        assert (ROOT / "notebooks" / "src" / f"{path.stem}.py").exists(), f"{path.name}: no source"
