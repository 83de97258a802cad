"""trace: a workload's prefill sizes from server logs, and traces merged.

`trace_logs` reads logs where they live (files, folders, globs, URLs) on this machine
(worker processes, bcgtune.adapters.sglang.log) or on a Dask cluster (`trace_on_cluster`):
each log is parsed where a worker runs into a histogram-only trace (the map step: counts
per size and request mixes per server configuration; its per-batch columns never leave
the worker), and the traces are merged pairwise in input order (the reduce step,
bcgtune.core.trace.merge.merge_traces, associative, so the tree of merges gives the trace
a serial merge gives). `merge_trace_files` is `bcgtune trace merge`.

Why Dask and not Ray: the job is a map over files and an associative reduce of small
results, which `Client.map` / `Client.submit` express directly; Dask's distributed
scheduler is pure Python (two wheels), starts a `LocalCluster` of worker processes in about
a second for tests and single machines, reads the same fsspec URLs bcgtune reads, and
connects to an existing cluster by address. Ray would add a large binary runtime whose
single-process local mode is deprecated, for no feature this job uses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import BcgError, ExternalError, InputError

CLUSTER_EXTRA = "cluster"


def expand_logs(locations: list[str]) -> list[str]:
    """The logs named by `--log` values: files and URLs as given, `-` for stdin, folders
    (local or in a bucket) and globs expanded to the logs they hold, sorted."""
    from bcgtune.adapters.sglang.log.remote import list_logs

    out: list[str] = []
    for loc in locations:
        out += [loc] if loc == "-" else list_logs(loc)
    return out


def log_input_files(locations: list[str]) -> list[str]:
    """The files on this machine that `--log` values read (folders and globs expanded as
    expand_logs does, `file://` and other local URLs as paths): the run's inputs an output
    may never replace. No error: a value that names nothing is refused when it is read."""
    from bcgtune.adapters.sglang.log.rotation import is_log_name
    from bcgtune.fileio import input_files

    return [f for loc in locations for f in input_files(loc) if not os.path.isdir(loc) or is_log_name(f)]


def trace_logs(
    locations: list[str],
    *,
    mixed_chunk: bool = False,
    jobs: int | None = None,
    histogram_only: bool = False,
    progress: Callable[[int, int | None], None] | None = None,
    launch: dict[str, Any] | None = None,
    group: int | None = None,
) -> PrefillTrace:
    """Logs parsed on this machine (worker processes for several files). launch: the launch
    settings of logs that state none (rotated logs without their server_args and startup
    lines), as launch flags (core.trace.groups.parse_launch_settings). group: only this
    server configuration of the logs (trace_of_group; no progress is reported then)."""
    from bcgtune.adapters.sglang.log import parse_logs

    if group is not None:
        return trace_of_group(locations, group, mixed_chunk=mixed_chunk, jobs=jobs, histogram_only=histogram_only, launch=launch)
    return parse_logs(
        expand_logs(locations), mixed_chunk=mixed_chunk, jobs=jobs, progress=progress, histogram_only=histogram_only,
        assumed_launch=_assumed(launch, mixed_chunk),
    )  # fmt: skip


def _assumed(launch: dict[str, Any] | None, mixed_chunk: bool = False) -> dict[str, Any] | None:
    """Launch settings given for logs that state none, as their server_args line would
    state them; --mixed-chunk beside enable_mixed_chunk=false is refused (they contradict)."""
    from bcgtune.core.trace.groups import logged_form

    if mixed_chunk and launch and launch.get("enable_mixed_chunk") is False:
        raise InputError("--mixed-chunk contradicts enable_mixed_chunk=false: give one of them", "--launch")
    return logged_form(launch) if launch else None


def trace_of_group(
    locations: list[str],
    group: int,
    *,
    mixed_chunk: bool = False,
    jobs: int | None = None,
    histogram_only: bool = False,
    launch: dict[str, Any] | None = None,
) -> PrefillTrace:
    """One server configuration of the logs on its own: the logs are parsed (histogram-only)
    to find the files of configuration `group` (numbered as the whole trace numbers them),
    and those files parsed again alone, so the trace's sources, statistics and batches are
    that configuration's. A file that holds two configurations (a server restarted with
    other settings) cannot be split by file, and is refused with its configurations named."""
    from bcgtune.adapters.sglang.log import parse_logs
    from bcgtune.core.trace.groups import check_group_index

    paths = expand_logs(locations)
    if "-" in paths:
        raise InputError("standard input cannot be read twice: save it to a file to pick a configuration", "--group")
    assumed = _assumed(launch, mixed_chunk)
    whole = parse_logs(paths, mixed_chunk=mixed_chunk, jobs=jobs, histogram_only=True, assumed_launch=assumed)
    check_group_index(whole.groups, group)
    if len(whole.groups) <= 1:
        return whole if histogram_only else parse_logs(paths, mixed_chunk=mixed_chunk, jobs=jobs, assumed_launch=assumed)
    assert len(whole.sources) == len(paths)
    own = sorted(set(whole.groups[group].sources))
    for s in own:
        others = [i for i, g in enumerate(whole.groups) if i != group and s in g.sources]
        if others:
            raise InputError(
                f"{whole.source_names()[s]} holds configurations {', '.join(map(str, sorted([group, *others])))}: "
                "one file cannot be split by configuration",
                "--group",
            )
    return parse_logs(
        [paths[s] for s in own], mixed_chunk=mixed_chunk, jobs=jobs, histogram_only=histogram_only, assumed_launch=assumed
    )


def merge_trace_files(paths: list[str], *, histogram_only: bool = False) -> PrefillTrace:
    """`bcgtune trace merge`: trace files in, one trace out (core.trace.merge)."""
    from bcgtune.core.trace.merge import join_given, merge_traces
    from bcgtune.fileio import display_path
    from bcgtune.files.trace_file import load_trace

    if len(paths) < 2:
        raise InputError("give at least two trace files to merge", "TRACES")
    if paths.count("-") > 1:
        raise InputError("is given twice: standard input is read once", "-")
    names = [display_path(p) for p in paths]
    with _stdin_kept(paths) as local:  # stdin as a file, so that its bytes are compared too
        traces = [load_trace(p, where=n) for p, n in zip(local, names)]  # each file's own errors first
        _refuse_duplicates(local, names)
    return join_given(merge_traces(traces, names=names, histogram_only=histogram_only))


@contextlib.contextmanager
def _stdin_kept(paths: list[str]) -> Iterator[list[str]]:
    """`paths` with `-` replaced by a temporary copy of standard input (at most a trace's size)."""
    import tempfile

    from bcgtune.fileio import keep_input
    from bcgtune.files.trace_file import MAX_TRACE_BYTES

    if "-" not in paths:
        yield paths
        return
    with tempfile.TemporaryDirectory(prefix="bcgtune-stdin-") as tmp:
        copy = keep_input("-", os.path.join(tmp, "stdin"), "trace", MAX_TRACE_BYTES)
        yield [copy if p == "-" else p for p in paths]


def _refuse_duplicates(paths: list[str], names: list[str]) -> None:
    """The same trace twice (one file, or two files with the same bytes, standard input
    among them) would count its batches twice: refused, naming both."""
    from bcgtune.fileio import MAX_DOCUMENT_BYTES, path_kind, sha256_file

    seen: dict[str, tuple[str, str]] = {}
    for p, name in zip(paths, names):
        if path_kind(p) != "file":  # devices and the missing: the loader's to refuse
            continue
        try:
            if os.path.getsize(p) > MAX_DOCUMENT_BYTES:
                continue
            key = sha256_file(p)
        except OSError:
            continue  # the loader says what is wrong with it
        if key in seen:
            twice = os.path.realpath(p) == os.path.realpath(seen[key][0])
            same = "is given twice" if twice else f"has the same contents as {seen[key][1]}"
            raise InputError(f"{same}: its batches would count twice", name)
        seen[key] = (p, name)


# ---- on a Dask cluster -------------------------------------------------------------------
@dataclass(frozen=True)
class _Failure:
    """A map or reduce task's BcgError, sent back as data (an exception's own pickling
    would lose where it happened) and raised again here."""

    kind: str
    what: str
    where: str | None


def _failure(exc: BcgError) -> _Failure:
    return _Failure(type(exc).__name__, exc.what, exc.where)


def _raise(f: _Failure) -> None:
    from bcgtune import errors

    cls = getattr(errors, f.kind, ExternalError)
    raise cls(f.what, f.where)


def parse_one(path: str, mixed_chunk: bool, assumed: dict[str, Any] | None = None) -> Any:
    """The map step, run on a worker: one log parsed histogram-only (its _FileResult)."""
    from bcgtune.adapters.sglang.log.columns import Want, _parse_file

    try:
        return _parse_file(path, 0, want=Want.of(mixed_chunk, True, assumed))
    except BcgError as exc:
        return _failure(exc)


def ends_of(r: Any) -> Any:
    """What the next piece of a rotated log needs of a parse (None for a failure)."""
    from bcgtune.adapters.sglang.log.columns import launch_ends

    return None if isinstance(r, _Failure) else launch_ends(r)


def trace_one(path: str, r: Any, first: dict | None, mixed_chunk: bool, assumed: dict[str, Any] | None = None) -> Any:
    """A parse into its log's trace, on a worker: a rotated piece first continues the launch
    `first` (read again when its histogram was counted by other settings)."""
    from bcgtune.adapters.sglang.log.build import continue_first, file_trace
    from bcgtune.adapters.sglang.log.columns import Want, _parse_file

    if isinstance(r, _Failure):
        return r
    try:
        want = Want.of(mixed_chunk, True, assumed)
        if first is not None and continue_first(r, first, want):
            r = _parse_file(path, 0, want=want._replace(first=first))
        return file_trace(path, r)
    except BcgError as exc:
        return _failure(exc)


def merge_two(a: PrefillTrace | _Failure, b: PrefillTrace | _Failure) -> PrefillTrace | _Failure:
    """The reduce step, run on a worker: two adjacent traces (or the first failure)."""
    from bcgtune.core.trace.merge import merge_traces

    if isinstance(a, _Failure):
        return a
    if isinstance(b, _Failure):
        return b
    try:
        return merge_traces([a, b], same_source_ok=True)
    except BcgError as exc:
        return _failure(exc)


def check_cluster(cluster: str) -> str:
    """`local`, `local:N`, or a scheduler address checked for what answers there
    (adapters.machine.dask_scheduler), before Dask is imported: a wrong value fails in seconds."""
    from bcgtune.adapters.machine.dask_scheduler import check_scheduler

    if cluster == "local" or cluster.startswith("local:"):
        n = cluster.partition(":")[2]
        if n and not (n.isdigit() and 1 <= int(n) <= 1024):
            raise InputError(f"local:N needs a worker count 1..1024, got {n[:20]!r}", "--cluster")
        return cluster
    return check_scheduler(cluster, "--cluster")


def _client(cluster: str) -> tuple[Any, Any]:
    """(dask Client, the LocalCluster it started or None): `local` (a worker process per
    core), `local:N`, or a scheduler address (tcp://host:8786) that check_cluster passed."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError(f"a cluster run needs dask[distributed]: pip install 'bcgtune[{CLUSTER_EXTRA}]'", "--cluster") from None
    if cluster == "local" or cluster.startswith("local:"):
        n = cluster.partition(":")[2]
        workers = int(n) if n else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        import dask

        local = client = None
        try:
            # Dask's default MALLOC_TRIM_THRESHOLD_ for workers turns off glibc's adaptive mmap
            # threshold: every chunk's numpy temporaries then cost fresh pages (measured: twice
            # the CPU time per log); None leaves glibc's own behaviour.
            # The workers' statistical profiler samples every thread every 10 ms: off, it is
            # CPU a parse does not need (a local cluster only; a remote one keeps its own).
            with (
                _stops_held() as stops,
                _hushed(),
                dask.config.set(
                    {
                        "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                        "distributed.worker.profile.enabled": False,
                    }
                ),
            ):
                # only a failure of the run itself is said (one error: line); what Dask logs as its
                # workers and scheduler stop is not (its ERROR tracebacks of closed connections)
                local = LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
                )
                client = Client(local)
        except Exception as exc:  # worker processes that cannot start: a port, memory, the environment
            _close(client, local)
            raise ExternalError(f"cannot start a local Dask cluster: {' '.join(str(exc).split())[:120]}", "--cluster") from None
        if stops:  # Ctrl-C or SIGTERM while it started: stopped now that it can be, then the stop
            _close(client, local)
            raise KeyboardInterrupt
        return client, local
    try:
        return Client(cluster, timeout="30s"), None
    except Exception as exc:  # the scheduler went away, or answered the handshake wrongly
        what = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ExternalError(f"cannot connect to the Dask scheduler: {what}", cluster) from None


@contextlib.contextmanager
def _stops_held() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM held (recorded in the list yielded, not raised) for the duration:
    a local Dask cluster stopped half-way through its start or its stop leaves worker
    processes behind and a traceback of Dask's exit handler (it asserts its workers
    started). Outside the main thread, where no handler can be set, nothing is held."""
    import signal

    seen: list[int] = []
    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda signum, _frame: seen.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield seen
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _close(client: Any, local: Any) -> None:
    """A cluster run's client and local cluster closed, with stops held and nothing said; a
    stop that came meanwhile is raised once both are closed."""
    with _stops_held() as stops, _hushed(local is not None):
        if client is not None:
            client.close()
        if local is not None:
            local.close()
    if stops:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _hushed(on: bool = True) -> Iterator[None]:
    """This process's stderr to /dev/null, and Dask's loggers silent, for the duration: a
    local cluster's worker processes are started so (they inherit it: what they would print
    is Dask's own logging; a task's failure comes back as its result), and stopped so (its
    scheduler, nannies and the queues to their workers may print tracebacks of connections
    closed under them while they stop, distributed issues 2273, 3581, 7192), once the result
    is in hand or the error raised. A cluster at an address is only disconnected from."""
    import logging
    import sys

    if not on:
        yield
        return
    names = ("distributed", "tornado", "asyncio")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        for n, level in levels.items():  # unless Dask set its own meanwhile (LocalCluster's silence_logs)
            if logging.getLogger(n).level == logging.CRITICAL + 1:
                logging.getLogger(n).setLevel(level)


def trace_on_cluster(
    locations: list[str],
    cluster: str,
    *,
    mixed_chunk: bool = False,
    progress: Callable[[int, int | None], None] | None = None,
    launch: dict[str, Any] | None = None,
) -> PrefillTrace:
    """Logs parsed on a Dask cluster into one histogram-only trace. The workers must reach
    the logs (a shared folder, or URLs). progress: (logs parsed, logs)."""
    if "-" in locations:
        raise InputError("standard input cannot be sent to a cluster", "--log -")
    address = check_cluster(cluster)
    assumed = _assumed(launch, mixed_chunk)
    from bcgtune.adapters.sglang.log.build import rotated_firsts
    from bcgtune.adapters.sglang.log.remote import is_url
    from bcgtune.adapters.sglang.log.rotation import previous_pieces

    paths = expand_logs(locations)
    # a worker runs in its own folder: a path relative to this one would name another file there
    paths = [p if is_url(p) else os.path.abspath(p) for p in paths]
    client, local = _client(address)
    try:
        from dask.distributed import as_completed

        parsed = client.map(parse_one, paths, mixed_chunk=mixed_chunk, assumed=assumed, pure=False)
        firsts: dict[int, dict] = {}
        if any(p is not None for p in previous_pieces(paths)):  # rotated pieces wait for the launch they continue
            firsts = rotated_firsts(paths, client.gather(client.map(ends_of, parsed, pure=False)))
        traced = [
            client.submit(trace_one, p, parsed[i], firsts.get(i), mixed_chunk, assumed, pure=False) for i, p in enumerate(paths)
        ]
        # the whole merge tree is submitted at once, so a pair merges as soon as both its logs are parsed,
        # while the others still parse (waiting for every parse first left the merges to run after them)
        level = list(traced)
        while len(level) > 1:  # adjacent pairs, in order: associativity makes any tree the same
            nxt = [client.submit(merge_two, level[i], level[i + 1], pure=False) for i in range(0, len(level) - 1, 2)]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        done = 0
        for _ in as_completed(parsed):
            done += 1
            if progress is not None:
                progress(done, len(paths))
        result = level[0].result()
    finally:
        _close(client, local)
    if isinstance(result, _Failure):
        _raise(result)
    assert isinstance(result, PrefillTrace)
    from bcgtune.core.trace.merge import join_given

    result = join_given(result)
    if result.n_batches == 0:
        from bcgtune.adapters.sglang.log.build import _no_records_error

        raise _no_records_error(paths, result)
    return result
