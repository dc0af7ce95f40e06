"""Hardware profiles (data/hardware/*.json) and the roofline.

Oracle for the profiles: each JSON carries the public document's own wording ("values"); the numeric
fields must be the numbers quoted there (guards against typos when the table was transcribed).
"""

import pytest

from shardlab.formulas import hardware as H


@pytest.mark.parametrize(
    "name,tflops,hbm_gb,ici_gbps",
    [("v5e", 197, 16, 400), ("v6e", 918, 32, 800), ("v5p", 459, 95, 1200)],
)
def test_profiles_match_quoted_source(name, tflops, hbm_gb, ici_gbps):
    c = H.chip(name)
    quoted = " ".join(s["values"] for s in c.sources)
    assert f"{tflops} TFLOPs" in quoted and f"{hbm_gb} GB" in quoted and f"{ici_gbps} GBps" in quoted
    assert c.bf16_peak_flops_per_s == tflops * 1e12
    assert c.hbm_bytes == hbm_gb * 10**9
    assert c.ici_bandwidth_bytes_per_s == ici_gbps * 1e9
    assert all(s["url"].startswith("https://") for s in c.sources)


def test_topologies():
    assert H.topology("v5e-8")[1] == 8
    assert H.topology("v6e-256") == (H.chip("v6e"), 256)
    assert H.topology("v5p-8")[1] == 4  # v5p names count TensorCores: 2x2x1 = 8 cores = 4 chips
    with pytest.raises(ValueError, match="unknown topology 'v7-8'"):
        H.topology("v7-8")


def test_roofline_arithmetic():
    c = H.chip("v6e")
    r = H.roofline(918e12, 400e9, c)  # 1 s of compute, 400 GB at 400 GB/s egress = 1 s
    assert r.compute_s == 1.0 and r.comm_s == 1.0 and r.step_s == 1.0 and r.comm_compute_ratio == 1.0
    r2 = H.roofline(918e12, 800e9, c)
    assert r2.bound == "communication" and r2.step_s == 2.0 and r2.step_no_overlap_s == 3.0


def test_hardware_dir_override(tmp_path, monkeypatch):
    import json
    import shutil

    for f in H.HARDWARE_DIR.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    d = json.loads((tmp_path / "v5e.json").read_text())
    d["name"] = "v5e-copy"
    (tmp_path / "v5e.json").write_text(json.dumps(d))
    monkeypatch.setenv("SHARDLAB_HARDWARE_DIR", str(tmp_path))
    H.chips.cache_clear()
    try:
        assert "v5e-copy" in H.chips()
    finally:
        monkeypatch.delenv("SHARDLAB_HARDWARE_DIR")
        H.chips.cache_clear()
    assert "v5e" in H.chips()
