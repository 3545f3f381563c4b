"""dask.distributed: every task on every worker traced, under the client's compute span.

The work is split so that the scheduler, every cluster's bottleneck, does next to
nothing per task:

* :mod:`.client` (client process): the ``dask.compute`` span per ``get``/``compute``/
  ``persist``, its context put on every task as an annotation (:mod:`.propagation`),
  and the plugins registered on the cluster;
* :mod:`.worker` (each worker process): task spans, with transfer and spill phases,
  task metrics and resource readings, built off the event loop and exported by the
  worker itself;
* :mod:`.scheduler` (scheduler process): gauges read at export time, one event per
  graph and per lost worker, and a tally per finished task (:mod:`.ledger`: what a
  worker killed outright took with it);
* :mod:`.adapter`: the only module that reads distributed's internals;
* :mod:`.preload`: ``dask scheduler|worker --preload otel_graph``.
"""
