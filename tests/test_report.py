"""The report runner end to end on tiny fake notebooks (tests/report_fakes.py), plus its bad-input errors.

Fakes write real records through ``Recorder`` without XLA, so a run costs a kernel start. Expected values
follow from the fakes' own arithmetic (``fake.collective.bytes = 4 * size``), not from the runner.
Input errors are checked to fire *before* any kernel starts (no records directory appears).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from report_fakes import fake_notebook

from shardlab.__main__ import main
from shardlab.report.notebooks import ReportInputError, find_notebooks, read_parameters, resolve_name

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 25          # > a fake's kernel start + run on a loaded 2-core machine, << the sleeping fake


def report(nbs: Path, out: Path, base: Path, *extra: str) -> int:
    return main(["report", "--notebooks-dir", str(nbs), "--out", str(out), "--baseline-dir", str(base), *extra])


@pytest.fixture
def nbs(tmp_path: Path) -> Path:
    d = tmp_path / "notebooks"
    fake_notebook(d, "01_alpha")
    fake_notebook(d, "02_beta", size=2)
    return d


# -- bad input: clear errors, exit status 2, nothing executed ---------------------------------------------------
def test_unknown_notebook_name(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    assert report(nbs, tmp_path / "out", tmp_path / "base", "--only", "09_nope") == 2
    err = capsys.readouterr().err
    assert "unknown notebook '09_nope'" in err and "01_alpha, 02_beta" in err
    assert not (tmp_path / "out").exists()


def test_undeclared_parameter(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    assert report(nbs, tmp_path / "out", tmp_path / "base", "-p", "tp", "4") == 2
    err = capsys.readouterr().err
    assert "parameter 'tp' is not declared by 01_alpha" in err and "size" in err
    assert not (tmp_path / "out").exists()


def test_non_literal_parameter_is_refused(tmp_path: Path, capsys: Any) -> None:
    """One rule for the parameters cell (plain literals), read by one parser, enforced before any kernel."""
    d = tmp_path / "notebooks"
    fake_notebook(d, "01_alpha", extra_params="hidden = 2 * 32\n")
    assert report(d, tmp_path / "out", tmp_path / "base") == 2
    err = capsys.readouterr().err
    assert "'hidden' must be a plain literal" in err and "2 * 32" in err and "line 7" in err


def test_out_dir_with_another_run_is_refused(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text('{"schema": "shardlab.report-run/1"}')
    (out / "index.html").write_text("earlier run")
    assert report(nbs, out, tmp_path / "base") == 2
    assert "already holds another report run" in capsys.readouterr().err
    assert (out / "index.html").read_text() == "earlier run"        # nothing overwritten


def test_force_never_deletes_a_foreign_directory(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert report(nbs, out, tmp_path / "base", "--force") == 2
    assert "refusing to delete it even with --force" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "precious"


def test_corrupt_baseline_fails_before_running(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "cpu-8.json").write_text('{"schema": "shardlab.baseline/1", "notebooks": ')
    assert report(nbs, tmp_path / "out", base) == 2
    err = capsys.readouterr().err
    assert "cpu-8.json is not valid JSON" in err and "--update-baseline" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "value", "option"), [("num_devices", "0", "--num-devices"),
                                                        ("num_devices", "8", "--num-devices"),
                                                        ("results_dir", "/tmp/elsewhere", "--out")])
def test_runner_owned_parameter_is_refused(nbs: Path, tmp_path: Path, capsys: Any, name: str, value: str,
                                           option: str) -> None:
    """-p num_devices 0 used to run with the runner's 8 devices and pass: the runner's value replaced it."""
    assert report(nbs, tmp_path / "out", tmp_path / "base", "-p", name, value) == 2
    err = capsys.readouterr().err
    assert f"-p {name} {value}" in err and option in err
    assert not (tmp_path / "out").exists()                          # refused before any kernel started


def test_runner_owned_parameter_is_refused_by_the_library(nbs: Path, tmp_path: Path) -> None:
    from shardlab.report.runner import ReportOptions, run_report

    opts = ReportOptions(notebooks_dir=nbs, out=tmp_path / "out", baseline_dir=tmp_path, params={"num_devices": 0})
    with pytest.raises(ReportInputError, match="--num-devices"):
        run_report(opts)
    assert not (tmp_path / "out").exists()


def test_report_param_takes_one_value(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    assert report(nbs, tmp_path / "out", tmp_path / "base", "-p", "size", "2", "3") == 2
    assert "takes exactly one value" in capsys.readouterr().err


def test_tpu_profile_without_a_tpu(nbs: Path, tmp_path: Path, capsys: Any) -> None:
    from shardlab.runtime import tpu_present

    if tpu_present():
        pytest.skip("this host has a TPU")
    assert report(nbs, tmp_path / "out", tmp_path / "base", "--device", "tpu") == 2
    assert "--device tpu but no TPU is visible" in capsys.readouterr().err


def test_parameters_cell_parsing(tmp_path: Path) -> None:
    path = fake_notebook(tmp_path, "05_x", extra_params="layer_sizes = [8, 16]\ndtype = 'float32'\n")
    params, err = read_parameters(path)
    assert err is None
    assert params == {"num_devices": 8, "results_dir": None, "size": 4, "fail": False, "drift": 0, "sleep": 0,
                      "layer_sizes": [8, 16], "dtype": "float32"}
    nb = json.loads(path.read_text())
    nb["cells"][1]["metadata"]["tags"] = ["parameters"]            # two parameters cells break the contract
    path.write_text(json.dumps(nb))
    assert "2 cells tagged 'parameters'" in (read_parameters(path)[1] or "")


@pytest.mark.parametrize(("source", "words"), [
    ("tp = 4\nhidden = tp * 16\n", "line 2: 'hidden' must be a plain literal"),
    ("import os\n", "line 1: only `name = literal` assignments are allowed"),
    ("a, b = 1, 2\n", "line 1: assign to one plain name"),
    ("tp = 4\nprint(tp)\n", "line 2: only `name = literal`"),
])
def test_one_parameters_parser_for_report_builder_and_tests(source: str, words: str) -> None:
    """The notebook builder rejects exactly what the report's parser rejects (it calls the same function)."""
    import importlib.util

    import nbformat

    from shardlab.report.notebooks import parse_parameters

    assert parse_parameters("tp = 4  # degree\nsizes: list = [8, 16]\nname = 'x'\n") == {
        "tp": 4, "sizes": [8, 16], "name": "x"}
    with pytest.raises(ValueError, match=words):
        parse_parameters(source)
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tools" / "build_notebooks.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["parameters"]})
    with pytest.raises(ValueError, match=words):
        build._check_parameters_cell("99_x", cell)


