"""The notebooks in a real JupyterLab, driven by headless Chromium.

What a learner sees is not what papermill sees: widgets and plotly figures are drawn by JupyterLab
extensions in the browser. This test starts JupyterLab on 127.0.0.1 with a random token in a temporary
root (copies of the notebooks, ``data/`` linked, every Jupyter runtime/settings directory inside the temp
dir), opens 01_block_matrices and one topic notebook in the system Chromium through Playwright, runs all
cells from the Run menu, and asserts on the DOM: an ipywidgets control and a plotly figure are rendered,
every code cell has finished, and the saved notebook holds no error output. Screenshots go to
``artifacts/jupyterlab/`` (``SHARDLAB_ARTIFACTS`` overrides). Everything started here is stopped by pid.

Needs ``/usr/bin/chromium`` (Debian package ``chromium``) and the ``playwright`` python package; no
``playwright install`` (we never download a browser). Marked ``jupyterlab`` and ``slow``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
TOPIC_CANDIDATES = ("02_megatron_mlp", "04_vocab_parallel_embedding_ce", "05_fsdp_flat_params", "03_megatron_attention",
                    "07_planner", "06_scan_shard_as")
RUN_TIMEOUT_S = 600            # one notebook's "Run All" on the loaded 2-core machine
SERVER_START_S = 90

pytestmark = [
    pytest.mark.jupyterlab,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install -y chromium)"),
]


def _topic_notebook() -> str | None:
    return next((n for n in TOPIC_CANDIDATES if (ROOT / "notebooks" / f"{n}.ipynb").exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    from shardlab.report.execute import kill_tree

    kill_tree(proc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A JupyterLab server in a temp root; yields its url, token, root and log."""
    pytest.importorskip("playwright.sync_api", reason="needs the playwright python package")
    root = tmp_path_factory.mktemp("lab")
    (root / "notebooks").mkdir()
    for nb in ("01_block_matrices", _topic_notebook()):
        if nb and (ROOT / "notebooks" / f"{nb}.ipynb").exists():
            shutil.copy(ROOT / "notebooks" / f"{nb}.ipynb", root / "notebooks")
    (root / "data").symlink_to(ROOT / "data")
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           "JUPYTER_RUNTIME_DIR": str(root / ".jupyter" / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(root / ".jupyter" / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / ".jupyter" / "workspaces"),
           "JUPYTER_CONFIG_DIR": str(root / ".jupyter" / "config")}
    env.pop("PLOTLY_RENDERER", None)
    # User settings: start the notebook's kernel without the "Select Kernel" dialog, render every cell (no
    # virtual windowing, so widgets and figures far down exist in the DOM), no news pop-up (no network).
    settings = root / ".jupyter" / "settings" / "@jupyterlab"
    tracker = {"autoStartDefaultKernel": True, "windowingMode": "none"}
    for ext, name, value in (("notebook-extension", "tracker", tracker),
                             ("apputils-extension", "notification", {"fetchNews": "false"})):
        (settings / ext).mkdir(parents=True, exist_ok=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
    log = root / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.news_url=None", "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False"]
    if os.geteuid() == 0:       # CI containers run as root; Jupyter refuses that without the flag
        cmd.append("--allow-root")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else f"not up in {SERVER_START_S} s"
                pytest.fail(f"JupyterLab {why}:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "token": token, "root": root, "log": log}
    finally:
        try:   # a clean shutdown also stops the kernels; kill the tree if it does not go
            req = urllib.request.Request(f"{url}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=10).close()
            proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill_tree(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()


def _artifacts() -> Path:
    d = Path(os.environ.get("SHARDLAB_ARTIFACTS", ROOT / "artifacts")) / "jupyterlab"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run_all_and_check(lab: dict[str, Any], browser: Any, name: str) -> None:
    shots = _artifacts()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    try:
        # a workspace of its own (no tabs restored from the other test), and every locator scoped to this panel
        page.goto(f"{lab['url']}/lab/workspaces/{name}/tree/notebooks/{name}.ipynb?reset&token={lab['token']}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=120_000)
        panel = page.locator(".jp-NotebookPanel >> visible=true").first
        page.wait_for_selector("#jp-main-statusbar :text('| Idle')", timeout=120_000)   # kernel started
        n_code = panel.locator(".jp-CodeCell").count()
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        # Finished when nothing is queued or running ([*]) twice in a row; Run All stops at an error, leaving
        # the later prompts empty, so "every prompt numbered" is the success condition checked after.
        deadline, quiet = time.monotonic() + RUN_TIMEOUT_S, 0
        while quiet < 2:
            time.sleep(3)
            prompts = [p.strip() for p in panel.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()]
            started = any(p[1:-2].isdigit() for p in prompts)
            quiet = quiet + 1 if started and not any("*" in p for p in prompts) else 0
            if time.monotonic() > deadline:
                page.screenshot(path=str(shots / f"{name}-timeout.png"), full_page=True)
                pytest.fail(f"{name}: Run All did not finish in {RUN_TIMEOUT_S} s; prompts {prompts}")
        unrun = [i for i, p in enumerate(prompts) if not p[1:-2].isdigit()]
        page.wait_for_timeout(1500)              # let widget views and plotly finish drawing
        page.screenshot(path=str(shots / f"{name}-full.png"), full_page=True)
        assert len(prompts) == n_code and not unrun, f"{name}: code cells {unrun} did not run (stopped at an error?)"
        widget = panel.locator(".jp-OutputArea-output .jupyter-widgets >> visible=true").first
        widget.wait_for(state="attached", timeout=30_000)
        widget.scroll_into_view_if_needed()
        widget.screenshot(path=str(shots / f"{name}-widget.png"))
        controls = panel.locator(", ".join(f".jp-OutputArea-output .{c}" for c in (
            "widget-dropdown", "widget-slider", "widget-inline-hbox", "widget-toggle-buttons")))
        assert controls.count() > 0, f"{name}: no ipywidgets control rendered"
        # Figures: count what is attached (cells far from the viewport may be skipped by the browser's
        # content-visibility, so "visible" is only asked of the one we scroll to and photograph).
        plots = panel.locator(".js-plotly-plot")       # JupyterLab puts the class on the output itself
        plots.first.wait_for(state="attached", timeout=30_000)
        assert panel.locator(".js-plotly-plot .main-svg").count() > 0, f"{name}: plotly figure has no SVG"
        plots.first.evaluate("e => e.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(1000)
        plots.first.screenshot(path=str(shots / f"{name}-plotly.png"))
        # save, then read what JupyterLab wrote: no error outputs anywhere
        page.keyboard.press("Control+s")
        page.wait_for_timeout(2000)
        saved = json.loads((lab["root"] / "notebooks" / f"{name}.ipynb").read_text())
        errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(saved["cells"])
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{name}: error outputs {errors}"
        assert not panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']").count()
        assert not console_errors, f"{name}: JavaScript errors {console_errors}"
    finally:
        page.close()


def test_block_matrices_in_jupyterlab(lab: dict[str, Any], browser: Any) -> None:
    if not (lab["root"] / "notebooks" / "01_block_matrices.ipynb").exists():
        pytest.skip("notebooks/01_block_matrices.ipynb not built yet")
    _run_all_and_check(lab, browser, "01_block_matrices")


def test_topic_notebook_in_jupyterlab(lab: dict[str, Any], browser: Any) -> None:
    name = _topic_notebook()
    if name is None:
        pytest.skip(f"no topic notebook yet (looked for {', '.join(TOPIC_CANDIDATES)})")
    _run_all_and_check(lab, browser, name)
