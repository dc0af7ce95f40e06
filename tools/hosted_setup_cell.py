"""The standard Colab / Kaggle setup cell that tools/build_notebooks.py inserts after every parameters cell.

Design note
-----------
On a hosted runtime nothing of shardlab is installed yet, so the cell is self-contained (standard library
only) and carries its pins as literals. They are read from requirements.txt when the notebooks are built,
so the cell can never drift from the suite's pins (a test checks that). Behaviour:

* local machine (not Colab, not Kaggle): does nothing and prints nothing;
* Colab / Kaggle: ``pip install`` the pinned torch, torch_xla (``[tpu]`` extra on a TPU runtime), jax,
  jaxlib, torchax, flax, libtpu (the XLA:TPU compiler: on a CPU runtime it still compiles for a described TPU
  slice, compile-only) and the shardlab package from ``REPO_URL`` (override with ``SHARDLAB_REPO_URL``);
* TPU runtime: ``PJRT_DEVICE=TPU`` before anything imports torch_xla.

``CELL`` is the cell text; ``hosted_kind(env, modules)`` is the same detection as a function for tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The public repository the hosted runtimes install shardlab from (pip's git+https form).
# Set this to where the repository is published; users can override it with SHARDLAB_REPO_URL at run time.
REPO_URL = "https://github.com/shardlab/shardlab"
HOSTED_PACKAGES = ("torch", "torch_xla", "jax", "jaxlib", "torchax", "flax", "libtpu", "transformers")


def pins(requirements: Path = ROOT / "requirements.txt") -> list[str]:
    """The exact pins of HOSTED_PACKAGES from requirements.txt, e.g. ``["torch==2.9.0", ...]``."""
    found: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if m and m.group(1).lower().replace("-", "_") in HOSTED_PACKAGES:
            found[m.group(1).lower().replace("-", "_")] = m.group(3)
    missing = [p for p in HOSTED_PACKAGES if p not in found]
    if missing:
        raise ValueError(f"{requirements} has no exact '==' pin for {missing}; the hosted setup cell needs them")
    return [f"{p}=={found[p]}" for p in HOSTED_PACKAGES]


def hosted_kind(env: Mapping[str, str], modules: Mapping[str, object]) -> str | None:
    """'colab', 'kaggle' or None (local) — the detection the cell performs."""
    if "google.colab" in modules or env.get("COLAB_RELEASE_TAG"):
        return "colab"
    if env.get("KAGGLE_KERNEL_RUN_TYPE") or env.get("KAGGLE_URL_BASE"):
        return "kaggle"
    return None


TEMPLATE = '''\
# Colab / Kaggle setup: installs the pinned torch / torch_xla / JAX / libtpu and shardlab. Does nothing locally.
import os, sys, glob, subprocess
_hosted = "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG") \\
    or os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE")
if _hosted:
    _tpu = bool(os.environ.get("TPU_NAME") or os.environ.get("TPU_ACCELERATOR_TYPE")
                or os.environ.get("COLAB_TPU_ADDR")
                or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    _pins = __PINS__
    if _tpu:
        _pins = [p.replace("torch_xla==", "torch_xla[tpu]==") for p in _pins]
        os.environ["PJRT_DEVICE"] = "TPU"
    _repo = os.environ.get("SHARDLAB_REPO_URL", __REPO__)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *_pins, "plotly", "ipywidgets", "pandas",
                    f"shardlab @ git+{_repo}"], check=True)
    print(f"hosted setup done: {'TPU' if _tpu else 'no TPU (CPU virtual devices)'}; pins {_pins}")
'''


def cell_source(requirements: Path = ROOT / "requirements.txt", repo_url: str = REPO_URL) -> str:
    return TEMPLATE.replace("__PINS__", repr(pins(requirements))).replace("__REPO__", repr(repo_url))


CELL = cell_source()
