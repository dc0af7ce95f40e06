"""The topic registry (``core.topics``): every registered topic is complete, every notebook is registered, and a
new topic in a folder of its own is picked up by the parameters check, the exercises and the report with no edit
to any shared file.

Oracles: the files on disk (the notebooks, sources, answer keys, tests and baselines are globbed and read here, not
asked of the registry), and for the throwaway topic what its own notebook recorded when the report ran it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from report_fakes import fake_notebook

from shardlab.core import topics
from shardlab.report.notebooks import read_parameters

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ("cpu-8", "tpu-v5e-8-aot")


def missing_files(lesson: topics.Lesson) -> list[str]:
    """What a lesson lacks on disk: its notebook, source, answer key, test file."""
    return [str(p) for p in (lesson.notebook, lesson.source, lesson.answer_key, lesson.test) if not p.exists()]


def test_every_registered_topic_is_complete() -> None:
    registered = topics.topics()
    assert len(registered) >= 11 and "tp" in {t.name for t in registered}  # the registry is really read
    for topic in registered:
        assert (ROOT / "lib" / "shardlab" / topic.name / "topic.py").exists(), topic.name
        for lesson in topic.lessons:
            assert missing_files(lesson) == [], lesson.stem
            declared, err = read_parameters(lesson.notebook)
            assert err is None and set(declared) == {f for f in lesson.params.defaults()}, lesson.stem
            key = json.loads(lesson.answer_key.read_text())
            numbers = {int(k) for k in key if not k.startswith("_")}
            assert numbers and numbers <= set(topics.solutions(lesson.stem)), f"{lesson.stem}: key {numbers}"
            for profile in BASELINES:  # every notebook has an entry in both; structural rows on CPU (05 has no
                rows = json.loads((ROOT / "data" / "baselines" / f"{profile}.json").read_text())["notebooks"]
                assert lesson.stem in rows, f"{lesson.stem}: not in the {profile} baseline"  # TPU view)
                assert profile != "cpu-8" or rows[lesson.stem].get("structural"), f"{lesson.stem}: no {profile} rows"


def test_every_notebook_is_registered_once() -> None:
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]*.ipynb"))
    sources = sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]*.py"))
    assert on_disk == sources == sorted(topics.lessons())


def test_no_shared_file_names_a_notebook() -> None:
    """The five registries the topics replaced are gone: no shared module spells a notebook's name."""
    shared = [*(ROOT / "lib" / "shardlab" / "core").glob("*.py"), *(ROOT / "lib" / "shardlab" / "report").glob("*.py")]
    stems = set(topics.lessons())
    for path in shared:
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
                and n.body and isinstance(n.body[0], ast.Expr)}  # docstrings may show an example
        named = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in stems
                 and id(n) not in docs]
        assert named == [], f"{path.name} names {named}"
    assert importlib.util.find_spec("shardlab.solutions") is None


def test_bad_entries_are_refused() -> None:
    from shardlab.core.params import NotebookParams

    with pytest.raises(ValueError, match="not a NotebookParams subclass"):
        topics.Topic("x", "", (topics.Lesson(NotebookParams),))
    from shardlab.tp.params import MlpParams

    with pytest.raises(ValueError, match="reads notebook '99_other'"):
        topics.Topic("x", "", (topics.Lesson(MlpParams, charts=(topics.ChartSpec("t", "99_other", "x", "y"),)),))
    with pytest.raises(KeyError, match="no topic registers notebook '99_nope'"):
        topics.lesson("99_nope")


