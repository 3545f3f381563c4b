"""Reading OTLP JSON lines files, streamed: ours, or a collector's ``file`` exporter output.

Each line is one export request; a line may hold spans (``resourceSpans``), metric
points (``resourceMetrics``) or logs (skipped). Files are read line by line, and each
span keeps only what the analyses and the HTML report's trace browser show
(:data:`KEPT_ATTRIBUTES`, its status message and, on a failed span, its ``exception``
event), so a 10^6-span file fits in memory easily: text that repeats across spans
(prefixes, workers, types, functions) is held once, and exception text is bounded per
file (:class:`_Exceptions`). Nothing in a file is executed or unpickled: it is data.

What a file can hold and still be read:

* **unreadable lines** (not JSON, or JSON but not an export request) are skipped and
  counted: a line cut short by a full disk, which the next write then joins onto,
  must not cost the rest of the file. A file with no readable line at all (empty, or
  not OTLP JSON) is refused, naming its first bad line.
* **out-of-range values** (times outside OTLP's unsigned 64 bits, sizes, counts and
  durations past int64 nanoseconds) are left out and counted: a span whose times,
  ``dask.task.count`` or ``dask.task.duration.sum`` are unusable is skipped; a
  descriptive value (``dask.task.nbytes``, ...) is dropped from its span.
* a value of the **wrong type** for an attribute the analyses need (a count that is
  text, a NaN duration) refuses the file, naming the line.

:meth:`TelemetryFile.notes` says what was left out of a file, a line per kind.

>>> import json, tempfile, pathlib
>>> line = {"resourceSpans": [{"resource": {"attributes": [
...     {"key": "service.name", "value": {"stringValue": "etl"}}]},
...     "scopeSpans": [{"spans": [{"traceId": "ab", "spanId": "01", "name": "inc",
...     "startTimeUnixNano": "10", "endTimeUnixNano": "25",
...     "attributes": [{"key": "dask.task.key", "value": {"stringValue": "('inc', 0)"}}]}]}]}]}
>>> path = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
>>> _ = path.write_text(json.dumps(line) + "\\n")
>>> (span,) = TelemetryFile.open(path).spans()
>>> span.name, span.duration_ns, span.attributes["dask.task.key"], span.resource["service.name"]
('inc', 15, "('inc', 0)", 'etl')
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from otel_graph.naming import INT64_MAX

#: Span attributes the analyses read or the trace browser shows; the rest are dropped as lines are read.
KEPT_ATTRIBUTES = frozenset({
    "dask.task.key", "dask.task.prefix", "dask.worker.id", "dask.worker.name", "thread.id",
    "dask.task.nbytes", "dask.task.type", "dask.task.dependencies", "dask.task.dependency_count",
    "dask.task.count", "dask.task.aggregate", "dask.task.duration.sum", "dask.task.duration.max",
    "dask.task.recovered", "dask.scheduler", "dask.graph.tasks", "error.type", "dask.transfer.bytes",
    "dask.transfer.source",
    # shown by the trace browser only
    "code.function.name", "dask.task.dependent_count", "dask.task.retries", "dask.task.attempt",
    "dask.task.duration.min", "dask.task.duration.mean", "dask.span.name", "dask.span.id",
    "dask.compute.tasks_done", "dask.compute.tasks_running", "dask.compute.tasks_waiting",
    "dask.graph.tasks_lost", "otel_graph.incomplete", "otel_graph.processing_error",
    # the compute's job, for comparing two runs of it
    "dask.compute.name", "dask.graph.fingerprint",
})
KEPT_RESOURCE = frozenset({"service.name", "service.instance.id", "host.name", "process.pid",
                           "dask.worker.id", "dask.worker.name"})
ERROR = 2
#: OTLP times are fixed64 nanoseconds since the epoch.
TIME_LIMIT_NS = 1 << 64
#: The longest duration int64 nanoseconds hold (292 years).
MAX_SECONDS = INT64_MAX / 1e9
#: Exception and status text kept per file; past it, failed spans keep a short message only.
EXCEPTION_CHARS = 20_000_000
SPARE_CHARS = 200


class BadTelemetryFile(ValueError):
    """A file that cannot be read as OTLP JSON; the message names the file and line."""


class Span(NamedTuple):
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]
    status_message: str = ""
    #: A failed span's ``exception`` event: (type, message, stack trace).
    exception: tuple[str, str, str] | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def failed(self) -> bool:
        return self.status_code == ERROR


class Point(NamedTuple):
    name: str
    time_ns: int
    value: float
    attributes: dict[str, Any]
    resource: dict[str, Any]


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value."""
    for kind, item in value.items():
        if kind == "stringValue" or kind == "boolValue":
            return item
        if kind == "intValue":
            return int(item)
        if kind == "doubleValue":
            return float(item)
        if kind == "arrayValue":
            return [any_value(v) for v in item.get("values", ())]
        if kind == "kvlistValue":
            return {kv["key"]: any_value(kv.get("value", {})) for kv in item.get("values", ())}
        if kind == "bytesValue":
            return item
    return None


