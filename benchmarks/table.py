"""The Markdown tables the benchmarks print, one row per ratio with its interval.

``make bench`` prints :func:`table` (bars and verdicts), ``make bench-ab`` prints
:func:`ab_table` (new over old). A ratio is shown as ``1.083× [1.071, 1.095]``: the ratio
and its 95% interval (:mod:`stats`).
"""

from __future__ import annotations

from typing import Any


def interval(ratio: float, lo: float, hi: float) -> str:
    return f"{ratio:.3f}× [{lo:.3f}, {hi:.3f}]"


def _verdict(row: dict[str, Any]) -> str:
    if "floor" in row:
        word = "yes" if row["verdict"] == "yes" else "**no**"
        return f"{word} (±{row['floor'] * 100:.0f}%)"
    if row["verdict"] is None:
        return "—"
    if row["verdict"] == "unresolved":
        more = row.get("more_rounds")
        return f"unresolved ({more:,} more rounds)" if more else "unresolved (on the bar)"
    return "yes" if row["verdict"] == "yes" else "**no**"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | bar | wall time, with / without | within | CPU time, with / without | rounds | notes |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        bar = f"≤ {row['bar']:.2f}×" if row["bar"] is not None else "—"
        lines.append(f"| {row['workload']} | {bar} | {interval(row['ratio'], row['lo'], row['hi'])} | "
                     f"{_verdict(row)} | {interval(row['cpu_ratio'], row['cpu_lo'], row['cpu_hi'])} | "
                     f"{row['rounds']} | {row.get('detail', '')} |")
    return "\n".join(lines)


def ab_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | wall time, new / old | CPU time, new / old | rounds |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['workload']} | {interval(row['ratio'], row['lo'], row['hi'])} | "
                     f"{interval(row['cpu_ratio'], row['cpu_lo'], row['cpu_hi'])} | {row['rounds']} |")
    return "\n".join(lines)