def test_name_resolution(nbs: Path) -> None:
    found = find_notebooks(nbs)
    assert resolve_name("01", found).stem == "01_alpha"
    assert resolve_name("beta", found).stem == "02_beta"
    assert resolve_name(str(nbs / "02_beta.ipynb"), found).stem == "02_beta"
    with pytest.raises(ReportInputError, match="unknown notebook"):
        resolve_name("03", found)


# -- real runs of fake notebooks -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """01 passes, 02 raises in its code cell, 03 sleeps past the timeout, 04 lacks results_dir."""
    root = tmp_path_factory.mktemp("suite")
    nbs = root / "notebooks"
    fake_notebook(nbs, "01_alpha")
    fake_notebook(nbs, "02_beta", size=2, extra_params="fail = True\n")
    fake_notebook(nbs, "03_gamma", extra_params="sleep = 600\n")
    fake_notebook(nbs, "04_delta", declare_required=False)
    cwd = Path.cwd()
    os.chdir(root)              # relative paths on purpose: kernels run in notebooks/, the runner must cope
    try:
        code = report(Path("notebooks"), Path("out"), Path("base"), "--update-baseline", "--jobs", "3",
                      "--timeout", str(TIMEOUT_S))
    finally:
        os.chdir(cwd)
    return {"root": root, "nbs": nbs, "out": root / "out", "base": root / "base", "code": code}


