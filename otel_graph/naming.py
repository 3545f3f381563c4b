"""Names and limits every part agrees on: a task's key and prefix as telemetry writes them,
and the bounds that keep one hostile key, message or size from breaking an export.

Read by capture, telemetry and the cluster code on the hot path, and by the offline report,
which reads files without Dask: ``dask.utils.key_split`` is imported at the first prefix
that needs it, not with this module.

>>> key_to_str(("inc-1", 0))
"('inc-1', 0)"
>>> task_prefix(("load-8a6f31c2", 3))
'load'
"""

from __future__ import annotations

import functools
from typing import Any

#: Longest key string kept; longer keys are cut and marked, so a pathological key
#: cannot blow up every span and log line it appears in.
MAX_KEY_CHARS = 512
#: Longest task prefix: it names spans and labels metrics, and a key with no ``-`` in it
#: is its own prefix (a 10 MB string key would make a 20 MB export request).
MAX_PREFIX_CHARS = 128
#: Stands for the prefixes past a limit, in span names and aggregates: a key with no
#: ``-`` is its own prefix, and 10^5 of them must not become 10^5 names.
OTHER_PREFIXES = "(other prefixes)"
#: Longest exception message and stack trace kept on a failed task's span.
MAX_MESSAGE_CHARS = 4096
MAX_STACK_CHARS = 16384
#: Largest integer OTLP carries (int64): a lying ``__sizeof__`` can claim more, and one
#: such value would fail its whole export.
INT64_MAX = (1 << 63) - 1
#: Dependency keys a task span lists (``dask.task.dependencies``): a collection's tasks can
#: depend on 10^4 keys, and a span need not carry them all.
MAX_DEPENDENCIES = 32
#: Tableau's 20 colours without its reds (kept for failures), as ``#rrggbb``: a prefix's colour
#: in the report's plots and, picked by a hash of the prefix, its NVTX ranges in Nsight Systems.
PREFIX_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                  "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def _split(key: Any) -> str:
    """``dask.utils.key_split`` uncached, for keys that run once (see :func:`task_prefix`);
    this stand-in loads it at the first call and puts it in its own place."""
    global _split
    from dask.utils import key_split

    _split = getattr(key_split, "__wrapped__", key_split)
    return _split(key)


@functools.lru_cache(maxsize=4096)
def _split_name(name: Any) -> str:
    # For the names of tuple keys, which many keys of a graph share. Not dask's own cache of
    # 100,000: a name lives for one compute, and a loop of computes would fill that with ours
    # (~0.4 kB a name).
    return _split(name)


def safe_text(text: str) -> str:
    """``text``, made encodable as UTF-8: lone surrogates (from ``os.fsdecode``, a
    ``surrogateescape`` decode, or a hostile ``__str__``) are shown escaped.

    Every string that leaves for an exporter passes here once: protobuf refuses to
    encode a surrogate, and one such attribute would fail its whole export batch.

    >>> safe_text("ok-" + chr(0xDCFF))
    'ok-\\\\udcff'
    >>> safe_text("ünïcødé")
    'ünïcødé'
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def bounded_text(text: str, limit: int) -> str:
    if len(text) > limit:
        text = f"{text[:limit]}… [{len(text) - limit} more characters]"
    return safe_text(text)


def key_to_str(key: Any) -> str:
    """A readable string for a Dask key of any shape: str, bytes, nested tuples, unicode.

    Non-UTF-8 bytes are shown escaped rather than failing.

    >>> key_to_str(b"x-\\xff")
    'x-\\\\xff'
    >>> key_to_str(("a", ("b", 1), b"c"))
    "('a', ('b', 1), b'c')"
    """
    if type(key) is str:
        text = key
    elif isinstance(key, bytes):
        text = key.decode("utf-8", "backslashreplace")
    else:
        try:
            text = repr(key) if isinstance(key, tuple) else str(key)
        except Exception:  # a user key type with a broken __repr__/__str__
            text = f"<{type(key).__name__} key>"
    return bounded_text(text, MAX_KEY_CHARS)


def fold_prefix(prefix: str, seen: set[str], *, limit: int) -> str:
    """``prefix`` itself while ``seen`` holds it or fewer than ``limit`` others (it is added),
    else :data:`OTHER_PREFIXES`: the first ``limit`` prefixes keep their own label.

    >>> seen = set()
    >>> [fold_prefix(p, seen, limit=2) for p in ["a", "b", "c", "a"]]
    ['a', 'b', '(other prefixes)', 'a']
    """
    if prefix in seen:
        return prefix
    if len(seen) < limit:
        seen.add(prefix)
        return prefix
    return OTHER_PREFIXES


def task_prefix(key: Any) -> str:
    """``dask.utils.key_split``, but total: a key it cannot split (non-UTF-8 bytes) still gets a name.

    >>> task_prefix(("load-8a6f31c2", 3))
    'load'
    >>> task_prefix(b"\\xff-raw")
    'Other'

    A key as telemetry writes it (a tuple key as its repr; the report reads those) splits alike:

    >>> task_prefix("('rechunk-merge-9a8b7c6d', 0, 3)"), task_prefix("inc-5f3c"), task_prefix("x")
    ('rechunk-merge', 'inc', 'x')
    """
    # A collection's tuple keys share their name, which hits a cache (0.05 us); a string key
    # mostly runs once (delayed's 'inc-<uuid>'), and a miss costs twice an uncached split
    # (0.53 against 0.24 us), and 10^5 one-off keys held in a cache are ~18 MB that a loop
    # of small computes would grow by.
    split = _split
    while type(key) is tuple and key:
        key, split = key[0], _split_name
    if split is _split and type(key) is str:
        # key_split's answer for the usual one-off key, "name-<token>", in a few steps: a second
        # word that is not all letters ends the prefix at the first word (0.1 against 0.7 µs);
        # most tokens start with a digit, the rest (a uuid's 'd6770bcb') are read to their end.
        # Not for a 32-character head (key_split may call it "data"), nor one bounded_text would change.
        head, _, rest = key.partition("-")
        if head[:1].isalpha() and (not rest[:1].isalpha() or not rest.partition("-")[0].isalpha()) \
                and len(head) != 32 and len(head) <= MAX_PREFIX_CHARS and head.isascii():
            return head
    try:
        prefix = split(key)
    except Exception:
        return "Other"
    # Called per task in the tracker: the common short ASCII prefix skips bounded_text's calls.
    if len(prefix) > MAX_PREFIX_CHARS or not prefix.isascii():
        return bounded_text(prefix, MAX_PREFIX_CHARS)
    return prefix
