"""Notebook parameters: the dataclass is the one declaration — each notebook's parameters cell is generated from
it (same names, defaults and comments, also checked by `tools/build_notebooks.py --check`) — and every rule raises
a ValueError naming the parameter (checked on the dataclasses directly)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardlab import planner
from shardlab.blocks.params import BlocksParams, WelcomeParams
from shardlab.core.params import field_comments
from shardlab.core.topics import notebook_params
from shardlab.fsdp.params import FsdpGspmdParams, FsdpParams
from shardlab.planner.params import PlannerParams
from shardlab.report.notebooks import read_parameters
from shardlab.tp.params import AttentionParams, MlpParams, VocabParams
from shardlab.xla_scan.params import ScanParams

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("stem", sorted(notebook_params()))
def test_parameters_cell_declares_exactly_the_dataclass_fields(stem):
    declared, err = read_parameters(NOTEBOOKS / f"{stem}.ipynb")
    assert err is None, err
    cls = notebook_params()[stem]
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in dataclasses.fields(cls)}
    assert sorted(declared) == sorted(defaults), f"{stem}: cell {sorted(declared)} vs dataclass {sorted(defaults)}"
    assert declared == {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}
    cls(**declared).validate()  # the defaults are legal


def test_every_notebook_has_a_parameter_dataclass():
    stems = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]*.ipynb"))
    assert stems == sorted(notebook_params()), "a notebook without a dataclass (or the reverse)"


def test_parameters_cell_is_generated_with_the_comments():
    """The cell is plain literals in field order with the comment of the class that declared each field last."""
    cell = MlpParams.parameters_cell().splitlines()
    assert cell[0].startswith("num_devices = 8  # ") and cell[-1].startswith("answers = None  # ")
    assert "ffn = 256  # MLP inner size (4 * hidden in GPT)" in cell
    assert 'dtype = "float32"  # "float32" or "bfloat16"' in cell
    assert field_comments(MlpParams)["ffn"] == "MLP inner size (4 * hidden in GPT)"


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
    (PlannerParams, {"data": 2}, "data=2 × fsdp=8 × tensor=1 = 16 does not equal the 8 chips of v6e-8"),
    (PlannerParams, {"model": "llama-9b"}, "unknown model preset 'llama-9b'"),
    (PlannerParams, {"model": 7}, "model=7 must be a preset name or a dict"),
    (PlannerParams, {"model": {"layers": 2}}, "missing keys ['hidden', 'ffn', 'heads', 'kv_heads', 'vocab']"),
    (PlannerParams, {"topology": "v9-8"}, "topology='v9-8' is not a known TPU slice; known slices: v5e-1"),
    (PlannerParams, {"topology": 8}, "topology=8 is not a known TPU slice"),
    (PlannerParams, {"recompute": "half"}, "recompute='half' must be one of"),
    (PlannerParams, {"global_batch": 4}, "global_batch=4 is not divisible by data × fsdp = 8"),
    (PlannerParams, {"val_world": 0}, "val_world=0 must be a positive int"),
    (PlannerParams, {"val_world": 3}, "val_ffn=512 is not divisible by val_world=3"),
    (PlannerParams, {"val_hidden": 100}, "val_hidden=100 is not divisible by val_heads=8"),
    (PlannerParams, {"val_heads": 6}, "val_heads=6 is not divisible by val_world=8"),
    (PlannerParams, {"val_tokens": 60}, "val_tokens=60 is not divisible by val_world=8"),
    (WelcomeParams, {"world_size": 3}, "world_size=3 must be one of"),
    (WelcomeParams, {"n": 1001}, "n=1001 is not divisible by world_size=8"),
    (WelcomeParams, {"n": 0}, "n=0 must be a positive int"),
    (BlocksParams, {"parts": 0}, "parts=0 must be a positive int"),
    (BlocksParams, {"k": 3}, "parts=4 is more than k=3"),
    (BlocksParams, {"n": 2}, "parts=4 is more than n=2"),
    (BlocksParams, {"m": 15}, "m=15 is odd"),
    (BlocksParams, {"dtype": "float16"}, "dtype='float16' must be one of"),
    (VocabParams, {"memory_tokens": -1}, "memory_tokens=-1 must be an int >= 0"),
    (AttentionParams, {"ffn": 30}, "ffn=30 is not divisible by tp=4"),
    (ScanParams, {"layers_sweep": [1, 4]}, "layers_sweep=[1, 4] has entries [1]: each must be an int >= 2"),
    (ScanParams, {"layers_sweep": []}, "layers_sweep=[] must be a non-empty list"),
    (ScanParams, {"mesh_fsdp": 1, "mesh_tensor": 8}, "mesh_fsdp=1 leaves shard_as nothing to do"),
    (ScanParams, {"hidden": 65}, "hidden=65 is not divisible by mesh_fsdp=2"),
    (ScanParams, {"ffn": 510}, "ffn=510 is not divisible by mesh_tensor=4"),
    (ScanParams, {"seq": 6}, "seq=6 is not divisible by mesh_tensor=4"),
    (ScanParams, {"batch": 2}, "batch=2 is not divisible by mesh_tensor=4 (the transposed mesh"),
    (ScanParams, {"devices_sweep": [3]}, "devices_sweep entry 3"),
    (ScanParams, {"placeholder_hiddens": [63]}, "placeholder_hiddens entry 63"),
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


def test_slice_parameters_take_either_form_and_keep_one():
    """The notebook parameter is the boundary: libtpu's "v6e:8x8" is accepted and stored as "v6e-64"."""
    from shardlab.inspect.params import YourModelParams

    p = PlannerParams(topology="v6e:8x8", fsdp=64, global_batch=64).validate()
    assert p.topology == "v6e-64" and planner.plan(p).chips == 64
    y = YourModelParams(topology="v5e:2x4", tiny_topology="v5e:2x4").validate()
    assert (y.topology, y.tiny_topology, y.inspect_config().topology) == ("v5e-8", "v5e-8", "v5e-8")
    with pytest.raises(ValueError, match=r"tiny_topology='v5e:3x3' is not a known TPU slice"):
        YourModelParams(tiny_topology="v5e:3x3").validate()