def _attributes(items: list[dict[str, Any]], kept: frozenset[str] | None = None) -> dict[str, Any]:
    if kept is None:
        return {kv["key"]: any_value(kv.get("value", {})) for kv in items}
    return {kv["key"]: any_value(kv["value"]) for kv in items if kv["key"] in kept}


def _loader() -> Callable[[bytes], Any]:
    try:  # about four times faster, where installed (the `report` extra)
        import orjson
    except ImportError:
        return json.loads

    def loads(raw: bytes) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            # orjson refuses some JSON the standard library reads (a lone surrogate escape,
            # which a str key can put there): what is read must not depend on what is installed.
            return json.loads(raw)

    return loads


_loads = _loader()


class TelemetryFile:
    """One OTLP JSON lines file; iterate its spans or metric points."""

    def __init__(self, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        self.path = path
        self._progress = progress
        self.skipped_lines = 0
        self._first_skipped: tuple[int, str] | None = None
        #: What was left out as out of range, e.g. ``{"dask.task.nbytes (dropped)": 2}``.
        self.unusable: Counter[str] = Counter()
        self._exceptions = _Exceptions()

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None) -> TelemetryFile:
        path = Path(path)
        if not path.exists():
            raise BadTelemetryFile(f"{path}: no such file")
        if not path.is_file():
            raise BadTelemetryFile(f"{path}: not a file")
        return cls(path, progress=progress)

    def _requests(self) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            handle = self.path.open("rb")
        except OSError as exc:
            raise BadTelemetryFile(f"{self.path}: cannot read: {exc.strerror}") from None
        readable = 0
        with handle:
            for number, raw in enumerate(handle, 1):
                if self._progress is not None:
                    self._progress(len(raw))
                if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
                    raw = raw[3:]
                if not raw.strip():
                    continue
                request, problem = _request(raw)
                if problem:
                    self._skip(number, problem)
                    continue
                readable += 1
                yield number, request
        if not readable:
            if self._first_skipped is None:
                raise BadTelemetryFile(f"{self.path}: empty: no OTLP JSON lines")
            number, problem = self._first_skipped
            more = f" ({self.skipped_lines - 1} more unreadable lines)" if self.skipped_lines > 1 else ""
            raise BadTelemetryFile(f"{self.path}:{number}: {problem}{more}")

    def _skip(self, number: int, problem: str) -> None:
        self.skipped_lines += 1
        if self._first_skipped is None:
            self._first_skipped = (number, problem)

    def notes(self) -> list[str]:
        """What was left out of this file, one line per kind (the command prints them on stderr)."""
        notes = []
        if self._first_skipped is not None:
            number, problem = self._first_skipped
            count = self.skipped_lines
            notes.append(f"{self.path}: skipped {count} unreadable line{'s' if count > 1 else ''} "
                         f"(the first, line {number}: {problem})")
        if self.unusable:
            listed = ", ".join(f"{count} {what}" for what, count in sorted(self.unusable.items()))
            notes.append(f"{self.path}: out-of-range values left out: {listed}")
        return notes

    def read(self, *, point_names: tuple[str, ...] = ()) -> tuple[list[Span], list[Point]]:
        """Spans and (those named with one of ``point_names``'s prefixes) metric points, in one pass."""
        spans: list[Span] = []
        points: list[Point] = []
        # Millions of small acyclic objects: the cyclic collector would rescan them over and
        # over as they pile up (a third of the time on 10^6 spans) and find nothing.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for number, request in self._requests():
                try:
                    spans.extend(_spans_of(request, self.unusable, self._exceptions))
                    if point_names:
                        points.extend(p for p in _points_of(request, self.unusable)
                                      if p.name.startswith(point_names))
                except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                    raise BadTelemetryFile(f"{self.path}:{number}: malformed data ({_reason(exc)})") from None
        finally:
            if collecting:
                gc.enable()
        return spans, points

    def spans(self) -> Iterator[Span]:
        for number, request in self._requests():
            try:
                spans = list(_spans_of(request, self.unusable, self._exceptions))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                raise BadTelemetryFile(f"{self.path}:{number}: malformed span data ({_reason(exc)})") from None
            yield from spans


