"""The hand-written answer keys of the notebooks' exercises (``data/answers/<notebook>.json``; a registered
topic's lesson may live elsewhere: its ``Lesson.answer_key``).

A key maps an exercise number (as a string) to its reference answer, worked out from the papers and by hand,
independently of each topic's ``solutions`` module; keys starting with ``_`` are comments (``"_source"`` says how each
answer was obtained). The tests and the report inject a notebook's key as its ``answers`` parameter, and the
notebook's grader must accept every answer in it. Pure JSON: importing this module imports nothing heavy.

Example::

    >>> load_key("02_megatron_mlp")["1"]
    50331648
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardlab.core.topics import lessons

ANSWERS_DIR = Path(__file__).resolve().parents[3] / "data" / "answers"


def load_key(notebook: str) -> dict[str, Any] | None:
    """The reference answers of ``notebook`` without the comment keys, or None when it has no key."""
    registered = lessons()
    path = registered[notebook].answer_key if notebook in registered else ANSWERS_DIR / f"{notebook}.json"
    if not path.exists():
        return None
    key = json.loads(path.read_text())
    return {k: v for k, v in key.items() if not k.startswith("_")}
