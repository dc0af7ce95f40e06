"""Sweeps: grid and table helpers on hand-made data, then a resumable sweep of a fake notebook.

Expected values come from the fake's arithmetic (``fake.collective.bytes = 4 * size``) and from counting
points, never from the sweep code itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from report_fakes import fake_notebook

from shardlab.__main__ import main
from shardlab.report import sweep as sw
from shardlab.report.charts import charts
from shardlab.report.notebooks import ReportInputError, find_notebooks


def test_grid_is_the_cartesian_product_in_order() -> None:
    assert sw.grid({"tp": [1, 2], "dtype": ["f32", "bf16"]}) == [
        {"tp": 1, "dtype": "f32"}, {"tp": 1, "dtype": "bf16"}, {"tp": 2, "dtype": "f32"}, {"tp": 2, "dtype": "bf16"}]
    assert sw.grid({}) == [{}]


def test_slug_is_filesystem_safe_and_distinct() -> None:
    assert sw.slug({"tp": 2, "dtype": "bf16"}) == 'tp=2,dtype=_bf16_'
    assert sw.slug({}) == "defaults"
    long_a, long_b = sw.slug({"layer_sizes": list(range(40))}), sw.slug({"layer_sizes": list(range(41))})
    assert len(long_a) <= 80 and long_a != long_b


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    points = [sw.Point({"vocab": r["vocab"]}, {}, Path(f"p{r['vocab']}"), "passed",
                       record={"measurements": r["m"]}) for r in rows]
    return sw.table(points, ["vocab"], {"L": r"\.L(\d+)$"})


def test_table_and_name_params() -> None:
    m = lambda name, v, src: {"name": name, "value": v, "unit": "B", "source": src, "kind": "structural"}  # noqa: E731
    frame = _frame([
        {"vocab": 1024, "m": [m("ce.gather_logits.bytes", 8192, "formula"),
                              m("ce.vocab_parallel.bytes", 64, "formula"),
                              m("scan.compile_s.loop.L8", 1.5, "metrics")]},
        {"vocab": 2048, "m": [m("ce.gather_logits.bytes", 16384, "formula"),
                              m("ce.vocab_parallel.bytes", 64, "formula")]},
    ])
    gathered = frame[frame["name"] == "ce.gather_logits.bytes"].set_index("vocab")["value"]
    assert gathered.to_dict() == {1024: 8192, 2048: 16384}
    scan = frame[frame["name"] == "scan.compile_s.loop"]
    assert scan["L"].tolist() == [8] and scan["value"].tolist() == [1.5]
    assert sw.match_names(frame, ["ce.*.bytes"]) == ["ce.gather_logits.bytes", "ce.vocab_parallel.bytes"]
    figs = charts(frame, "vocab")
    assert len(figs) == 1
    menu = figs[0].layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == ["ce.gather_logits.bytes", "ce.vocab_parallel.bytes",
                                               "scan.compile_s.loop"]


def test_bad_sweep_inputs(tmp_path: Path, capsys: Any) -> None:
    nbs = tmp_path / "nbs"
    fake_notebook(nbs, "01_alpha")
    fake_notebook(nbs, "02_beta")
    argv = ["sweep", "--notebooks-dir", str(nbs), "--out", str(tmp_path / "s")]
    assert main([*argv[:1], "09", *argv[1:], "-p", "size", "1", "2"]) == 2
    assert "unknown notebook '09'" in capsys.readouterr().err
    assert main([*argv[:1], "01", *argv[1:], "-p", "tp", "1", "2"]) == 2
    assert "parameter 'tp' is not declared by 01_alpha" in capsys.readouterr().err
    assert main([*argv[:1], "01", *argv[1:], "-p", "results_dir", "a", "b"]) == 2
    err = capsys.readouterr().err
    assert "results_dir is set by the sweep itself" in err and "--out" in err
    assert main([*argv[:1], "01", *argv[1:], "-p", "num_devices", "1", "2"]) == 2
    err = capsys.readouterr().err
    assert "-p num_devices 1 2" in err and "--num-devices N [N ...]" in err
    assert main([*argv[:1], "01", *argv[1:], "-p", "size", "1", "--num-devices", "0"]) == 2
    assert "--num-devices 0 must be an int >= 1" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()                             # nothing claimed, no kernel started
    nb = find_notebooks(nbs)["02_beta"]
    sw.claim_dir(tmp_path / "s", "01_alpha", force=False)
    with pytest.raises(ReportInputError, match="holds a sweep of 01_alpha, not 02_beta"):
        sw.claim_dir(tmp_path / "s", nb.stem, force=False)


@pytest.mark.notebook
def test_sweep_is_resumable_and_reruns_failures(tmp_path: Path) -> None:
    nb = find_notebooks(fake_notebook(tmp_path / "nbs", "01_alpha").parent)["01_alpha"]
    out = tmp_path / "sweep"
    first = sw.run_sweep(nb, {"size": [1, 2]}, out, jobs=2, timeout_s=120)
    assert [p.status for p in first.points] == ["passed", "passed"] and first.ran == 2
    second = sw.run_sweep(nb, {"size": [1, 2, 3]}, out, jobs=2, timeout_s=120)
    assert [p.status for p in second.points] == ["cached", "cached", "passed"] and second.ran == 1
    table = pd.read_csv(out / "table.csv")
    hlo_bytes = table[(table["name"] == "fake.collective.bytes") & (table["source"] == "hlo")]
    assert dict(zip(hlo_bytes["size"], hlo_bytes["value"], strict=True)) == {1: 4.0, 2: 8.0, 3: 12.0}
    assert (out / "charts.html").exists()
    # a failing point is recorded as failed and run again next time (it is not "completed")
    bad = sw.run_sweep(nb, {"size": [1]}, out, base={"fail": True}, timeout_s=120, render=False)
    assert bad.points[0].status == "failed" and "not allowed when fail=True" in bad.points[0].message
    again = sw.run_sweep(nb, {"size": [1]}, out, base={"fail": True}, timeout_s=120, render=False)
    assert again.ran == 1
    meta = json.loads((again.points[0].dir / "point.json").read_text())
    assert meta["status"] == "failed"
