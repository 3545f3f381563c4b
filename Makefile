# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
#
# Python packages come from uv.lock, exactly (`make lock` moves it to the newest releases the
# ranges in pyproject.toml allow). uv itself is pinned and bootstrapped into .tools/ with the
# machine's python3, so nothing but Python 3.10+ has to be there first.
PYTHON ?= python3
VENV ?= .venv
UV_VERSION := 0.13.9
UV_HOME := .tools/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
STAMP := $(VENV)/.installed-lock
SYSTEM := .tools/.system-packages
# Debian packages the tests drive for real: chromium (the HTML report in a headless browser)
# and prometheus (every dashboard and alert query, evaluated by a real Prometheus).
DEBIAN_PACKAGES := chromium prometheus npm
# npm packages for the dashboards' schema check: Grafana's published TypeScript schema, at
# the version of the Grafana image in docker-compose.yml, and the TypeScript checker.
NODE_DIR := .tools/node
NODE_STAMP := $(NODE_DIR)/.installed
NODE_PACKAGES := @grafana/schema@12.4.11 typescript@5.9.3
# Mermaid as the docs site's pages load it (docs/conf.py's mermaid_version), unpacked without its
# dependencies (its dist/ is self-contained): the docs test renders the diagrams from it offline.
MERMAID_VERSION := 11.12.1
# Test processes at once. The suite mostly waits on subprocesses and clusters, so it runs
# more of them than there are cores.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) * 2 )))
PYTEST_ARGS ?=
# Where the newest-releases and lowest-versions runs build their own environments.
LATEST_VENV := .venv-latest
OLDEST_VENV := .venv-oldest
OLDEST_LOCAL_VENV := .venv-oldest-local
PEER_VENV := .venv-peer
LATEST_EXTRAS := test,distributed,prometheus,report,demo,gpu
LOCAL_EXTRAS := test,prometheus,report,instruments,gpu
CLUSTER_EXTRAS := test,prometheus,report,distributed,gpu
# The oldest run uses the lowest Python pyproject.toml allows, where the machine has it.
OLDEST_PYTHON ?= $(or $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10),$(shell command -v python3.10),$(PYTHON))

# Python never downloaded by uv (the machine's own interpreter is used); bytecode compiled at
# install, since machines that set PYTHONDONTWRITEBYTECODE otherwise compile every module in
# every process the tests start.
export UV_PYTHON_DOWNLOADS := never
export UV_COMPILE_BYTECODE := 1
export UV_PROJECT_ENVIRONMENT := $(VENV)
UV_SYNC := $(UV) sync --locked --all-extras --python $(PYTHON)
# loadgroup: tests that share a module-scoped fixture go to one process (tests/conftest.py
# groups them), which makes the fixture once.
PYTEST := -m pytest -n $(TEST_WORKERS) --dist loadgroup
# The versions a run names before it starts, so that its log says what it tested.
SHOWN := dask|distributed|opentelemetry-sdk|opentelemetry-exporter-otlp-proto-grpc|grpcio|protobuf|cloudpickle|psutil

.PHONY: lint docs screenshot test test-fast test-latest test-oldest peer-test peer-test-wheels demo venv lock bench \
	bench-ab bench-faults bench-lifecycle bench-nvtx bench-preload bench-suite clean

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(STAMP): uv.lock pyproject.toml | $(UV)
	$(UV_SYNC)
	touch $@

