"""Progress for long builds: a bar with rate and ETA on a terminal, log lines otherwise."""

import sys
import time

from absl import logging


def _fmt_time(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Tracks a fraction of the input done, plus a token count for the rate."""

    def __init__(self, total: float, label: str = "build", stream=None,
                 log_every_s: float = 30.0, tty=None):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every_s = log_every_s
        self.start = time.monotonic()
        self.done = 0.0
        self.tokens = 0
        self._last = 0.0

    def update(self, done: float, tokens: int = 0):
        self.done = min(max(self.done, done), self.total)
        self.tokens += tokens
        now = time.monotonic()
        if now - self._last < (0.2 if self.tty else self.log_every_s):
            return
        self._last = now
        self._show(now)

    def line(self, now: float = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        frac = self.done / self.total
        eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        eta_s = _fmt_time(eta) if frac > 0 else "?"
        return (f"{self.label}: {100 * frac:5.1f}%  {self.tokens / elapsed / 1e6:.2f}M tokens/s  "
                f"elapsed {_fmt_time(elapsed)}  ETA {eta_s}")

    def _show(self, now: float):
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total)
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line(now)}  ")
            self.stream.flush()
        else:
            logging.info(self.line(now))

    def abandon(self):
        """The work stopped short: ends the bar's line, not at 100%, so that an error
        printed next stands on a line of its own."""
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
            self._last = 0.0

    def close(self):
        self.done = self.total
        self._show(time.monotonic())
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
