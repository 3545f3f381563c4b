"""The stack's files, checked with the real tools available here (no Docker engine, no collector).

* ``docker-compose.yml`` against the Compose specification's JSON schema
  (``check-jsonschema --builtin-schema vendor.compose-spec``), then our own rules: ports on
  127.0.0.1, configs read-only, images pinned, no default Grafana password, health checks.
* The collector and Jaeger configs: component names of the pinned versions only (a typo or
  a pre-rename name fails here instead of at ``docker compose up``), every pipeline's
  components defined, every defined component used, memory_limiter first.
* The couplings between files: the ports and hosts each service is told to reach, the
  span-metrics unit and namespace Jaeger reads, the dashboards' mount path.
* Grafana: dashboards against Grafana's own published TypeScript schema
  (``@grafana/schema``, checked by ``tsc``), and every datasource uid that a panel, variable,
  alert rule or datasource link names exists.
* The alert queries through ``promtool check rules``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from grafana_files import dashboards
from prometheus_server import PROMTOOL

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COLLECTOR = ROOT / "collector" / "otelcol-config.yaml"
JAEGER = ROOT / "collector" / "jaeger.yaml"
PROMETHEUS = ROOT / "collector" / "prometheus.yml"
GRAFANA = ROOT / "grafana"
NODE_MODULES = ROOT / ".tools" / "node" / "node_modules"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def services() -> dict[str, Any]:
    return load(COMPOSE)["services"]


# -- docker-compose.yml ------------------------------------------------------------------------
def test_compose_file_is_valid_against_the_compose_specification():
    check = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                            str(COMPOSE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_schema_check_can_fail(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    image: grafana/", "    imagee: grafana/"))
    check = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                            str(broken)], capture_output=True, text=True)
    assert check.returncode == 1


def test_compose_binds_loopback_pins_images_and_mounts_configs_read_only():
    found = services()
    assert set(found) == {"otel-collector", "jaeger", "prometheus", "grafana"}
    for name, service in found.items():
        image, _, tag = service["image"].rpartition(":")
        assert image and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a release tag, not {tag!r}"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert volume.endswith(":ro"), f"{name}: {volume} must be read-only"
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
    assert {v.split(":")[0]: v.split(":")[1] for v in found["grafana"]["volumes"]}["grafana-data"] == "/var/lib/grafana"
    assert "grafana-data" in load(COMPOSE)["volumes"]


def test_health_checks_where_the_image_can_run_one():
    found = services()
    for name in ("jaeger", "prometheus", "grafana"):
        assert found[name]["healthcheck"]["test"][0] == "CMD", name
    # The collector image is FROM scratch: Prometheus watches it (the "Telemetry lost" rule).
    assert "healthcheck" not in found["otel-collector"]
    rules = (GRAFANA / "provisioning" / "alerting" / "rules.yaml").read_text()
    assert 'up{job=~"otel-collector|otel-collector-self"}' in rules


def test_grafana_has_no_default_password_and_no_anonymous_access():
    environment = services()["grafana"]["environment"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", environment["GF_SECURITY_ADMIN_PASSWORD"])
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert environment["GF_USERS_ALLOW_SIGN_UP"] == "false"
    # Every $VARIABLE the provisioning files expand is set in Grafana's environment.
    expanded = set()
    for path in (GRAFANA / "provisioning").rglob("*.yaml"):
        for text in strings(load(path)):
            expanded |= set(re.findall(r"(?<!\$)\$\{?([A-Z][A-Z0-9_]+)", text))
    assert "ALERT_EMAIL" in expanded
    unset = expanded - set(environment)
    assert not unset, f"provisioning expands {unset}, which compose does not set"


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


# -- collector and Jaeger configs --------------------------------------------------------------
#: Component types of otelcol-contrib 0.160.0 and Jaeger 2.21.0 that the stack uses, by kind.
#: Pre-rename aliases (otlp as an exporter, spanmetrics) are deliberately absent.
KNOWN = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch"},
    "exporters": {"otlp_grpc", "otlp_http", "prometheus", "debug", "jaeger_storage_exporter"},
    "connectors": {"span_metrics"},
    "extensions": {"health_check", "healthcheckv2", "jaeger_storage", "jaeger_query"},
}


def check_pipelines(config: dict[str, Any]) -> None:
    kinds = ("receivers", "processors", "exporters", "connectors", "extensions")
    defined = {kind: set(config.get(kind) or {}) for kind in kinds}
    for kind, names in defined.items():
        for name in names:
            assert name.split("/")[0] in KNOWN[kind], f"unknown {kind[:-1]} {name!r}"
    service = config["service"]
    assert set(service.get("extensions", [])) == defined["extensions"]
    used: dict[str, set[str]] = {kind: set() for kind in kinds}
    connectors_in, connectors_out = set(), set()
    for pipeline_name, pipeline in service["pipelines"].items():
        for role in ("receivers", "processors", "exporters"):
            for name in pipeline.get(role, []):
                if role != "processors" and name in defined["connectors"]:
                    (connectors_in if role == "receivers" else connectors_out).add(name)
                    used["connectors"].add(name)
                else:
                    assert name in defined[role], f"{pipeline_name} uses undefined {role[:-1]} {name!r}"
                    used[role].add(name)
    assert connectors_in == connectors_out == defined["connectors"], "a connector must both feed and be fed"
    for kind in ("receivers", "processors", "exporters"):
        assert used[kind] == defined[kind], f"defined but unused {kind}: {defined[kind] - used[kind]}"


def test_collector_config_uses_the_pinned_versions_components_and_wires_every_one():
    config = load(COLLECTOR)
    check_pipelines(config)
    for name, pipeline in config["service"]["pipelines"].items():
        assert pipeline["processors"][0] == "memory_limiter", f"{name}: memory_limiter must come first"
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"


def test_the_component_check_catches_a_pre_rename_name():
    config = load(COLLECTOR)
    config["connectors"]["spanmetrics"] = config["connectors"].pop("span_metrics")
    with pytest.raises(AssertionError, match="spanmetrics"):
        check_pipelines(config)


def test_jaeger_config_wires_its_components_and_bounds_memory_and_trace_size():
    config = load(JAEGER)
    check_pipelines(config)
    storage = config["extensions"]["jaeger_storage"]
    query = config["extensions"]["jaeger_query"]
    (backend,) = storage["backends"].values()
    assert backend["memory"]["max_traces"] > 0
    assert query["max_trace_size"] > 0
    assert query["storage"]["traces"] in storage["backends"]
    assert query["storage"]["metrics"] in storage["metric_backends"]
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] in storage["backends"]


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].split("/")[0])


def test_every_service_reaches_the_others_where_they_listen():
    collector, jaeger, found = load(COLLECTOR), load(JAEGER), services()
    published = {name: {int(str(p).split(":")[-1]) for p in s.get("ports", [])} for name, s in found.items()}
    # The collector: OTLP in, health published.
    assert {4317, 4318, port_of(collector["extensions"]["health_check"]["endpoint"])} <= published["otel-collector"]
    # Collector -> Jaeger over OTLP/gRPC.
    (jaeger_exporter,) = [v for k, v in collector["exporters"].items() if k.startswith("otlp_grpc")]
    host, port = jaeger_exporter["endpoint"].rsplit(":", 1)
    assert host in found and port_of(jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == int(port)
    # Prometheus scrapes the collector's exporter and its own telemetry.
    scraped = {t for job in load(PROMETHEUS)["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    own = collector["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert scraped == {f"otel-collector:{port_of(collector['exporters']['prometheus']['endpoint'])}",
                       f"otel-collector:{own['port']}"}
    # Jaeger's Monitor tab reads the span metrics in the unit and namespace the connector writes.
    span_metrics = collector["connectors"]["span_metrics"]
    (metrics_backend,) = jaeger["extensions"]["jaeger_storage"]["metric_backends"].values()
    assert metrics_backend["prometheus"]["endpoint"] == "http://prometheus:9090"
    assert metrics_backend["prometheus"]["latency_unit"] == span_metrics["histogram"]["unit"] == "s"
    assert metrics_backend["prometheus"]["metric_namespace"] == span_metrics["namespace"].replace(".", "_")
    assert "--feature-gates=-spanmetrics.statusCodeConvention.useOtelPrefix" in found["otel-collector"]["command"]
    assert port_of(jaeger["extensions"]["jaeger_query"]["http"]["endpoint"]) in published["jaeger"]
    # Grafana's datasources point at the services, and its dashboards are mounted where the provider looks.
    datasources = load(GRAFANA / "provisioning" / "datasources" / "datasources.yaml")["datasources"]
    urls = {d["uid"]: d["url"] for d in datasources}
    assert urls == {"prometheus": "http://prometheus:9090", "jaeger": "http://jaeger:16686"}
    (provider,) = load(GRAFANA / "provisioning" / "dashboards" / "dashboards.yaml")["providers"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in found["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"


# -- Grafana -----------------------------------------------------------------------------------
def referenced_uids(node: Any) -> set[str]:
    """Every datasource uid named anywhere in a dashboard, rule or datasource file."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict) and "uid" in value:
                found.add(value["uid"])
            elif key in ("datasourceUid",) and isinstance(value, str):
                found.add(value)
            else:
                found |= referenced_uids(value)
    elif isinstance(node, list):
        for item in node:
            found |= referenced_uids(item)
    return found


