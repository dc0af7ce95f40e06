"""The report and the compile-only TPU view: two baselines, the CPU-vs-TPU column, --full-size.

A fake notebook (no XLA, tests/report_fakes.py) records a count from formula / hlo / tpu, a value that the
TPU "combines" (recorded with ``differs``, the field the harness writes for a value that differs by backend), and
its ``full_size`` parameter. Expected values follow from the fake's arithmetic, not from the runner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from report_fakes import fake_notebook

from shardlab.__main__ import main

BODY = '''\
from shardlab.profile.record import Recorder
rec = Recorder(NAME, params=dict(size=size, full_size=full_size), results_dir=results_dir)
for src in ("formula", "hlo", "tpu"):
    rec.measure("fake.all_reduce.count", size, "count", src)
rec.measure("fake.all_reduce.ops", size, "count", "hlo")
rec.measure("fake.all_reduce.ops", 1 + drift, "count", "tpu",
            differs="the tpu compiler combined 4 all-reduces into 1 tuple instruction(s)")
if full_size:
    rec.measure("fake.full.per_chip.bytes", 1000 * size, "B", "tpu")
rec.close()
'''


def report(nbs: Path, out: Path, base: Path, *extra: str) -> int:
    return main(["report", "--notebooks-dir", str(nbs), "--out", str(out), "--baseline-dir", str(base),
                 "--timeout", "120", *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tpu")
    nbs = root / "notebooks"
    fake_notebook(nbs, "01_alpha", body=BODY, extra_params="full_size = False\n")
    code = report(nbs, root / "out", root / "base", "--update-baseline")
    return {"root": root, "nbs": nbs, "base": root / "base", "code": code}


@pytest.mark.notebook
def test_tpu_rows_have_their_own_baseline(run: dict[str, Any]) -> None:
    assert run["code"] == 0
    cpu = json.loads((run["base"] / "cpu-8.json").read_text())["notebooks"]["01_alpha"]["structural"]
    tpu = json.loads((run["base"] / "tpu-v5e-8-aot.json").read_text())["notebooks"]["01_alpha"]["structural"]
    assert "fake.all_reduce.count [hlo]" in cpu and not any(k.endswith("[tpu]") for k in cpu)
    assert set(tpu) == {"fake.all_reduce.count [tpu]", "fake.all_reduce.ops [tpu]"}
    assert tpu["fake.all_reduce.count [tpu]"]["value"] == 4


@pytest.mark.notebook
def test_a_changed_tpu_value_regresses_against_the_tpu_baseline(run: dict[str, Any]) -> None:
    out = run["root"] / "drift"
    assert report(run["nbs"], out, run["base"], "-p", "drift", "1") == 1
    nb = json.loads((out / "run.json").read_text())["notebooks"][0]
    assert nb["status"] == "regressed"  # its checks pass; only the TPU program changed (1 -> 2 instructions)
    assert any("differ from the baseline tpu-v5e-8-aot" in r for r in nb["reasons"])
    assert not any("baseline cpu-8" in r for r in nb["reasons"])


@pytest.mark.notebook
def test_cpu_vs_tpu_column_and_marked_differences(run: dict[str, Any]) -> None:
    page = (run["root"] / "out" / "index.html").read_text()
    assert "CPU vs TPU compiler" in page
    assert "differs: the tpu compiler combined 4 all-reduces into 1 tuple instruction(s)" in page
    assert "1 †</span>" in page  # the TPU's 1 is marked and left out of "agree"
    assert "<td>same</td>" in page  # the count: hlo 4 = tpu 4


@pytest.mark.notebook
def test_full_size_switch_sets_the_parameter_and_its_own_profiles(run: dict[str, Any], capsys: Any) -> None:
    out = run["root"] / "full"
    assert report(run["nbs"], out, run["base"], "--full-size", "--update-baseline") == 0
    rec = json.loads((out / "records" / "01_alpha.json").read_text())
    assert rec["params"]["full_size"] is True
    full = json.loads((run["base"] / "tpu-v5e-8-aot-full.json").read_text())["notebooks"]["01_alpha"]
    assert full["structural"]["fake.full.per_chip.bytes [tpu]"]["value"] == 4000
    assert (run["base"] / "cpu-8-full.json").exists()
    default = json.loads((run["base"] / "tpu-v5e-8-aot.json").read_text())["notebooks"]["01_alpha"]
    assert "fake.full.per_chip.bytes [tpu]" not in default["structural"]  # the default profile is untouched
    assert report(run["nbs"], run["root"] / "p", run["base"], "-p", "full_size", "true") == 2
    assert "use --full-size" in capsys.readouterr().err


def test_tpu_profile_is_named_by_the_slice() -> None:
    """The TPU baseline profile carries the slice in the suite's one form (generation-chips)."""
    from shardlab.profile.tpu import topology_for
    from shardlab.report.datatypes import ReportOptions

    for gen, n in (("v5e", 8), ("v6e", 4)):
        assert ReportOptions(num_devices=n, tpu_generation=gen).tpu_profile == f"tpu-{topology_for(n, gen)}-aot"
