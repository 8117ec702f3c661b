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

# Each script writes bench/results/NAME.json; docs/performance.md's blocks are made from them.
# bench/fleet_capacity.py (an hour a run) is left out: its JSON is committed.
BENCH = bench/results
bench: $(VENV)/.installed
	$(PY) bench/bench_exporter.py --window 15 --scrape-seconds 3 --bursts 3 --json $(BENCH)/exporter.json
	$(PY) bench/bench_snapshot.py --json $(BENCH)/snapshot.json
	$(PY) bench/bench_log.py --json $(BENCH)/log.json
	$(PY) bench/bench_request_records.py --seconds 10 --repeats 1 --json $(BENCH)/request_records.json
	$(PY) bench/bench_gpu.py --json $(BENCH)/gpu.json
	$(PY) bench/bench_status_page.py --rounds 5 --scrapes 20 --json $(BENCH)/status_page.json
	$(PY) bench/bench_slow_clients.py --json $(BENCH)/slow_clients.json
	$(PY) -m sglang_obs.generate performance

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test]'
	touch $@
