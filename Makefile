# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-test

.PHONY: test demo venv bench clean system-deps

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# Debian packages the tests drive for real; installed only when we are root (CI and the dev machines are).
system-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi

test: $(STAMP) system-deps
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/run.py

demo: $(STAMP)
	$(PY) -m otel_graph.demo

clean:
	rm -rf $(VENV) .pytest_cache otel-graph-out
