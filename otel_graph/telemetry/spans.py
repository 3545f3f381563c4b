"""Task records -> spans: the attributes of a task span, and two ways to emit it.

A task span is named after the task prefix (``dask.utils.key_split``), never the key,
so span names stay few: a key with no ``-`` is a prefix of its own, so past the
process's first ``metrics.MAX_METRIC_PREFIXES`` prefixes, spans are named
``(other prefixes)`` (``dask.task.prefix`` still says which). It carries:

=============================  =====================================================
``dask.task.key``              the key as a readable string
``dask.task.prefix``           the prefix (also the span name)
``dask.worker.id``             thread ident (sync, threads) or worker pid (processes)
``thread.id``                  the thread that ran the task
``dask.task.nbytes``           ``dask.sizeof`` of the result
``dask.task.type``             the result's type name
``dask.task.dependencies``     dependency keys, at most :data:`~otel_graph.naming.MAX_DEPENDENCIES`
``dask.task.dependency_count`` all dependencies, even past that bound
``dask.task.dependent_count``  tasks that consume this one's result
``code.function.name``         the function; for fused tasks and ``toolz.compose`` the inner ones,
                               innermost first, ``, ``-joined
``error.type``                 failed tasks only, with an ``exception`` event and ERROR status
=============================  =====================================================

Emitters (each returns the new span's context, for children such as a task's phases):

* :class:`ApiEmitter` goes through ``tracer.start_span``: any provider, including
  one the application configured, receives the spans the ordinary way.
* :class:`DirectEmitter` builds the SDK's ``ReadableSpan`` itself and hands it to the
  provider's span processors. It is used only for providers otel_graph built, and
  costs a tenth of the API path, which is what makes a span per task affordable.
"""

from __future__ import annotations

import random
import weakref
from functools import lru_cache, partial
from itertools import islice
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dask._task_spec import NestedContainer, Task, _execute_subgraph, _identity_cast
from dask.utils import funcname
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags
from toolz.functoolz import Compose

from otel_graph.naming import INT64_MAX, MAX_DEPENDENCIES, MAX_KEY_CHARS, OTHER_PREFIXES, key_to_str, safe_text, task_prefix

from otel_graph.telemetry.events import AT_END, AT_ERROR, AT_KEY, AT_NBYTES, AT_START, ErrorInfo, TaskEvent
from otel_graph.telemetry.policy import Aggregate

if TYPE_CHECKING:
    from otel_graph.telemetry.metrics import Run

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


@lru_cache(maxsize=4096)
def _worker_id(worker: int | str) -> str:
    return str(worker)


# Distributed reports a result type's __qualname__, which may be set to any string, a
# lone surrogate included; there are few distinct types.
_type_text = lru_cache(maxsize=1024)(safe_text)

# A key is rendered once as its own span's key and again in each dependent's list.
_rendered = lru_cache(maxsize=1 << 14)(key_to_str)


def key_text(key: Any) -> str:
    """:func:`otel_graph.naming.key_to_str`, remembered; a short ASCII string is its own text,
    with nothing remembered: most keys are, and many are seen once (a delayed call's)."""
    if type(key) is str and len(key) <= MAX_KEY_CHARS and key.isascii():
        return key
    return _rendered(key)


def run_attributes(ev: Any, prefix: str) -> dict[str, Any]:
    """What every task span says of its run, on any scheduler: key, prefix, where, and its outcome."""
    attributes: dict[str, Any] = {
        "dask.task.key": key_text(ev.key),
        "dask.task.prefix": prefix,
        "dask.worker.id": _worker_id(ev.worker),
        "thread.id": ev.thread,
    }
    if ev.error is None:
        attributes["dask.task.type"] = _type_text(ev.type_name)
        if 0 <= ev.nbytes <= INT64_MAX:
            attributes["dask.task.nbytes"] = ev.nbytes
    else:
        attributes["error.type"] = ev.error.type_name
    return attributes


