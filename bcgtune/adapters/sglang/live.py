"""Live runs against a real SGLang server: launch from a profile, wait until healthy, drive
SGLang's own benchmark client, stop, and read the server's log.

Shared by `trace --live`, `validate --server` and `bench` (their pipelines are in
bcgtune/services/). Everything here talks to 127.0.0.1 only.

Two environment variables exist for wrappers and tests:
  BCGTUNE_SERVER_CMD   replaces `python -m sglang.launch_server` (shell-split), e.g. a
                       container exec, or the test suite's stand-in server; the profile's
                       flags follow it unchanged. The flag check against SGLang's parser is
                       skipped then (the wrapper may run another SGLang).
  BCGTUNE_BENCH_CLIENT the benchmark client: a module name run with `python -m` (default
                       sglang.benchmark.serving) or a path to a .py script.

Which batches carried images: SGLang's prefill line does not say (`waiting-image-req` counts
queued requests, not the batch's), so the live trace's `images` column is inferred from the
benchmark dataset only: 0 for every batch of a text-only dataset, 1 for every batch of
`--dataset-name image` / `mmmu` (every request carries an image; a chunk of an image request
counts as an image batch, as SGLang keeps the request's multimodal inputs on every chunk),
and -1 (unknown) otherwise. The rule used is recorded in trace.meta["images_rule"].
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from bcgtune.core.bench.bench_result import VariantKind
from bcgtune.errors import ExternalError, InputError

if TYPE_CHECKING:
    from bcgtune.adapters.sglang.launcher import ServerProcess
    from bcgtune.files.profile_file import Profile

Say = Callable[[str], None]

DEFAULT_CLIENT_MODULE = "sglang.benchmark.serving"
HEALTH_TIMEOUT_S = 1800.0  # a large MoE model with many graphs can take many minutes
TEXT_DATASETS = {"random", "random-ids", "sharegpt", "generated-shared-prefix", "longbench_v2", "custom", "openai"}
IMAGE_DATASETS = {"image", "mmmu"}


def _quiet(msg: str) -> None:
    """The default progress callback: say nothing (the library never prints)."""


# --------------------------------------------------------------------------- variants
@dataclasses.dataclass
class Variant:
    """A profile variant: how one arm's server is launched."""

    name: str
    kind: VariantKind
    buckets: list[int] | None = None

    def describe(self) -> str:
        if self.kind == "list":
            return f"{self.name}: list={','.join(map(str, self.buckets or []))}"
        return f"{self.name}: {self.kind}"


VARIANT_SYNTAX = (
    "NAME:profile (the profile's bucket list), NAME:disabled (prefill graphs off), "
    "NAME:default (SGLang's default ladder) or NAME:list=256,512,... (an explicit list)"
)


def parse_variant(spec: str) -> Variant:
    from bcgtune.core.sglang.replay import parse_bucket_list

    name, sep, what = spec.partition(":")
    name = name.strip()
    what = what.strip()
    if not sep or not name or not what:
        raise InputError(f"arm {spec!r} is not NAME:VARIANT; VARIANT is {VARIANT_SYNTAX}", "--arm")
    if not all(c.isalnum() or c in "-_." for c in name):
        raise InputError(f"arm name {name!r} may hold letters, digits, '-', '_' and '.' only", "--arm")
    if what == "profile":
        return Variant(name, "profile")
    if what == "disabled":
        return Variant(name, "disabled")
    if what in ("default", "ladder", "ladder:default"):
        return Variant(name, "default")
    if what.startswith("list="):
        return Variant(name, "list", parse_bucket_list(what[5:], where=f"--arm {spec}"))
    raise InputError(f"unknown variant {what!r} in arm {spec!r}; use {VARIANT_SYNTAX}", "--arm")


