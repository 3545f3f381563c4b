"""Files the ``otel-graph`` command writes: readable by their owner only, never half written.

A report or a trace export holds task keys and worker addresses, which may name data
and hosts: :func:`private_file` creates it 0600 whatever the umask, and, written beside
its path and renamed over it, a symlink planted there is replaced, not followed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[TextIO]:
    """``path`` opened for writing text, as a new file only its owner can read (0600).

    The text goes to a new file beside it (``mkstemp``: 0600 whatever the umask, never
    an existing file), renamed over ``path`` once complete: a symlink planted at
    ``path`` is replaced, not followed, and no reader sees half a file.
    """
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".otel-graph-", suffix=".tmp")
    except OSError as exc:  # name the file asked for, not the temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        # backslashreplace: a lone surrogate in a key (JSON allows it) must not stop the write.
        with open(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            yield out
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError) and exc.filename == temporary:  # `path` is a directory, ...
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
