"""dask.distributed: every task on every worker traced, under the client's compute span.

The work is split so that the scheduler, every cluster's bottleneck, does next to
nothing per task:

* :mod:`.client` (client process): the ``dask.compute`` span per ``get``/``compute``/
  ``persist``, its context sent to the scheduler ahead of the graph and handed to the
  workers with the tasks (:mod:`.propagation`, in a :mod:`.note` of the trace context,
  span budget and caller's clock: :mod:`.clock`), nothing added to the graph;
  ``distributed.span`` blocks as spans (:mod:`.spans`); :mod:`.membership`: the
  plugins registered on the cluster, and the cluster's events; :mod:`.bounded`: calls
  on the cluster made with a deadline;
* :mod:`.worker` (each worker process): the plugin; :mod:`.task_spans`: task spans,
  with transfer and spill phases, and task metrics, built off the event loop and
  exported by the worker itself; :mod:`.inside_tasks`: the task's span current while it
  runs, and the spans its code makes put on the caller's timeline; :mod:`.process`: what
  the process shares (delivery accounts, SIGTERM, its SDK, spill counters);
* :mod:`.scheduler` (scheduler process): gauges read at export time
  (:mod:`.scheduler_gauges`), one event per graph, per compute and per lost worker, and
  a tally per finished task (:mod:`.ledger`: what a worker killed outright took with it;
  :mod:`.compute_totals`: each compute's failed tasks and result bytes); each task's
  context handed to its worker; distributed's fine performance metrics as counters
  (:mod:`.fine_metrics`);
* :mod:`.adapter`: the only package that reads distributed's internals (one module per side);
* :mod:`.preload`: ``dask scheduler|worker --preload otel_graph``.

A worker's finished runs become spans and metrics with :mod:`otel_graph.telemetry`'s parts
(the span budget, span attributes, a background thread's passes), off the event loop.

May import: :mod:`otel_graph.telemetry`, :mod:`otel_graph.readings`, :mod:`otel_graph.export`
and the shared modules at the top. ``distributed`` is imported where it is used, never when
the package is: the local schedulers' users need not have it.
"""