def dependency_keys(deps: Collection[Any]) -> tuple[str, ...]:
    """``dask.task.dependencies``: the keys as text, sorted; past :data:`~otel_graph.naming.MAX_DEPENDENCIES`, a
    bounded sample of them rather than 10^4 keys rendered per span."""
    shown = deps if len(deps) <= MAX_DEPENDENCIES else islice(deps, MAX_DEPENDENCIES)
    return tuple(sorted(map(key_text, shown)))


#: What the graph and Dask's state say of a task, for its span: its dependencies (a collection
#: of keys), how many tasks depend on it (None: no state to say), its functions' names.
TaskFacts = tuple[Collection[Any], "int | None", "str | None"]


def task_facts(key: Any, graph: Mapping | None, state: Mapping | None, *, keep: bool = False,
               known: dict[int, str] | None = None) -> TaskFacts:
    """The task's :data:`TaskFacts`. With ``keep``, in plain values, which keep neither the graph
    nor Dask's state alive (its dependencies as a tuple, not Dask's own set). ``known``: a dict
    shared by the calls for one graph's tasks, while it is alive (:class:`_FunctionNames`)."""
    if state is None:
        deps: Collection[Any] = ()
        dependents = None
    else:
        deps = state["dependencies"].get(key, ())
        dependents = len(state["dependents"].get(key, ()))
        if keep:
            deps = tuple(deps) if deps else ()
    return deps, dependents, None if graph is None else function_names(graph.get(key), known=known)


def task_attributes(ev: TaskEvent, prefix: str, graph: Mapping | None, state: Mapping | None) -> dict[str, Any]:
    return attributes_of(ev, prefix, task_facts(ev.key, graph, state))


def attributes_of(ev: TaskEvent, prefix: str, facts: TaskFacts) -> dict[str, Any]:
    """:func:`task_attributes`, given the task's :data:`TaskFacts`."""
    attributes = run_attributes(ev, prefix)
    deps, dependents, functions = facts
    if dependents is not None:
        attributes["dask.task.dependency_count"] = len(deps)
        attributes["dask.task.dependent_count"] = dependents
        if deps:
            attributes["dask.task.dependencies"] = dependency_keys(deps)
    if functions:
        attributes["code.function.name"] = functions
    return attributes


def aggregate_attributes(agg: Aggregate) -> dict[str, Any]:
    return {
        "dask.task.prefix": agg.prefix,
        "dask.task.count": agg.count,
        "dask.task.aggregate": True,
        "dask.task.duration.sum": agg.duration_sum_ns / 1e9,
        "dask.task.duration.min": agg.duration_min_ns / 1e9,
        "dask.task.duration.max": agg.duration_max_ns / 1e9,
        "dask.task.duration.mean": agg.duration_sum_ns / agg.count / 1e9,
        "dask.task.nbytes": min(agg.nbytes, INT64_MAX),
    }


def recovered_attributes(*, prefix: str, count: int, duration_s: float, worker: str) -> dict[str, Any]:
    """Tasks whose telemetry their worker took with it, as the scheduler counted them."""
    return {
        "dask.task.prefix": prefix,
        "dask.task.count": count,
        "dask.task.aggregate": True,
        "dask.task.recovered": True,
        "dask.task.duration.sum": duration_s,
        "dask.task.duration.mean": duration_s / count,
        "dask.worker.id": worker,
    }


def exception_event_attributes(error: ErrorInfo) -> dict[str, str]:
    return {
        "exception.type": error.type_name,
        "exception.message": error.message,
        "exception.stacktrace": error.stacktrace,
    }


#: The status of a span that did not fail; the encoders know it by identity.
UNSET_STATUS = Status(StatusCode.UNSET)


def _status(error: ErrorInfo | None) -> Status:
    if error is None:
        return UNSET_STATUS
    return Status(StatusCode.ERROR, f"{error.type_name}: {error.message}"[:1024])


