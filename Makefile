# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-test
SYSTEM := $(VENV)/.system-packages
# Debian packages the tests drive for real: chromium (the HTML report in a headless browser)
# and prometheus (every dashboard and alert query, evaluated by a real Prometheus).
DEBIAN_PACKAGES := chromium prometheus npm
# npm packages for the dashboards' schema check: Grafana's published TypeScript schema, at
# the version of the Grafana image in docker-compose.yml, and the TypeScript checker.
NODE_DIR := $(VENV)/node
NODE_STAMP := $(NODE_DIR)/.installed
NODE_PACKAGES := @grafana/schema@12.4.11 typescript@5.9.3

.PHONY: test demo venv bench clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[test]'
	touch $@

$(SYSTEM): Makefile | $(PY)
	@missing=""; for p in $(DEBIAN_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "not root or no apt-get: install$$missing yourself, or the tests that need them are skipped"; fi
	touch $@

$(NODE_STAMP): Makefile | $(SYSTEM)
	@if command -v npm >/dev/null 2>&1; then \
		npm install --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error $(NODE_PACKAGES) && touch $@; \
	else echo "no npm: the dashboards' schema check is skipped"; fi

venv: $(STAMP)

test: $(STAMP) $(SYSTEM) $(NODE_STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/bench_distributed.py
	$(PY) benchmarks/bench_faults.py

demo: $(STAMP)
	$(VENV)/bin/otel-graph demo

clean:
	rm -rf $(VENV) .pytest_cache otel-graph-out
