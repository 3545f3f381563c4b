"""Export: the OpenTelemetry SDK set up, spans and points delivered, nothing lost silently.

- ``sdk`` builds providers from the standard ``OTEL_*`` environment when the application did
  not; ``exporters`` makes the exporters ``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER``
  name; ``endpoint`` asks whether anything listens where spans go; ``http_session`` keeps the
  OTLP/HTTP exporters' certificates.
- ``pipeline``: the span processor and metric exporter that bound, batch, retry and count
  every span and point that could not be delivered.
- ``otlp_fast``: OTLP span encoding straight to protobuf bytes; ``otlp_json``: OTLP JSON lines
  files; ``histograms``: pre-aggregated histograms merged in at export time.
- ``sdk_internals``: every private part of the SDK used anywhere, each checked before use.
- ``forks``: what each part does in a process forked from an instrumented one.

May import: only the shared modules at the top (``config``, ``errors``, ``naming``). Knows
nothing of Dask.
"""
