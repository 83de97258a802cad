"""Several logs: parsed serially, or in worker processes (one file at a time each, biggest
first), with progress in bytes and the first error in input order raised as a serial parse
would. Ctrl-C reaches the parent only; it stops the workers (no orphans)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, Self

import numpy as np

from bcgtune.adapters.sglang.log.columns import Continuations, Want, _FileResult, parse_and_finish
from bcgtune.adapters.sglang.log.grammar import _quote
from bcgtune.adapters.sglang.log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang.log.remote import is_url, url_size
from bcgtune.errors import BcgError, ExternalError, InputError

# ---- several files: serial or in worker processes ------------------------------------
_MAX_JOBS_PER_CORE = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _input_size(path: str) -> int | None:
    """Bytes of a regular file or a URL's object (compressed size for .gz); None for stdin
    and others."""
    if path == "-":
        return None
    if is_url(path):
        return url_size(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if os.path.isfile(path) else None


class _Progress:
    """Bytes consumed per input, reported as (done, total) to the caller's callback."""

    def __init__(self, callback: Callable[[int, int | None], None] | None, sizes: list[int | None]):
        self.callback = callback
        self.sizes = sizes
        self.total = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
        self.done = [0] * len(sizes)

    def update(self, i: int, position: int) -> None:
        self.done[i] = position
        if self.callback is not None:
            self.callback(sum(self.done), self.total)

    def finished(self, i: int) -> None:
        size = self.sizes[i]
        self.update(i, size if size is not None else self.done[i])


def _parse_files(
    paths: list[str],
    jobs: int | None,
    progress: _Progress,
    options: ParseOptions = DEFAULT_OPTIONS,
    want: Want | list[Want] = Want(),
    finish: Callable[[str, _FileResult], Any] | None = None,
) -> list[Any]:
    """Each path parsed with its Want (one for all, or one per path); a rotated piece after
    the piece before it (Continuations), with the launch that one ended with. finish: what
    becomes of each parse, where it ran (None: the _FileResult itself)."""
    wants = want if isinstance(want, list) else [want] * len(paths)
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"jobs must be a positive integer, got {_quote(repr(jobs))}", "jobs")
    files = [i for i, p in enumerate(paths) if p != "-"]
    n = min(jobs or _cores(), len(files), _MAX_JOBS_PER_CORE * _cores())
    big = sum(progress.sizes[i] or 0 for i in files) >= options.parallel_min_bytes
    cont = Continuations(paths)
    if n < 2 or not big or multiprocessing.current_process().daemon:
        return _parse_serial(paths, progress, options, wants, cont, finish)
    return _parse_parallel(paths, files, n, progress, options, wants, cont, finish)


def _parse_serial(
    paths: list[str], progress: _Progress, options: ParseOptions, wants: list[Want], cont: Continuations, finish=None
) -> list[Any]:
    """One file after another: in input order, rotated pieces after the piece before them
    (then every file is parsed, and the first error in input order raised)."""
    out: list[Any] = [None] * len(paths)
    failed: dict[int, BcgError] = {}
    todo = deque(cont.ready())
    while todo:
        i = todo.popleft()
        last = None
        try:
            last, out[i] = parse_and_finish(paths[i], partial(progress.update, i), options, cont.want(i, wants[i]), finish)
        except BcgError as exc:
            if not cont.chained:
                raise
            failed[i] = exc
        progress.finished(i)
        todo.extend(cont.done(i, last))
    if failed:
        raise failed[min(failed)]
    return out


def _worker_signals() -> None:
    """A worker's signals: Ctrl-C is the parent's to handle, and SIGTERM (how the parent
    stops a worker) ends it quietly. A forked worker inherits the command's SIGTERM handler,
    which turns SIGTERM into KeyboardInterrupt: a worker stopped while its last result was
    on its way out printed a traceback on a run that succeeded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it started the workers
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


_SPILL_MIN_BYTES = 1 << 16


def _spill_dir() -> str:
    """A private folder for columns on their way from the workers: in memory (/dev/shm)
    where there is one, else the temporary folder."""
    import tempfile

    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="bcgtune-parse-", dir=where)


def _columns_of(out: Any) -> dict | None:
    cols = getattr(out, "batches", None)
    if cols is None:
        cols = getattr(out, "columns", None)
    return cols if isinstance(cols, dict) else None


def _spill(out: Any, folder: str, i: int) -> Any:
    """A worker's per-batch columns written to files in `folder` (one copy at the speed of
    memory) instead of pickled through the result pipe (several copies, 0.3 s per 100 MB
    measured): each large column is left as (path, dtype, length)."""
    cols = _columns_of(out)
    for k, a in list((cols or {}).items()):
        if isinstance(a, np.ndarray) and a.nbytes >= _SPILL_MIN_BYTES and a.ndim == 1:
            path = os.path.join(folder, f"{i}.{k}")
            np.ascontiguousarray(a).tofile(path)
            cols[k] = _Spilled(path, a.dtype.str, len(a))  # type: ignore[index]
    return out


def _unspill(out: Any) -> Any:
    cols = _columns_of(out)
    for k, a in list((cols or {}).items()):
        if isinstance(a, _Spilled):
            cols[k] = np.fromfile(a.path, dtype=np.dtype(a.dtype), count=a.length)  # type: ignore[index]
            os.unlink(a.path)
    return out


class _Spilled(NamedTuple):
    path: str
    dtype: str
    length: int


class _Failed(NamedTuple):
    """A parse's BcgError, as a worker sends it back (raised again in the parent)."""

    cls: type
    what: str
    where: str | None


