"""Build ``notebooks/NN_name.ipynb`` from its jupytext percent-format source ``notebooks/src/NN_name.py``.

Design: the ``.py`` source is what we review and edit; the ``.ipynb`` is what learners open and papermill
runs. The builder (1) writes the first cell, the code cell tagged ``parameters``, from the notebook's parameter
dataclass (``NotebookParams.parameters_cell``: the dataclass is the one declaration of every parameter, its
default and its comment) into the source and the notebook, (2) inserts
the standard Colab/Kaggle setup cell (``tools/hosted_setup_cell.py``) right after it,
(3) writes the notebook with outputs cleared and a plain ``python3`` kernelspec. ``--check`` rebuilds in
memory and fails if a committed notebook differs from its source, or a parameters cell from its dataclass (the
test suite runs it).

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

from shardlab.core.topics import notebook_params
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


PARAMETERS_HEADER = '# %% tags=["parameters"]'


def with_parameters(text: str, stem: str) -> str:
    """The source ``text`` with its parameters cell (the first ``# %%`` cell, tagged) generated from the
    notebook's dataclass."""
    params = notebook_params()
    if stem not in params:
        raise ValueError(f"{stem}: no topic registers a parameter dataclass with NOTEBOOK={stem!r} "
                         "(a Lesson in some shardlab/<topic>/topic.py)")
    if not text.startswith(PARAMETERS_HEADER + "\n"):
        raise ValueError(f"{stem}: the source must start with the line {PARAMETERS_HEADER}")
    rest = text[len(PARAMETERS_HEADER) + 1:]
    end = rest.find("\n# %%")
    rest = rest[end + 1:] if end >= 0 else ""
    return f"{PARAMETERS_HEADER}\n{params[stem].parameters_cell()}\n\n{rest}"


def build(src: Path, text: str | None = None) -> nbformat.NotebookNode:
    nb = jupytext.reads(text if text is not None else src.read_text(), fmt="py:percent")
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
        source = src.read_text()
        generated = with_parameters(source, src.stem)
        text = render(build(src, generated))
        if args.check:
            if generated != source:
                stale.append(f"{src.relative_to(ROOT)} (its parameters cell differs from its dataclass)")
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            if generated != source:
                src.write_text(generated)
                print(f"wrote the parameters cell of {src.relative_to(ROOT)}")
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python tools/build_notebooks.py): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
