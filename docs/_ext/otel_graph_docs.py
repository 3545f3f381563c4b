"""Reference pages generated from the code that defines them.

Three directives render :mod:`otel_graph.config`'s catalogues as tables, so that the
configuration page cannot drift from what ``load_settings`` reads:

* ``{otel-graph-variables}``: every ``OTEL_GRAPH_*`` variable, its keyword option of
  ``instrument_scheduler()`` and its meaning and default (``OWN_VARIABLES``, ``OPTIONS``);
* ``{otel-graph-standard-variables}``: the standard ``OTEL_*`` variables otel_graph reads or
  honours, and what it does with them (``STANDARD_VARIABLES``);
* ``{otel-graph-checked-variables}``: those whose values it checks, with what each accepts
  (``CHOICES``).

Four render :mod:`otel_graph.conventions`, the names the telemetry carries (the tests hold
it to what real computes emit), for the telemetry reference:

* ``{otel-graph-span} KIND``: one kind of span (``compute``, ``task``...): its name, where it
  is made, what it is, and its attributes and events;
* ``{otel-graph-events}``: every span event and its attributes;
* ``{otel-graph-metrics}``: every instrument, its kind, unit, attributes and meaning;
* ``{otel-graph-resource}``: the resource attributes set where otel_graph builds the SDK.

Text between backticks in the catalogues is shown as code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx

_CODE = re.compile(r"`([^`]+)`")


def _cell(text: str, *, code: bool) -> nodes.paragraph:
    if code:
        return nodes.paragraph("", "", nodes.literal(text, text)) if text else nodes.paragraph()
    parts: list[nodes.Node] = []
    for index, piece in enumerate(_CODE.split(text)):
        if piece:
            parts.append(nodes.literal(piece, piece) if index % 2 else nodes.Text(piece))
    return nodes.paragraph("", "", *parts)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, code_columns: int) -> nodes.table:
    """A table; the first ``code_columns`` columns of each row are shown as code."""
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    group += [nodes.colspec(colwidth=1) for _ in header[:-1]] + [nodes.colspec(colwidth=4)]
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    for parent, cells, code in ((head, header, 0), *((body, row, code_columns) for row in rows)):
        row = nodes.row()
        for index, text in enumerate(cells):
            entry = nodes.entry()
            entry += _cell(text, code=index < code) if parent is body else nodes.paragraph(text=text)
            row += entry
        parent += row
    return table


class OwnVariables(Directive):
    def run(self) -> list[Any]:
        from otel_graph.config import OPTIONS, OWN_VARIABLES

        option_of = {variable: option for option, variable in OPTIONS.items()}
        rows = [(name, option_of.get(name, ""), text) for name, text in OWN_VARIABLES.items()]
        return [_table(("variable", "option", "meaning and default"), rows, code_columns=2)]


class StandardVariables(Directive):
    def run(self) -> list[Any]:
        from otel_graph.config import STANDARD_VARIABLES

        return [_table(("variable", "what otel_graph does with it"), list(STANDARD_VARIABLES.items()),
                       code_columns=1)]


class CheckedVariables(Directive):
    def run(self) -> list[Any]:
        from otel_graph.config import CHOICES

        rows = [(name, ", ".join(f"`{choice}`" for choice in choices)) for name, choices in CHOICES.items()]
        return [_table(("variable", "accepted values"), rows, code_columns=1)]


def _codes(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _attribute_rows(names: Sequence[str]) -> list[tuple[str, str, str]]:
    from otel_graph.conventions import ATTRIBUTES

    return [(name, ATTRIBUTES[name].type, ATTRIBUTES[name].brief) for name in names]


class SpanKind(Directive):
    required_arguments = 1

    def run(self) -> list[Any]:
        from otel_graph.conventions import SPANS

        kind = self.arguments[0]
        if kind not in SPANS:
            raise self.error(f"no span kind {kind!r} in otel_graph.conventions.SPANS: {', '.join(SPANS)}")
        span = SPANS[kind]
        name = span.name if " " in span.name or "`" in span.name else f"`{span.name}`"
        out: list[Any] = [_cell(f"Name: {name}. On: {span.where}. {span.brief}", code=False),
                          _table(("attribute", "type", "meaning"), _attribute_rows(span.attributes),
                                 code_columns=2)]
        if span.events:
            out.append(_cell(f"Events: {_codes(span.events)} (see below).", code=False))
        return out


class Events(Directive):
    def run(self) -> list[Any]:
        from otel_graph.conventions import EVENTS

        rows = [(name, _codes(event.attributes), event.brief) for name, event in EVENTS.items()]
        return [_table(("event", "attributes", "meaning"), rows, code_columns=1)]


class Metrics(Directive):
    def run(self) -> list[Any]:
        from otel_graph.conventions import METRICS

        rows = [(name, metric.unit, metric.instrument, _codes(metric.attributes),
                 metric.brief + ("" if metric.where == "every scheduler" else f" ({metric.where})"))
                for name, metric in METRICS.items()]
        return [_table(("metric", "unit", "instrument", "attributes", "meaning"), rows, code_columns=2)]


class Resource(Directive):
    def run(self) -> list[Any]:
        from otel_graph.conventions import RESOURCE

        return [_table(("resource attribute", "value"), list(RESOURCE.items()), code_columns=1)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("otel-graph-span", SpanKind)
    app.add_directive("otel-graph-events", Events)
    app.add_directive("otel-graph-metrics", Metrics)
    app.add_directive("otel-graph-resource", Resource)
    app.add_directive("otel-graph-variables", OwnVariables)
    app.add_directive("otel-graph-standard-variables", StandardVariables)
    app.add_directive("otel-graph-checked-variables", CheckedVariables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
