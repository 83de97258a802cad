"""A fleet's logs against the generator's ground truth (benchmarks/fleet_gen.py): two
configurations (mixed chunk on one, DP attention on the other), rotated logs, a replica that
lost its start-up lines. Every way of reading them (per batch, histogram-only, in worker
processes, on a Dask cluster, through the API) gives each configuration exactly its own
files and batches, with no hint, warning or note that is not true of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from fleet_gen import demo_fleet  # noqa: E402

from bcgtune.files.trace_file import load_trace  # noqa: E402


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet")
    configs, truth = demo_fleet(folder, batches=240, seed=3)
    return folder, configs, truth


def _launch(cfg) -> list[str]:
    return [a for s in cfg.launch() for a in ("--launch", s)]


def _check(trace, configs, truth, lost_apart: bool) -> None:
    """Each group is one configuration's: its files, settings and histogram, exactly."""
    names = [os.path.basename(n) for n in trace.source_names()]
    want = {c: truth.files[c] for c in truth.files}
    if lost_apart:  # the replica that lost its start: its files are a configuration of their own, unknown
        want = {c: [f for f in files if not f.startswith("c0-r2.")] for c, files in want.items()}
    assert len(trace.groups) == len(configs) + lost_apart
    for g in trace.groups:
        files = sorted(names[s] for s in g.sources)
        if not g.settings:
            assert lost_apart and files == sorted(f for f in truth.files[0] if f.startswith("c0-r2."))
            continue
        c = next(c for c, cfg in enumerate(configs) if g.settings.get("model_path") == cfg.model)
        cfg = configs[c]
        assert files == want[c]
        assert g.rank_chunk == cfg.rank_chunk and g.settings["chunked_prefill_size"] == cfg.chunk
        assert g.settings["enable_mixed_chunk"] is cfg.mixed_chunk
        assert g.settings["enable_dp_attention"] is cfg.dp_attention and g.settings["tp_size"] == cfg.tp
        if not lost_apart or c != 0:
            sizes, counts = truth.histogram(c)
            assert g.sizes.tolist() == sizes and g.counts.tolist() == counts, f"configuration {c}"


@pytest.mark.parametrize("how", [["-j", "1"], ["-j", "2"], ["--histogram-only"], ["--histogram-only", "-j", "2"]])
def test_every_configuration_exact(fleet, tmp_path, how):
    folder, configs, truth = fleet
    out = tmp_path / "t.json"
    r = cli(["trace", "--log", folder, *_launch(configs[0]), *how, "-o", out, "--json"])
    assert r.code == 0, r.err
    t = load_trace(str(out))
    _check(t, configs, truth, lost_apart=False)
    summary = json.loads(r.out)
    assert not summary["hints"] and not summary["warnings"], (summary["hints"], summary["warnings"])
    assert not any("match a record" in n for n in summary["notes"]), summary["notes"]
    assert any("joined group 0" in n for n in summary["notes"])
    assert [sorted(os.path.basename(f) for f in g["files"]) for g in summary["groups"]] == [truth.files[0], truth.files[1]]


def test_without_launch_settings_the_lost_replica_stays_apart(fleet, tmp_path):
    folder, configs, truth = fleet
    out = tmp_path / "t.json"
    r = cli(["trace", "--log", folder, "-o", out, "--json"])
    assert r.code == 0, r.err
    _check(load_trace(str(out)), configs, truth, lost_apart=True)
    summary = json.loads(r.out)
    assert not summary["warnings"] and not any("match a record" in n for n in summary["notes"])
    # its batches carry the mixed-chunk signature: the hint says so for that group only, with its chunk
    assert len(summary["hints"]) == 1 and "launch settings not logged" in summary["hints"][0]
    assert "--mixed-chunk --launch chunked_prefill_size=4096" in summary["hints"][0]


def test_the_api_and_a_cluster_give_the_same(fleet, tmp_path):
    pytest.importorskip("distributed")
    import bcgtune

    folder, configs, truth = fleet
    launch = dict(s.split("=", 1) for s in configs[0].launch())
    launch = {k: (v == "true") if v in ("true", "false") else int(v) if v.isdigit() else v for k, v in launch.items()}
    for kw in ({}, {"histogram_only": True}, {"cluster": "local:2"}):
        t = bcgtune.trace_from_logs(folder, launch=launch, **kw)
        _check(t, configs, truth, lost_apart=False)
        assert not bcgtune.trace_summary(t).hints
    one = bcgtune.trace_from_logs(folder, launch=launch, group=1)
    assert sorted(os.path.basename(n) for n in one.source_names()) == truth.files[1]
    assert one.sizes.tolist() == truth.histogram(1)[0]


def test_a_quiet_cluster_run_prints_nothing_on_stderr(fleet, tmp_path):
    """`trace --cluster local:2 -q` (docs/cluster.md): the summary on stdout, nothing on
    stderr, run after run (Dask's tracebacks of closed connections at its stop were shown)."""
    pytest.importorskip("distributed")
    folder, configs, _ = fleet
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for k in range(2):
        out = tmp_path / f"c{k}.json"
        r = subprocess.run(
            [sys.executable, "-m", "bcgtune", "trace", "--log", str(folder), *_launch(configs[0]), "--cluster", "local:2",
             "-o", str(out), "-q"],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
        assert "configurations   2" in r.stdout and out.exists()


@pytest.mark.parametrize("histogram_only", [False, True])
def test_worker_processes_give_the_same(fleet, histogram_only):
    """The files parsed in 2 worker processes (however small), as a fleet's gigabytes are."""
    from bcgtune.adapters.sglang.log import ParseOptions, parse_logs
    from bcgtune.core.trace.groups import logged_form, parse_launch_settings
    from bcgtune.services.trace import expand_logs

    folder, configs, truth = fleet
    given = logged_form(parse_launch_settings(configs[0].launch()))
    t = parse_logs(expand_logs([str(folder)]), jobs=2, histogram_only=histogram_only, assumed_launch=given,
                   options=ParseOptions(parallel_min_bytes=0))  # fmt: skip
    _check(t, configs, truth, lost_apart=False)


def _live_in_group(pgid: int) -> list[int]:
    """The processes of group `pgid` still running (a zombie waiting for init is not)."""
    from proc_helpers import proc_table

    return [pid for pid, (state, _, group) in proc_table().items() if group == pgid and state != "Z"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_while_a_local_cluster_starts(fleet, tmp_path, sig):
    """Ctrl-C or SIGTERM while the local cluster's workers start: exit 130 with one line, no
    output file, and no process left (Dask's exit handler printed a traceback of workers
    that had not started, and they were left running)."""
    pytest.importorskip("distributed")
    import time

    folder, _, _ = fleet
    out = tmp_path / "t.json"
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal\n"
        "from distributed.nanny import Nanny\n"
        "start = Nanny.start_unsafe\n"
        "async def stopped_while_starting(self):  # the stop lands while the workers start\n"
        f"    os.kill(os.getpid(), signal.{sig})\n"
        "    return await start(self)\n"
        "Nanny.start_unsafe = stopped_while_starting\n"
        "from bcgtune.cli.app import main\n"
        f"main(['trace', '--log', {str(folder)!r}, '--cluster', 'local:2', '-o', {str(out)!r}, '-q'])\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        _, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 130 and err == "error: interrupted\n", (p.returncode, err[-3000:])
    assert not out.exists()
    for _ in range(3000):  # the workers are stopped before it exits; their exit is asynchronous
        if not _live_in_group(p.pid):
            break
        time.sleep(0.01)
    assert not _live_in_group(p.pid)
