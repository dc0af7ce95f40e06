"""A worker process that builds a graph on its own CPU device world and compiles it for a TPU topology.

Design
------
A process holds exactly one torch_xla device world (the device count is read once), but the TPU program of a
4-chip slice needs a graph whose mesh spans 4 devices. :func:`worker_for` starts (once per chip count, reused for
the life of the parent) ``python -m shardlab.profile.tpu_worker_main <chips>``: it sets up a ``<chips>``-device CPU
world, then serves requests ``(build, cfg, topology, options)``: it calls ``build(cfg)`` (an importable
module-level function, pickled by reference, that sets up its mesh on the current world and returns the output
tensors or a ``tpu.Step``) and :func:`shardlab.profile.tpu.compile_built`, and sends the :class:`TpuCompile` back.

Messages are length-prefixed pickles on a private copy of the worker's stdout (fd 1 itself is pointed at the
worker's stderr, so stray prints cannot corrupt the stream). The worker's stderr goes to a log file whose tail
is quoted when the worker fails. The worker's compile cache lives as long as the worker.

Example::

    >>> from shardlab.core.case import build_graph
    >>> from shardlab.tp.params import MlpParams
    >>> from shardlab.tp.case import MlpCase
    >>> w = worker_for(4)                      # ~5 s the first time (torch_xla import + 4-device world)
    >>> cfg = MlpCase(MlpParams(tp=4))         # a Megatron MLP step, tp = 4
    >>> w.compile(build_graph, cfg, "v5e-4", {}).count("all-reduce")   # fwd + bwd (the loss depends on out)
    2
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from shardlab.profile.tpu_store import settings as store_settings

_HEADER = struct.Struct("<Q")
_WORKERS: dict[int, Worker] = {}
_LOCK = threading.Lock()


class TpuWorkerError(RuntimeError):
    """The worker failed (its traceback or log tail is in the message)."""


def _send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("worker stream closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv_bytes(stream: IO[bytes]) -> bytes:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    return _read_exact(stream, n)


def _recv(stream: IO[bytes]) -> Any:
    return pickle.loads(_recv_bytes(stream))


class Worker:
    """One persistent worker process with a ``chips``-device CPU world."""

    def __init__(self, chips: int) -> None:
        self.chips = chips
        env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(chips), JAX_PLATFORMS="cpu",
                   ALLOW_MULTIPLE_LIBTPU_LOAD="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        # The worker imports what this process imports (worktree sources, the builder's module), and must not
        # dump into this process's HLO dump directory.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump"))
        self.log = tempfile.NamedTemporaryFile(prefix=f"shardlab-tpu-worker-{chips}-", suffix=".log", delete=False)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "shardlab.profile.tpu_worker_main", str(chips)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.lock = threading.Lock()
        self.versions = self._reply()[1]  # ("ready", versions) once the world is up
        self.start_s = time.perf_counter() - t0

    def _log_tail(self, lines: int = 30) -> str:
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def _reply(self) -> Any:
        assert self.proc.stdout is not None
        try:
            return _recv(self.proc.stdout)
        except (EOFError, pickle.UnpicklingError) as e:
            code = self.proc.poll()
            raise TpuWorkerError(f"the {self.chips}-device TPU compile worker died (exit code {code}, {e}); "
                                 f"its log {self.log.name} ends with:\n{self._log_tail()}") from None

    def compile(self, build: Any, cfg: Any, topology: str, options: dict[str, Any]) -> Any:
        if getattr(build, "__module__", "__main__") == "__main__" or "<locals>" in getattr(build, "__qualname__", ""):
            raise ValueError(f"build={getattr(build, '__qualname__', build)!r} must be a module-level function in an "
                             "importable module (not defined in a notebook, __main__ or inside a function): the "
                             "worker process imports it by name")
        assert self.proc.stdin is not None
        with self.lock:
            try:
                # this process's store mode and directory travel with each request (they may change after the
                # worker started: shardlab.profile.tpu_store)
                _send(self.proc.stdin, (build, cfg, topology, options, store_settings()))
            except BrokenPipeError:
                pass  # the reply below reports the dead worker with its log
            reply = self._reply()
        if reply[0] == "ok":
            return reply[1]
        _, kind, message, tb = reply
        raise TpuWorkerError(f"{kind} in the {self.chips}-device TPU compile worker: {message}\n{tb}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                _send(self.proc.stdin, None)
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def worker_for(chips: int) -> Worker:
    """The persistent worker with ``chips`` devices (started on first use; restarted if it died)."""
    with _LOCK:
        w = _WORKERS.get(chips)
        if w is None or w.proc.poll() is not None:
            w = _WORKERS[chips] = Worker(chips)
        return w


@atexit.register
def close_workers() -> None:
    for w in list(_WORKERS.values()):
        w.close()
    _WORKERS.clear()
