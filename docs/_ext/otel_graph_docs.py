"""Reference pages generated from the code that defines them.

Three directives render :mod:`otel_graph.config`'s catalogues as tables, so that the
configuration page cannot drift from what ``load_settings`` reads:

* ``{otel-graph-variables}``: every ``OTEL_GRAPH_*`` variable, its keyword option of
  ``instrument_scheduler()`` and its meaning and default (``OWN_VARIABLES``, ``OPTIONS``);
* ``{otel-graph-standard-variables}``: the standard ``OTEL_*`` variables otel_graph reads or
  honours, and what it does with them (``STANDARD_VARIABLES``);
* ``{otel-graph-checked-variables}``: those whose values it checks, with what each accepts
  (``CHOICES``).

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


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("otel-graph-variables", OwnVariables)
    app.add_directive("otel-graph-standard-variables", StandardVariables)
    app.add_directive("otel-graph-checked-variables", CheckedVariables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
