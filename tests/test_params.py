"""Notebook parameters: each notebook's parameters cell declares exactly its dataclass's fields, with the same
defaults, and every rule raises a ValueError naming the parameter (checked on the dataclasses directly)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardlab.params import NOTEBOOK_PARAMS, AttentionParams, FsdpGspmdParams, FsdpParams, MlpParams, VocabParams
from shardlab.report.notebooks import read_parameters

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("stem", sorted(NOTEBOOK_PARAMS))
def test_parameters_cell_declares_exactly_the_dataclass_fields(stem):
    declared, err = read_parameters(NOTEBOOKS / f"{stem}.ipynb")
    assert err is None, err
    cls = NOTEBOOK_PARAMS[stem]
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    assert sorted(declared) == sorted(defaults), f"{stem}: cell {sorted(declared)} vs dataclass {sorted(defaults)}"
    assert declared == defaults
    cls(**declared).validate()  # the defaults are legal


def test_from_namespace_reads_every_field_and_rejects_a_missing_one():
    ns = {f.name: f.default for f in dataclasses.fields(MlpParams)}
    assert MlpParams.from_namespace({**ns, "tp": 2, "unrelated": 1}).tp == 2
    del ns["ffn"]
    with pytest.raises(ValueError, match=r"does not define \['ffn'\]"):
        MlpParams.from_namespace(ns)


@pytest.mark.parametrize("cls, change, words", [
    (MlpParams, {"tp": 0}, "tp=0 must be a positive int"),
    (MlpParams, {"tp": 3}, "ffn=256 is not divisible by tp=3"),
    (MlpParams, {"dtype": "float16"}, "dtype='float16' must be one of"),
    (MlpParams, {"run_gloo": "yes"}, "run_gloo='yes' must be True or False"),
    (MlpParams, {"batch": True}, "batch=True must be a positive int"),
    (MlpParams, {"answers": [1]}, "answers=[1] must be None or a dict"),
    (AttentionParams, {"heads": 6}, "hidden=64 is not divisible by heads=6"),
    (AttentionParams, {"tp": 16, "heads": 8}, "heads=8 is not divisible by tp=16"),
    (VocabParams, {"tp": 1}, "tp=1 communicates nothing"),
    (VocabParams, {"vocab": 4}, "vocab=4 is smaller than tp=8"),
    (VocabParams, {"label_smoothing": 1.5}, "label_smoothing=1.5 is not a number in"),
    (FsdpParams, {"batch": 60}, "batch=60 is not divisible by world_size=8"),
    (FsdpParams, {"layer_sizes": [30]}, "layer_sizes=[30] must be a list of >= 2 positive ints"),
    (FsdpParams, {"layer_sizes": [30, 0]}, "layer_sizes=[30, 0] must be a list of >= 2 positive ints"),
    (FsdpParams, {"align": 1}, "align=1 must be True or False"),
    (FsdpParams, {"steps": 0}, "steps=0 must be a positive int"),
    (FsdpParams, {"world_size": 0}, "world_size=0 must be a positive int"),
    (FsdpGspmdParams, {"torch_fsdp_world": 5}, "torch_fsdp_world=5 must be an int in [0, 4]"),
    (FsdpGspmdParams, {"world_size": 3, "batch": 64}, "batch=64 is not divisible by world_size=3"),
])
def test_rules_name_the_parameter(cls, change, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        dataclasses.replace(cls(), **change).validate()


def test_tp_may_exceed_the_device_count():
    """Formula and ledger need no devices: tp=8 on a 1-device world is legal (compiler views are skipped)."""
    assert MlpParams(num_devices=1, tp=8).validate().tp == 8


def test_record_leaves_out_where_and_the_answer_key():
    rec = MlpParams(results_dir="/tmp/x", answers={"1": 2}).as_record()
    assert "results_dir" not in rec and "answers" not in rec and rec["tp"] == 4


def test_fsdp_world_size_needs_no_devices():
    """The FlatParameter, the formulas and the TPU view need no devices: W = 8 on one device is legal (the CPU
    compiler view of 05b is then skipped with a note); papermill's YAML lists become tuples."""
    assert FsdpParams(num_devices=1, world_size=8).validate().world_size == 8
    assert FsdpGspmdParams(num_devices=1, layer_sizes=[4, 6, 2]).validate().layer_sizes == (4, 6, 2)
