# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-test

.PHONY: test demo venv bench clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test]'
	touch $@

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/bench_distributed.py

demo: $(STAMP)
	$(PY) -m otel_graph.demo

clean:
	rm -rf $(VENV) .pytest_cache otel-graph-out