class ApiEmitter:
    """Spans through the tracer API; works with any TracerProvider."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def emit(self, *, parent: trace.Span, name: str, start_ns: int, end_ns: int,
             attributes: dict[str, Any], error: ErrorInfo | None = None) -> trace.SpanContext:
        context = trace.set_span_in_context(parent)
        span = self._tracer.start_span(name, context=context, kind=SpanKind.INTERNAL,
                                       attributes=attributes, start_time=start_ns)
        if error is not None:
            span.add_event("exception", exception_event_attributes(error), timestamp=end_ns)
            span.set_status(_status(error))
        span.end(end_time=end_ns)
        return span.get_span_context()


class DirectEmitter:
    """ReadableSpans handed straight to an SDK provider's processors (providers we built)."""

    #: emit() takes the span id given out while the task ran (otel_graph.telemetry.task_context).
    sets_span_ids = True

    def __init__(self, provider: Any, scope: Any) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.trace import SpanContext

        from otel_graph.export.sdk_internals import follows_parent, processors_behind, span_processor

        self._processor = span_processor(provider)
        #: The provider's processor, where its list of processors can be read (each span asks
        #: whether that list changed: one attribute read, the release's layout checked here once).
        self._multi = self._processor if self._processor is not None and processors_behind(self._processor) \
            is not None else None
        self._resource = provider.resource
        self._scope = scope
        self._readable = ReadableSpan
        #: The SDK's span event class (a compute's root span makes its events with it too).
        self.event = Event
        #: What a root span is made with (otel_graph.telemetry.compute_span), as the provider's tracer would.
        self.sampler, self.id_generator = provider.sampler, provider.id_generator
        #: The id generator is the SDK's RandomIdGenerator itself (a root span draws its ids as it does).
        self.draws_ids = type(provider.id_generator) is RandomIdGenerator
        #: Whether its trace ids are random (W3C's flag for a root span says so); a generator
        #: that cannot say is taken as not random.
        try:
            self.random_trace_ids = bool(getattr(self.id_generator, "is_trace_id_random", bool)())
        except Exception:  # noqa: BLE001 - an application's generator must not stop instrumenting
            self.random_trace_ids = False
        #: The sampler is the SDK's default: a root span's decision needs no call to it.
        self.follows_parent = follows_parent(provider.sampler)
        self._checked: tuple[Any, bool] = (None, False)
        self._encoding: tuple[Any, Any] = (None, None)  # (processors, the encoder's parts or None)
        self._span_context = SpanContext
        self._random = random.Random()
        #: (the last parent, its context), one attribute: emit() runs in more than one thread.
        self._parent: tuple[Any, Any] = (None, None)
        #: The span limits the provider applies to spans it starts (OTEL_*_LIMIT), applied
        #: here too; None when nothing otel_graph makes can reach them (the defaults).
        self._limits = _biting_limits()
        if self._limits is None:
            self.encoding = self._encoder  # type: ignore[method-assign]

    def emit(self, *, parent: trace.Span, name: str, start_ns: int, end_ns: int,
             attributes: dict[str, Any], error: ErrorInfo | None = None, span_id: int = 0) -> Any:
        parent_context = self._context_of(parent)
        span_id = span_id or self._random.getrandbits(64) or 1
        context = self._span_context(parent_context.trace_id, span_id, False, parent_context.trace_flags,
                                     parent_context.trace_state)
        events = ()
        if error is not None:
            events = (self.event("exception", exception_event_attributes(error), end_ns),)
        self._hand_over(name, context, parent_context, start_ns, end_ns, attributes, events, _status(error))
        return context

    def _context_of(self, parent: trace.Span) -> Any:
        """``parent``'s span context: spans come in runs of one compute, so it is read once a run."""
        last, parent_context = self._parent
        if parent is not last:
            parent_context = parent.get_span_context()
            self._parent = (parent, parent_context)
        return parent_context

    def queues_only(self) -> bool:
        """Whether every processor on the provider is one of otel_graph's, which queue a span
        and return: then spans may be made in the user's thread, and a root span needs no
        ``on_start``. Asked per compute (an application may add a processor of its own),
        answered from the last answer while the provider's list is the same object."""
        multi = self._multi
        if multi is None:
            return False
        current = multi._span_processors
        checked = self._checked  # one read: computes begin in several threads
        if current is not checked[0]:
            checked = self._checked = (current, bool(current) and all(getattr(p, "never_blocks", False)
                                                                     for p in current))
        return checked[1]

    def _encoder(self) -> tuple[Any, _Encoding] | None:
        """(processors, what encodes for them) while every processor takes encoded spans, else None.
        Asked per span (a cluster's ledger may start reading delivered spans), answered from
        the last answer while the provider's processors are the same, and its memo not too
        big (a new one then: task keys would grow it without end)."""
        multi = self._multi
        if multi is None:
            return None
        current = multi._span_processors
        known, parts = self._encoding
        if parts is not None and len(parts.memo.pairs) > _MEMO_PAIRS:
            known = None  # a new memo: task keys would grow it without end
        if current is not known:
            parts = None
            if current and all(getattr(p, "takes_encoded", False) for p in current):
                parts = _Encoding(self._resource, self._scope)
            self._encoding = (current, parts)
        if parts is None:
            return None
        for processor in current:
            if not processor.takes_encoded:
                return None
        return current, parts

    def encoding(self) -> tuple[Any, _Encoding] | None:
        """Where spans are encoded as they end: (the processors now, what encodes for them), for
        :meth:`encoded_batch`; None where they are not, or where a span limit bites. (Where none
        bites, the instance's own ``encoding`` is :meth:`_encoder` itself: a call fewer.)"""
        return None if self._limits is not None else self._encoder()

    def encoded_batch(self, encoding: tuple[Any, _Encoding] | None = None) -> EncodedBatch | None:
        """Somewhere to encode spans as they end (:meth:`EncodedBatch.add_tasks`, :meth:`EncodedBatch.add_task`,
        :meth:`EncodedBatch.add`), to queue them together (:meth:`EncodedBatch.queue`) to the processors
        of ``encoding`` (an earlier :meth:`encoding`'s, taken as it is; None: now's, and None where
        spans are not encoded as they end, or where a span limit bites)."""
        if encoding is None:
            encoding = self.encoding()
            if encoding is None:
                return None
        batch = EncodedBatch()  # list's own __init__: a Python one cost each compute a call
        batch.emitter, (batch.processors, batch.parts) = self, encoding
        return batch

    @staticmethod
    def _queue_encoded(processors: Any, encoded: tuple[bytes, int]) -> None:
        for processor in processors:
            processor.on_end_encoded(encoded)

    def hand_over(self, *, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
                  attributes: dict[str, Any], events: tuple[Any, ...], status: Status) -> None:
        """One finished span, cut to the span limits, to the provider's processors.

        Encoded here, once, when every processor queues it for an exporter of encoded
        chunks (:mod:`otel_graph.export.otlp_fast`): no ``ReadableSpan`` is made, nor encoded later.
        """
        self._hand_over(name, context, parent, start_ns, end_ns, attributes, events, status)

    def _hand_over(self, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
                   attributes: dict[str, Any], events: tuple[Any, ...], status: Status) -> None:
        # hand_over's body, called positionally once a task span: keywords cost a span ~0.3 µs.
        if self._limits is not None:
            attributes, events = _limited(self._limits, attributes, events, self.event)
        else:
            encoding = self._encoder()
            if encoding is not None:
                processors, parts = encoding
                encoded = _encoded(parts, name, context, parent, start_ns, end_ns, attributes, events, status)
                if encoded is not None:
                    self._queue_encoded(processors, encoded)
                    return
        self._processor.on_end(self._readable(
            name=name, context=context, parent=parent, resource=self._resource,
            attributes=attributes, events=events, kind=SpanKind.INTERNAL, status=status,
            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope,
        ))


