"""The provisioned Grafana files, read once for every test that checks them.

``dashboards()`` maps each file's stem to its JSON; ``dashboard_queries()`` lists
(dashboard uid, where, query) for every variable and panel target; ``alert_rules()``
maps each alert rule's uid to its definition (one rule group, as provisioned).
"""

from __future__ import annotations

import json
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
            for target in panel["targets"]:
                found.append((board["uid"], panel["title"], target["expr"]))
    return found


def alert_rules() -> dict[str, dict[str, Any]]:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["uid"]: rule for rule in group["rules"]}
