"""Configuration: every environment variable otel_graph reads, parsed once, with clear errors.

Two families of variables matter:

* **Standard ``OTEL_*`` variables.** The OpenTelemetry SDK and exporters read most
  of them themselves (endpoints, headers, certificates, resource). When otel_graph
  builds the SDK (the application configured none), :func:`check_sdk_environment`
  *validates* the ones whose bad values the SDK would otherwise ignore or turn into
  a traceback deep inside an export thread, so that a typo fails at
  :func:`otel_graph.instrument_scheduler` with a message that names the variable
  and the accepted values::

      OTEL_EXPORTER_OTLP_PROTOCOL='carrier-pigeon' is not valid; accepted values: grpc, http/protobuf

  An application that brings its own providers gets none of that: they are its SDK's
  to read. :func:`load_settings` checks only the few otel_graph interprets itself
  (``OTEL_SDK_DISABLED``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_PROMETHEUS_PORT``),
  and reads the exporter lists as the SDK does (:func:`exporter_names`).

* **Our own ``OTEL_GRAPH_*`` variables**, documented in :data:`OWN_VARIABLES`. Each but
  ``OTEL_GRAPH_FILE_DIR`` has a keyword-only twin in ``instrument_scheduler(**options)``
  (:data:`OPTIONS`); an explicit option wins over the environment.

The docs' configuration page is generated from :data:`OWN_VARIABLES`, :data:`OPTIONS`,
:data:`STANDARD_VARIABLES` and :data:`CHOICES`: a variable added here appears there.

:func:`load_settings` reads the environment once and returns an immutable
:class:`Settings`. Nothing else in the package reads ``os.environ`` for these names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from otel_graph.errors import ConfigurationError

# --- our own variables -------------------------------------------------------
OTEL_GRAPH_MAX_TASK_SPANS = "OTEL_GRAPH_MAX_TASK_SPANS"
OTEL_GRAPH_MAX_QUEUED_SPANS = "OTEL_GRAPH_MAX_QUEUED_SPANS"
OTEL_GRAPH_EXIT_TIMEOUT = "OTEL_GRAPH_EXIT_TIMEOUT"
OTEL_GRAPH_DRAIN_INTERVAL = "OTEL_GRAPH_DRAIN_INTERVAL"
OTEL_GRAPH_EARLY_DRAIN = "OTEL_GRAPH_EARLY_DRAIN"
OTEL_GRAPH_PROGRESS_INTERVAL = "OTEL_GRAPH_PROGRESS_INTERVAL"
OTEL_GRAPH_RESOURCES = "OTEL_GRAPH_RESOURCES"
OTEL_GRAPH_GPU = "OTEL_GRAPH_GPU"
OTEL_GRAPH_NVTX = "OTEL_GRAPH_NVTX"
OTEL_GRAPH_FILE_DIR = "OTEL_GRAPH_FILE_DIR"
OTEL_GRAPH_CLOCK = "OTEL_GRAPH_CLOCK"

#: Exit waits this long for a collector making no progress. The bar is an exit within 2 s
#: of the last compute, down or hung collector included; the interpreter's own teardown
#: after our hook takes 0.2-0.3 s more.
DEFAULT_EXIT_TIMEOUT_S = 1.0
#: Task records awaiting the tracker at which a compute on a pool is drained while it runs:
#: its threads sleep or wait on I/O much of the time, and the spans made then are not left
#: for the flush after it.
DEFAULT_EARLY_DRAIN_TASKS = 256

OWN_VARIABLES: Mapping[str, str] = {
    OTEL_GRAPH_MAX_TASK_SPANS: "Task spans per compute before tasks are folded into one "
    "aggregate span per prefix; an integer >= 0 or `unlimited`. Default 1000.",
    OTEL_GRAPH_MAX_QUEUED_SPANS: "Spans held in memory while the collector is slow or "
    "down, about 2.5 kB each (a span with a larger exception text counts as more); past it "
    "the oldest are dropped and counted. Default 100000 (about 250 MB).",
    OTEL_GRAPH_EXIT_TIMEOUT: "Seconds the interpreter may spend at exit delivering what "
    "is left when the collector makes no progress. Default 1.",
    OTEL_GRAPH_DRAIN_INTERVAL: "Seconds between turning running computes' task records "
    "into spans, so long jobs show up while they run. Default 2.",
    OTEL_GRAPH_EARLY_DRAIN: "Task records of a compute on the threads or processes scheduler "
    "that, once they wait, are turned into spans while it runs, not only every "
    "OTEL_GRAPH_DRAIN_INTERVAL; an integer >= 1, or `unlimited` (never early: tracker work "
    "kept out of CPU-bound pool computes). Default 256.",
    OTEL_GRAPH_PROGRESS_INTERVAL: "Seconds between the `dask.compute.progress` spans of a "
    "compute still running, which make its trace visible before its root span ends. Default 30.",
    OTEL_GRAPH_RESOURCES: "`true`/`false`: publish CPU, memory and GPU readings. Default true.",
    OTEL_GRAPH_GPU: "`true`/`false`: read GPUs through NVML. Default true.",
    OTEL_GRAPH_NVTX: "`true`/`false`: run each task inside an NVTX range named by its prefix, and each compute "
    "inside one too, for NVIDIA Nsight Systems (needs the `gpu` extra: `pip install 'otel-graph[gpu]'`). "
    "Nothing is done while no NVTX tool is attached to the process. Default false.",
    OTEL_GRAPH_CLOCK: "`caller` (default): a dask.distributed worker places its spans on the timeline of the "
    "process that made the trace's `dask.compute` span, correcting its clock by the offsets measured between "
    "worker, scheduler and client (`dask.clock.correction` on its spans); `local`: each process keeps its own "
    "clock. A worker with no `OTEL_*` variables of its own takes its client's.",
    OTEL_GRAPH_FILE_DIR: "Directory of `traces.jsonl` and `metrics.jsonl` (OTLP JSON lines) when "
    "OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER lists `otlp_file`. Default `otel-graph-out`.",
}

# --- standard variables ----------------------------------------------------------
#: The standard variables otel_graph reads or honours, and what it does with them: the SDK and
#: its exporters read most of them; where otel_graph builds the SDK it checks their values first.
STANDARD_VARIABLES: Mapping[str, str] = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "Where to send, with `_TRACES_`/`_METRICS_` variants per signal. "
    "Default `http://localhost:4317` (gRPC), `http://localhost:4318` with `http/protobuf`.",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "`grpc` (default) or `http/protobuf`, with per-signal variants.",
    "OTEL_EXPORTER_OTLP_HEADERS": "Transport, with `_TIMEOUT`, `_COMPRESSION`, `_INSECURE`, `_CERTIFICATE`, "
    "`_CLIENT_KEY`, `_CLIENT_CERTIFICATE` and per-signal variants. Header values are never printed, not even in "
    "errors; `_INSECURE` takes `true` or `false` only (the exporters read any other value as false, so `1` would "
    "quietly mean TLS).",
    "OTEL_SERVICE_NAME": "The resource's `service.name` (default `dask`), with `OTEL_RESOURCE_ATTRIBUTES`; "
    "`service.instance.id`, `process.pid` and `host.name` are added.",
    "OTEL_TRACES_EXPORTER": "A comma-separated list, as the SDK reads it (every exporter named gets every span): "
    "`otlp` (default), `otlp_proto_grpc`, `otlp_proto_http`, `console`, `otlp_file` (OTLP JSON lines, see "
    "OTEL_GRAPH_FILE_DIR), any name an installed package registers in the `opentelemetry_traces_exporter` "
    "entry-point group; or `none`.",
    "OTEL_METRICS_EXPORTER": "The same, for metrics: `otlp` (default), `otlp_proto_grpc`, `otlp_proto_http`, "
    "`console`, `otlp_file`, `prometheus` (a pull endpoint on OTEL_EXPORTER_PROMETHEUS_HOST/_PORT, default "
    "`localhost:9464`; needs the `prometheus` extra), any name in `opentelemetry_metrics_exporter`; or `none`. A "
    "pull reader of another package's gets no `dask.task.duration` or `dask.compute.duration`: otel_graph "
    "pre-aggregates those for push exporters and its own Prometheus reader. With several exporters, `stats()` "
    "counts add up over them.",
    "OTEL_METRIC_EXPORT_INTERVAL": "Milliseconds between metric exports. Default here 1000.",
    "OTEL_METRIC_EXPORT_TIMEOUT": "Milliseconds a metric export may take, as the SDK reads it; a positive number.",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "`cumulative` (default), `delta` or `lowmemory`, as "
    "the OTLP metric exporter reads it.",
    "OTEL_EXPORTER_PROMETHEUS_HOST": "Where the `prometheus` metrics exporter serves `/metrics`, with "
    "OTEL_EXPORTER_PROMETHEUS_PORT (a TCP port 1-65535). Default `localhost:9464`.",
    "OTEL_TRACES_SAMPLER": "Sampling, with OTEL_TRACES_SAMPLER_ARG, decided per compute: a trace is whole or absent.",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "The SDK's span limits, with OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, "
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, OTEL_SPAN_EVENT_COUNT_LIMIT and OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT: "
    "applied to every span otel_graph makes, task spans too (built without the SDK's `Span`), as the SDK "
    "applies them.",
    "OTEL_SDK_DISABLED": "`true`: Dask is left untouched (`true` or `false` only, as the SDK reads it).",
    "TRACEPARENT": "A launcher's trace (a W3C `traceparent` value), read once when otel_graph is instrumented: "
    "the parent of each `dask.compute` span begun with no current span. One that is not valid is ignored, "
    "with one warning.",
    "TRACESTATE": "The launcher's W3C `tracestate`, kept on those computes' spans with TRACEPARENT.",
}

#: The standard variables whose values otel_graph checks before the SDK reads them, and what
#: each accepts (the SDK would ignore a bad one, or fail inside an export thread).
CHOICES: Mapping[str, tuple[str, ...]] = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": ("grpc", "http/protobuf"),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": ("grpc", "http/protobuf"),
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": ("grpc", "http/protobuf"),
    "OTEL_EXPORTER_OTLP_COMPRESSION": ("gzip", "none", "deflate"),
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": ("gzip", "none", "deflate"),
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": ("gzip", "none", "deflate"),
    "OTEL_TRACES_SAMPLER": (
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ),
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": ("cumulative", "delta", "lowmemory"),
}
_BOOLEANS = (
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
)
_POSITIVE_NUMBERS = (
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
)
_KEY_VALUE_LISTS = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_RESOURCE_ATTRIBUTES",
)
_ENDPOINTS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
_FILES = (
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
)
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")

DEFAULT_MAX_TASK_SPANS = 1000
DEFAULT_METRIC_EXPORT_INTERVAL_MS = 1000


def _invalid(name: str, value: str, accepted: str) -> ConfigurationError:
    # Header values carry credentials: name the variable, never echo the value.
    shown = "<hidden>" if "HEADERS" in name else repr(value)
    return ConfigurationError(f"{name}={shown} is not valid; accepted values: {accepted}")


def parse_spec_bool(name: str, value: str) -> bool:
    """A boolean ``OTEL_*`` variable, read as the SDK reads it: only ``true`` is true. Any
    other value but ``false`` or empty is an error, not a quiet false: ``..._INSECURE=1``
    would otherwise pass here and still mean TLS to the exporter."""
    lowered = value.strip().lower()
    if lowered in ("true", "false", ""):
        return lowered == "true"
    raise _invalid(name, value, "true, false")


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _invalid(name, value, "true, false")


def parse_limit(name: str, value: str | int | None, default: int | None) -> int | None:
    """An integer >= 0, or ``unlimited`` (returned as ``None``)."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _invalid(name, str(value), "an integer >= 0, or unlimited")
        return value
    text = str(value).strip().lower()
    if text in ("unlimited", "none", "inf"):
        return None
    try:
        number = int(text)
    except ValueError:
        raise _invalid(name, str(value), "an integer >= 0, or unlimited") from None
    if number < 0:
        raise _invalid(name, str(value), "an integer >= 0, or unlimited")
    return number