def _worker(paths: list[str], tasks, taken, results, done, options: ParseOptions, finish=None, spill: str = "") -> None:
    """A worker process: parse the files it is given, (index, Want) at a time on `tasks`,
    until told to stop (None); send (index, (last launch, the parse as `finish` makes it))
    or (index, the parts of its InputError) on `results`."""
    _worker_signals()
    while True:
        task = tasks.get()
        if task is None:
            return
        i, want = task
        with taken.get_lock():
            taken.value += 1

        def report(pos: int, i: int = i) -> None:
            done[i] = pos

        try:
            last, parsed = parse_and_finish(paths[i], report, options, want, finish)
            out: Any = (last, _spill(parsed, spill, i) if spill else parsed)
        except BcgError as exc:  # re-raised in the parent, with its file and line
            out = _Failed(type(exc), exc.what, exc.where)
        results.put((i, out))


def _start_method() -> str:
    # fork is fast and safe while this process runs one thread; otherwise start clean
    # interpreters (the workers import this module, nothing else of the caller's)
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


class _Workers:
    """`jobs` processes parsing `files` (biggest first), and those given later (submit),
    started with Ctrl-C ignored. As a context manager it stops them all on the way out,
    whatever happened (no orphans)."""

    def __init__(
        self,
        paths: list[str],
        files: list[int],
        jobs: int,
        sizes: list[int | None],
        options: ParseOptions,
        wants: list[Want],
        finish=None,
    ):
        ctx: Any = multiprocessing.get_context(_start_method())
        self.sizes = sizes
        self.done = ctx.RawArray("q", len(paths))
        self.results = ctx.Queue()
        self.tasks = ctx.Queue()
        self.spill = _spill_dir()
        self.submit([(i, wants[i]) for i in files])
        # kept on self: a spawned worker unpickles these after __init__ returns, and a
        # collected one unlinks its semaphore first
        self.taken = taken = ctx.Value("q", 0)
        self.procs = [
            ctx.Process(
                target=_worker, args=(paths, self.tasks, taken, self.results, self.done, options, finish, self.spill), daemon=True
            )
            for _ in range(jobs)
        ]
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        # SIGTERM waits until the workers are started: a worker forked with the command's
        # handler takes its own (_worker_signals) before any SIGTERM reaches it
        mask = main and hasattr(signal, "pthread_sigmask")
        if mask:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            for proc in self.procs:
                proc.start()
        finally:
            if main:
                signal.signal(signal.SIGINT, old)
            if mask:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def submit(self, tasks: list[tuple[int, Want]]) -> None:
        """Files to parse, (index, Want) each: the biggest first."""
        for task in sorted(tasks, key=lambda t: -(self.sizes[t[0]] or 0)):
            self.tasks.put(task)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.results.close()
        self.tasks.close()
        import shutil

        shutil.rmtree(self.spill, ignore_errors=True)

    def next_result(self, timeout: float) -> tuple[int, Any] | None:
        """(index, result) of a finished file, or None after `timeout` seconds. Raises
        ExternalError when a worker died without sending its result."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            for proc in self.procs:
                if proc.exitcode not in (None, 0):
                    raise ExternalError(f"a log parsing process stopped (exit code {proc.exitcode})") from None
            if not any(proc.is_alive() for proc in self.procs) and self.results.empty():
                raise ExternalError("the log parsing processes stopped before their last result") from None
            return None


def _parse_parallel(
    paths: list[str],
    files: list[int],
    jobs: int,
    progress: _Progress,
    options: ParseOptions = DEFAULT_OPTIONS,
    wants: list[Want] | None = None,
    cont: Continuations | None = None,
    finish=None,
) -> list[Any]:
    """Files in `jobs` worker processes (a rotated piece once the piece before it is done),
    stdin in this one; results in input order, and the first error in input order is raised
    (as a serial parse would). Ctrl-C reaches this process only: it stops the workers and
    raises KeyboardInterrupt."""
    results: list[Any] = [None] * len(paths)
    wants = wants or [Want()] * len(paths)
    cont = cont or Continuations([])
    ready = set(cont.ready()) if cont.prev else set(files)
    with _Workers(paths, [i for i in files if i in ready], jobs, progress.sizes, options, wants, finish) as workers:
        if "-" in paths:
            i = paths.index("-")
            try:
                results[i] = parse_and_finish("-", lambda pos: progress.update(i, pos), options, wants[i], finish)
            except BcgError as exc:
                results[i] = _Failed(type(exc), exc.what, exc.where)
            progress.finished(i)
        first = 0  # results[:first] are known and fine
        while first < len(paths):
            if results[first] is not None:
                if isinstance(results[first], _Failed):
                    cls, what, where = results[first]
                    raise cls(what, where)
                first += 1
                continue
            got = workers.next_result(0.2)
            if got is None:
                for j in files:
                    progress.done[j] = max(progress.done[j], workers.done[j])
                progress.update(files[0], progress.done[files[0]])
            else:
                results[got[0]] = got[1] if isinstance(got[1], _Failed) else (got[1][0], _unspill(got[1][1]))
                progress.finished(got[0])
                last = None if isinstance(got[1], _Failed) else got[1][0]  # (last launch, parse)
                workers.submit([(j, cont.want(j, wants[j])) for j in cont.done(got[0], last)])
    return [r[1] for r in results]
