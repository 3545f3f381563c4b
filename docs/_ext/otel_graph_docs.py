"""Reference pages generated from the code that defines them.

``{otel-graph-variables}`` renders every ``OTEL_GRAPH_*`` variable with its meaning and
default, from :data:`otel_graph.config.OWN_VARIABLES` (the text ``load_settings`` is
documented by), and every standard ``OTEL_*`` variable otel_graph checks itself, with
the values it accepts, from the same module. A variable added there appears here.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx


def _table(header: tuple[str, str], rows: list[tuple[str, str]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=2)
    table += group
    group += [nodes.colspec(colwidth=1), nodes.colspec(colwidth=3)]
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body
    for parent, cells in ((head, header), *((body, row) for row in rows)):
        row = nodes.row()
        for index, text in enumerate(cells):
            entry = nodes.entry()
            entry += nodes.paragraph("", "", nodes.literal(text, text) if index == 0 and parent is body
                                     else nodes.Text(text))
            row += entry
        parent += row
    return table


class OwnVariables(Directive):
    """Every ``OTEL_GRAPH_*`` variable, from ``otel_graph.config.OWN_VARIABLES``."""

    def run(self) -> list[Any]:
        from otel_graph.config import OWN_VARIABLES

        rows = [(name, text.replace("`", "")) for name, text in OWN_VARIABLES.items()]
        return [_table(("variable", "meaning and default"), rows)]


class CheckedVariables(Directive):
    """The standard ``OTEL_*`` variables otel_graph validates, with what each accepts."""

    def run(self) -> list[Any]:
        from otel_graph import config

        rows = [(name, "one of: " + ", ".join(choices)) for name, choices in config._CHOICES.items()]
        return [_table(("variable", "accepted values"), rows)]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("otel-graph-variables", OwnVariables)
    app.add_directive("otel-graph-checked-variables", CheckedVariables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
