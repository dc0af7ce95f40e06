"""``inspect --recompute offload``: full recompute with each scanned layer's hidden-state input in host memory.

Oracles: the compiled XLA:TPU program's own instructions and memory statistics (arrays in host memory space
``S(5)``, the asynchronous transfers in the loop bodies, ``host_temp_size_in_bytes``) against a hand count of what
was offloaded — L layers x the per-chip hidden state [b / fsdp, s, h] in bf16 — and the same step compiled with
plain full recompute (nothing in host memory, more HBM temporaries).
"""

from __future__ import annotations

import pytest

from shardlab.inspect import output
from shardlab.inspect.api import run
from shardlab.inspect.config import make_config

pytestmark = pytest.mark.xla

ATTN = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512}
L, B, S, H, CHIPS = 4, 8, 256, 128, 8
_RESULTS: dict[tuple[str, str], object] = {}


def inspected(recompute: str, layers: str = "scan"):  # type: ignore[no-untyped-def]
    if (recompute, layers) not in _RESULTS:
        cfg = make_config("llama-3-8b", mesh=f"fsdp={CHIPS}", topology="v5e-8", batch=B, seq=S, num_layers=L,
                          overrides=ATTN, recompute=recompute, layers=layers)
        _RESULTS[recompute, layers] = run(cfg)
    return _RESULTS[recompute, layers]


@pytest.mark.parametrize("layers", ["scan", pytest.param("scan_layers", marks=pytest.mark.slow)])
def test_offload_moves_the_layer_inputs_to_host_and_the_peak_drops(layers: str, xla_world) -> None:  # type: ignore
    full, off = inspected("full", layers), inspected("offload", layers)
    assert full.fits and off.fits
    offloaded = L * (B // CHIPS) * S * H * 2  # bf16 [L, b/fsdp, s, h]: every layer's hidden-state input
    assert full.host is None  # nothing in host memory without offload
    h = off.host
    assert h is not None and h["space"] == "S(5)"
    assert [a["shape"] for a in h["arrays"]] == [f"bf16[{L},{B // CHIPS},{S},{H}]"]
    assert h["host_temp"] == h["arrays"][0]["bytes"] == offloaded
    to_host = h["transfers"]["dynamic-update-slice-start (device -> host)"]
    to_dev = h["transfers"]["dynamic-slice-start (host -> device)"]
    assert to_host["per_step"] == to_dev["per_step"] == L  # one per layer, in the forward / backward loop
    assert to_host["bytes_per_step"] == to_dev["bytes_per_step"] == offloaded
    # the HBM the capacity check counts drops by at least what went to the host (measured: by more)
    drop = full.row("temporaries")["compiler"] - off.row("temporaries")["compiler"]
    assert drop >= offloaded and off.totals["peak"] < full.totals["peak"]
    # the planner prices the same: its kept layer inputs leave HBM
    assert full.planner["memory"]["activations"] - off.planner["memory"]["activations"] == offloaded
    assert any("recompute offload" in n and "S(5)" in n for n in off.notes)
    # terminal and HTML say what is in host memory and that it was read from the program
    for text in (output.text(off), output.html_fragment(off)):
        assert f"bf16[{L},{B // CHIPS},{S},{H}]" in text and "host memory (measured" in text
    assert "host memory" not in output.text(full)
