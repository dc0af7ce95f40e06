"""Hardware profiles (data/hardware/*.json) and the roofline.

Oracle for the profiles: each JSON carries the public document's own wording ("values"); the numeric
fields must be the numbers quoted there (guards against typos when the table was transcribed).
"""

import os
import subprocess
import sys

import pytest

from shardlab.formulas import hardware as H

# What the XLA:TPU compiler reports as one chip's usable HBM, per chip and topology: a compile-only probe whose
# arguments cannot fit fails with "Ran out of memory in memory space hbm. Used 120.00G of 31.25G hbm".
_PROBE = """
import re, jax, jax.numpy as jnp
from jax.experimental import topologies
topo = topologies.get_topology_desc({topology!r}, "tpu", **{bounds!r})
sh = jax.sharding.SingleDeviceSharding(topo.devices[0])
big = jax.ShapeDtypeStruct((120 * 2**30 // 4,), jnp.float32, sharding=sh)  # 120 GiB: larger than any chip
try:
    jax.jit(lambda x: x * 2).lower(big).compile()
except Exception as e:
    print(re.search(r"Used [\\d.]+G of ([\\d.]+G) hbm", str(e)).group(1))
"""
# libtpu's own slice names (generation:shape): the probe asks JAX directly, not the suite
_TOPOLOGIES = {"v5e": ("v5e:1x1", {"chips_per_host_bounds": (1, 1, 1)}),
               "v6e": ("v6e:1x1", {"chips_per_host_bounds": (1, 1, 1)}), "v5p": ("v5p:2x2x1", {}),
               "v4": ("v4:2x2x1", {"chip_config_name": "megacore"})}  # v4: one device per chip, as the suite


@pytest.mark.parametrize(
    "name,tflops,hbm_gb,ici_gbps",
    [("v5e", 197, 16, 400), ("v6e", 918, 32, 800), ("v5p", 459, 95, 1200)],
)
def test_profiles_match_quoted_source(name, tflops, hbm_gb, ici_gbps):
    c = H.chip(name)
    quoted = " ".join(s["values"] for s in c.sources)
    assert f"{tflops} TFLOPs" in quoted and f"{hbm_gb} GB" in quoted and f"{ici_gbps} GBps" in quoted
    assert c.bf16_peak_flops_per_s == tflops * 1e12
    assert c.hbm_bytes == hbm_gb * 2**30  # the published GB read as GiB (see the usable-capacity test)
    assert c.ici_bandwidth_bytes_per_s == ici_gbps * 1e9
    assert all(s["url"].startswith("https://") for s in c.sources)


def test_published_gb_are_gib_because_the_compiler_allows_more_than_gb():
    for name in ("v5e", "v6e"):
        c = H.chip(name)
        published = int(c.sources[0]["values"].split(" GB")[0].split()[-1].rstrip(","))  # "... 32 GB ..."
        assert published * 10**9 < c.hbm_usable_bytes < c.hbm_bytes == published * 2**30


def test_v4_profile_matches_quoted_source():
    """v4's page words its table differently ("275 teraflops", "32 GiB, 1200 GBps") and gives no ICI figure."""
    c = H.chip("v4")
    quoted = " ".join(s["values"] for s in c.sources)
    assert "275 TFLOPs" in quoted and "32 GiB, 1200 GBps" in quoted and "4096 chips" in quoted
    assert c.bf16_peak_flops_per_s == 275e12 and c.hbm_bytes == 32 * 2**30 and c.hbm_bandwidth_bytes_per_s == 1200e9
    assert c.torus_dims == 3 and c.slices["v4-128"] == 64 and c.slices["v4-8"] == 4  # TensorCores: 2 per chip


@pytest.mark.parametrize("name", ["v5e", "v6e", "v5p", "v4"])
def test_usable_hbm_is_what_the_tpu_compiler_reports(name):
    """Oracle: the XLA:TPU compiler itself (compile-only, libtpu); skipped where libtpu is not installed."""
    pytest.importorskip("libtpu")
    pytest.importorskip("jax")
    topology, bounds = _TOPOLOGIES[name]
    env = {**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(topology=topology, bounds=bounds)], env=env,
                         capture_output=True, text=True, timeout=300)
    reported = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    c = H.chip(name)
    assert c.hbm_usable_bytes == round(float(reported.removesuffix("G")) * 2**30), reported
    assert reported in c.hbm_usable_as_reported


def test_topologies():
    assert H.topology("v5e-8")[1] == 8
    assert H.topology("v6e-256") == (H.chip("v6e"), 256)
    assert H.topology("v5p-8")[1] == 4  # v5p names count TensorCores: 2x2x1 = 8 cores = 4 chips
    with pytest.raises(ValueError, match="unknown topology 'v7-8'"):
        H.topology("v7-8")
    with pytest.raises(ValueError, match=r"unknown topology 'v6e:2x4' \(that is libtpu's generation:shape form"):
        H.slice_shape("v6e:2x4")  # one name inside the suite: generation-chips


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


