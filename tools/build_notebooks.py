"""Build ``notebooks/NN_name.ipynb`` from its jupytext percent-format source ``notebooks/src/NN_name.py``.

Design: the ``.py`` source is what we review and edit; the ``.ipynb`` is what learners open and papermill
runs. The builder (1) keeps the first cell, which must be a code cell tagged ``parameters`` holding plain
values (checked by ``shardlab.report.notebooks.parse_parameters``, the reader the report uses), (2) inserts
the standard Colab/Kaggle setup cell (``tools/hosted_setup_cell.py``) right after it,
(3) writes the notebook with outputs cleared and a plain ``python3`` kernelspec. ``--check`` rebuilds in
memory and fails if a committed notebook differs from its source (the test suite runs it).

Usage::

    python tools/build_notebooks.py                 # all sources
    python tools/build_notebooks.py 01_block_matrices
    python tools/build_notebooks.py --check
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import jupytext
import nbformat

from shardlab.report.notebooks import parse_parameters

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def hosted_cell_source() -> str | None:
    """Source of the Colab/Kaggle setup cell, or None while tools/hosted_setup_cell.py does not exist."""
    path = ROOT / "tools" / "hosted_setup_cell.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("hosted_setup_cell", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.CELL).strip()


def _check_parameters_cell(name: str, cell: nbformat.NotebookNode) -> None:
    if cell.cell_type != "code" or "parameters" not in cell.metadata.get("tags", []):
        raise ValueError(f"{name}: the first cell must be a code cell tagged 'parameters'")
    parse_parameters(cell.source, f"{name}: the parameters cell")  # plain `name = literal` lines, or ValueError


def build(src: Path) -> nbformat.NotebookNode:
    nb = jupytext.read(src, fmt="py:percent")
    if not nb.cells:
        raise ValueError(f"{src.name}: empty notebook source")
    _check_parameters_cell(src.stem, nb.cells[0])
    hosted = hosted_cell_source()
    if hosted:
        cell = nbformat.v4.new_code_cell(hosted, metadata={"tags": ["hosted-setup"]})
        nb.cells.insert(1, cell)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{src.stem[:2]}-{i:03d}"
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook stems (default: all sources)")
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    args = ap.parse_args(argv)
    sources = sorted(SRC.glob("*.py"))
    if args.names:
        known = {p.stem: p for p in sources}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            ap.error(f"unknown notebook source(s) {unknown}; known: {sorted(known)}")
        sources = [known[n] for n in args.names]
    stale = []
    for src in sources:
        target = OUT / f"{src.stem}.ipynb"
        text = render(build(src))
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python tools/build_notebooks.py): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
