"""The provisioned Grafana files, read once for every test that checks them.

``dashboards()`` maps each file's stem to its JSON; ``dashboard_queries()`` lists
(dashboard uid, where, query) for every variable and Prometheus panel target; ``alert_rules()``
maps each alert rule's uid to its definition, from every rule group; ``alert_condition()``
gives its query and Grafana's test of each series it returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

GRAFANA = Path(__file__).resolve().parent.parent / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
RULES = GRAFANA / "provisioning" / "alerting" / "rules.yaml"


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def dashboard_queries() -> list[tuple[str, str, str]]:
    found = []
    for board in dashboards().values():
        for variable in board["templating"]["list"]:
            found.append((board["uid"], f"variable {variable['name']}", variable["query"]["query"]))
        for panel in board["panels"]:
            for target in panel.get("targets", ()):  # rows and alert lists have none
                if "expr" in target:  # Jaeger's searches have none
                    found.append((board["uid"], panel["title"], target["expr"]))
    return found


def alert_rules() -> dict[str, dict[str, Any]]:
    return {rule["uid"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}


def alert_condition(rule: dict[str, Any]) -> tuple[str, Callable[[float], bool]]:
    """A rule's query (A), and Grafana's test of each of its series: reduce B (last), then
    threshold C (``gt``, ``lt`` or ``outside_range``) on B."""
    query, reduce, threshold = (item["model"] for item in rule["data"])
    assert reduce["type"] == "reduce" and reduce["reducer"] == "last" and reduce["expression"] == "A"
    assert threshold["type"] == "threshold" and threshold["expression"] == "B"
    (condition,) = threshold["conditions"]
    kind, params = condition["evaluator"]["type"], condition["evaluator"]["params"]
    tests: dict[str, Callable[[float], bool]] = {
        "gt": lambda value: value > params[0], "lt": lambda value: value < params[0],
        "outside_range": lambda value: value < params[0] or value > params[1]}
    return query["expr"], tests[kind]