$(SYSTEM): Makefile
	@missing=""; for p in $(DEBIAN_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "not root or no apt-get: install$$missing yourself, or the tests that need them are skipped"; fi
	touch $@

$(NODE_STAMP): Makefile | $(SYSTEM)
	@if command -v npm >/dev/null 2>&1; then \
		npm install --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error $(NODE_PACKAGES) && \
		rm -rf $(NODE_DIR)/mermaid && mkdir -p $(NODE_DIR)/mermaid && \
		npm pack --silent --pack-destination $(NODE_DIR) mermaid@$(MERMAID_VERSION) >/dev/null && \
		tar -xzf $(NODE_DIR)/mermaid-$(MERMAID_VERSION).tgz -C $(NODE_DIR)/mermaid --strip-components=1 && \
		rm $(NODE_DIR)/mermaid-$(MERMAID_VERSION).tgz && touch $@; \
	else echo "no npm: the dashboards' schema check and the docs' diagrams check are skipped"; fi

venv: $(STAMP)

# Lint first, in seconds, so that the suite's minutes are not spent on code that fails it:
# ruff (style, import order, likely bugs) over everything, mypy (types) over the package.
# Their versions are pinned in pyproject.toml's lint extra.
LINTED := otel_graph tests benchmarks docs
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy

# The docs site, into docs/_build/html. Warnings are errors, and make test builds it: a
# broken page or reference fails the run.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html

# The README's picture: the demo's HTML report, in the headless Chromium the tests use.
screenshot: $(STAMP) $(SYSTEM)
	cd tests && ../$(VENV)/bin/python screenshot.py ../docs/images

test: lint docs $(STAMP) $(SYSTEM) $(NODE_STAMP)
	$(VENV)/bin/python $(PYTEST) $(PYTEST_ARGS)

# Everything but the cases marked slow (worker exits, fault and scale runs, alerts firing).
test-fast: $(STAMP) $(SYSTEM) $(NODE_STAMP)
	$(VENV)/bin/python $(PYTEST) -m "not slow" $(PYTEST_ARGS)

# $(call suite_in,VENV,PYTHON,EXTRAS,RESOLUTION OPTIONS,PYTEST OPTIONS): the suite in a venv made
# anew, with the project and EXTRAS resolved there and then (the lock is not used or changed).
define suite_in
	$(UV) venv -q --clear --python $(2) $(1)
	$(UV) pip install -q --python $(1)/bin/python $(4) -e '.[$(3)]'
	$(UV) pip list --python $(1)/bin/python --format freeze | grep -iE '^($(SHOWN))=='
	$(1)/bin/python $(PYTEST) $(5) $(PYTEST_ARGS)
endef

# The suite on the newest release of every dependency: a release that breaks otel_graph
# shows up here first.
test-latest: $(SYSTEM) $(NODE_STAMP) | $(UV)
	$(call suite_in,$(LATEST_VENV),$(PYTHON),$(LATEST_EXTRAS),--refresh --resolution highest,)

# The floors: every direct dependency at the lowest version pyproject.toml allows, on the
# lowest Python it allows. Two runs, for two floors: dask alone for the local schedulers
# (distributed not installed: its tests are skipped, and otel_graph.cluster is not
# collected), then dask and distributed at the distributed extra's floor.
test-oldest: $(SYSTEM) $(NODE_STAMP) | $(UV)
	$(call suite_in,$(OLDEST_LOCAL_VENV),$(OLDEST_PYTHON),$(LOCAL_EXTRAS),--resolution lowest-direct,--ignore=otel_graph/cluster)
	$(call suite_in,$(OLDEST_VENV),$(OLDEST_PYTHON),$(CLUSTER_EXTRAS),--resolution lowest-direct,)

# dask/distributed's own tests, plain and instrumented, and every test whose outcome differs:
#   make peer-test DISTRIBUTED_SRC=path/to/distributed [DISTRIBUTED_VERSION=2026.7.1] [PEER_ARGS=...]
# The checkout's distributed (and the dask it pins) replace the locked ones in a venv of their
# own; DISTRIBUTED_VERSION is needed only for a checkout without its git history.
DISTRIBUTED_VERSION ?= $(shell git -C "$(DISTRIBUTED_SRC)" describe --tags --exact-match 2>/dev/null)
PEER_PACKAGES := pytest-timeout pytest-rerunfailures
PEER_ARGS ?=
peer-test: | $(UV)
	@test -n "$(DISTRIBUTED_SRC)" || { echo "usage: make peer-test DISTRIBUTED_SRC=path/to/distributed"; exit 2; }
	UV_PROJECT_ENVIRONMENT=$(PEER_VENV) $(UV_SYNC)
	SETUPTOOLS_SCM_PRETEND_VERSION=$(DISTRIBUTED_VERSION) $(UV) pip install -q --python $(PEER_VENV)/bin/python \
		"$(DISTRIBUTED_SRC)" $(PEER_PACKAGES)
	$(UV) pip list --python $(PEER_VENV)/bin/python --format freeze | grep -iE '^($(SHOWN))=='
	$(PEER_VENV)/bin/python tests/peer/run.py --src "$(DISTRIBUTED_SRC)" $(PEER_ARGS)

# The tests dask and xarray ship in their wheels, plain and instrumented, and every test whose
# outcome differs, each suite's results in peer-results/<suite>-wheel/:
#   make peer-test-wheels [PEER_ARGS="-n 1"]
# The locked dask and distributed, with the releases of what the suites import beside them
# (pytest-timeout is in the lock), in a venv of their own. Each wheel's tests run in its
# site-packages, with the configuration and root conftest.py its repository gives them there
# (tests/peer/dask_root.*, xarray_root.*), which the wheel does not ship.
WHEELS_VENV := .venv-wheels
WHEELS_PACKAGES := xarray==2026.9.0 pandas==3.1.1 pyarrow==26.0.1 pytest-rerunfailures==16.7 pytest-asyncio==1.5.0
DASK_WHEEL_TESTS := dask/tests dask/dataframe/tests dask/bag/tests dask/array/tests/test_array_core.py
XARRAY_WHEEL_TESTS := xarray/tests/test_dask.py xarray/tests/test_distributed.py xarray/tests/test_parallelcompat.py \
	xarray/tests/test_computation.py
peer-test-wheels: | $(UV)
	UV_PROJECT_ENVIRONMENT=$(WHEELS_VENV) $(UV_SYNC)
	$(UV) pip install -q --python $(WHEELS_VENV)/bin/python $(WHEELS_PACKAGES)
	$(UV) pip list --python $(WHEELS_VENV)/bin/python --format freeze | grep -iE '^($(SHOWN)|numpy|pandas|pyarrow|xarray)=='
	@site=$$($(WHEELS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); status=0; \
	$(WHEELS_VENV)/bin/python tests/peer/run.py --src "$$site" --config tests/peer/dask_root.toml \
		--out peer-results/dask-wheel $(PEER_ARGS) $(DASK_WHEEL_TESTS) || status=1; \
	$(WHEELS_VENV)/bin/python tests/peer/run.py --src "$$site" --config tests/peer/xarray_root.toml \
		--out peer-results/xarray-wheel $(PEER_ARGS) $(XARRAY_WHEEL_TESTS) || status=1; \
	exit $$status

# Moves uv.lock to the newest releases pyproject.toml allows; commit the result.
lock: | $(UV)
	$(UV) lock --upgrade --python $(PYTHON)

# The tables of docs/performance.md: every ratio with its 95% interval and verdict, each
# workload's arms interleaved on one core (benchmarks/rig.py; also benchmarks/out/bench.json),
# then, without BENCH_ARGS, the seconds a cluster's start and stop take (bench-lifecycle,
# bench-preload). BENCH_ARGS: e.g. --only tiny, --scale 2.
BENCH_ARGS ?=
bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench.py $(BENCH_ARGS)
	$(if $(BENCH_ARGS),,$(VENV)/bin/python benchmarks/lifecycle.py)
	$(if $(BENCH_ARGS),,$(VENV)/bin/python benchmarks/preload_start.py)

# This tree against another revision, interleaved in one run: new/old per row, with intervals.
#   make bench-ab OLD=<git rev> [ROWS=sync-100k,threads-2k]
# The other revision gets a worktree and a venv of its own, from its own lock, in
# benchmarks/out/trees/. Also written as benchmarks/out/ab.json.
bench-ab: $(STAMP) | $(UV)
	@test -n "$(OLD)" || { echo "usage: make bench-ab OLD=<git rev> [ROWS=a,b]"; exit 2; }
	$(VENV)/bin/python benchmarks/ab.py --old "$(OLD)" --uv $(UV) --python $(PYTHON) $(if $(ROWS),--rows $(ROWS)) \
		$(BENCH_ARGS)

# The benchmarks that run each way in processes of their own, each with a table of its own:
# a faulty collector (compute and exit times), a short cluster script's start and stop phase by
# phase, NVTX ranges, and dask's own test suite.
bench-faults: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_faults.py
# make bench-lifecycle [OLD=<git rev>]: plain, the bare SDK and otel_graph, or OLD's otel_graph against this tree's.
bench-lifecycle: $(STAMP) | $(UV)
	$(VENV)/bin/python benchmarks/lifecycle.py $(if $(OLD),--old "$(OLD)" --uv $(UV) --python $(PYTHON))
bench-nvtx: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_nvtx.py
# make bench-preload: dask scheduler/worker --preload otel_graph, ready and stopped, against plain and the bare SDK.
bench-preload: $(STAMP)
	$(VENV)/bin/python benchmarks/preload_start.py
bench-suite: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_suite.py

demo: $(STAMP)
	$(VENV)/bin/otel-graph demo

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(OLDEST_VENV) $(OLDEST_LOCAL_VENV) $(PEER_VENV) $(WHEELS_VENV) .tools .pytest_cache .mypy_cache .ruff_cache otel-graph-out docs/_build benchmarks/out peer-results
	-git worktree prune
