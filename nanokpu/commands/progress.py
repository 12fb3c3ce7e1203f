"""Progress of the long commands: stages with their elapsed time and, where the total is known,
a bar with an estimate of the time left.

On a terminal the bar is rich's live one; when stdout is not a terminal (CI logs, pipes, files)
every stage and every step is one plain line, so the logs stay readable; ``--quiet`` prints
nothing of it (the commands' summary lines are printed apart, as before).

>>> with Progress(quiet=args.quiet) as progress:
...     with progress.stage("yosys"):
...         ...
...     progress.start(total=12, what="points")
...     for task in tasks:
...         progress.advance(f"{task}: done")

A :class:`Progress` is also a ``progress`` callback of :func:`fpga.flow.synthesize` (it is
callable with one line).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

__all__ = ["Progress", "add_quiet", "duration"]


def add_quiet(parser) -> None:
    """Add ``--quiet`` / ``-q`` to a command's parser."""
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines or bar (the summary is still printed)")


def duration(seconds: float) -> str:
    """``seconds`` as a short human duration: ``42 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Stages, lines and a bar of one command run.

    Parameters
    ----------
    quiet : bool
        Print nothing.
    stream : file, optional
        Where the lines go (default: ``sys.stdout``).
    live : bool, optional
        Draw a live bar (rich); default: when ``stream`` is a terminal.

    Members
    -------
    t0 : float
        ``time.monotonic()`` at the start; :meth:`stamp` is measured from it.
    done, total : int
        Steps finished and steps in all (after :meth:`start`).
    """

    def __init__(self, *, quiet: bool = False, stream=None, live: bool | None = None):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.live = (isatty() if live is None else live) and not quiet
        self.t0 = time.monotonic()
        self.done = 0
        self.total = 0
        self._t_bar = self.t0
        self._bar = None   # rich.progress.Progress while a live bar is shown
        self._task = None

    # -- lines and stages ---------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def stamp(self) -> str:
        """The elapsed time as a line prefix: ``[  12.3s]``."""
        return f"[{self.elapsed():7.1f}s]"

    def line(self, text: str) -> None:
        """Print one line (above the bar when one is shown)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    __call__ = line   # a progress callback of the synthesis flows

    @contextmanager
    def stage(self, name: str):
        """A stage: a line as it starts, one with its duration as it ends (or fails)."""
        self.line(f"{self.stamp()} {name} ...")
        t = time.monotonic()
        try:
            yield self
        except BaseException:
            self.line(f"{self.stamp()} {name} failed after {duration(time.monotonic() - t)}")
            raise
        self.line(f"{self.stamp()} {name} done ({duration(time.monotonic() - t)})")

    # -- a bar of known total -----------------------------------------------------------------
    def start(self, total: int, what: str = "steps") -> None:
        """Begin counting ``total`` steps (a live bar on a terminal)."""
        self.total, self.done, self._t_bar = total, 0, time.monotonic()
        self._what = what
        if self.live and total:
            import rich.progress as rp
            from rich.console import Console
            self._bar = rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                                    rp.TimeElapsedColumn(), rp.TextColumn("left"), rp.TimeRemainingColumn(),
                                    console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)

    def estimate(self) -> float | None:
        """Seconds left at the mean pace of the steps done so far (None before the first)."""
        if not self.done or not self.total:
            return None
        return (time.monotonic() - self._t_bar) / self.done * max(self.total - self.done, 0)

    def advance(self, note: str = "", steps: int = 1) -> None:
        """``steps`` more done; on a terminal the bar moves and ``note`` is printed above it,
        otherwise one line: elapsed time, count, ``note`` and the estimate of the time left."""
        self.done += steps
        if self._bar is not None:
            self._bar.update(self._task, advance=steps)
            if note:
                self.line(f"{self.stamp()} {note}")
            return
        left = self.estimate()
        tail = "" if left is None or self.done >= self.total else f" (~{duration(left)} left)"
        self.line(f"{self.stamp()} [{self.done}/{self.total}] {note}{tail}".rstrip())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
