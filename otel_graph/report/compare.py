"""``otel-graph report --compare``: two runs of the same job, side by side.

Two runs are comparable when their graphs have the same shape: the same
``dask.graph.fingerprint`` (:mod:`otel_graph.telemetry.job`). :func:`pick_runs` finds them:

* in two files: the latest compute of the second file whose fingerprint the first file
  also has ("after"), against the latest compute of that fingerprint in the first file
  ("before");
* in one file: the latest compute that ran before with the same fingerprint ("after"),
  against its run just before.

``--fingerprint`` names the fingerprint to compare instead. :func:`render` then says,
from the runs' task spans:

* which prefixes got slower: per prefix, the tasks, the mean task time before and after
  and their ratio, and the time each prefix added, most added first;
* whether the critical path changed: each run's path as its prefixes in order (a run of
  one prefix shown once with its count), the time it spent in each prefix, and whether
  the sequence is the same.

A run whose spans were cut by the span budget compares on what it has: aggregate spans
count in the prefix table (their tasks and summed times), not on the critical path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TextIO

from otel_graph.report.analysis import Compute, CriticalPath, critical_path, prefix_table
from otel_graph.report.labels import seconds
from otel_graph.report.text import cell, table

FINGERPRINT = "dask.graph.fingerprint"


class NothingToCompare(ValueError):
    """No two runs share a fingerprint (or the one asked for): the message says what there is."""


@dataclass
class PrefixChange:
    prefix: str
    tasks_before: int
    tasks_after: int
    mean_before_s: float
    mean_after_s: float
    added_s: float  # total task time after less before

    @property
    def ratio(self) -> float | None:
        return self.mean_after_s / self.mean_before_s if self.mean_before_s > 0 else None


def fingerprint_of(compute: Compute) -> str | None:
    value = compute.root.attributes.get(FINGERPRINT)
    return value if isinstance(value, str) and value else None


def pick_runs(files: Sequence[Sequence[Compute]], *, fingerprint: str | None = None) -> tuple[Compute, Compute]:
    """(before, after) from one file's computes or two files' (see the module docs)."""
    if len(files) not in (1, 2):
        raise NothingToCompare(f"--compare takes one file (two runs in it) or two files, not {len(files)}")
    every = [c for computes in files for c in computes]
    if not any(fingerprint_of(c) for c in every):
        raise NothingToCompare(f"no compute here carries {FINGERPRINT}: these files were written by an otel_graph "
                               "that did not record it, or hold no dask.compute spans")
    if len(files) == 2:
        before_file, after_file = ([c for c in computes if fingerprint_of(c)] for computes in files)
        shared = {fingerprint_of(c) for c in before_file} & {fingerprint_of(c) for c in after_file}
        wanted = shared if fingerprint is None else shared & {fingerprint}
        candidates = [c for c in after_file if fingerprint_of(c) in wanted]
        if not candidates:
            raise NothingToCompare(_nothing(every, fingerprint, "the two files have no fingerprint in common"))
        after = max(candidates, key=lambda c: c.root.start_ns)
        before = max((c for c in before_file if fingerprint_of(c) == fingerprint_of(after)),
                     key=lambda c: c.root.start_ns)
        if (before.root.trace_id, before.root.span_id) == (after.root.trace_id, after.root.span_id):
            raise NothingToCompare("nothing to compare: both files give the same run (trace "
                                   f"{before.root.trace_id}): the same file twice?")
        return before, after
    runs: dict[str, list[Compute]] = defaultdict(list)
    for compute in sorted(every, key=lambda c: c.root.start_ns):
        found = fingerprint_of(compute)
        if found is not None and (fingerprint is None or found == fingerprint):
            runs[found].append(compute)
    repeated = [computes for computes in runs.values() if len(computes) >= 2]
    if not repeated:
        raise NothingToCompare(_nothing(every, fingerprint, "no two computes in the file share one"))
    latest = max(repeated, key=lambda computes: computes[-1].root.start_ns)
    return latest[-2], latest[-1]


def _nothing(computes: Sequence[Compute], fingerprint: str | None, why: str) -> str:
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for compute in computes:
        found = fingerprint_of(compute)
        if found is not None:
            counts[(found, str(compute.root.attributes.get("dask.compute.name", "")))] += 1
    seen = ", ".join(f"{found} ({name or 'unnamed'}, {count} run{'s' if count > 1 else ''})"
                     for (found, name), count in sorted(counts.items())[:10])
    asked = f"no two runs with fingerprint {fingerprint}" if fingerprint else why
    return f"nothing to compare: {asked}; fingerprints found: {seen}"


def prefix_changes(before: Compute, after: Compute) -> list[PrefixChange]:
    """Per prefix of either run, most task time added first."""
    old = {row.prefix: row for row in prefix_table([before])}
    new = {row.prefix: row for row in prefix_table([after])}
    changes = []
    for prefix in old.keys() | new.keys():
        was, now = old.get(prefix), new.get(prefix)
        changes.append(PrefixChange(
            prefix, was.tasks if was else 0, now.tasks if now else 0, was.mean_s if was else 0.0,
            now.mean_s if now else 0.0, (now.duration_s if now else 0.0) - (was.duration_s if was else 0.0)))
    return sorted(changes, key=lambda change: (-change.added_s, change.prefix))


def path_shape(path: CriticalPath) -> list[tuple[str, int, float]]:
    """The path's prefixes in order, a run of one prefix as one (prefix, steps, seconds)."""
    shape: list[tuple[str, int, float]] = []
    for step in path.steps:
        prefix = str(step.span.attributes.get("dask.task.prefix", step.span.name))
        duration = step.span.duration_ns / 1e9
        if shape and shape[-1][0] == prefix:
            _, count, total = shape[-1]
            shape[-1] = (prefix, count + 1, total + duration)
        else:
            shape.append((prefix, 1, duration))
    return shape


