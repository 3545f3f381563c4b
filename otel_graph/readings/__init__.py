"""Readings: CPU, memory and GPU as OpenTelemetry observable gauges.

``resources`` registers the process and host readings (psutil), ``gpu`` the NVIDIA ones
(NVML, through ``pynvml``, imported only when a GPU is asked for); ``guard`` is what every
reading's callback shares: a switch that silences it and failures counted, never raised into
the SDK's collection.

May import: only the shared modules at the top (``config``, ``conventions``, ``errors``).
Knows nothing of Dask or of how the readings are exported.
"""
