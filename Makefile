# Verbs: generate (derived files), test (the whole suite; sets itself up on a fresh machine),
# check (lint and the fast tests: no `slow` or `e2e` marker, under two minutes), bench.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: test test-under-load check generate bench goldens

test: $(VENV)/.installed
	$(VENV)/bin/ruff check exporter simulator sglang_obs grafana tests bench conformance
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25

# The whole suite with every core kept busy by a spinning process (tests/under_load.py).
test-under-load: $(VENV)/.installed
	$(PY) tests/under_load.py $(MAKE) test

check: $(VENV)/.installed
	$(VENV)/bin/ruff check exporter simulator sglang_obs grafana tests bench conformance
	$(PY) -m pytest -q -n 2 -m "not slow and not e2e"

generate: $(VENV)/.installed
	$(PY) -m sglang_obs.generate

# SGLang's own code, release by release, into conformance/goldens/ (downloads each release and
# its imports into throwaway virtualenvs; minutes, and gigabytes for torch). Then make generate.
goldens:
	$(PYTHON) conformance/generate.py

bench: $(VENV)/.installed
	$(PY) bench/bench_exporter.py
	$(PY) bench/bench_log.py
	$(PY) bench/bench_request_records.py --seconds 10 --repeats 1
	$(PY) bench/bench_gpu.py
	$(PY) bench/bench_status_page.py --rounds 5 --scrapes 20

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test]'
	touch $@