@pytest.mark.notebook
def test_failures_do_not_stop_the_run(suite: dict[str, Any]) -> None:
    assert suite["code"] == 1
    run = json.loads((suite["out"] / "run.json").read_text())
    status = {n["stem"]: n["status"] for n in run["notebooks"]}
    assert status == {"01_alpha": "passed", "02_beta": "failed", "03_gamma": "timeout", "04_delta": "failed"}
    assert run["exit_status"] == 1


@pytest.mark.notebook
def test_report_html_shows_everything(suite: dict[str, Any]) -> None:
    page = (suite["out"] / "index.html").read_text()
    assert page.count("<script type='text/javascript'>") == 1       # plotly.js bundled once
    assert "<script src=" not in page                               # nothing fetched from a network
    # the failed notebook: its failing cell and the traceback
    assert "size=2 is not allowed when fail=True" in page and "Traceback:" in page
    assert "raise ValueError(f&quot;size={size} is not allowed when fail=True&quot;)" in page
    # the failing cell's index counts the executed notebook's cells: papermill's error banner (0), parameters
    # (1), injected parameters (2), markdown (3), papermill's error anchor (4), code (5)
    assert "<b>error</b> in cell 5 " in page
    assert f"notebook timed out after {TIMEOUT_S} s" in page
    assert "does not declare num_devices, results_dir" in page
    # everything else is still there: checks and the three-way table of the passing notebook (4 * size = 16)
    assert "fake.collective.count: formula = ledger = hlo" in page
    assert "fake.collective.bytes" in page and "<td>16</td>" in page
    assert "@cpu-8" in page                                          # timings carry their device
    # skipped views and values that differ by backend come from the record's own fields
    assert "[tpu] skipped: no such slice here" in page
    assert (suite["out"] / "notebooks" / "01_alpha.ipynb").exists()


@pytest.mark.notebook
def test_executed_notebook_html_draws_plotly_offline(suite: dict[str, Any]) -> None:
    page = (suite["out"] / "notebooks" / "01_alpha.html").read_text()
    assert '<script src="plotly.min.js"></script>' in page and "Plotly.newPlot" in page
    assert (suite["out"] / "notebooks" / "plotly.min.js").stat().st_size > 1_000_000


@pytest.mark.notebook
def test_update_baseline_skips_failed_notebooks(suite: dict[str, Any]) -> None:
    base = json.loads((suite["base"] / "cpu-8.json").read_text())
    assert list(base["notebooks"]) == ["01_alpha"]
    assert base["notebooks"]["01_alpha"]["structural"]["fake.collective.bytes [hlo]"] == {"value": 16, "unit": "B"}
    assert "report.notebook.wall_s [timer]" in base["notebooks"]["01_alpha"]["timing"]


@pytest.mark.notebook
def test_structural_change_is_a_regression_then_clean_run_passes(suite: dict[str, Any]) -> None:
    out2, out3 = suite["root"] / "out2", suite["root"] / "out3"
    assert report(suite["nbs"], out2, suite["base"], "--only", "01", "-p", "size", "5") == 1
    run = json.loads((out2 / "run.json").read_text())
    assert run["notebooks"][0]["status"] == "regressed"
    page = (out2 / "index.html").read_text()
    assert "param size" in page and "16 B -&gt; 20 B" in page        # 4 * 4 -> 4 * 5
    assert report(suite["nbs"], out3, suite["base"], "--only", "01_alpha") == 0
    run = json.loads((out3 / "run.json").read_text())
    assert run["notebooks"][0]["status"] == "passed"


