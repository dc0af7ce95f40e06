"""Filter what C/C++ code writes to file descriptor 2 (libtpu's missing-TPU warnings, PyTorch's deallocation
notices): Python's ``sys.stderr`` redirection never sees those lines, so the descriptor itself is redirected.

Example::

    >>> with filtered_stderr(lambda line: "harmless" in line):
    ...     pass          # a library writing "harmless ..." to fd 2 here prints nothing; any other line comes back
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def filtered_stderr(drop: Callable[[str], bool]) -> Iterator[None]:
    """Capture file descriptor 2 inside the block; afterwards re-emit (to ``sys.stderr``) every line ``drop``
    does not reject."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines() if not drop(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)