def test_every_user_reads_hbm_from_the_profiles():
    """One fact, one place: the planner's verdicts and the scan seed case use data/hardware's usable HBM."""
    from shardlab import planner as P
    from shardlab.formulas.scan import seed_case

    v6e = H.chip("v6e")
    assert P.plan(P.PlanConfig("llama-3-8b", "v6e-8")).hbm_bytes == v6e.hbm_usable_bytes
    c = seed_case()
    assert c.hbm_usable_bytes == v6e.hbm_usable_bytes
    assert c.one_d_fraction_of_hbm == c.one_d_per_chip_bytes / v6e.hbm_usable_bytes


def test_ici_per_axis():
    """The JAX scaling book's per-axis model: a 2D torus chip has 4 links (v5e 400 GB/s bidirectional -> 100 GB/s
    per link); a ring on one axis sends over 2 links one way each = one link's bidirectional figure; on both axes
    twice that = half the published number (the all-axes egress this module always had)."""
    v5e, v5p = H.chip("v5e"), H.chip("v5p")
    assert (v5e.torus_dims, v5e.ici_links_per_chip, v5e.ici_link_bytes_per_s) == (2, 4, 100e9)
    assert v5e.ici_egress_for(1) == 100e9 and v5e.ici_egress_for(2) == v5e.ici_egress_bytes_per_s == 200e9
    assert (v5p.torus_dims, v5p.ici_egress_for(1), v5p.ici_egress_for(3)) == (3, 200e9, 600e9)
    with pytest.raises(ValueError, match=r"axes=3 must be an int in \[1, 2\]"):
        v5e.ici_egress_for(3)
    r = H.roofline(918e12, 0.0, H.chip("v6e"), comm_s=0.5, bubble_ratio=0.25)  # 1 s compute + a quarter of bubble
    assert (r.comm_s, r.bubble_s, r.step_s, r.step_no_overlap_s, r.bound) == (0.5, 0.25, 1.25, 1.75, "compute")


def test_slice_shapes_and_groups():
    # Google's published slice shapes: v5e / v6e 2x4 (8), 4x4, 8x8, 16x16; v5p 2x2x1 (v5p-8), 2x4x4 (v5p-64)
    assert [H.slice_shape(t) for t in ("v6e-1", "v6e-8", "v6e-16", "v6e-64", "v6e-256")] == \
        [(1, 1), (2, 4), (4, 4), (8, 8), (16, 16)]
    assert [H.slice_shape(t) for t in ("v5p-8", "v5p-16", "v5p-64", "v5p-256")] == \
        [(2, 2, 1), (2, 2, 2), (2, 4, 4), (4, 4, 8)]
    # row-major mesh, the last axis fastest: (data 2, fsdp 4): fsdp's group of device 0 is 0..3, data's {0, 4}
    assert H.mesh_group({"data": 2, "fsdp": 4}, ("fsdp",)) == [0, 1, 2, 3]
    assert H.mesh_group({"data": 2, "fsdp": 4}, ("data",)) == [0, 4]
    assert H.mesh_group({"data": 2, "fsdp": 2, "tensor": 2}, ("data", "tensor"), device=2) == [2, 3, 6, 7]
    assert H.group_axes("v6e-8", [0, 4]) == 1 and H.group_axes("v6e-8", [0, 1, 2, 3]) == 2
    assert H.group_axes("v6e-8", [0]) == 0


@pytest.mark.parametrize("slice_name", ["v5e-2", "v5e-8", "v5e-32", "v6e-2", "v6e-16", "v6e-64", "v6e-256", "v5p-8",
                                        "v5p-256", "v4-128"])
def test_device_coords_are_libtpus(slice_name):
    """Oracle: libtpu's own TpuDevice.coords of the compile-only topology the suite compiles for (its device
    assignment is the devices in this order)."""
    pytest.importorskip("libtpu")
    pytest.importorskip("jax")
    from shardlab.profile import tpu

    got = [tuple(d.coords)[:len(H.slice_shape(slice_name))] for d in tpu.topology_devices(slice_name)]
    assert got == H.device_coords(slice_name)
    assert H.slice_shape(slice_name) == tuple(int(d) for d in tpu.get_topology(slice_name).shape.split("x"))


def test_slice_chips_takes_compile_only_slices():
    """Generations named by chip count take any count (the compile-only v5e-2 has no rentable slice); v5p names
    count TensorCores: any even count resolves to half as many chips (v5p-2048, the compile-only 1024-chip slice)."""
    assert H.slice_chips("v5e-2")[1] == 2 and H.slice_chips("v6e-8") == H.topology("v6e-8")
    assert H.slice_chips("v5p-8")[1] == 4 and H.slice_chips("v5p-2048")[1] == 1024
    assert H.slice_chips("v4-8192")[1] == 4096
    for bad in ("v5p-1", "v5p-7", "v7x-8", "v5e-x"):
        with pytest.raises(ValueError, match="unknown topology"):
            H.slice_chips(bad)