def apply_variant(profile: Profile, variant: Variant) -> Profile:
    """A copy of `profile` launched as `variant` says (the file is never changed)."""
    server = dict(profile.server)
    if variant.kind == "profile":
        return dataclasses.replace(profile, server=server)
    # Graph-disabling keys would fight the variant: drop them, then state the backend.
    for k in ("disable_prefill_cuda_graph", "cuda_graph_backend_prefill"):
        server.pop(k, None)
    if variant.kind == "disabled":
        server["cuda_graph_backend_prefill"] = "disabled"
        return dataclasses.replace(profile, server=server, buckets=None)
    backend = profile.server.get("cuda_graph_backend_prefill")
    if not backend or backend == "disabled" or profile.server.get("disable_prefill_cuda_graph") is True:
        backend = "breakable"
    server["cuda_graph_backend_prefill"] = backend
    if variant.kind == "default":
        return dataclasses.replace(profile, server=server, buckets=None)
    return dataclasses.replace(profile, server=server, buckets=list(variant.buckets or []))


def graphs_off(profile: Profile) -> Profile:
    return apply_variant(profile, Variant("eager", "disabled"))


# --------------------------------------------------------------------------- launching
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    port: int
    base_url: str
    log_path: Path

    def shell_line(self) -> str:
        return shlex.join(self.argv)


