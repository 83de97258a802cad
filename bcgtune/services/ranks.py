"""A run over real all-reduces: one process per tensor-parallel rank, each building its own
slice and running the same service function in the same order (the timed rounds' order is
seeded, so every rank runs the same call when the others do), all-reducing through
torch.distributed (NCCL on GPUs, gloo on the CPU). Rank 0 runs here and its result is the
run's; the other ranks run in child processes that die with this one (PR_SET_PDEATHSIG on
Linux, and a watchdog here: a rank that fails ends the run, since the others would wait for
it in their next collective)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bcgtune.engines.config import EngineConfig
from bcgtune.errors import ExternalError

T = TypeVar("T")
_POLL_S = 0.2


def run_ranks(cfg: EngineConfig, fn: Callable[..., T], *args: Any, **here: Any) -> T:
    """fn(cfg, *args) on every rank of `cfg` (a module-level function: the children import
    it); `here`: keyword arguments for rank 0 only (progress callbacks). Without a real
    all-reduce: fn(cfg, *args, **here), in this process."""
    par = cfg.parallel
    if par.all_reduce != "real" or par.tp == 1:
        return fn(cfg, *args, **here)
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="bcgtune-ranks-")
    rendezvous = os.path.join(folder, "rendezvous")
    errors = ctx.SimpleQueue()
    children = [
        ctx.Process(
            target=_rank_main, args=(cfg.for_rank(r, rendezvous), fn, args, errors), daemon=True, name=f"bcgtune-rank-{r}"
        )
        for r in range(1, par.tp)
    ]
    stop = threading.Event()
    try:
        for child in children:
            child.start()
        watch = threading.Thread(target=_watch, args=(children, errors, stop), daemon=True)
        watch.start()
        result = fn(cfg.for_rank(0, rendezvous), *args, **here)
        stop.set()
        for child in children:
            child.join(timeout=600)
        failed = [c for c in children if c.exitcode not in (0, None)]
        if failed:
            raise ExternalError(f"rank {failed[0].name.rsplit('-', 1)[-1]} failed: {_first_error(errors)}")
        return result
    finally:
        stop.set()
        _leave_group()
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _rank_main(cfg: EngineConfig, fn: Callable[..., Any], args: tuple, errors: Any) -> None:
    """A child rank: dies with its parent, runs fn, reports its error in one line."""
    die_with_parent()
    try:
        fn(cfg, *args)
    except BaseException as exc:  # noqa: BLE001  (any failure of a rank ends the run: say which)
        errors.put(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        sys.exit(1)
    finally:
        _leave_group()


def _watch(children: list[Any], errors: Any, stop: threading.Event) -> None:
    """A rank that exits with an error leaves rank 0 waiting in a collective that never
    completes: end this process with the rank's error (outputs are written atomically, so
    nothing is left half-written)."""
    while not stop.wait(_POLL_S):
        for child in children:
            if child.exitcode not in (None, 0) and not stop.is_set():
                sys.stderr.write(
                    f"error: {child.name.removeprefix('bcgtune-')} failed: {_first_error(errors)} (a real all-reduce)\n"
                )
                sys.stderr.flush()
                os._exit(ExternalError.exit_code)


def _first_error(errors: Any) -> str:
    try:
        return errors.get() if not errors.empty() else "exited without a message"
    except (OSError, EOFError):
        return "exited without a message"


def die_with_parent() -> None:
    """This process is killed when the one that started it dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


def _leave_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001  (leaving is best effort: the process ends next)
        pass
