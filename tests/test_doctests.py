"""Every docstring example in lib/shardlab runs as a doctest (``>>>`` lines; ``Example::`` blocks without
prompts are prose and are not run).

The process-wide 8-device XLA world is already set up (conftest), so examples that touch ``runtime`` run as
they would in a notebook. A module whose examples cannot run as written is listed in SKIP with the reason.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import shardlab

SKIP: dict[str, str] = {}  # module -> why its examples cannot run as written (none today)
MODULES = sorted(m.name for m in pkgutil.walk_packages(shardlab.__path__, "shardlab."))


def test_every_module_is_collected() -> None:
    assert "shardlab.formulas.fsdp" in MODULES and "shardlab.tp.cross_entropy" in MODULES
    assert set(SKIP) <= set(MODULES), sorted(set(SKIP) - set(MODULES))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, xla_world) -> None:  # type: ignore[no-untyped-def]
    if name in SKIP:
        pytest.skip(SKIP[name])
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in finder.find(module):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
