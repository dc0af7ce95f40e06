# Two commands on a fresh machine: `make report` (the main job) and `make test`.
# Both create .venv from the pinned requirements when it is missing or out of date.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= out/report

.PHONY: venv report baseline test test-full notebooks lint clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "shardlab needs Python 3.11 (torch_xla 2.9.0 wheels); set PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade-strategy only-if-needed -r requirements.txt
	$(PY) -m pip install --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# Two notebooks at a time (~1.5 GB each): the whole report in about half the sequential time on 2 cores.
# The baseline's timing bands are recorded the same way (make baseline), so the two stay comparable.
JOBS   ?= 2

report: $(STAMP)
	$(PY) -m shardlab report --out $(OUT) --overwrite --jobs $(JOBS)

baseline: $(STAMP)
	$(PY) -m shardlab report --out $(OUT) --overwrite --jobs $(JOBS) --update-baseline

# Two pytest workers (one per core), a test file never split across them (module fixtures run once).
TEST_JOBS ?= 2

test: $(STAMP)
	$(PY) tools/build_notebooks.py --check
	$(PY) -m ruff check lib tests tools notebooks/src
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile -m "not full_size"

# The live full-size compiles (06's 405B story: tens of minutes); make test checks their cached results instead.
test-full: $(STAMP)
	$(PY) -m pytest -m full_size

notebooks: $(STAMP)
	$(PY) tools/build_notebooks.py

lint: $(STAMP)
	$(PY) -m ruff check lib tests tools notebooks/src

clean:
	rm -rf out .pytest_cache