#: (key, value) pairs the encoder of spans as they end remembers, at most (about 1 MB).
_MEMO_PAIRS = 4096


class EncodedBatch(list):  # type: ignore[type-arg]
    """Spans encoded as they ended, ``(entry, origin)``, for the processors it was made for
    (:meth:`DirectEmitter.encoded_batch`): :meth:`queue` hands them over with one lock round trip each."""

    __slots__ = ("emitter", "processors", "parts")

    emitter: DirectEmitter
    processors: Any
    parts: _Encoding

    def add(self, name: str, context: Any, parent: Any, start_ns: int, end_ns: int, attributes: dict[str, Any],
            events: tuple[Any, ...], status: Status) -> None:
        """A finished span, as :meth:`DirectEmitter.hand_over` takes it, encoded into this batch
        (or, where it cannot be encoded, handed over on its own). No span limit applies: a
        batch is only made where none bites (:meth:`DirectEmitter.encoded_batch`)."""
        encoded = _encoded(self.parts, name, context, parent, start_ns, end_ns, attributes, events, status)
        if encoded is None:
            if type(context) is tuple:  # a set-aside root's context, as a plain tuple of its fields
                context = span_context_of(context)
            self.emitter.hand_over(name=name, context=context, parent=parent, start_ns=start_ns, end_ns=end_ns,
                                   attributes=attributes, events=events, status=status)
        else:
            self.append(encoded)

    def add_tasks(self, parent: Any, tasks: Sequence[tuple[tuple[Any, ...], TaskFacts]],
                  label: Callable[[str], str | None], scheduler: str, encode: Callable[..., bytes]
                  ) -> tuple[list[Run], list[tuple[TaskEvent, str]]]:
        """Task records (TaskEvent's fields), each with its :data:`TaskFacts`,
        as task spans, children of the span whose context is ``parent`` (a SpanContext, or a tuple
        of its first five fields), in one pass:
        the tasks' runs, for :meth:`otel_graph.telemetry.metrics.TaskMetrics.record_runs`, and the tasks
        left out, ``(event, prefix)``.

        Each task is labelled ``label(prefix)`` (:meth:`~otel_graph.telemetry.metrics.TaskMetrics.label`),
        in order, failed ones too, and its span named by the label. One that succeeded is added
        as :meth:`add_task` adds it, its attributes ``encode(ev, prefix, facts, memo)``
        (:meth:`otel_graph.telemetry.task_encoding.TaskAttributeEncoder.encode`). Left out, for :meth:`DirectEmitter.emit` to make: failed
        tasks (their spans carry an exception event), and those whose attributes raised (the
        generic path logs the attribute and leaves it out)."""
        parts = self.parts
        memo, child_entry, origin = parts.memo, parts.child_entry, parts.origin
        span_id, make, append = self.emitter._random.getrandbits, TaskEvent._make, self.append
        runs: list[Run] = []
        left: list[tuple[TaskEvent, str]] = []
        # A record is read by position (events.AT_*), made a TaskEvent only if left out.
        for task, facts in tasks:
            prefix = task_prefix(task[AT_KEY])
            labelled = label(prefix)
            failed = task[AT_ERROR] is not None
            start, end = task[AT_START], task[AT_END]
            runs.append((labelled, scheduler, failed, end - start, task[AT_NBYTES]))
            if failed:
                left.append((make(task), prefix))
                continue
            try:  # add_task's body, inlined: a call a task cost a small compute's spans a tenth more
                entry = child_entry(parent, span_id(64) or 1, OTHER_PREFIXES if labelled is None else prefix,
                                    start, end, encode(task, prefix, facts, memo), memo)
            except Exception:  # noqa: BLE001 - made the generic way, which says what it left out
                left.append((make(task), prefix))
                continue
            append((entry, origin))
        return runs, left

    def add_task(self, parent: trace.Span, ev: TaskEvent, prefix: str, name: str, encode: Callable[..., bytes],
                 graph: Any, state: Any) -> bool:
        """The span of a task that succeeded, a child of ``parent`` named ``name`` (status UNSET,
        no events), encoded into this batch, its attributes ``encode(ev, prefix, graph, state,
        memo)`` (:class:`otel_graph.telemetry.task_encoding.TaskAttributeEncoder`): no attribute dict, no
        span context, no ``ReadableSpan``. False, having added nothing, for a failed task or
        attributes that raised: :meth:`DirectEmitter.emit` then makes it."""
        if ev.error is not None:
            return False
        parts = self.parts
        memo = parts.memo
        try:
            entry = parts.child_entry(self.emitter._context_of(parent), self.emitter._random.getrandbits(64) or 1,
                                      name, ev.start_ns, ev.end_ns, encode(ev, prefix, graph, state, memo), memo)
        except Exception:  # noqa: BLE001 - made the generic way, which says what it left out
            return False
        self.append((entry, parts.origin))
        return True

    def queue(self) -> None:
        if self:
            try:
                for processor in self.processors:
                    processor.on_end_encoded_many(self)
            finally:  # refused, they are counted once (by the caller), never queued again
                self.clear()


