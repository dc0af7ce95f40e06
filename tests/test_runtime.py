"""Device-world setup: validation before any XLA work, one world per process, mesh tiling rules."""

import subprocess
import sys

import pytest

from shardlab import runtime


def test_check_mesh_shape() -> None:
    runtime.check_mesh_shape((2, 4), ("fsdp", "tensor"), 8)
    with pytest.raises(ValueError, match=r"uses 6 devices but the world has num_devices=8"):
        runtime.check_mesh_shape((3, 2), ("a", "b"), 8)
    with pytest.raises(ValueError, match="has 2 axes but 1 names"):
        runtime.check_mesh_shape((2, 4), ("a",), 8)
    with pytest.raises(ValueError, match="must be distinct"):
        runtime.check_mesh_shape((2, 4), ("a", "a"), 8)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_bad_counts_fail_before_torch_xla_import() -> None:
    code = (
        "import sys\nfrom shardlab import runtime\n"
        "for n in (0, 10_000):\n"
        "    try:\n        runtime.setup(num_devices=n)\n    except ValueError as e:\n        print(e)\n"
        "print('torch_xla' in sys.modules)\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "num_devices=0 must be >= 1"
    assert "num_devices=10000 is above what this host allows" in lines[1]
    assert lines[2] == "False"  # nothing imported torch_xla


@pytest.mark.xla
def test_world_and_restart_rule(xla_world) -> None:  # type: ignore[no-untyped-def]
    import torch_xla.runtime as xr

    assert xla_world.kind == "cpu" and xla_world.num_devices == 8 == xr.global_runtime_device_count()
    assert xla_world.versions["torch"].startswith("2.9.0") and xla_world.versions["torch_xla"].startswith("2.9.0")
    assert runtime.setup(num_devices=8) is xla_world  # idempotent
    with pytest.raises(RuntimeError, match="restart the kernel"):
        runtime.setup(num_devices=4)
    mesh = runtime.mesh((2, 4), ("fsdp", "tensor"))
    assert mesh.shape() == {"fsdp": 2, "tensor": 4}
    with pytest.raises(ValueError, match="must equal the device count"):
        runtime.mesh((4, 4), ("a", "b"))


def test_torch_xla_imported_first_is_refused() -> None:
    out = _run(
        "import os; os.environ['PJRT_DEVICE']='CPU'; os.environ['CPU_NUM_DEVICES']='2'\n"
        "import torch_xla\nfrom shardlab import runtime\n"
        "try:\n    runtime.setup(num_devices=8)\nexcept RuntimeError as e:\n    print(e)\n"
    )
    assert "torch_xla was imported before shardlab.runtime.setup()" in out.stdout, out.stderr


def test_world_hides_the_slow_optional_import_and_figures_still_render() -> None:
    """A world's process never builds rfc3987_syntax's grammars (what plotly's first figure would pull in through
    nbformat → jsonschema), and nbformat still validates and plotly still renders a figure without it."""
    out = _run(
        "import sys\nfrom shardlab import runtime\nruntime.setup(num_devices=2)\n"
        "import plotly.graph_objects as go, plotly.io as pio, nbformat\n"
        "bundle = pio.renderers['plotly_mimetype'].to_mimebundle(go.Figure(go.Bar(y=[1, 2])).to_dict())\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1')])\nnbformat.validate(nb)\n"
        "print(sorted(bundle), 'rfc3987_syntax' in sys.modules and sys.modules['rfc3987_syntax'] is not None)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['application/vnd.plotly.v1+json'] False", out.stdout