def _request(raw: bytes) -> tuple[dict[str, Any], str]:
    """One line as an export request, or why it is not one."""
    try:
        request = _loads(raw)
    except RecursionError:
        return {}, "not JSON (nested too deeply)"
    except ValueError as exc:  # UnicodeDecodeError included: bytes that are not UTF-8
        reason = getattr(exc, "msg", None) or str(exc).split(":")[0]
        return {}, f"not JSON ({reason})"
    if not isinstance(request, dict) or not ({"resourceSpans", "resourceMetrics", "resourceLogs"} & request.keys()):
        return {}, "not an OTLP JSON export request (no resourceSpans, resourceMetrics or resourceLogs)"
    return request, ""


class _OutOfRange(Exception):
    """A value of the right type but past what any real run records: left out and counted."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing {exc.args[0]!r}" if exc.args else "a field is missing"
    return f"{type(exc).__name__}: {exc}"[:200]


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, float) and math.isnan(value):
        raise ValueError(f"dask.task.count must be a count, not {value!r}"[:120])
    if not 0 <= value <= INT64_MAX:
        raise _OutOfRange
    return int(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"a duration must be a number of seconds, not {value!r}"[:120])
    if not 0 <= value <= MAX_SECONDS:  # 1e300 s would overflow int nanoseconds
        raise _OutOfRange
    return float(value)


def _size(value: Any) -> int | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not 0 <= value <= INT64_MAX:  # 10^400 bytes would overflow every float computed from it
        raise _OutOfRange
    return value


def _text_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"dask.task.dependencies must be a list, not {value!r}"[:120])
    return [v if isinstance(v, str) else json.dumps(v) for v in value]


def _int_or_drop(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shared(value: Any) -> str:
    """Text that repeats across spans (a prefix, a worker), held once however many spans carry it."""
    return sys.intern(value if isinstance(value, str) else json.dumps(value))


# What each attribute the analyses read must be: a bad essential value rejects the file
# (raise ValueError), a bad descriptive one is dropped (None), a key of any shape becomes
# text. An out-of-range value (_OutOfRange) skips its span if it is essential (_ESSENTIAL),
# else is dropped; either way it is counted.
_CHECKS: dict[str, Any] = {
    "dask.task.count": _count,
    "dask.task.duration.sum": _seconds,
    "dask.task.duration.max": _seconds,
    "dask.task.dependencies": _text_list,
    "dask.task.dependency_count": _count,
    "dask.task.nbytes": _size,
    "thread.id": _int_or_drop,
    "dask.graph.tasks": _int_or_drop,
    "dask.task.key": lambda v: v if isinstance(v, str) else json.dumps(v),
    "dask.task.prefix": _shared,
    "dask.worker.id": lambda v: sys.intern(str(v)),
    "dask.worker.name": lambda v: sys.intern(str(v)),
    "dask.task.type": _shared,
    "code.function.name": _shared,
    "dask.scheduler": _shared,
    "dask.task.recovered": lambda v: v if v is True else None,
    "dask.compute.name": _shared,
    "dask.graph.fingerprint": _shared,
}


_ESSENTIAL = frozenset({"dask.task.count", "dask.task.duration.sum"})


class _SkipSpan(Exception):
    """The span cannot be used at all; the argument says why, for the count."""


def _checked(attributes: dict[str, Any], unusable: Counter[str]) -> dict[str, Any]:
    for name, check in _CHECKS.items():
        if name in attributes:
            try:
                value = check(attributes[name])
            except _OutOfRange:
                if name in _ESSENTIAL:
                    raise _SkipSpan(f"{name} (span skipped)") from None
                unusable[f"{name} (dropped)"] += 1
                value = None
            if value is None:
                del attributes[name]
            else:
                attributes[name] = value
    return attributes


def _time_ns(value: Any) -> int:
    time_ns = int(value)
    if not 0 <= time_ns < TIME_LIMIT_NS:
        raise _SkipSpan("times past OTLP's 64 bits (span skipped)")
    return time_ns


def _id(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a hex string, not {value!r}"[:120])
    return value


def _resource(entry: dict[str, Any]) -> dict[str, str]:
    """The kept attributes of a ``resourceSpans`` or ``resourceMetrics`` entry's resource, as text."""
    return {k: str(v) for k, v in _attributes(entry.get("resource", {}).get("attributes", ()), KEPT_RESOURCE).items()}


