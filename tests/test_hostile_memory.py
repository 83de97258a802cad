"""Memory bounds as tests: every reader of an untrusted file has a stated bound
(docs/formats.md, "What bcgtune reads of an input, at most"), and a hostile file beyond it is
refused with one line and exit 2, never read whole: here each one is opened by the real
command line in a child process whose address space is limited (resource.RLIMIT_AS) to
LIMIT, far below what reading it whole would take. Without the bound such a run ends in
MemoryError (exit 3, "out of memory") or the kernel's kill; with it, exit 2. A good input
of each kind runs within the same limit (the limit is not what refuses)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import HANG_S
from hostile_fixtures import Fixtures

REPO = Path(__file__).resolve().parents[1]
LIMIT = 1 << 30  # the child's whole address space: Python, numpy and bcgtune take about 200 MiB of it

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
sys.argv = ["bcgtune", *sys.argv[1:]]
from bcgtune.cli.app import main
main()
"""

TIME = "suggest-buckets {F:trace.small} --objective time --calibration {in}"
# (reader, command with {in} for the file (or `-`: the file on stdin), the fixture, the first words of the refusal)
HOSTILE = [
    ("binary trace", "suggest-buckets {in}", "trace.npz_bomb_rows", "batches.forward_tokens: has 1,000,000,000 rows"),
    ("binary trace", "suggest-buckets {in}", "trace.npz_bomb_count", "batches.graph.npy: 8,191 MiB is more than a trace"),
    ("binary trace", "suggest-buckets {in}", "trace.npz_many_members", "its zip directory lists 5,015 members"),
    ("binary trace on stdin", "suggest-buckets -", "trace.npz_bomb_rows", "batches.forward_tokens: has 1,000,000,000 rows"),
    ("JSON trace", "suggest-buckets {in}", "trace.gz_bomb", "larger than 512 MiB: not a trace"),
    ("JSON trace", "suggest-buckets {in}", "trace.list_values_bomb", "more than 33,554,432 values"),
    ("JSON trace", "drift --profile h200 --trace {in}", "any.json_deep", "invalid JSON: nested too deeply"),
    ("TOML profile", "serve --profile {in} --dry-run --no-sglang-probe", "profile.gz_bomb", "larger than 1 MiB: not a profile"),
    ("TOML profile", "doctor --no-sglang-probe --profile {in}", "profile.buckets_many", "larger than 1 MiB: not a profile"),
    ("TOML profile", "doctor --no-sglang-probe --profile {in}", "any.toml_deep", "invalid TOML: nested too deeply"),
    ("TOML workload", "trace --simulate --workload {in}", "workload.oversize", "larger than 16 MiB: not a workload"),
    ("calibration", "suggest-buckets {F:trace.small} --objective time --calibration {in}", "cal.gz_bomb", "larger than 64 MiB"),
    (
        "calibration",
        "suggest-buckets {F:trace.small} --objective time --calibration {in}",
        "cal.values_bomb",
        "larger than 64 MiB",
    ),
    ("log, one line of 1 GiB", "trace --log {in}", "log.gz_one_line", "no prefill batch lines found"),
    ("log of 256 MiB", "trace --log {in}", "log.gz_bomb", "no prefill batch lines found"),
    ("log archive", "trace --log zip://a.log::file://{in}", "log.zip_many_members", "its zip directory lists"),
    ("tune state", "tune {F:trace.csv} --model tiny --device cpu --state-dir {in}", "state.oversize", "larger than 64 MiB"),
]
GOOD = [
    ("binary trace", "suggest-buckets {in}", "trace.npz"),
    ("JSON trace", "suggest-buckets {in}", "trace.json"),
    ("TOML profile", "serve --profile {in} --dry-run --no-sglang-probe", "profile.good"),
    ("calibration", TIME, "cal.good"),
    ("log", "trace --log {in}", "log.good"),
]


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixtures:
    return Fixtures(tmp_path_factory.mktemp("memory"))


def _run(command: str, path: Path, fx: Fixtures, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    words = [w.replace("{in}", str(path)) for w in command.split(" ")]
    args = []
    for w in words:
        if w.startswith("{F:"):
            w = str(fx.path(w[3:-1]))
        args.append(w)
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=LIMIT), *args],
        input=stdin, capture_output=True, cwd=REPO, timeout=HANG_S,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="no RLIMIT_AS on this system")
@pytest.mark.parametrize("reader, command, name, says", HOSTILE, ids=[f"{h[0]}-{h[2]}" for h in HOSTILE])
def test_a_hostile_file_is_refused_within_the_memory_limit(fx, reader, command, name, says):
    if command.startswith("tune"):
        pytest.importorskip("torch")
    if command.startswith("trace --log zip://"):
        pytest.importorskip("fsspec")
    path = fx.path(name)
    stdin = path.read_bytes() if command.endswith(" -") else None
    p = _run(command, path, fx, stdin)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, (reader, p.returncode, err[-1500:])
    assert "out of memory" not in err and "MemoryError" not in err and "Traceback" not in err, err[-1500:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and lines[0][len("error: ") :].startswith(says), (reader, lines)


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="no RLIMIT_AS on this system")
@pytest.mark.parametrize("reader, command, name", GOOD, ids=[g[0] for g in GOOD])
def test_a_good_file_of_each_kind_is_read_within_the_same_limit(fx, reader, command, name):
    p = _run(command, fx.path(name), fx)
    assert p.returncode == 0, (reader, p.stderr.decode("utf-8", "replace")[-1500:])
