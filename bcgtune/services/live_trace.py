"""`bcgtune trace --live`: launch a profile's server, run SGLang's own benchmark client
against it, stop the server, and trace its log (bcgtune/adapters/sglang/live.py runs the processes).

The trace carries what the run was in trace.meta["live"] (`LiveRun.to_json()`): the launch
command and environment, the profile's sha256, the client command and its result line. Its
`images` column comes from the benchmark's dataset (live.images_rule: the log does not say
which batches carried images), and the rule used is in trace.meta["images_rule"].
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bcgtune.adapters.sglang.live import (
    HEALTH_TIMEOUT_S,
    build_launch,
    client_command,
    dataset_of,
    images_rule,
    read_result_line,
    run_client,
    running_server,
    terminate_as_interrupt,
)
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.core.trace.summary import TraceSummary, summarize


@dataclass
class LiveRun:
    """One live run: how the server was launched and the client run, and its result line."""

    launch_command: list[str]
    launch_shell: str
    launch_env: dict[str, str]
    profile: str
    profile_path: str
    profile_sha256: str
    bench_command: list[str]
    bench_args: list[str]
    bench_result: dict[str, Any]
    started: str
    wall_s: float
    workdir: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LiveTraceResult:
    """The trace of a live run (origin "sglang-live", the run in its meta) and its summary."""

    trace: PrefillTrace
    run: LiveRun
    summary: TraceSummary

    def to_json(self) -> dict[str, Any]:
        """The trace's summary, as `trace --log --json` prints it."""
        return self.summary.to_dict()


def live_trace(
    profile_ref: str,
    bench_args: Sequence[str],
    *,
    workdir: str | os.PathLike[str] | None = None,
    health_timeout: float = HEALTH_TIMEOUT_S,
    say: Callable[[str], None] | None = None,
) -> LiveTraceResult:
    """Launch the profile's server, run the benchmark client with `bench_args`, stop the
    server, and trace its log. `say`: progress callback (one line each); the client's own
    output is echoed to stderr only when there is one."""
    import numpy as np

    from bcgtune.adapters.sglang.log import parse_logs
    from bcgtune.fileio import sha256_file
    from bcgtune.files.profile_file import load_profile, resolve_profile_path

    def note(msg: str) -> None:
        if say is not None:
            say(msg)

    profile = load_profile(profile_ref)
    profile_path = resolve_profile_path(profile_ref)
    folder = Path(workdir) if workdir else Path.cwd() / f"bcgtune-live-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    launch = build_launch(profile, folder / "server.log")
    result_file = folder / "bench.jsonl"
    argv = client_command(bench_args, launch.base_url, result_file)
    t0 = time.time()
    with terminate_as_interrupt():
        with running_server(launch, timeout=health_timeout, say=say) as server:
            note(f"running benchmark: {shlex.join(argv[1:])}")
            run_client(argv, server=server, launch=launch, log_path=folder / "client.log", echo=say is not None)
            result = read_result_line(result_file, folder / "client.log")
            note("benchmark done; stopping server")
    trace = parse_logs([str(launch.log_path)])
    assert trace.batches is not None  # a parsed log has per-batch columns
    n = len(trace.batches["forward_tokens"])
    flag, rule = images_rule(dataset_of(bench_args))
    trace.batches["images"] = np.full(n, flag, dtype=np.int8)
    trace.origin = "sglang-live"
    run = LiveRun(
        launch_command=launch.argv,
        launch_shell=launch.shell_line(),
        launch_env=launch.env,
        profile=profile.name,
        profile_path=str(profile_path),
        profile_sha256=sha256_file(str(profile_path)),
        bench_command=argv,
        bench_args=list(bench_args),
        bench_result=result,
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0)),
        wall_s=round(time.time() - t0, 3),
        workdir=str(folder),
    )
    trace.meta["live"] = run.to_json()
    trace.meta["images_rule"] = rule
    return LiveTraceResult(trace, run, summarize(trace))
