"""Find the suite's notebooks and read what each one declares as parameters.

Design note
-----------
The report and the sweeps never import a notebook; they read its JSON. A notebook is any
``notebooks/NN_name.ipynb`` (two digits, underscore, name). Its parameters are the plain assignments in the
single cell tagged ``parameters`` (design.md "Notebook parameters"); we parse that cell with ``ast`` so that
``--only`` names and ``-p name value`` pairs are checked *before* any kernel starts:

    >>> nb = find_notebooks(Path("notebooks"))["01_block_matrices"]
    >>> sorted(nb.parameters)[:3]              # names declared in the parameters cell
    ['dtype', 'k', 'm']
    >>> check_params(nb, {"tp": 4})            # raises: 'tp' is not a parameter of 01_block_matrices ...

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

NOTEBOOK_RE = re.compile(r"^(\d\d)_[A-Za-z0-9_]+$")
# Parameters every notebook must declare (design.md): the runner always passes them.
REQUIRED_PARAMETERS = ("num_devices", "results_dir")


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


def read_parameters(path: Path) -> tuple[dict[str, Any], str | None]:
    """Return ({name: default}, error) from the notebook's ``parameters`` cell.

    Defaults that are not Python literals are reported as None (the name still counts as declared).
    """
    try:
        nb = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {}, f"cannot read {path}: {exc}"
    cells = [c for c in nb.get("cells", []) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        return {}, f"{path.name} has {len(cells)} cells tagged 'parameters' (the rule is exactly one)"
    try:
        tree = ast.parse(_cell_source(cells[0]))
    except SyntaxError as exc:
        return {}, f"parameters cell of {path.name} is not valid Python: {exc}"
    params: dict[str, Any] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    params[target.id] = ast.literal_eval(value) if value is not None else None
                except ValueError:
                    params[target.id] = None
    return params, None


def find_notebooks(directory: Path) -> dict[str, NotebookInfo]:
    """All ``NN_name.ipynb`` in ``directory``, sorted by name, keyed by stem."""
    found: dict[str, NotebookInfo] = {}
    for path in sorted(Path(directory).resolve().glob("*.ipynb")):
        if NOTEBOOK_RE.match(path.stem):
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


def parse_value(text: str) -> Any:
    """Parse a command-line value the way papermill's ``-y`` does: YAML scalars and lists.

    >>> parse_value("4"), parse_value("0.5"), parse_value("bf16"), parse_value("[2, 4]")
    (4, 0.5, 'bf16', [2, 4])
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
