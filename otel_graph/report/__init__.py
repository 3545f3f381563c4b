"""Report: OTLP files read back, analysed, and shown as text, HTML or a Chrome trace.

- ``otlp_read``: OTLP JSON lines files (ours or a collector's ``file`` exporter), streamed,
  validated, into :class:`Span` and :class:`Point` records.
- ``analysis``: bottlenecks by prefix, slowest tasks, worker balance, the critical path.
- ``text``: the text report (``otel-graph report``); ``html``: the self-contained HTML page
  (Bokeh), with ``plots`` (the task stream and readings), ``waterfall`` (the trace browser)
  and ``labels`` (names, colours, times and sizes as people read them); ``chrome``: Chrome
  Trace Event JSON for Perfetto; ``progress``: the reading's bar on a terminal.
- ``private_files``: files the command writes, owner-only and never half written.

May import: only ``naming`` and ``errors`` at the top: the report reads files anywhere,
without Dask, the SDK or a running cluster.
"""
