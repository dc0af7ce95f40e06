"""Baseline comparison on hand-made records (no notebooks, no XLA).

The oracle is the rule itself, stated for the report: a changed structural value is a regression whatever its
size; a timing inside the band derived from the baseline's spread is not flagged; new and missing rows are
listed. Records are written by hand so nothing here comes from the code under test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from shardlab.report import baseline as bl


def record(**overrides: Any) -> dict[str, Any]:
    rec = {
        "schema": "shardlab.record/1", "notebook": "02_megatron_mlp", "params": {"tp": 4, "hidden": 256},
        "env": {"device_kind": "cpu", "device_count": 8}, "status": "passed",
        "measurements": [
            {"name": "mlp.fwd.all_reduce.count", "value": 1, "unit": "count", "source": "formula",
             "kind": "structural"},
            {"name": "mlp.fwd.all_reduce.count", "value": 1, "unit": "count", "source": "hlo", "kind": "structural"},
            {"name": "mlp.fwd.all_reduce.bytes", "value": 32768, "unit": "B", "source": "hlo", "kind": "structural"},
            {"name": "mlp.grad_spec", "value": "{devices=[2,4]0,1,2,3,4,5,6,7}", "unit": "", "source": "hlo",
             "kind": "structural"},
            {"name": "mlp.step.time", "value": 0.100, "unit": "s", "source": "timer", "kind": "timing",
             "spread": {"min": 0.090, "max": 0.130, "n": 5}},
        ],
        "checks": [{"name": "mlp.fwd.all_reduce.count: formula = hlo", "ok": True, "detail": ""}],
    }
    rec.update(overrides)
    return rec


def by_key(diffs: list[bl.Diff]) -> dict[str, bl.Diff]:
    return {d.key: d for d in diffs}


def test_same_record_is_same_everywhere() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    diffs = bl.compare(base, [record()])
    assert {d.status for d in diffs} == {"same", "within"}
    assert not any(d.regression or d.flagged for d in diffs)


def test_changed_structural_value_is_a_regression() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    cur = record()
    cur["measurements"][2]["value"] = 32769          # one byte more: still a regression (exact compare)
    d = by_key(bl.compare(base, [cur]))["mlp.fwd.all_reduce.bytes [hlo]"]
    assert d.status == "changed" and d.regression
    assert d.baseline == 32768 and d.current == 32769


def test_changed_string_and_type_are_regressions() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    cur = record()
    cur["measurements"][3]["value"] = "{devices=[1,4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    cur["measurements"][0]["value"] = 1.0            # int 1 -> float 1.0 is a change of the structural value
    diffs = by_key(bl.compare(base, [cur]))
    assert diffs["mlp.grad_spec [hlo]"].regression
    assert diffs["mlp.fwd.all_reduce.count [formula]"].regression


def test_timing_within_band_is_not_flagged_outside_is() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    # half-width = max(3 * (0.130 - 0.090) / 2, 0.5 * 0.100) = max(0.06, 0.05) = 0.06 around 0.100
    lo, hi = bl.timing_band(base["notebooks"]["02_megatron_mlp"]["timing"]["mlp.step.time [timer]"])
    assert (lo, hi) == pytest.approx((0.04, 0.16))
    for value, status in ((0.155, "within"), (0.045, "within"), (0.17, "slower"), (0.03, "faster")):
        cur = record()
        cur["measurements"][4]["value"] = value
        d = by_key(bl.compare(base, [cur]))["mlp.step.time [timer]"]
        assert d.status == status, value
        assert not d.regression                       # timings never fail the run


def test_new_and_missing_rows_are_listed() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    cur = record()
    dropped = cur["measurements"].pop(1)              # hlo count missing now
    cur["measurements"].append({"name": "mlp.bwd.all_reduce.count", "value": 1, "unit": "count",
                                "source": "ledger", "kind": "structural"})
    diffs = by_key(bl.compare(base, [cur]))
    assert diffs[f"{dropped['name']} [hlo]"].status == "missing"
    assert diffs["mlp.bwd.all_reduce.count [ledger]"].status == "new"
    assert not any(d.regression for d in diffs.values())


def test_repeated_names_are_keyed_in_order() -> None:
    rows = [{"name": "a", "source": "hlo", "value": 1}, {"name": "a", "source": "hlo", "value": 2}]
    assert list(bl.key_rows(rows)) == ["a [hlo]", "a [hlo] #2"]


def test_no_baseline_entry_means_all_new() -> None:
    diffs = bl.compare(None, [record()])
    assert {d.status for d in diffs} == {"new"}


def test_update_keeps_other_notebooks() -> None:
    other = record(notebook="01_block_matrices")
    old = bl.baseline_from_records("cpu-8", [record(), other])
    cur = record()
    cur["measurements"][2]["value"] = 1
    new = bl.baseline_from_records("cpu-8", [cur], previous=old)
    assert set(new["notebooks"]) == {"01_block_matrices", "02_megatron_mlp"}
    assert new["notebooks"]["02_megatron_mlp"]["structural"]["mlp.fwd.all_reduce.bytes [hlo]"]["value"] == 1


def test_param_changes() -> None:
    base = bl.baseline_from_records("cpu-8", [record()])
    cur = record(params={"tp": 8, "hidden": 256})
    assert bl.param_changes(base["notebooks"]["02_megatron_mlp"], cur) == {"tp": (4, 8)}


def test_save_load_round_trip(tmp_path: Path) -> None:
    base = bl.baseline_from_records("cpu-8", [record()], env={"torch_xla": "2.9.0"})
    path = tmp_path / "cpu-8.json"
    bl.save(base, path)
    assert bl.load(path, "cpu-8") == json.loads(json.dumps(base))
    assert bl.load(tmp_path / "absent.json", "cpu-8") is None


@pytest.mark.parametrize("mutate, words", [
    (lambda d: "{not json", "not valid JSON"),
    (lambda d: [1, 2], "top level is a list"),
    (lambda d: {**d, "schema": "shardlab.baseline/0"}, "schema is 'shardlab.baseline/0'"),
    (lambda d: {**d, "profile": "tpu-8"}, "profile 'tpu-8'"),
    (lambda d: {**d, "notebooks": []}, "'notebooks' must be an object"),
    (lambda d: {**d, "notebooks": {"02_megatron_mlp": {"structural": {"x [hlo]": {"value": 1}}, "timing": {}}}},
     "needs 'value' and 'unit'"),
    (lambda d: {**d, "notebooks": {"02": {"structural": {}, "timing": {"t [timer]": {"median": "fast"}}}}},
     "numeric 'median'"),
])
def test_corrupt_or_mismatched_baseline_is_a_clear_error(tmp_path: Path, mutate: Any, words: str) -> None:
    good = bl.baseline_from_records("cpu-8", [record()])
    bad = mutate(copy.deepcopy(good))
    path = tmp_path / "cpu-8.json"
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with pytest.raises(bl.BaselineError) as err:
        bl.load(path, "cpu-8")
    assert words in str(err.value) and str(path) in str(err.value) and "--update-baseline" in str(err.value)