def test_blocks_and_world_may_exceed_the_device_count():
    """Formula and ledger need no devices: p = 8 blocks or an 8-rank collective on one device are legal."""
    assert BlocksParams(num_devices=1, parts=8).validate().parts == 8
    assert WelcomeParams(num_devices=1, world_size=8).validate().world_size == 8
    assert BlocksParams(parts=3, m=5).validate().m == 5  # an odd p has no grid, so m may be odd


def test_tp_may_exceed_the_device_count():
    """Formula and ledger need no devices: tp=8 on a 1-device world is legal (compiler views are skipped)."""
    assert MlpParams(num_devices=1, tp=8).validate().tp == 8


def test_planner_validation_may_exceed_the_device_count():
    """The plan is arithmetic and the validation's formula / ledger need no devices: val_world=8 on 1 device."""
    assert PlannerParams(num_devices=1).validate().val_world == 8
    assert planner.plan(PlannerParams()).config.fsdp == 8


def test_record_leaves_out_where_and_the_answer_key():
    rec = MlpParams(results_dir="/tmp/x", answers={"1": 2}).as_record()
    assert "results_dir" not in rec and "answers" not in rec and rec["tp"] == 4


def test_fsdp_world_size_needs_no_devices():
    """The FlatParameter, the formulas and the TPU view need no devices: W = 8 on one device is legal (the CPU
    compiler view of 05b is then skipped with a note); papermill's YAML lists become tuples."""
    assert FsdpParams(num_devices=1, world_size=8).validate().world_size == 8
    assert FsdpGspmdParams(num_devices=1, layer_sizes=[4, 6, 2]).validate().layer_sizes == (4, 6, 2)