#: Longest wait we accept, in seconds (or milliseconds where the variable is in ms): a
#: thread cannot wait on more than ``threading.TIMEOUT_MAX``, and a 1e308 s interval would
#: stop the metric reader's thread with an OverflowError, silently ending metrics.
MAX_WAIT = 10**7


def parse_seconds(name: str, value: str | float | None, default: float, *,
                  accepted: str = "a number of seconds > 0 and at most 10^7") -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _invalid(name, str(value), accepted) from None
    if not 0 < number <= MAX_WAIT:  # also refuses nan and inf
        raise _invalid(name, str(value), accepted)
    return number


def check_sdk_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse, naming the variable, a standard value the SDK otel_graph builds would choke on."""
    env = os.environ if env is None else env
    for name, accepted in CHOICES.items():
        value = env.get(name)
        if value is not None and value.strip().lower() not in accepted:
            raise _invalid(name, value, ", ".join(accepted))
    for name in _BOOLEANS:
        if name in env:
            parse_spec_bool(name, env[name])
    for name in _POSITIVE_NUMBERS:
        if name in env:
            parse_seconds(name, env[name], 1.0, accepted="a number > 0 and at most 10^7")
    for name in _KEY_VALUE_LISTS:
        value = env.get(name, "")
        for item in filter(None, (part.strip() for part in value.split(","))):
            key, sep, _ = item.partition("=")
            if not sep or not key.strip():
                raise _invalid(name, value, "comma-separated key=value pairs")
    for name in _ENDPOINTS:
        value = env.get(name)
        if value is not None and value.strip() and not _is_endpoint(value.strip()):
            raise _invalid(name, value, "a URL such as http://localhost:4317")
    for name in _FILES:
        value = env.get(name)
        if value and not os.path.isfile(value):
            raise ConfigurationError(f"{name}={value!r} is not valid; accepted values: a readable file")
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    arg = env.get("OTEL_TRACES_SAMPLER_ARG")
    if sampler.endswith("traceidratio") and arg is not None:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise _invalid("OTEL_TRACES_SAMPLER_ARG", arg, "a probability between 0 and 1")
    _check_interpreted(env)


def _check_interpreted(env: Mapping[str, str]) -> None:
    """The standard values otel_graph itself reads into :class:`Settings`."""
    if "OTEL_SDK_DISABLED" in env:
        parse_spec_bool("OTEL_SDK_DISABLED", env["OTEL_SDK_DISABLED"])
    if "OTEL_METRIC_EXPORT_INTERVAL" in env:
        parse_seconds("OTEL_METRIC_EXPORT_INTERVAL", env["OTEL_METRIC_EXPORT_INTERVAL"], 1.0,
                      accepted="a number > 0 and at most 10^7")
    port = env.get("OTEL_EXPORTER_PROMETHEUS_PORT")
    digits = (port or "").strip()
    # isascii: "²" and "٣" are digits to str.isdigit, and int() refuses the first.
    if port is not None and not (digits.isascii() and digits.isdigit() and 0 < int(digits) < 65536):
        raise _invalid("OTEL_EXPORTER_PROMETHEUS_PORT", port, "a TCP port 1-65535")


def _is_endpoint(value: str) -> bool:
    """A URL with a host and, if any, a port the exporters can use."""
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        return False
    host = parts.hostname or ""
    return bool(parts.scheme and host) and not any(c.isspace() for c in parts.netloc)


@dataclass(frozen=True)
class Settings:
    """Everything otel_graph decided from the environment and the caller's options."""

    max_task_spans: int | None = DEFAULT_MAX_TASK_SPANS
    max_queued_spans: int = 100_000
    exit_timeout_s: float = DEFAULT_EXIT_TIMEOUT_S
    drain_interval_s: float = 2.0
    #: None: a pool compute is drained only every drain_interval_s.
    early_drain_tasks: int | None = DEFAULT_EARLY_DRAIN_TASKS
    progress_interval_s: float = 30.0
    resources: bool = True
    gpu: bool = True
    nvtx: bool = False
    #: ``caller`` or ``local``: whose clock a worker's spans are placed on (:mod:`otel_graph.cluster.clock`).
    clock: str = "caller"
    sdk_disabled: bool = False
    #: The exporters ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` name, in order;
    #: empty for ``none`` (see :func:`exporter_names`). Resolved when the SDK is built.
    traces_exporters: tuple[str, ...] = ("otlp",)
    metrics_exporters: tuple[str, ...] = ("otlp",)
    metric_export_interval_ms: float = DEFAULT_METRIC_EXPORT_INTERVAL_MS
    prometheus_host: str = "localhost"
    prometheus_port: int = 9464
    file_dir: str = "otel-graph-out"
    extra: Mapping[str, Any] = field(default_factory=dict)


