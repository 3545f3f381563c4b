"""The one table ``make bench`` prints: every workload's ratio against its bar.

Each benchmark writes its rows with ``--json`` (``workload``, ``bar``, ``ratio``,
``detail``); this reads the files named and prints them as one Markdown table, the one
the documentation's performance section shows. Usage::

    python benchmarks/table.py rows1.json rows2.json ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(rows: list[dict]) -> str:
    lines = ["| workload | bar | with otel_graph / without | within | notes |", "|---|---|---|---|---|"]
    for row in rows:
        detail = row.get("detail", "")
        if row["bar"] is None:  # a cost measured and stated, with no bar to hold it to
            lines.append(f"| {row['workload']} | none | {row['ratio']:.3f}× | — | {detail} |")
            continue
        within = "yes" if row["ratio"] <= row["bar"] else "**no**"
        lines.append(f"| {row['workload']} | ≤ {row['bar']:.2f}× | {row['ratio']:.3f}× | {within} | {detail} |")
    return "\n".join(lines)


def main() -> None:
    rows = [row for name in sys.argv[1:] if Path(name).exists() for row in json.loads(Path(name).read_text())]
    print(table(rows))


if __name__ == "__main__":
    main()
