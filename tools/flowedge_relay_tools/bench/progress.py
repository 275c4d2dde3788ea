# SPDX-License-Identifier: Apache-2.0
"""A small stderr progress bar for long bench runs (any subcommand may use it).

    with Progress("overload", total=15) as bar:
        for point in points:
            bar.update(label=f"load {load} {policy}")   # redraws at most every 0.1 s
            ...
            bar.advance()

It writes only to stderr (stdout keeps the readable table), redraws in place with a carriage
return on a terminal and prints plain lines (at most one per `log_every_s`) when stderr is not a
terminal, so CI logs stay short. `quiet=True` silences it.
"""

from __future__ import annotations

import sys
import time

WIDTH = 24


class Progress:
    def __init__(
        self,
        title: str,
        total: float,
        *,
        unit: str = "",
        stream=None,
        quiet: bool = False,
        log_every_s: float = 5.0,
    ) -> None:
        self.title, self.total, self.unit = title, max(float(total), 1e-9), unit
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.done = 0.0
        self.label = ""
        self._t0 = time.monotonic()
        self._last_draw = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._min_period = 0.1 if self._tty else log_every_s

    def __enter__(self) -> Progress:
        self.draw(force=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, done: float | None = None, label: str | None = None) -> None:
        if done is not None:
            self.done = min(float(done), self.total)
        if label is not None:
            self.label = label
        self.draw()

    def advance(self, n: float = 1.0, label: str | None = None) -> None:
        self.update(self.done + n, label)

    def line(self) -> str:
        frac = self.done / self.total
        filled = int(round(frac * WIDTH))
        elapsed = time.monotonic() - self._t0
        eta = elapsed * (1 - frac) / frac if frac > 0.01 else float("nan")
        eta_txt = f"eta {eta:4.0f}s" if eta == eta else "eta    ?"
        count = f"{self.done:g}/{self.total:g}{self.unit}"
        return (
            f"[{self.title}] |{'#' * filled}{'.' * (WIDTH - filled)}| {frac * 100:3.0f}% "
            f"{count} {elapsed:4.0f}s {eta_txt} {self.label}"
        )

    def draw(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self._min_period:
            return
        self._last_draw = now
        if self._tty:
            self.stream.write("\r" + self.line()[:119].ljust(119))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.quiet:
            return
        self.draw(force=True)
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
        self.quiet = True  # idempotent


def progress_bar(title: str, total: float, **kwargs) -> Progress:
    """Alias reading well at call sites: `with progress_bar("calibrate", n) as bar: ...`."""
    return Progress(title, total, **kwargs)
