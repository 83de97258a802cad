"""What a command writes: results on stdout (exactly the text or JSON the command promises),
notes and progress on stderr, silenced by --quiet.

Progress appears only for work that lasts (after `delay` seconds) and only on a terminal: a
bar (rich, which typer brings), erased when the step ends. Written to a file or a pipe, a
command's output never depends on how fast the machine ran it."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class StdoutClosed(Exception):
    """The reader of stdout went away (`bcgtune ... | head`): stop quietly."""


def out(text: str, *, nl: bool = True) -> None:
    """Result text on stdout. A reader that went away stops the command quietly; a stdout
    that cannot be written (a full disk) is an outside failure (exit 3)."""
    import typer

    try:
        typer.echo(text, nl=nl)
    except BrokenPipeError:
        raise StdoutClosed() from None
    except OSError as exc:
        from bcgtune.errors import ExternalError

        raise ExternalError(f"cannot write: {exc.strerror or exc}", "standard output") from None


def out_json(obj: Any) -> None:
    out(json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default))


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def emit(obj: Any, text: Any, *, as_json: bool, out_path: str | None = None, quiet: bool = False) -> None:
    """A command's result: the JSON document written to `out_path` when asked (atomic), and
    on stdout either that JSON (`--json`) or the rendered text. `obj` and `text` may be
    callables, built only when needed."""
    if out_path or as_json:
        doc = obj() if callable(obj) else obj
        if out_path:
            from bcgtune.fileio import atomic_write_json

            atomic_write_json(out_path, doc)
            note(f"wrote {out_path}", quiet)
        if as_json:
            out_json(doc)
            return
    out(text() if callable(text) else text, nl=False)


def err_line(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def note(text: str, quiet: bool = False) -> None:
    """Chatter: a line on stderr, unless --quiet."""
    if not quiet:
        err_line(text)


class Sayer:
    """`say` for the services: a note per call (stderr, unless --quiet), and `waiting(label)`,
    the Progress of a wait in seconds (a bar on a terminal, nothing elsewhere), which a
    service uses while SGLang is asked."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        note(text, self.quiet)

    def waiting(self, label: str) -> "Progress":
        return Progress(label, unit=" s", quiet=self.quiet, delay=1.0)


class Progress:
    """Progress of one long step, as a bar on stderr when stderr is a terminal (erased when
    the step ends); nothing when it is not, so what a command writes to a file or a pipe is
    the same on a fast or a busy machine. `update(done, total)` as often as convenient;
    nothing shows for the first `delay` seconds."""

    def __init__(
        self,
        label: str,
        *,
        total: float | None = None,
        unit: str = "",
        quiet: bool = False,
        delay: float = 2.0,
        scale: float = 1.0,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.quiet = quiet
        self.delay = delay
        self.scale = scale
        self.t0 = time.monotonic()
        self.done = 0.0
        self._bar: Any = None
        self._task: Any = None
        try:
            self.tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, done: float, total: float | None = None) -> None:
        if self.quiet:
            return
        self.done = done
        if total is not None:
            self.total = total
        now = time.monotonic()
        if now - self.t0 < self.delay:
            return
        if self.tty:
            self._tty_update()
        # elsewhere (a file, a pipe, a CI log) nothing: a line whose presence and figures
        # depend on how fast the machine is would make the same run print different text

    def _text(self) -> str:
        d = self.done / self.scale
        if self.total:
            t = self.total / self.scale
            return f"{100.0 * self.done / self.total:.0f}% ({d:,.0f} of {t:,.0f}{self.unit})"
        return f"{d:,.0f}{self.unit}"

    def _tty_update(self) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(f"bcgtune: {self.label}"),
                BarColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self._text(), total=self.total)
        self._bar.update(self._task, completed=self.done, total=self.total, description=self._text())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