@pytest.mark.notebook
@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / "notebooks" / "01_block_matrices.ipynb").exists(), reason="01 not built yet")
def test_real_block_matrices_notebook(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["report", "--only", "01_block_matrices", "--out", str(out), "--baseline-dir", str(tmp_path)])
    run = json.loads((out / "run.json").read_text())
    assert code == 0, run
    rec = json.loads((out / "records" / "01_block_matrices.json").read_text())
    names = {m["name"] for m in rec["measurements"]}
    assert {"blocks.col.collective.count", "blocks.row.all_reduce.count", "blocks.row.all_reduce.bytes",
            "blocks.grid.collective.bytes"} <= names
    assert run["notebooks"][0]["compile_s"] > 0                       # Recorder.close read torch_xla's metrics


def test_longest_notebooks_start_first(nbs: Path, tmp_path: Path) -> None:
    from shardlab.report import baseline as bl
    from shardlab.report.runner import ReportOptions, longest_first

    fake_notebook(nbs, "03_gamma")                                  # no baseline entry: unknown, so first
    rec = {"notebook": "", "params": {}, "measurements": [], "checks": [], "status": "passed"}
    walls = {"01_alpha": 5.0, "02_beta": 20.0}
    timing = {s: {"report.notebook.wall_s [timer]": {"median": w, "min": w, "max": w, "n": 1, "unit": "s"}}
              for s, w in walls.items()}
    base = bl.baseline_from_records("cpu-8", [{**rec, "notebook": s} for s in walls], {}, timing)
    bl.save(base, tmp_path / "cpu-8.json")
    chosen = list(find_notebooks(nbs).values())
    order = longest_first(ReportOptions(notebooks_dir=nbs, baseline_dir=tmp_path), chosen)
    assert [nb.stem for nb in order] == ["03_gamma", "02_beta", "01_alpha"]


def test_exit_status_and_charts_from_records(tmp_path: Path) -> None:
    from shardlab.report.charts import ChartSpec, report_charts
    from shardlab.report.datatypes import NotebookResult, Report, ReportOptions

    ok = NotebookResult("01_alpha", "passed", [], None, {"checks": []}, None)
    rep = Report(ReportOptions(), tmp_path, 0.0, 1.0, [ok], tmp_path / "b.json", "none", {})
    assert rep.exit_status == 0
    ok.status = "regressed"
    assert rep.exit_status == 1
    rec = {"notebook": "01_alpha", "measurements": [
        {"name": "fake.curve.x1.bytes", "value": 4, "source": "formula"},
        {"name": "fake.curve.x2.bytes", "value": 8, "source": "formula"},
        {"name": "fake.curve.x2.bytes", "value": 8, "source": "hlo"}]}
    spec = ChartSpec("curve", "01_alpha", r"fake\.curve\.x(?P<x>\d+)\.bytes", "B")
    chart, missing = report_charts([rec], (spec, ChartSpec("none", "09_nope", r"x(?P<x>\d)", "B")))
    assert [list(t.x) for t in chart.figure.data] == [[1.0, 2.0], [2.0]]   # formula at x = 1, 2; hlo at 2
    assert missing.figure is None and "did not run" in missing.note


# -- the floor: kernel start + import torch_xla, measured in the same run ------------------------------------------
def test_floor_arithmetic() -> None:
    from shardlab.report.floor import Floor, Probe, default_probes

    probes = (Probe(0.5, 2.5), Probe(1.0, 3.0), Probe(0.25, 9.75))       # totals 3, 4, 10: median 4
    f = Floor(16, 2, probes)
    assert f.per_notebook_s == 4.0 and f.floor_s == 16 * 4.0 / 2
    assert f.ratio(96.0) == 96.0 / 32.0
    assert f.summary(96.0) == "wall 96.0 s, floor 32.0 s (16 notebooks × 4.00 s ÷ 2), ratio 3.00"
    assert Floor(1, 4, probes).floor_s == 4.0                             # one notebook: no faster than one kernel
    assert [default_probes(j) for j in (1, 2, 3)] == [2, 2, 3]
    with pytest.raises(ValueError, match="at least one probe"):
        Floor(16, 2, ())


