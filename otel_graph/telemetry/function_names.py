"""The functions a task calls, by name: ``code.function.name`` on its span.

A graph node names no function of its own when Dask fused several tasks into it, or
wrapped them in ``toolz.compose``: :data:`function_names` walks the node and names each
function it reaches, innermost first, at most :data:`MAX_FUNCTION_NAMES`. It runs once
per task span, so names are cached by function, and a graph's callables looked up by
identity first.

>>> from dask._task_spec import Task
>>> function_names(Task("x", sum, [1, 2]))
'sum'
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from functools import partial
from typing import Any

from dask._task_spec import NestedContainer, Task, _execute_subgraph, _identity_cast
from dask.utils import funcname
from toolz.functoolz import Compose

from otel_graph.naming import safe_text

MAX_FUNCTION_NAMES = 16
#: Partials of partials looked through to name the function at the bottom.
_MAX_PARTIALS = 32


class _FunctionNames:
    """The functions a graph node calls, innermost first: fused nodes hold several.

    Fusion comes in two shapes: ``Task`` arguments that are themselves tasks (the
    legacy ``dask.optimization.fuse``), and ``_execute_subgraph`` over an inner graph
    (``fuse_linear_task_spec``). Both are walked; containers are looked through.
    ``funcname`` is slow (it unwraps partials and curries), so names are cached per function.
    """

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}
        #: id(callable) -> (a weak reference to it, its name): a graph's blocks share their
        #: callables, so most lookups end here. Weak, so that no callable is kept alive.
        self._seen: dict[int, tuple[Any, str]] = {}

    def __call__(self, node: Any, *, known: dict[int, str] | None = None) -> str | None:
        """``known``: names by callable id, for the nodes of one graph, which keeps them alive
        meanwhile (its blocks share callables that the weak cache cannot hold: NumPy's).
        Never raises: a node that cannot be walked (the walk reads user data: nested tasks,
        containers) is named None, and its span says nothing of its code."""
        if not isinstance(node, Task):
            return None
        names: list[str] = []
        try:
            self._visit(node, names, 0, known=known)
        except Exception:
            return None
        return ", ".join(names) or None

    def _name(self, func: Any, *, known: dict[int, str] | None) -> str:
        # A partial is named by its function (_named): known by that one's identity, it is found
        # in the cache, where a graph's partials, made anew each compute, never were. Bounded: a
        # partial can be made its own function (its __setstate__ allows it).
        given, unwrapped = func, 0
        while type(func) is partial and unwrapped < _MAX_PARTIALS:
            func, unwrapped = func.func, unwrapped + 1
        if known is not None:
            name = known.get(id(func))
            if name is not None:
                if given is not func:  # the partial too: _visit finds it without this call
                    known[id(given)] = name
                return name
        seen = self._seen.get(id(func))
        if seen is not None and seen[0]() is func:  # not another callable since given its id
            name = seen[1]
            if known is not None and given is not func:
                known[id(given)] = name
            return name
        name = self._named(func)
        if known is not None:
            known[id(func)] = known[id(given)] = name
        if type(func).__weakrefoffset__:  # a weak reference can be made to it
            try:
                ref = weakref.ref(func)
            except TypeError:
                return name
            if len(self._seen) >= 10_000:
                self._seen.clear()
            self._seen[id(func)] = (ref, name)
        return name

    def _named(self, func: Any) -> str:
        # Keyed by the code's identity as text, never by the callable: a bound method or a
        # closure in the cache would keep the user's objects (a model, a dataset) alive. Partials
        # are unwrapped already (_name).
        module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
        if not (isinstance(module, str) and isinstance(qualname, str)):
            return safe_text(funcname(func))
        key = (module, qualname, type(func))
        name = self._names.get(key)
        if name is None:
            name = safe_text(funcname(func))
            if len(self._names) < 10_000:
                self._names[key] = name
        return name

    def _visit(self, value: Any, names: list[str], depth: int, *, known: dict[int, str] | None) -> None:
        # Only tasks and containers can hold functions: other values are not visited at all
        # (a call each cost an array reduction's spans a third of their making).
        if len(names) >= MAX_FUNCTION_NAMES or depth > 32:
            return
        if isinstance(value, Task):
            # Any, not Task.func's Callable: a toolz Compose's fields are read below (toolz is untyped,
            # so ``type(func) is Compose`` narrows nothing). A bare local annotation: no runtime cost.
            func: Any
            func, args = value.func, value.args
            if func is _execute_subgraph and args and (type(args[0]) is dict or isinstance(args[0], Mapping)):
                for inner in args[0].values():
                    if isinstance(inner, _HOLDERS):
                        self._visit(inner, names, depth + 1, known=known)
                return
            for arg in args:
                if isinstance(arg, _HOLDERS):
                    self._visit(arg, names, depth + 1, known=known)
            if value.kwargs:
                for arg in value.kwargs.values():
                    if isinstance(arg, _HOLDERS):
                        self._visit(arg, names, depth + 1, known=known)
            # Containers (a List node, or the plain Task that builds one) are structure, not code.
            # A plain Task is none: known without NestedContainer's isinstance, Python code (an ABC).
            if (type(value) is Task or not isinstance(value, NestedContainer)) and func is not _identity_cast:
                try:
                    if type(func) is Compose:  # toolz.compose (Dask's reductions): the functions it chains
                        for inner in (func.first, *func.funcs)[:MAX_FUNCTION_NAMES - len(names)]:
                            names.append(self._name(inner, known=known))
                    else:
                        # A callable this graph named already (a block's, shared by its siblings):
                        # _name's first look, without the call.
                        name = None if known is None else known.get(id(func))
                        names.append(self._name(func, known=known) if name is None else name)
                except Exception:
                    return
        else:  # a list or a tuple
            for item in value:
                if isinstance(item, _HOLDERS):
                    self._visit(item, names, depth + 1, known=known)


#: What may hold a function to name: a task, or a container of them.
_HOLDERS = (Task, list, tuple)


function_names = _FunctionNames()
