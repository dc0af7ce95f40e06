"""The worker side of ``shardlab.profile.tpu_worker``: ``python -m shardlab.profile.tpu_worker_main <chips>``.

Design: a separate module so the import graph has no cycle — the parent side (``tpu_worker``) is imported by
``shardlab.profile.tpu``, and this side imports ``tpu`` to compile. It sets up a ``<chips>``-device CPU world,
then serves length-prefixed pickled requests ``(build, cfg, topology, options, store settings)`` on stdin:
``build(cfg)`` gives the output tensors of the graph (or a ``tpu.Step``), :func:`shardlab.profile.tpu.compile_built`
compiles them (with the parent's store mode and directory, :mod:`shardlab.profile.tpu_store`), and the
:class:`TpuCompile` (or the error with its traceback) goes back on a private copy of stdout.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback

from shardlab import runtime
from shardlab.profile import tpu
from shardlab.profile.tpu_store import apply_settings as apply_store_settings
from shardlab.profile.tpu_worker import _recv_bytes, _send


def main(chips: int) -> None:
    out = os.fdopen(os.dup(1), "wb")  # private reply stream; fd 1 now shares the log with fd 2
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    runtime.setup(num_devices=chips, device="cpu", dump_hlo=False)
    _send(out, ("ready", tpu.check_backend()))
    while True:
        try:
            data = _recv_bytes(inp)
        except EOFError:
            return
        try:
            request = pickle.loads(data)  # may fail: the builder's module must import here too
            if request is None:
                return
            build, cfg, topology, options, store = request
            apply_store_settings(*store)  # the parent's store mode and directory at this request
            _send(out, ("ok", tpu.compile_built(build(cfg), topology, **options)))
        except BaseException as e:  # reported to the parent, which raises
            _send(out, ("error", type(e).__name__, str(e), traceback.format_exc()))


if __name__ == "__main__":
    main(int(sys.argv[1]))