def test_store_line_counts_live_and_stored_tpu_compiles() -> None:
    """Per notebook, the record's ``xla.TpuCompileTime`` (count, total_s, stored): the report's line sums them by
    hand and names the notebooks that compiled live."""
    from types import SimpleNamespace

    from shardlab.report.datatypes import NotebookResult, Report

    def result(stem: str, xla: dict[str, Any] | None) -> NotebookResult:
        return NotebookResult(stem, "passed", [], None, {"xla": xla} if xla else None, None)

    rs = [result("01_a", {"TpuCompileTime": {"count": 0, "total_s": 0.0, "stored": 5}}),
          result("02_b", {"TpuCompileTime": {"count": 2, "total_s": 1.5, "stored": 3}}),
          result("03_c", {"TpuCompileTime": {"count": 1, "total_s": 0.25}}),   # a record from before the store
          result("04_d", None)]
    assert [(r.tpu_live, r.tpu_stored, r.tpu_compile_s) for r in rs] == [
        (0, 5, 0.0), (2, 3, 1.5), (1, 0, 0.25), (None, None, None)]
    report = SimpleNamespace(results=rs)
    line = Report.store_line(report)  # type: ignore[arg-type]
    assert line is not None and line.startswith("XLA:TPU compiles: 3 live (1.8 s), 8 served from the committed store")
    assert line.endswith("compiled live in 02_b, 03_c (not stored: python tools/tpu_store.py refresh)")
    assert Report.store_line(SimpleNamespace(results=[rs[-1]])) is None  # type: ignore[arg-type]


def test_page_and_terminal_state_wall_and_floor_of_the_same_run(nbs: Path, tmp_path: Path, capsys: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake probes (no timing): k = median(3, 4) = 3.5 s, 2 notebooks, 2 jobs -> floor 3.5 s; the wall is the run's
    own, printed by the terminal and the page alike, and the probes run before any notebook."""
    import re

    from shardlab.report import runner
    from shardlab.report.floor import Probe

    events: list[str] = []
    fakes = iter([Probe(0.5, 2.5), Probe(1.0, 3.0)])
    real_run = runner.run

    def fake_probe(env: dict[str, str]) -> Probe:
        events.append("probe")
        return next(fakes)

    def logged_run(*args: Any, **kwargs: Any) -> Any:
        events.append("notebook")
        return real_run(*args, **kwargs)

    monkeypatch.setattr(runner, "run_probe", fake_probe)
    monkeypatch.setattr(runner, "run", logged_run)
    out = tmp_path / "out"
    assert report(nbs, out, tmp_path / "base", "--jobs", "2") == 0
    terminal = capsys.readouterr().out
    assert events[:2] == ["probe", "probe"] and events.count("notebook") == 2
    wall = re.search(r"index\.html {2}\((\d+\.\d) s\)", terminal).group(1)
    found = re.search(rf"report (wall {wall} s, floor 3\.5 s \(2 notebooks × 3\.50 s ÷ 2\), ratio (\d+\.\d\d))\n",
                      terminal)
    assert found, terminal
    assert abs(float(found.group(2)) - float(wall) / 3.5) <= 0.05 / 3.5 + 0.005   # wall printed to 0.1 s
    assert found.group(1) in (out / "index.html").read_text()                        # the same line, same run
    floor = json.loads((out / "run.json").read_text())["floor"]
    assert floor["floor_s"] == 3.5 and floor["per_notebook_s"] == 3.5 and len(floor["probes"]) == 2


def test_a_failed_probe_costs_the_floor_not_the_report(nbs: Path, tmp_path: Path, capsys: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from shardlab.report import runner

    def broken(env: dict[str, str]) -> Any:
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(runner, "run_probe", broken)
    out = tmp_path / "out"
    assert report(nbs, out, tmp_path / "base", "--only", "01") == 0
    terminal = capsys.readouterr().out
    assert "floor not measured: no kernel here" in terminal and "floor not measured" in (out / "index.html").read_text()
    assert report(nbs, tmp_path / "out2", tmp_path / "base", "--floor-probes", "-1") == 2
