"""The package's shape: concern packages importing downward only, no cycle, no module too long.

The layout (each package's ``__init__`` docstring says the same in words):

- at the top, the public API and the command (``otel_graph``, ``instrumentation``,
  ``instrumentor``, ``cli``, ``demo``): they may import anything, and nothing imports them;
- beside them, what every part shares (``config``, ``conventions``, ``errors``, ``naming``,
  ``_version``): any module may import these, and they import only one another;
- the concern packages, each importing only those :data:`MAY_IMPORT` names for it.

Every ``import`` and ``from ... import`` statement in ``otel_graph`` counts, those inside
functions too: an import put off to call time still says one module needs the other. A
module imported is the longest name of the package's own modules it starts with (``from
otel_graph.cluster import adapter`` imports ``otel_graph.cluster.adapter``). A cycle is
reported as the group of modules that reach one another (a strongly connected component).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import otel_graph

PACKAGE = Path(otel_graph.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _own(name: str, modules: dict[str, Path]) -> str | None:
    """The package's module that importing ``name`` loads (None: not one of ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its code."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = _own(target, modules)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == {("a", "b", "c")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_function_level_imports_and_modules_from_packages_count() -> None:
    graph = import_graph()
    # process.py imports process_state only inside functions (at SIGTERM, at start-up).
    assert "otel_graph.telemetry.process_state" in graph["otel_graph.cluster.process"]
    # `from otel_graph.cluster import adapter` is the adapter module, not the package.
    assert "otel_graph.cluster.adapter" in graph["otel_graph.cluster.client"]


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == set()


SHARED = frozenset({"config", "conventions", "errors", "naming", "_version"})
#: Each concern package and what else it may import, as its ``__init__`` docstring says: data
#: flows from Dask's schedulers (capture, cluster) through telemetry to export; readings and
#: the report stand alone, the report without even the configuration.
MAY_IMPORT = {
    "cluster": {"telemetry", "readings", "export", *SHARED},
    "capture": {"telemetry", "readings", "export", *SHARED},
    "telemetry": {"readings", "export", *SHARED},
    "readings": {"config", "conventions", "errors"},
    "export": {"config", "errors", "naming"},
    "report": {"naming", "errors"},
}
MAX_LINES = 500


def _place(module: str) -> str:
    """A module's package (``telemetry``), or its own name if it sits at the top (``config``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layering_errors(graph: dict[str, set[str]]) -> list[str]:
    errors = []
    for module, imported in sorted(graph.items()):
        place = _place(module)
        for target in sorted(imported):
            goes_to = _place(target)
            if place in SHARED:
                allowed = goes_to in SHARED
            elif place in MAY_IMPORT:
                allowed = goes_to == place or goes_to in MAY_IMPORT[place]
            else:  # the API and the command
                allowed = True
            if not allowed:
                errors.append(f"{module} imports {target}")
    return errors


def test_layering_errors_are_found() -> None:
    graph = {"otel_graph.export.sdk": {"otel_graph.telemetry.tracker", "otel_graph.config"},
             "otel_graph.naming": {"otel_graph.report.text"},
             "otel_graph.report.text": {"otel_graph.cli", "otel_graph.config", "otel_graph.report.analysis"},
             "otel_graph.cli": {"otel_graph.report.text", "otel_graph.cluster.client"}}
    assert layering_errors(graph) == ["otel_graph.export.sdk imports otel_graph.telemetry.tracker",
                                      "otel_graph.naming imports otel_graph.report.text",
                                      "otel_graph.report.text imports otel_graph.cli",
                                      "otel_graph.report.text imports otel_graph.config"]


def test_concern_packages_import_downward_only() -> None:
    assert layering_errors(import_graph()) == []


def test_every_package_has_its_place_and_says_what_it_may_import() -> None:
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == set(MAY_IMPORT)
    for package in MAY_IMPORT:
        doc = (PACKAGE / package / "__init__.py").read_text(encoding="utf-8")
        assert doc.startswith('"""') and "May import" in doc, package


def test_no_module_too_long() -> None:
    long = {name: lines for name, path in _modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_the_report_reads_files_without_dask_or_the_sdk() -> None:
    code = ("import sys, otel_graph.cli, otel_graph.report.text, otel_graph.report.html, otel_graph.report.chrome; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed', 'opentelemetry'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"