def render(before: Compute, after: Compute, out: TextIO) -> None:
    """The comparison as text, untrusted text made safe as in the text report."""
    name = after.root.attributes.get("dask.compute.name") or before.root.attributes.get("dask.compute.name")
    out.write(f"\nComparing two runs of {cell(name or 'an unnamed job')} "
              f"(fingerprint {cell(fingerprint_of(after))})\n")
    ratio = f" ({after.wall_ns / before.wall_ns:.2f}x)" if before.wall_ns > 0 else ""
    for label, run, extra in (("before", before, ""), ("after ", after, ratio)):
        started = datetime.fromtimestamp(run.root.start_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        out.write(f"  {label}: trace {cell(run.root.trace_id)}, started {started}, "
                  f"wall {seconds(run.wall_ns / 1e9)}{extra}, {run.task_count} tasks\n")

    out.write("\nPrefixes, most task time added first\n")
    table(out, ["prefix", "tasks before", "tasks after", "mean before", "mean after", "ratio", "time added"],
          [[c.prefix, str(c.tasks_before), str(c.tasks_after), seconds(c.mean_before_s), seconds(c.mean_after_s),
            "-" if c.ratio is None else f"{c.ratio:.2f}x", _signed(c.added_s)] for c in prefix_changes(before, after)])

    old, new = critical_path(before), critical_path(after)
    old_shape, new_shape = path_shape(old), path_shape(new)
    if not old_shape or not new_shape:
        out.write("\nCritical path: not known (no task spans with keys in "
                  f"{'either run' if not old_shape and not new_shape else 'one run'})\n")
        return
    same = [(p, n) for p, n, _ in old_shape] == [(p, n) for p, n, _ in new_shape]
    out.write("\nCritical path: " + ("the same prefixes in the same order" if same else "changed") + "\n")
    for label, shape, path in (("before", old_shape, old), ("after ", new_shape, new)):
        steps = " -> ".join(prefix if count == 1 else f"{prefix} x{count}" for prefix, count, _ in shape)
        out.write(f"  {label}: {cell(steps)} ({seconds(path.on_path_ns / 1e9)} "
                  f"on the path, idle {seconds(path.gaps_ns / 1e9)})\n")
    on_path: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for index, shape in enumerate((old_shape, new_shape)):
        for prefix, _, total in shape:
            on_path[prefix][index] += total
    table(out, ["prefix on the path", "before", "after", "time added"],
          [[prefix, seconds(was), seconds(now), _signed(now - was)]
           for prefix, (was, now) in sorted(on_path.items(), key=lambda item: item[1][0] - item[1][1])])


def _signed(value_s: float) -> str:
    return ("+" if value_s >= 0 else "-") + seconds(abs(value_s))
