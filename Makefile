# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-test
SYSTEM := $(VENV)/.system-packages
# Debian packages the tests drive for real: chromium (the HTML report in a headless browser)
# and prometheus (every dashboard and alert query, evaluated by a real Prometheus).
DEBIAN_PACKAGES := chromium prometheus

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

venv: $(STAMP)

test: $(STAMP) $(SYSTEM)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/run.py
	$(PY) benchmarks/bench_distributed.py

demo: $(STAMP)
	$(VENV)/bin/otel-graph demo

clean:
	rm -rf $(VENV) .pytest_cache otel-graph-out
