"""Find the suite's notebooks and read what each one declares as parameters.

Design note
-----------
The report and the sweeps never import a notebook; they read its JSON. A notebook is any
``notebooks/NN_name.ipynb`` (two digits, an optional letter as in ``05b``, underscore, name). Its parameters are
the plain assignments in the single cell tagged ``parameters`` (one ``name = literal`` per statement, nothing
else: papermill injects its values after that cell). :func:`parse_parameters` is the one reader of such a
cell — the report, the notebook builder (``tools/build_notebooks.py``) and the tests all call it — so that
``--only`` names and ``-p name value`` pairs are checked *before* any kernel starts:

    >>> nb = find_notebooks(Path(__file__).parents[3] / "notebooks")["01_block_matrices"]
    >>> sorted(nb.parameters)[:3]              # names declared in the parameters cell
    ['answers', 'dtype', 'k']
    >>> check_params(nb, {"tp": 4})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    shardlab.report.notebooks.ReportInputError: parameter 'tp' is not declared by 01_block_matrices (its ...

Errors are :class:`ReportInputError` (the CLI turns them into exit status 2 with the message).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shardlab.core.topics import lessons

NOTEBOOK_RE = re.compile(r"^(\d\d[a-z]?)_[A-Za-z0-9_]+$")  # 05_..., 05b_...
# Parameters every notebook must declare: the runner always passes them, from its own options. A `-p` for
# one of them would be overwritten without a word, so it is refused, naming the option that sets it.
REQUIRED_PARAMETERS = ("num_devices", "results_dir")
RUNNER_OWNED = {"num_devices": "--num-devices", "results_dir": "--out", "full_size": "--full-size",
                "generation": "--tpu-generation"}


class ReportInputError(ValueError):
    """Bad input to the report or sweep commands (unknown notebook, undeclared parameter, ...)."""


@dataclass(frozen=True)
class NotebookInfo:
    stem: str                      # "02_megatron_mlp"
    path: Path                     # notebooks/02_megatron_mlp.ipynb
    parameters: dict[str, Any] = field(default_factory=dict)  # name -> default (None when not a literal)
    parameters_error: str | None = None   # why the parameters cell could not be read, if it could not

    @property
    def sha256(self) -> str:
        """Hash of the notebook file: a sweep point computed from another version is stale."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _cell_source(cell: Mapping[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def parse_parameters(source: str, where: str = "parameters cell") -> dict[str, Any]:
    """``{name: value}`` of a parameters cell: ``name = literal`` (or ``name: type = literal``) statements only.

    Raises ValueError naming ``where`` and the line for anything else (a call, an import, a non-literal value,
    a tuple target):

    >>> parse_parameters("tp = 4  # degree\\ndtype = 'bf16'\\nsizes = [8, 16]")
    {'tp': 4, 'dtype': 'bf16', 'sizes': [8, 16]}
    >>> parse_parameters("tp = 2 * 2")
    Traceback (most recent call last):
    ValueError: parameters cell line 1: 'tp' must be a plain literal (papermill injects plain values), got 2 * 2
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{where} is not valid Python: {exc}") from exc
    params: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            raise ValueError(f"{where} line {node.lineno}: only `name = literal` assignments are allowed, got "
                             f"{ast.get_source_segment(source, node)!r}")
        if not isinstance(target, ast.Name):
            raise ValueError(f"{where} line {node.lineno}: assign to one plain name, got "
                             f"{ast.get_source_segment(source, target)}")
        try:
            params[target.id] = ast.literal_eval(value)
        except ValueError as exc:
            raise ValueError(f"{where} line {node.lineno}: {target.id!r} must be a plain literal (papermill "
                             f"injects plain values), got {ast.get_source_segment(source, value)}") from exc
    return params


def read_parameters(path: Path) -> tuple[dict[str, Any], str | None]:
    """Return ({name: default}, error) from the notebook's ``parameters`` cell (see :func:`parse_parameters`)."""
    try:
        nb = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {}, f"cannot read {path}: {exc}"
    cells = [c for c in nb.get("cells", []) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        return {}, f"{path.name} has {len(cells)} cells tagged 'parameters' (the rule is exactly one)"
    try:
        return parse_parameters(_cell_source(cells[0]), f"parameters cell of {path.name}"), None
    except ValueError as exc:
        return {}, str(exc)


def find_notebooks(directory: Path | None = None) -> dict[str, NotebookInfo]:
    """The registered topics' notebooks (:func:`shardlab.core.topics.lessons`), or with ``directory`` every
    ``NN_name.ipynb`` in it; sorted by name, keyed by stem."""
    if directory is None:
        paths = [lesson.notebook for lesson in lessons().values()]
    else:
        paths = [p for p in sorted(Path(directory).resolve().glob("*.ipynb")) if NOTEBOOK_RE.match(p.stem)]
    found: dict[str, NotebookInfo] = {}
    for path in paths:
        params, err = read_parameters(path)
        found[path.stem] = NotebookInfo(path.stem, path, params, err)
    return found


def resolve_name(name: str, notebooks: Mapping[str, NotebookInfo]) -> NotebookInfo:
    """Accept ``02_megatron_mlp``, ``02_megatron_mlp.ipynb``, a path to it, or the bare number ``02``."""
    stem = Path(name).name.removesuffix(".ipynb")
    if stem in notebooks:
        return notebooks[stem]
    by_number = [nb for s, nb in notebooks.items() if s.split("_", 1)[0] == stem]
    if len(by_number) == 1:
        return by_number[0]
    by_suffix = [nb for s, nb in notebooks.items() if s.split("_", 1)[-1] == stem]
    if len(by_suffix) == 1:
        return by_suffix[0]
    known = ", ".join(notebooks) or "(none found)"
    raise ReportInputError(f"unknown notebook {name!r}; known notebooks: {known}")


def select(names: Iterable[str] | None, notebooks: Mapping[str, NotebookInfo]) -> list[NotebookInfo]:
    """The notebooks named by ``--only`` (all when None), in suite order, each at most once."""
    if not names:
        return list(notebooks.values())
    chosen = {resolve_name(n, notebooks).stem for n in names}
    return [nb for s, nb in notebooks.items() if s in chosen]


def check_params(nb: NotebookInfo, params: Mapping[str, Any]) -> None:
    """Raise ReportInputError if ``params`` names anything the parameters cell does not declare."""
    if nb.parameters_error:
        raise ReportInputError(nb.parameters_error)
    unknown = [p for p in params if p not in nb.parameters]
    if unknown:
        declared = ", ".join(nb.parameters)
        raise ReportInputError(
            f"parameter {unknown[0]!r} is not declared by {nb.stem} (its parameters cell declares: {declared})"
        )


def check_runner_owned(params: Mapping[str, Any], command: str = "report") -> None:
    """Refuse ``-p`` values for parameters the runner sets itself (they would be silently replaced).

    >>> check_runner_owned({"num_devices": 0})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    shardlab.report.notebooks.ReportInputError: -p num_devices 0: ... set by the report itself, from --num-devices ...
    """
    for name, value in params.items():
        option = RUNNER_OWNED.get(name)
        if option is None or (command == "sweep" and name in ("full_size", "generation")):
            continue  # a sweep may sweep those like any parameter
        shown = " ".join(str(v) for v in value) if isinstance(value, list) and command == "sweep" else value
        why = {"results_dir": f"the records go to <--out>/{'points/<point>/' if command == 'sweep' else ''}records",
               "full_size": "it also selects the <profile>-full baselines and a longer timeout",
               "generation": "every notebook's TPU view compiles for one generation, compared with its baseline"}
        how = ("--num-devices N [N ...] runs (or sweeps) device counts" if command == "sweep" else f"use {option}")
        raise ReportInputError(f"-p {name} {shown}: {name} is set by the {command} itself, from {option} "
                               f"({why.get(name, f'it passes {option} to every notebook, replacing any -p value')}); "
                               f"{how if name == 'num_devices' else 'use ' + option}")


def parse_value(text: str) -> Any:
    """Parse a command-line value the way papermill's ``-y`` does: YAML scalars and lists.

    >>> parse_value("4"), parse_value("0.5"), parse_value("bf16"), parse_value("[2, 4]")
    (4, 0.5, 'bf16', [2, 4])
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
