"""Colab / Kaggle links for the notebooks: the README's "Open in Colab" / "Open in Kaggle" badge table.

Design note
-----------
Both services open a notebook straight from a public GitHub repository:

* Colab: ``https://colab.research.google.com/github/<owner>/<repo>/blob/<branch>/<path>``
* Kaggle: ``https://kaggle.com/kernels/welcome?src=https://github.com/<owner>/<repo>/blob/<branch>/<path>``

The notebooks' own setup cell (``tools/hosted_setup_cell.py``) then installs the pinned stack. Free Colab
offers one TPU chip (run with ``num_devices=1``); Kaggle's TPU v5e-8 is the free multi-chip option
(``num_devices=8``). ``python -m shardlab badges --repo OWNER/NAME`` prints the table.

    >>> badge_table(["01_block_matrices"], "me/shardlab").splitlines()[2].startswith("| 01_block_matrices |")
    True
"""

from __future__ import annotations

from collections.abc import Iterable

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"


def colab_url(repo: str, path: str, branch: str = "main") -> str:
    return f"https://colab.research.google.com/github/{repo}/blob/{branch}/{path}"


def kaggle_url(repo: str, path: str, branch: str = "main") -> str:
    return f"https://kaggle.com/kernels/welcome?src=https://github.com/{repo}/blob/{branch}/{path}"


def badge_table(stems: Iterable[str], repo: str, branch: str = "main") -> str:
    """A Markdown table: one row per notebook with its Colab and Kaggle badges."""
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"repo={repo!r} must be 'owner/name' of the public GitHub repository")
    rows = ["| notebook | Colab | Kaggle |", "|---|---|---|"]
    for stem in stems:
        path = f"notebooks/{stem}.ipynb"
        rows.append(f"| {stem} | [![Open in Colab]({COLAB_BADGE})]({colab_url(repo, path, branch)}) "
                    f"| [![Open in Kaggle]({KAGGLE_BADGE})]({kaggle_url(repo, path, branch)}) |")
    return "\n".join(rows)
