"""Tiny fake notebooks for the report / sweep tests: they write real records without touching XLA.

Each fake is a parameters cell plus one code cell using ``shardlab.profile.record.Recorder`` (no torch_xla),
so a papermill run costs about a kernel start (~2 s) instead of an 8-device XLA world.
"""

from __future__ import annotations

import json
from pathlib import Path

BODY = '''\
import time
from shardlab.profile.record import Recorder
import plotly.graph_objects as go
rec = Recorder(NAME, params=dict(size=size, fail=fail), results_dir=results_dir)
for src in ("formula", "ledger", "hlo"):
    rec.measure("fake.collective.count", size, "count", src)
rec.check("fake.collective.count: formula = ledger = hlo", True, f"{size}")
rec.measure("fake.collective.bytes", 4 * size, "B", "formula")
rec.measure("fake.collective.bytes", 4 * size + drift, "B", "hlo", differs="a fake reason" if drift else None)
rec.measure("fake.curve.x1.bytes", size, "B", "formula")
rec.measure("fake.curve.x2.bytes", 2 * size, "B", "formula")
rec.skip("fake.tpu_view", "tpu", "no such slice here")
rec.measure("fake.step.time", 0.01 * size, "s", "timer", kind="timing", spread={"min": 0.009, "max": 0.011, "n": 5})
go.Figure(go.Bar(x=[1, 2], y=[size, 2 * size])).show()
time.sleep(sleep)
if fail:
    raise ValueError(f"size={size} is not allowed when fail=True")
rec.close()
'''


def fake_notebook(directory: Path, stem: str, *, size: int = 4, extra_params: str = "", body: str | None = None,
                  declare_required: bool = True) -> Path:
    """Write ``directory/stem.ipynb``; parameters: num_devices, results_dir, size, fail, drift, sleep."""
    params = "num_devices = 8\nresults_dir = None\n" if declare_required else ""
    params += f"size = {size}\nfail = False\ndrift = 0\nsleep = 0\n{extra_params}"
    code = (body or BODY).replace("NAME", repr(stem))
    nb = {"cells": [
        {"cell_type": "code", "execution_count": None, "id": "p", "metadata": {"tags": ["parameters"]},
         "outputs": [], "source": params},
        {"cell_type": "markdown", "id": "m", "metadata": {}, "source": f"# {stem}"},
        {"cell_type": "code", "execution_count": None, "id": "c", "metadata": {}, "outputs": [], "source": code},
    ], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                    "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path
