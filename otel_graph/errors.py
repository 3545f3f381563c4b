"""The errors otel_graph raises to its caller: light, so that importing the package stays so."""

from __future__ import annotations


class ConfigurationError(ValueError):
    """A setting has a value otel_graph cannot use; the message names it and what is accepted."""


# Named by its public path in tracebacks (``otel_graph.ConfigurationError: ...``), and pickled so.
ConfigurationError.__module__ = "otel_graph"