def span_context_of(fields: tuple[Any, ...]) -> trace.SpanContext:
    """The SpanContext of a plain tuple of its first five fields (a set-aside root's context:
    :meth:`otel_graph.telemetry.compute_span.ComputeSpan.end_aside`)."""
    trace_id, span_id, remote, flags, state = fields
    return trace.SpanContext(trace_id, span_id, remote, TraceFlags(flags), state)


def _encoded(parts: _Encoding, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
             attributes: dict[str, Any], events: tuple[Any, ...], status: Status) -> tuple[bytes, int] | None:
    """A finished INTERNAL span encoded as it is queued, ``(entry, origin)``; None where it cannot
    be encoded: as a ReadableSpan, the exporter then refuses it alone."""
    try:
        if status is UNSET_STATUS and not events:
            return parts.simple_entry(context, parent, name, start_ns, end_ns, attributes, parts.memo), parts.origin
        return parts.span_entry(context, parent, name, SpanKind.INTERNAL, start_ns, end_ns, attributes, events, (),
                                status, parts.memo), parts.origin
    except Exception:  # noqa: BLE001
        return None


class _Encoding:
    """What encodes spans as they end, for one set of processors: the encoders, their memo,
    and the number of the spans' (resource, scope)."""

    __slots__ = ("span_entry", "simple_entry", "child_entry", "memo", "origin")

    def __init__(self, resource: Any, scope: Any) -> None:
        from otel_graph.export.otlp_fast import child_entry, new_memo, origin, simple_entry, span_entry

        self.span_entry, self.simple_entry, self.child_entry = span_entry, simple_entry, child_entry
        self.memo = new_memo()
        self.origin = origin(resource, scope)


