"""Cached full-size results: one JSON file of named results plus how they were measured.

Design note: the full-size compiles of notebooks 06 and 07 take minutes, so their results are committed under
``data/scale/`` and the notebooks read them unless asked to compile live. A file is
``{"_source": {how, where, when}, "results": {name: result.as_dict()}}``; the caller passes its own result type's
``from_dict``. A missing file is an error that says how to produce it.

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.json"
    >>> class R(dict):
    ...     def as_dict(self): return dict(self)
    >>> save_results({"a": R(x=1)}, p, command="doctest")
    >>> load_results(p, dict, "run the doctest")
    ({'a': {'x': 1}}, {'command': 'doctest'})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def save_results(results: Mapping[str, Any], path: Path, **source: Any) -> None:
    """Write ``{name: result.as_dict()}`` and ``source`` (how and where it was measured) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"_source": source, "results": {k: r.as_dict() for k, r in results.items()}}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def load_results(path: Path, from_dict: Callable[[dict[str, Any]], T],
                 how_to_make: str) -> tuple[dict[str, T], dict[str, Any]]:
    """The results in ``path`` (each through ``from_dict``) and their ``_source``; a missing file raises
    ``FileNotFoundError`` saying ``how_to_make`` it."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {how_to_make}")
    data = json.loads(path.read_text())
    return {k: from_dict(v) for k, v in data["results"].items()}, data.get("_source", {})