def test_every_datasource_uid_referenced_exists():
    datasources = load(GRAFANA / "provisioning" / "datasources" / "datasources.yaml")
    defined = {d["uid"] for d in datasources["datasources"]}
    referenced = set().union(*(referenced_uids(b) for b in dashboards().values()))
    referenced |= referenced_uids(load(GRAFANA / "provisioning" / "alerting" / "rules.yaml"))
    referenced |= referenced_uids(datasources)
    assert referenced - {"__expr__"} <= defined, referenced - defined
    assert {"prometheus", "jaeger"} <= referenced


def test_dashboards_have_readable_fixed_uids_and_the_variables_users_filter_by():
    boards = dashboards()
    assert set(boards) == {"dask-jobs", "dask-overview", "dask-resources", "otel-graph-health"}
    for stem, board in boards.items():
        assert board["uid"] == stem
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {"service", "host"} <= variables, stem
    assert "prefix" in {v["name"] for v in boards["dask-overview"]["templating"]["list"]}
    assert "worker" in {v["name"] for v in boards["dask-resources"]["templating"]["list"]}
    assert "name" in {v["name"] for v in boards["dask-jobs"]["templating"]["list"]}


@pytest.mark.skipif(not (NODE_MODULES / "@grafana" / "schema").exists() or not shutil.which("node"),
                    reason="make test installs @grafana/schema and typescript with npm")
