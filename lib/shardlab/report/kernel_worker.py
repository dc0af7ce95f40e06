"""The worker process behind every execution: one Jupyter kernel that runs one or more notebooks in turn.

Design note
-----------
``python -m shardlab.report.kernel_worker`` is started by ``pool.Worker`` in the notebooks directory. It reads
one JSON command per line on stdin::

    {"src": IN.ipynb, "executed": OUT.ipynb, "params": {...}, "cwd": DIR, "log": LOG | null, "done": DONE.json}

executes it with papermill in its kernel (started on the first command, kept for the next ones), and
writes ``{"ok": bool, "error": str}`` to ``done`` (atomically) when the notebook has finished. ``log`` is the
file for this run's papermill output (cell outputs included); null when the worker's own stderr already is
that file (a worker that runs a single notebook). A cell error (``PapermillExecutionError``) leaves the
kernel usable; anything else (the kernel died, papermill failed) ends the worker after reporting it.
End of stdin: shut the kernel down and exit.

papermill saves the executed notebook after every cell, so a run killed on timeout (the pool kills the
worker and its kernel by pid) still leaves everything that ran.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from shardlab.report.execute import hide_slow_modules

# papermill waits 60 s for a kernel by default; two 8-device kernels starting at once on 2 busy cores took
# longer ("Kernel didn't respond in 60 seconds" in a sweep point), so give them more room.
KERNEL_START_TIMEOUT_S = 300


def _report(done: Path, ok: bool, error: str = "") -> None:
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps({"ok": ok, "error": error}))
    tmp.replace(done)


def _kernel_manager(kernel_name: str) -> Any:
    """A kernel manager that remembers the clients papermill makes, so each run's client can be closed."""
    from jupyter_client.manager import AsyncKernelManager

    class SharedKernelManager(AsyncKernelManager):  # type: ignore[misc]
        clients: list[Any] = []

        def client(self, **kwargs: Any) -> Any:
            kc = super().client(**kwargs)
            self.clients.append(kc)
            return kc

        def close_clients(self) -> None:
            for kc in self.clients:
                kc.stop_channels()
            self.clients.clear()

    return SharedKernelManager(kernel_name=kernel_name)


def run_one(cmd: dict[str, Any], km: Any) -> tuple[bool, str, bool]:
    """Execute one command in the kernel of ``km`` -> (ok, error text, kernel still usable)."""
    import papermill as pm

    root, handler, saved = logging.getLogger(), None, None
    if cmd.get("log"):                                # this run's output to its own log, not the kernel's
        handler = logging.FileHandler(cmd["log"], mode="w")
        handler.setFormatter(logging.Formatter("%(message)s"))
        saved, root.handlers = root.handlers, [handler]
    try:
        pm.execute_notebook(cmd["src"], cmd["executed"], parameters=cmd["params"], cwd=cmd["cwd"],
                            progress_bar=False, log_output=True, start_timeout=KERNEL_START_TIMEOUT_S, km=km)
        return True, "", True
    except pm.PapermillExecutionError as exc:        # a cell raised: the kernel itself is fine
        return False, f"{exc.ename}: {exc.evalue}", True
    except Exception:  # noqa: BLE001 - the kernel died or papermill failed: report it, then stop
        return False, traceback.format_exc(), False
    finally:
        km.close_clients()
        if handler is not None:
            root.handlers = saved or []
            handler.close()


def main() -> int:
    hide_slow_modules()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from jupyter_core.utils import run_sync

    km: Any = None
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if km is None:
                nb = json.loads(Path(cmd["src"]).read_text())
                name = nb.get("metadata", {}).get("kernelspec", {}).get("name") or "python3"
                km = _kernel_manager(name)                      # papermill starts it in cmd["cwd"]
            ok, error, usable = run_one(cmd, km)
            _report(Path(cmd["done"]), ok, error)
            if not usable:
                return 1
    finally:
        if km is not None and km.has_kernel:
            try:
                run_sync(km.shutdown_kernel)(now=True)
            except Exception:  # noqa: BLE001 - the pool kills what is left by pid
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