# ---------------------------------------------------------------------------------------- a throwaway topic
PARAMS = '''
from dataclasses import dataclass
from typing import ClassVar

from shardlab.core.params import NotebookParams, positive_int


@dataclass(frozen=True)
class ThrowawayParams(NotebookParams):
    NOTEBOOK: ClassVar[str] = "99_throwaway"

    size: int = 4  # elements per rank
    fail: bool = False  # make the notebook raise
    drift: int = 0  # added to the hlo bytes
    sleep: float = 0  # seconds to sleep

    def checks(self) -> None:
        positive_int("size", self.size)
'''
SOLUTIONS = '''
from shardlab.core.topics import Solution

SOLUTIONS = {"99_throwaway": {1: Solution(lambda size=None: 4 * size, "four bytes per element")}}
'''
EXPLORERS = '''
from shardlab.core.explorer import Explorer, Shown, Slider

EXPLORERS = {"99_throwaway": Explorer({"size": Slider(1, 64)}, lambda p, v: {"bytes": 4 * p.size},
                                      lambda res, v: Shown(True, f"{res['bytes']} B"), fields=True)}
'''
TOPIC = '''
from pathlib import Path

from shardlab.throwaway.params import ThrowawayParams
from shardlab.core.topics import ChartSpec, Lesson, Topic

TOPIC = Topic("throwaway", "a topic that exists for one test", (
    Lesson(ThrowawayParams, charts=(ChartSpec("throwaway curve", "99_throwaway", r"fake\\.curve\\.x(?P<x>\\d+)\\.bytes",
                                              "bytes"),),
           root=Path(__file__).resolve().parents[2] / "root"),
))
'''
BODY = '''\
from shardlab.core import topics
from shardlab.core.exercises import Exercises
from shardlab.profile.record import Recorder

p = topics.lesson(NAME).params.from_namespace(globals())
rec = Recorder.for_params(p)
rec.measure("fake.curve.x1.bytes", p.size, "B", "formula")
rec.measure("fake.curve.x2.bytes", 2 * p.size, "B", "formula")
print(Exercises(p.NOTEBOOK, rec, p.answers).grade(1, None, size=p.size))
rec.close()
'''


@pytest.fixture
def throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A topic folder ``throwaway`` outside the repository (registered through SHARDLAB_TOPIC_DIRS), with its
    notebook, source, answer key and test file under a root of its own."""
    pkg = tmp_path / "topics" / "throwaway"
    pkg.mkdir(parents=True)
    for name, text in (("__init__", ""), ("params", PARAMS), ("solutions", SOLUTIONS), ("explorers", EXPLORERS),
                       ("topic", TOPIC)):
        (pkg / f"{name}.py").write_text(text)
    root = tmp_path / "root"
    (root / "data" / "answers").mkdir(parents=True)
    (root / "data" / "answers" / "99_throwaway.json").write_text(json.dumps({"_source": "4 B × 4", "1": 16}))
    (root / "tests").mkdir()
    (root / "tests" / "test_nb_99_throwaway.py").write_text("")
    monkeypatch.setenv(topics.ENV_DIRS, str(tmp_path / "topics"))
    import shardlab

    path = list(shardlab.__path__)
    yield root
    shardlab.__path__[:] = path
    for name in [m for m in sys.modules if m.startswith("shardlab.throwaway")]:
        del sys.modules[name]


@pytest.mark.notebook
def test_a_new_topic_needs_no_shared_edit(throwaway: Path, tmp_path: Path) -> None:
    from shardlab.__main__ import main

    lesson = topics.lesson("99_throwaway")
    assert lesson.root == throwaway and "99_throwaway" in topics.notebook_params()
    # the parameters check: the notebook's parameters cell is generated from the registered dataclass
    builder = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tools" / "build_notebooks.py")
    build = importlib.util.module_from_spec(builder)
    builder.loader.exec_module(build)  # type: ignore[union-attr]
    source = build.with_parameters('# %% tags=["parameters"]\n\n# %%\n' + BODY.replace("NAME", '"99_throwaway"'),
                                   "99_throwaway")
    lesson.source.parent.mkdir(parents=True)
    lesson.source.write_text(source)
    fake_notebook(lesson.notebook.parent, "99_throwaway", declare_required=False, body=BODY,
                  extra_params="num_devices = 8\nresults_dir = None\nseed = 0\nanswers = None\n")
    declared, err = read_parameters(lesson.notebook)
    assert err is None and declared == lesson.params.defaults()
    assert missing_files(lesson) == []
    # the exercises: the topic's own solutions grade its own answer key
    from shardlab.core.exercises import Exercises, load_key

    assert load_key("99_throwaway") == {"1": 16}
    assert Exercises("99_throwaway").grade(1, 16, size=4) == "exercise 1: right"
    # the explorer: the topic's own declaration, built over its parameters by the shared hook
    from shardlab.core.explorer import explorer_for

    live = explorer_for(lesson.params())
    assert live.controls["size"].value == 4 and live.update(size=8)["bytes"] == 32 and live.status.value == "32 B"
    # the report: found through the registry (no --notebooks-dir), key injected, chart drawn from the record
    out = tmp_path / "out"
    assert main(["report", "--only", "99_throwaway", "--out", str(out), "--baseline-dir", str(tmp_path / "base"),
                 "--timeout", "120"]) == 0
    record = json.loads((out / "records" / "99_throwaway.json").read_text())
    assert {c["name"]: c["ok"] for c in record["checks"]}["exercise.1.answer_key"] is True
    page = (out / "index.html").read_text()
    assert "99_throwaway" in page and "throwaway curve" in page