#: Each keyword option of ``instrument_scheduler()`` and the variable it stands in for.
OPTIONS: Mapping[str, str] = {
    "max_task_spans": OTEL_GRAPH_MAX_TASK_SPANS,
    "max_queued_spans": OTEL_GRAPH_MAX_QUEUED_SPANS,
    "exit_timeout_s": OTEL_GRAPH_EXIT_TIMEOUT,
    "drain_interval_s": OTEL_GRAPH_DRAIN_INTERVAL,
    "early_drain_tasks": OTEL_GRAPH_EARLY_DRAIN,
    "progress_interval_s": OTEL_GRAPH_PROGRESS_INTERVAL,
    "resources": OTEL_GRAPH_RESOURCES,
    "gpu": OTEL_GRAPH_GPU,
    "nvtx": OTEL_GRAPH_NVTX,
    "clock": OTEL_GRAPH_CLOCK,
}


def load_settings(env: Mapping[str, str] | None = None, **options: Any) -> Settings:
    """Read and validate the environment; keyword options override ``OTEL_GRAPH_*`` values.

    Raises :class:`ConfigurationError` for any bad value or unknown option.
    """
    env = os.environ if env is None else env
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(OPTIONS))}"
        )
    _check_interpreted(env)

    def raw(option: str) -> Any:
        return options[option] if option in options else env.get(OPTIONS[option])

    def flag(option: str, default: bool) -> bool:
        value = raw(option)
        if value is None:
            return default
        return value if isinstance(value, bool) else parse_bool(OPTIONS[option], str(value))

    queued = parse_limit(OTEL_GRAPH_MAX_QUEUED_SPANS, raw("max_queued_spans"), 100_000)
    interval = env.get("OTEL_METRIC_EXPORT_INTERVAL")
    return Settings(
        max_task_spans=parse_limit(OTEL_GRAPH_MAX_TASK_SPANS, raw("max_task_spans"), DEFAULT_MAX_TASK_SPANS),
        max_queued_spans=10**12 if queued is None else max(queued, 1),
        exit_timeout_s=parse_seconds(OTEL_GRAPH_EXIT_TIMEOUT, raw("exit_timeout_s"), DEFAULT_EXIT_TIMEOUT_S),
        drain_interval_s=parse_seconds(OTEL_GRAPH_DRAIN_INTERVAL, raw("drain_interval_s"), 2.0),
        early_drain_tasks=_early_drain(raw("early_drain_tasks")),
        progress_interval_s=parse_seconds(OTEL_GRAPH_PROGRESS_INTERVAL, raw("progress_interval_s"), 30.0),
        resources=flag("resources", True),
        gpu=flag("gpu", True),
        nvtx=flag("nvtx", False),
        clock=_clock(raw("clock")),
        sdk_disabled=parse_spec_bool("OTEL_SDK_DISABLED", env.get("OTEL_SDK_DISABLED", "false")),
        traces_exporters=exporter_names(env.get("OTEL_TRACES_EXPORTER")),
        metrics_exporters=exporter_names(env.get("OTEL_METRICS_EXPORTER")),
        metric_export_interval_ms=float(interval) if interval else DEFAULT_METRIC_EXPORT_INTERVAL_MS,
        prometheus_host=env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost"),
        prometheus_port=int(env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")),
        file_dir=env.get(OTEL_GRAPH_FILE_DIR, "").strip() or "otel-graph-out",
    )


#: What OTEL_GRAPH_CLOCK accepts.
CLOCKS = ("caller", "local")


def _clock(value: Any) -> str:
    if value is None:
        return "caller"
    clock = str(value).strip().lower()
    if clock not in CLOCKS:
        raise _invalid(OTEL_GRAPH_CLOCK, str(value), ", ".join(CLOCKS))
    return clock


def _early_drain(value: str | int | None) -> int | None:
    accepted = "an integer >= 1, or unlimited"
    try:
        number = parse_limit(OTEL_GRAPH_EARLY_DRAIN, value, DEFAULT_EARLY_DRAIN_TASKS)
    except ConfigurationError:
        raise _invalid(OTEL_GRAPH_EARLY_DRAIN, str(value), accepted) from None
    if number == 0:  # a drain asked for at every batch: never what anyone means
        raise _invalid(OTEL_GRAPH_EARLY_DRAIN, str(value), accepted)
    return number


def exporter_names(value: str | None) -> tuple[str, ...]:
    """``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` as the SDK reads them: a
    comma-separated list of exporter names, each as written but for surrounding spaces
    (they name entry points, which are case-sensitive); ``none`` in any case for none.
    Unset or empty: ``otlp``, the specification's default. A name listed twice counts once.

    >>> exporter_names("console, otlp"), exporter_names("NONE"), exporter_names(None)
    (('console', 'otlp'), (), ('otlp',))
    """
    if value is None or not value.strip():
        return ("otlp",)
    if value.strip().lower() == "none":
        return ()
    return tuple(dict.fromkeys(name.strip() for name in value.split(",")))


def exit_timeout() -> float:
    """``OTEL_GRAPH_EXIT_TIMEOUT`` as read at exit, where a bad value must not raise."""
    try:
        return load_settings().exit_timeout_s
    except ConfigurationError:  # refused loudly at start already
        return DEFAULT_EXIT_TIMEOUT_S


def otlp_protocol(signal: str, env: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol for ``traces`` or ``metrics``; grpc unless told otherwise.

    grpc is the default of the Python SDK's own ``opentelemetry-instrument`` and of
    port 4317; the per-signal variable wins over the general one, as the spec says.
    """
    env = os.environ if env is None else env
    value = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    return value.strip().lower()
