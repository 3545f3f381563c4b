"""A progress bar on the terminal for ``otel-graph report``'s reading of large files.

>>> bar = Progress(2_000_000, label="reading", enabled=False)
>>> bar(1_000_000); bar.close()  # disabled: nothing is written
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Bytes read of all files, as a bar on stderr redrawn every half second, where stderr is a
    terminal (or ``enabled=True``); piped or redirected, nothing is written.

    ``reading [###########.........................]  31%  33/104 MB``
    """

    WIDTH = 36

    def __init__(self, total: int, *, label: str, enabled: bool | None = None) -> None:
        self._total, self._label, self._done, self._shown = max(total, 1), label, 0, 0.0
        self._enabled = sys.stderr.isatty() if enabled is None else enabled

    def __call__(self, count: int) -> None:
        self._done += count
        now = time.monotonic()
        if self._enabled and now - self._shown >= 0.5:
            self._shown = now
            self._draw()

    def _draw(self) -> None:
        share = min(self._done / self._total, 1.0)
        filled = int(share * self.WIDTH)
        sys.stderr.write(f"\r{self._label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {100 * share:3.0f}%  "
                         f"{self._done / 1e6:.0f}/{self._total / 1e6:.0f} MB")
        sys.stderr.flush()

    def close(self) -> None:
        if self._enabled and self._shown:
            self._done = self._total
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()