def build_launch(
    profile: Profile, log_path: str | os.PathLike[str], *, port: int | None = None, extra: Sequence[str] = ()
) -> Launch:
    """The launch command for `profile`: SGLang's launcher (or BCGTUNE_SERVER_CMD) with the
    profile's flags, checked as serve checks them. The port is the profile's [server].port,
    else a free local one."""
    from bcgtune.adapters.sglang.launcher import build_server_command
    from bcgtune.adapters.sglang.resolve import check_flags

    if port is None:
        p = profile.server.get("port")
        port = int(p) if isinstance(p, int) and not isinstance(p, bool) else free_port()
    cmd = build_server_command(profile, port=port, extra=list(extra))
    override = os.environ.get("BCGTUNE_SERVER_CMD", "").strip()
    if override:
        head = shlex.split(override)
        argv = head + cmd.argv[3:]  # drop `python -m sglang.launch_server`
    else:
        argv = cmd.argv
        # serve's check on SGLang's own parser, in a child process or from its cached answer
        # (this process never imports SGLang); when it cannot run, the server itself judges
        flags = check_flags(cmd)
        if flags.ok is False:
            raise InputError(flags.message or "SGLang's parser refused the launch", flags.where or profile.where)
    host = str(profile.server.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", "localhost", ""):
        host = "127.0.0.1"
    if host != "127.0.0.1":
        raise InputError(f"live runs talk to 127.0.0.1 only; the profile sets host {host!r}", profile.where)
    return Launch(argv, dict(cmd.env), port, f"http://{host}:{port}", Path(log_path))


class Cancelled(KeyboardInterrupt):
    """SIGTERM received: unwinds like Ctrl-C so every child is stopped on the way out."""


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the duration, so `finally` blocks stop the
    server and the client instead of leaving them orphaned. Main thread only."""
    try:
        old = signal.getsignal(signal.SIGTERM)
    except ValueError:
        yield
        return

    def handler(signum, _frame):
        raise Cancelled()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def running_server(
    launch: Launch, *, label: str = "server", timeout: float = HEALTH_TIMEOUT_S, grace_s: float = 30.0, say: Say | None = None
) -> Iterator[ServerProcess]:
    """Start the server, report progress through `say` until /health answers, yield the
    ServerProcess, always stop it (and its whole process group) on the way out."""
    note = say or _quiet
    from bcgtune.adapters.sglang.launcher import ServerProcess, describe_exit, http_ok

    server = ServerProcess(launch.argv, log_path=launch.log_path, extra_env=launch.env, echo=None, grace_s=grace_s)
    note(f"starting {label} on port {launch.port} (log: {launch.log_path})")
    server.start()
    try:
        t0 = time.monotonic()
        last = t0
        while True:
            rc = server.returncode
            if rc is not None:
                server.wait(0)
                raise ExternalError(
                    f"{label} {describe_exit(rc)} before it became healthy{last_error_hint(launch.log_path)}",
                    f"log: {launch.log_path}",
                )
            if http_ok(launch.base_url + "/health", timeout=2.0):
                break
            now = time.monotonic()
            if now - t0 > timeout:
                raise ExternalError(f"{label} not healthy after {timeout:g} s", f"log: {launch.log_path}")
            if now - last >= 10.0:
                note(f"waiting for {label}: {now - t0:.0f} s")
                last = now
            time.sleep(0.2)
        note(f"{label} healthy after {time.monotonic() - t0:.1f} s")
        yield server
    finally:
        server.stop()


def last_error_hint(log_path: Path) -> str:
    """`: <last error-looking line>` from the server's log, to put the cause on the error line."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return ""
    for line in reversed(lines):
        low = line.lower()
        if "error" in low or "exception" in low or "traceback" in low:
            text = line.strip()
            if "] " in text[:60]:
                text = text.split("] ", 1)[1]
            return ": " + (text[:160] + "..." if len(text) > 160 else text)
    return ""


def ensure_alive(server: ServerProcess, launch: Launch, what: str) -> None:
    from bcgtune.adapters.sglang.launcher import describe_exit

    rc = server.returncode
    if rc is not None:
        raise ExternalError(
            f"server {describe_exit(rc)} during {what}{last_error_hint(launch.log_path)}", f"log: {launch.log_path}"
        )


# --------------------------------------------------------------------------- the client
def client_command(user_args: Sequence[str], base_url: str, output_file: str | os.PathLike[str]) -> list[str]:
    """[python, -m, client, *user args, (--base-url URL), --output-file F]. The user's
    arguments pass unchanged; --base-url is added only when they name no server."""
    client = os.environ.get("BCGTUNE_BENCH_CLIENT", "").strip() or DEFAULT_CLIENT_MODULE
    head = [sys.executable, client] if client.endswith(".py") else [sys.executable, "-m", client]
    args = list(user_args)
    for a in args:
        if a.split("=", 1)[0] == "--output-file":
            raise InputError("--output-file is set by bcgtune (the result is recorded in the trace)", "bench args")
    names = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    extra: list[str] = []
    if not names & {"--base-url", "--host", "--port"}:
        extra = ["--base-url", base_url]
    return head + args + extra + ["--output-file", str(output_file)]


def run_client(
    argv: list[str],
    *,
    server: ServerProcess,
    launch: Launch,
    log_path: Path,
    echo: bool = True,
    env: dict[str, str] | None = None,
    on_poll: Callable[[], None] | None = None,
) -> None:
    """Run the benchmark client to completion in its own process group, its output teed to
    `log_path` (and to stderr when `echo`). Fails when the server dies meanwhile (the client
    is stopped then) or the client exits non-zero."""
    from bcgtune.adapters.sglang.launcher import ServerProcess, describe_exit

    client = ServerProcess(argv, log_path=log_path, extra_env=env or {}, echo=(sys.stderr.buffer if echo else None), grace_s=5.0)
    client.start()
    try:
        while client.returncode is None:
            if server.returncode is not None:
                client.stop(grace_s=2.0)
                ensure_alive(server, launch, "the benchmark")
            if on_poll is not None:
                on_poll()
            time.sleep(0.1)
        client.wait(5.0)
    finally:
        client.stop(grace_s=2.0)
    ensure_alive(server, launch, "the benchmark")
    rc = client.returncode
    if rc != 0:
        raise ExternalError(f"benchmark client {describe_exit(rc)}{last_error_hint(log_path)}", f"log: {log_path}")


def read_result_line(path: str | os.PathLike[str], client_log: Path) -> dict[str, Any]:
    """The last JSON line the client appended to --output-file."""
    p = Path(path)
    try:
        lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    except OSError:
        lines = []
    if not lines:
        raise ExternalError("benchmark client wrote no result line", f"log: {client_log}")
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ExternalError(f"benchmark result is not JSON: {exc.msg}", str(p)) from None
    if not isinstance(obj, dict):
        raise ExternalError("benchmark result is not a JSON object", str(p))
    return obj


def dataset_of(user_args: Sequence[str]) -> str:
    """--dataset-name as the client parses it (argparse's default: sharegpt)."""
    args = list(user_args)
    for i, a in enumerate(args):
        if a == "--dataset-name" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--dataset-name="):
            return a.split("=", 1)[1]
    return "sharegpt"


def images_rule(dataset: str) -> tuple[int, str]:
    if dataset in IMAGE_DATASETS:
        return 1, f"dataset {dataset!r}: every request carries an image, so every batch is an image batch"
    if dataset in TEXT_DATASETS:
        return 0, f"dataset {dataset!r} is text-only, so no batch carries images"
    return -1, f"dataset {dataset!r}: unknown whether batches carry images (the log does not say)"
