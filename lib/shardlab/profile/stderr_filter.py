"""Filter what C/C++ code writes to file descriptor 2 (libtpu's missing-TPU warnings, PyTorch's deallocation
notices) or 1 (the auto-sharding solver's progress log): Python's ``sys.stderr`` / ``sys.stdout`` redirection
never sees those lines, so the descriptor itself is redirected.

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
def filtered_fd(fd: int, drop: Callable[[str], bool]) -> Iterator[None]:
    """Capture file descriptor ``fd`` (1 or 2) inside the block; afterwards re-emit (to ``sys.stdout`` /
    ``sys.stderr``) every line ``drop`` does not reject."""
    stream = sys.stdout if fd == 1 else sys.stderr
    with contextlib.suppress(Exception):
        stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines() if not drop(line)]
            if kept:
                print("\n".join(kept), file=stream)


def filtered_stderr(drop: Callable[[str], bool]) -> contextlib.AbstractContextManager[None]:
    """:func:`filtered_fd` on file descriptor 2."""
    return filtered_fd(2, drop)