def test_dashboards_type_check_against_grafanas_published_schema(tmp_path):
    (tmp_path / "node_modules").symlink_to(NODE_MODULES)
    files = []
    for stem, board in dashboards().items():
        source = tmp_path / f"{stem}.ts"
        # Inline object literals: tsc checks excess keys there, not in imported JSON.
        source.write_text("import type { Dashboard } from '@grafana/schema';\n"
                          f"export const dashboard: Dashboard = {json.dumps(board, indent=1)};\n")
        files.append(str(source))
    bad = tmp_path / "broken.ts"
    bad.write_text("import type { Dashboard } from '@grafana/schema';\n"
                   "export const dashboard: Dashboard = {title: 'x', schemaVersion: 'forty', panels: []};\n")
    tsc = [str(NODE_MODULES / ".bin" / "tsc"), "--noEmit", "--strict", "--moduleResolution", "bundler",
           "--module", "esnext", "--target", "es2022", "--skipLibCheck"]
    env = {**os.environ, "NODE_OPTIONS": ""}
    check = subprocess.run([*tsc, *files], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    refused = subprocess.run([*tsc, str(bad)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert refused.returncode != 0 and "broken.ts(2," in refused.stdout


def promtool_check(tmp_path: Path, queries: dict[str, str]) -> subprocess.CompletedProcess:
    """``promtool check rules`` on each query as an alerting rule's expression."""
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": [
        {"alert": name, "expr": expr} for name, expr in queries.items()]}]}))
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)


@pytest.mark.skipif(not PROMTOOL, reason="promtool comes with Debian's prometheus package")
def test_alert_queries_pass_promtool(tmp_path):
    rules = load(GRAFANA / "provisioning" / "alerting" / "rules.yaml")
    queries = {rule["uid"]: rule["data"][0]["model"]["expr"] for group in rules["groups"] for rule in group["rules"]}
    check = promtool_check(tmp_path, queries)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(queries)} rules found" in check.stdout


def grafana_expands(text: str, span_name: str) -> str:
    """What Grafana makes of a trace-to-metrics query: ``$$`` from provisioning, then the span macros."""
    text = text.replace("$$", "$")
    return text.replace("${__span.name}", span_name).replace("$__tags", "")


@pytest.mark.skipif(not PROMTOOL, reason="promtool comes with Debian's prometheus package")
def test_trace_to_metrics_queries_parse_as_grafana_sends_them(tmp_path):
    (jaeger,) = [d for d in load(GRAFANA / "provisioning" / "datasources" / "datasources.yaml")["datasources"]
                 if d["uid"] == "jaeger"]
    queries = {f"q{i}": grafana_expands(q["query"], "inc")
               for i, q in enumerate(jaeger["jsonData"]["tracesToMetrics"]["queries"])}
    assert queries and all('"inc"' in q for q in queries.values())
    check = promtool_check(tmp_path, queries)
    assert check.returncode == 0, check.stdout + check.stderr
    # An empty $__tags in front of a matcher (what Grafana sends for Jaeger's v1 API) does not parse.
    broken = promtool_check(tmp_path, {"q": grafana_expands('sum(rate(x{$$__tags, span_name="$${__span.name}"}[5m]))',
                                                            "inc")})
    assert broken.returncode != 0


def test_data_links_use_fields_their_query_returns():
    links = 0
    for board in dashboards().values():
        for panel in board["panels"]:
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", []):
                links += 1
                grouped = {label.strip() for target in panel["targets"]
                           for by in re.findall(r"by \(([^)]*)\)", target["expr"]) for label in by.split(",")}
                fields = set(re.findall(r"\$\{__data\.fields\.(\w+)\}", link["url"]))
                assert fields and fields <= grouped, (panel["title"], fields - grouped)
                assert "$service" not in link["url"] and "${service}" not in link["url"], "a multi-value variable"
    assert links >= 1


@pytest.mark.skipif(not PROMTOOL, reason="promtool comes with Debian's prometheus package")
def test_the_docs_promql_examples_pass_promtool(tmp_path):
    pages = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))
    blocks = [block for page in pages for block in re.findall(r"^```promql\n(.*?)^```", page.read_text(), re.S | re.M)]
    queries = {}
    for block in blocks:  # a block: queries, each after its comment line
        for index, query in enumerate(re.split(r"^#.*\n", block, flags=re.M)):
            if query.strip():
                queries[f"q{len(queries)}_{index}"] = query.strip()
    assert len(queries) >= 3
    check = promtool_check(tmp_path, queries)
    assert check.returncode == 0, check.stdout + check.stderr