class _Exceptions:
    """Exception and status text of one file's spans, bounded: each distinct text held once
    (a thousand tasks failing alike share one stack trace), a message cut at 4,096
    characters and a stack trace at 16,384 (its end kept), as otel_graph cuts them; past
    :data:`EXCEPTION_CHARS` of distinct text, each is cut to :data:`SPARE_CHARS` (a storm of
    10^5 failures with different messages must not take gigabytes).
    """

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._chars = 0

    def text(self, value: Any, limit: int, *, end: bool = False) -> str:
        text = value if isinstance(value, str) else "" if value is None else json.dumps(value)
        if len(text) > limit:
            text = "…" + text[1 - limit:] if end else text[:limit - 1] + "…"
        held = self._held.get(text)
        if held is None:
            if self._chars >= EXCEPTION_CHARS:
                return text[-SPARE_CHARS:] if end else text[:SPARE_CHARS]
            self._chars += len(text)
            held = self._held[text] = text
        return held

    def of(self, events: Any) -> tuple[str, str, str] | None:
        """The last ``exception`` event's type, message and stack trace; None if none can be read."""
        for event in reversed(events) if isinstance(events, list) else ():
            if isinstance(event, dict) and event.get("name") == "exception":
                try:  # what it says is descriptive: an unreadable event is left out, never refuses the file
                    found = _attributes(event.get("attributes") or [])
                except (KeyError, TypeError, AttributeError, ValueError, OverflowError, RecursionError):
                    return None
                return (self.text(found.get("exception.type"), 256), self.text(found.get("exception.message"), 4096),
                        self.text(found.get("exception.stacktrace"), 16384, end=True))
        return None


def _spans_of(request: dict[str, Any], unusable: Counter[str], exceptions: _Exceptions | None = None) -> Iterator[Span]:
    exceptions = exceptions or _Exceptions()
    for resource_spans in request.get("resourceSpans", ()):
        resource = _resource(resource_spans)
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                try:
                    start, end = _time_ns(span["startTimeUnixNano"]), _time_ns(span["endTimeUnixNano"])
                    attributes = _checked(_attributes(span.get("attributes", ()), KEPT_ATTRIBUTES), unusable)
                except _SkipSpan as skipped:
                    unusable[str(skipped)] += 1
                    continue
                status = span.get("status", {})
                code, message = int(status.get("code", 0)), status.get("message")
                yield Span(
                    _id(span["traceId"], "traceId"), _id(span["spanId"], "spanId"),
                    _id(span.get("parentSpanId", ""), "parentSpanId"), str(span.get("name", "")),
                    start, max(start, end),  # a clock that stepped back must not make negative time
                    attributes, code, resource, exceptions.text(message, 4096) if message else "",
                    exceptions.of(span.get("events")) if code == ERROR else None,
                )


def _points_of(request: dict[str, Any], unusable: Counter[str]) -> Iterator[Point]:
    for resource_metrics in request.get("resourceMetrics", ()):
        resource = _resource(resource_metrics)
        for scope_metrics in resource_metrics.get("scopeMetrics", ()):
            for metric in scope_metrics.get("metrics", ()):
                for kind in ("gauge", "sum"):
                    for point in metric.get(kind, {}).get("dataPoints", ()):
                        value = point.get("asDouble", point.get("asInt"))
                        if value is None:
                            continue
                        try:
                            number = float(value)
                        except OverflowError:  # an asInt past a float's range
                            unusable["metric points (skipped)"] += 1
                            continue
                        if not math.isfinite(number):  # a NaN reading: nothing to plot
                            continue
                        time_ns = int(point.get("timeUnixNano", 0))
                        if not 0 <= time_ns < TIME_LIMIT_NS:
                            unusable["metric points (skipped)"] += 1
                            continue
                        yield Point(metric["name"], time_ns, number, _attributes(point.get("attributes", ())),
                                    resource)
