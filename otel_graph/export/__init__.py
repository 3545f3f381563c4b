"""Export: the OpenTelemetry SDK set up, spans and points delivered, nothing lost silently.

- ``sdk`` builds providers from the standard ``OTEL_*`` environment when the application did
  not; ``exporters`` makes the exporters ``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER``
  name; ``endpoint`` asks whether anything listens where spans go; ``http_session`` keeps the
  OTLP/HTTP exporters' certificates.
- ``pipeline``: the span processor that bounds, batches, retries and counts every span that
  could not be delivered; ``span_batches``: what a queued span weighs and how a batch is
  taken; ``metric_counting``: the metric exporter wrapper that counts points alike.
- ``otlp_fast``: OTLP span encoding straight to protobuf bytes (a request; ``otlp_spans``: one
  span; ``otlp_wire``: the wire format and attribute values); ``otlp_json``: OTLP JSON lines
  files; ``histograms``: pre-aggregated histograms merged in at export time.
- ``sdk_internals``: every private part of the SDK used anywhere, each checked before use.
- ``forks``: what each part does in a process forked from an instrumented one.

May import: only the shared modules at the top (``config``, ``errors``, ``naming``). Knows
nothing of Dask.
"""
