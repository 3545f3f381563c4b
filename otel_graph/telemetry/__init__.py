"""Telemetry: task records -> spans, the span budget and task metrics.

- ``events``: the record every capture path produces (:class:`TaskEvent`) and its field
  positions; ``naming`` (at the top) holds the limits and key names it applies.
- ``tracker``: computes in flight (``compute_record``), and the one background thread
  (``passes``) that turns their records into spans and metric points, in bulk: ``drain``
  makes one compute's, ``aside`` small computes' together.
- ``policy``: the span budget (which tasks get a span of their own, what stands for the rest).
- ``attributes`` (with ``function_names``): what a task's span says; ``spans``: the emitters
  that hand finished spans to the provider; ``encoded_batch``, ``task_encoding`` and
  ``compute_span``: most spans encoded straight to OTLP bytes as they end;
  ``task_context``: the running task as the parent of user spans; ``env_context``: the
  launcher's ``TRACEPARENT`` as the parent of computes begun with no current span.
- ``metrics``: what tasks and computes add to the metric stream.
- ``nvtx_ranges``: tasks and computes as NVTX ranges for Nsight Systems (``OTEL_GRAPH_NVTX``).
- ``process_state``: the telemetry one process holds (providers, readings, the exit hook),
  shared by the handle at the top and by :mod:`otel_graph.cluster`.

May import: :mod:`otel_graph.readings`, :mod:`otel_graph.export`, and the shared modules at
the top (``config``, ``conventions``, ``errors``, ``naming``, ``_version``).
"""
