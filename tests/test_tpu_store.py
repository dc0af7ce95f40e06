"""The committed store of XLA:TPU compile results (``shardlab.profile.tpu_store``).

Oracle: the compiler itself. A stored entry must be what a live compile of the same proto with the same options
returns — program text, memory statistics, cost analysis, out-of-memory message — compared exactly; a served
result must equal the live one field by field; and the key must change with anything that changes the program.
"""

from __future__ import annotations

import dataclasses

import pytest
import tpu_programs as tp

pytestmark = pytest.mark.xla


@pytest.fixture
def store(xla_world, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """An empty store in a temp dir and a fresh in-process cache (a served result must come from the store)."""
    from shardlab.profile import tpu, tpu_store

    tpu.check_backend()
    monkeypatch.setattr(tpu_store, "STORE_DIR", tmp_path / "store")
    monkeypatch.setattr(tpu, "_CACHE", {})
    return tpu, tpu_store


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert (a.fits, a.hlo_text, a.memory, a.cost, a.num_chips, a.topology) == \
        (b.fits, b.hlo_text, b.memory, b.cost, b.num_chips, b.topology)
    assert (a.oom.message if a.oom else None) == (b.oom.message if b.oom else None)


def test_write_then_read_serves_the_live_result(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "write")
    live = tpu.compile_tensors(tp.megatron_mlp(tp.MlpCfg()), "v5e-8", label="mlp")
    assert not live.cached and not live.stored and live.compile_s > 0
    (key, entry), = tpu_store.stored_compiles()
    assert tpu_store.key_of(entry.fields) == key and entry.label == "mlp" and entry.text == live.hlo_text

    monkeypatch.setattr(tpu, "_CACHE", {})
    monkeypatch.setenv(tpu_store.ENV, "read")
    compiles, hits = tpu.COMPILES, tpu.STORE_HITS
    served = tpu.compile_tensors(tp.megatron_mlp(tp.MlpCfg()), "v5e-8", label="mlp again")
    assert served.stored and served.cached and served.label == "mlp again"
    assert tpu.COMPILES == compiles and tpu.STORE_HITS == hits + 1  # no compile counted, one store hit
    _same(served, live)
    assert served.module.summary() == live.module.summary()  # the program is read from the stored text

    monkeypatch.setattr(tpu, "_CACHE", {})
    monkeypatch.setenv(tpu_store.ENV, "off")
    again = tpu.compile_tensors(tp.megatron_mlp(tp.MlpCfg()), "v5e-8")
    assert not again.cached and not again.stored and tpu.COMPILES == compiles + 1
    _same(again, live)


def test_out_of_memory_is_stored_as_the_compilers_message(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "write")
    live = tpu.compile_tensors(tp.big_temporary(), "v5e-8", label="big")
    assert not live.fits
    monkeypatch.setattr(tpu, "_CACHE", {})
    monkeypatch.setenv(tpu_store.ENV, "read")
    served = tpu.compile_tensors(tp.big_temporary(), "v5e-8", label="big")
    assert served.stored and not served.fits and served.module is None
    assert dataclasses.asdict(served.oom) == dataclasses.asdict(live.oom)
    (_, entry), = tpu_store.stored_compiles()
    assert tpu.recompile_stored(entry) == []  # the compiler still says exactly that


def test_the_key_follows_the_program_topology_and_options(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "write")
    outs = tp.data_parallel_step(tp.MlpCfg())
    tpu.compile_tensors(outs, "v5e-8")
    tpu.compile_tensors(outs, "v5e-8")                                       # the same: one entry
    tpu.compile_tensors(outs, "v6e-8")                                       # another chip
    tpu.compile_tensors(outs, "v5e-8", disable_passes=("all-reduce-combiner",))  # another option
    tpu.compile_tensors(tp.data_parallel_step(tp.MlpCfg(tokens=128)), "v5e-8")  # another program
    entries = [e for _, e in tpu_store.stored_compiles()]
    assert len(entries) == 4
    assert len({e.fields["program_sha256"] for e in entries}) == 2
    assert {e.fields["topology"] for e in entries} == {"v5e-8", "v6e-8"}


def test_a_tampered_entry_is_caught_by_recompiling_it(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "write")
    tpu.compile_tensors(tp.zero3_step(tp.MlpCfg()), "v5e-8")
    (_, entry), = tpu_store.stored_compiles()
    assert tpu.recompile_stored(entry) == []
    bad = dataclasses.replace(entry, text=entry.text.replace("reduce-scatter", "all-reduce"),
                              memory={**entry.memory, "temp": entry.memory["temp"] + 1})
    diffs = tpu.recompile_stored(bad)
    assert diffs[0] == "program text" and diffs[1].startswith("memory:")
    other = dataclasses.replace(entry, fields={**entry.fields, "program_sha256": "0" * 64})
    assert tpu.recompile_stored(other) == ["the stored proto is not the program its key names"]


def test_a_bad_mode_is_refused_by_name(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "sometimes")
    with pytest.raises(ValueError, match=r"SHARDLAB_TPU_STORE='sometimes' is not one of read, off, write"):
        tpu.compile_tensors(tp.zero3_step(tp.MlpCfg()), "v5e-8")


def test_the_committed_store_is_what_the_compiler_says(xla_world) -> None:  # type: ignore[no-untyped-def]
    """Every committed file is named by its fields' key, and the cheapest entries recompile to exactly what they
    hold (``python tools/tpu_store.py verify`` recompiles all of them)."""
    from shardlab.profile import tpu, tpu_store

    entries = tpu_store.stored_compiles()
    assert entries, "data/tpu_store is empty: python tools/tpu_store.py refresh"
    assert all(tpu_store.key_of(e.fields) == key for key, e in entries)
    for _, entry in sorted(entries, key=lambda kv: kv[1].compile_s)[:3]:
        assert tpu.recompile_stored(entry) == [], entry.label


def test_a_compile_worker_compiles_in_this_processs_mode_and_store(store, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A 4-chip program compiles in a worker started long before: the store mode and directory go with each
    request, so a write lands in this test's store, and an ``off`` compile stores nothing."""
    tpu, tpu_store = store
    monkeypatch.setenv(tpu_store.ENV, "write")
    cfg = tp.MlpCfg(tokens=48, hidden=128, ffn=512)  # compiled by no other test: the worker's own cache cannot serve it
    out = tpu.compile_program(tp.megatron_mlp, cfg, "v5e-4", label="mlp tp4")
    assert out.fits and not out.stored
    (_, entry), = tpu_store.stored_compiles()  # written by the worker into this test's directory
    assert entry.fields["topology"] == "v5e-4" and entry.text == out.hlo_text and entry.label == "mlp tp4"
    monkeypatch.setenv(tpu_store.ENV, "off")
    tpu.compile_program(tp.zero3_step, cfg, "v5e-4")
    assert len(tpu_store.stored_compiles()) == 1