#: More than any span otel_graph makes carries: limits at or above it change nothing.
_MOST_ATTRIBUTES = 128


def _biting_limits() -> Any:
    """The span limits of a provider otel_graph built (the SDK's ``SpanLimits()``, read from
    the ``OTEL_*_LIMIT`` variables, as that provider's were), or None where they cannot
    touch a span of ours."""
    from opentelemetry.sdk.trace import SpanLimits

    limits = SpanLimits()

    def under(value: int | None) -> bool:
        return value is not None and value < _MOST_ATTRIBUTES

    if limits.max_span_attribute_length is None and limits.max_attribute_length is None \
            and not any(under(v) for v in (limits.max_span_attributes, limits.max_events,
                                           limits.max_event_attributes)):
        return None
    return limits


def _limited(limits: Any, attributes: dict[str, Any], events: Sequence[Any], make_event: Any
             ) -> tuple[Any, Sequence[Any]]:
    """``attributes`` and ``events`` cut to ``limits`` as the SDK cuts a span it started
    (``Span.set_attributes``, ``Span.add_event``), with what was dropped counted."""
    from opentelemetry.attributes import BoundedAttributes

    bounded = BoundedAttributes(limits.max_span_attributes, attributes, immutable=True,
                                max_value_len=limits.max_span_attribute_length)
    if events:
        from opentelemetry.sdk.util import BoundedList

        events = BoundedList.from_seq(limits.max_events, [  # keeps the last, counts the rest, as Span does
            make_event(event.name, BoundedAttributes(limits.max_event_attributes, event.attributes, immutable=True,
                                                     max_value_len=limits.max_attribute_length), event.timestamp)
            for event in events])
    return bounded, events

