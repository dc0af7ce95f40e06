"""The worker process behind every execution: it runs notebooks with papermill, one at a time, in its kernel.

Design note
-----------
``python -m shardlab.report.kernel_worker`` is started by ``pool.Worker`` in the notebooks directory and lives
as long as the pool (so python, papermill and jupyter_client start once per worker, not once per notebook).
It reads one JSON command per line on stdin::

    {"src": IN.ipynb, "executed": OUT.ipynb, "params": {...}, "cwd": DIR, "log": LOG, "done": DONE.json,
     "key": KEY | null}

``key`` null asks for a fresh kernel: started for this notebook and shut down when it has finished, before
the reply (the shutdown is part of the run, as it was when each notebook had a papermill process of its own).
A key asks for the kernel of that key: kept from the previous command if it had the same key, else started
(and kept afterwards). A kernel of another key is shut down first; that time is reported as ``setup_s`` so
the pool can leave it out of the run's wall time. The reply, written atomically to ``done`` when the
notebook has finished, is ``{"ok": bool, "error": str, "setup_s": float, "kernel": KEY | null}`` (the key of
the kernel still running). ``log`` receives this run's papermill output (cell outputs included); the worker's
own stdout / stderr (the pool's ``worker-N.log``) receives what the kernel prints outside cells. A cell error
(``PapermillExecutionError``) leaves a shared kernel usable; anything else (the kernel died, papermill
failed) drops the kernel. End of stdin: shut the kernel down and exit.

papermill saves the executed notebook after every cell, so a run killed on timeout (the pool kills the
worker and its kernel by pid) still leaves everything that ran.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from shardlab.report.execute import hide_slow_modules

# papermill waits 60 s for a kernel by default; two 8-device kernels starting at once on 2 busy cores took
# longer ("Kernel didn't respond in 60 seconds" in a sweep point), so give them more room.
KERNEL_START_TIMEOUT_S = 300


def _report(done: Path, reply: dict[str, Any]) -> None:
    tmp = done.with_name(done.name + ".tmp")
    tmp.write_text(json.dumps(reply))
    tmp.replace(done)


def _kernel_manager(kernel_name: str) -> Any:
    """A kernel manager that remembers the clients papermill makes, so each run's client can be closed."""
    from jupyter_client.manager import AsyncKernelManager

    class SharedKernelManager(AsyncKernelManager):  # type: ignore[misc]
        def client(self, **kwargs: Any) -> Any:
            kc = super().client(**kwargs)
            self.__dict__.setdefault("_clients", []).append(kc)
            return kc

        def close_clients(self) -> None:
            for kc in self.__dict__.pop("_clients", []):
                kc.stop_channels()

    return SharedKernelManager(kernel_name=kernel_name)


def run_one(cmd: dict[str, Any], km: Any) -> tuple[bool, str, bool]:
    """Execute one command in the kernel of ``km`` -> (ok, error text, kernel still usable)."""
    import papermill as pm

    root = logging.getLogger()
    handler = logging.FileHandler(cmd["log"], mode="w")      # this run's output to its own log
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved, root.handlers = root.handlers, [handler]
    try:
        pm.execute_notebook(cmd["src"], cmd["executed"], parameters=cmd["params"], cwd=cmd["cwd"],
                            progress_bar=False, log_output=True, start_timeout=KERNEL_START_TIMEOUT_S, km=km)
        return True, "", True
    except pm.PapermillExecutionError as exc:        # a cell raised: the kernel itself is fine
        return False, f"{exc.ename}: {exc.evalue}", True
    except Exception:  # noqa: BLE001 - the kernel died or papermill failed: report it, drop the kernel
        return False, traceback.format_exc(), False
    finally:
        km.close_clients()
        root.handlers = saved
        handler.close()


class Kernels:
    """The worker's one kernel (or none) and the key it was started for."""

    def __init__(self) -> None:
        self.km: Any = None
        self.key: str | None = None

    def drop(self) -> float:
        """Shut the kernel down politely (its atexit handlers run: runtime.setup's HLO dump directory is
        removed), killed after jupyter_client's grace period; returns the seconds it took."""
        from jupyter_core.utils import run_sync

        started = time.monotonic()
        if self.km is not None and self.km.has_kernel:
            try:
                run_sync(self.km.shutdown_kernel)(now=False)
            except Exception:  # noqa: BLE001 - the pool kills what is left by pid
                pass
        self.km, self.key = None, None
        return time.monotonic() - started

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        want = cmd.get("key")
        setup_s = self.drop() if self.km is not None and (want is None or want != self.key) else 0.0
        if self.km is None:
            nb = json.loads(Path(cmd["src"]).read_text())
            self.km = _kernel_manager(nb.get("metadata", {}).get("kernelspec", {}).get("name") or "python3")
            self.key = want                                   # papermill starts the kernel in cmd["cwd"]
        ok, error, usable = run_one(cmd, self.km)
        if want is None or not usable:
            self.drop()
        return {"ok": ok, "error": error, "setup_s": setup_s, "kernel": self.key}


def main() -> int:
    hide_slow_modules()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    kernels = Kernels()
    try:
        for line in sys.stdin:
            if line.strip():
                cmd = json.loads(line)
                _report(Path(cmd["done"]), kernels.run(cmd))
    finally:
        kernels.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
