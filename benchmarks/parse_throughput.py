"""Log parse throughput of `bcgtune trace --log` (bcgtune.adapters.sglang.log.parse_logs).

Generates synthetic SGLang server logs (seeded) in benchmarks/_work/, then in the same run:
  * single process: times parse_logs on a big log (>= 200 MB by default) and a 20 MB one,
    each in a fresh child process that reports its wall time, CPU time and peak RSS
    (ru_maxrss), best of --repeat runs; and `grep -c 'Prefill batch'` on the same file;
    peak RSS must grow only with the per-batch columns (a few dozen bytes per prefill
    batch), not with the file; and a log of a busy DP-attention server (8 ranks,
    millisecond stamps, counts of widely varying width: many distinct field layouts);
  * several files: times parse_logs(files, jobs=J) for each J of --jobs on --files logs of
    --file-mb MB each (CPU time includes the worker processes) and checks that every J
    gives the same trace.
Wall-clock MB/s on a shared machine is a lower bound; CPU-time MB/s says what one core does.

Usage: python benchmarks/parse_throughput.py [--mb 200] [--small-mb 20] [--varied-mb 100]
           [--files 4] [--file-mb 50] [--jobs 1 2] [--repeat 3] [--seed 0] [--real-mb 200] [--only-real]
           [--file LOG ...]
       python benchmarks/parse_throughput.py --goals [--goal-mb 1000] [--fleet-mb 300] [--rounds 3]

--goals: the speed goals as a user meets them, each a ratio of two measurements made in one
run (interleaved rounds, best of each): whole commands (`bcgtune trace ...`, interpreter
start-up included) against `grep -c 'Prefill batch'` on the same cached file of real lines
(the public excerpts repeated to --goal-mb MB); a generated fleet (benchmarks/fleet_gen.py,
--fleet-mb MB, rotated logs of two configurations) per batch against grep over its files,
with the peak memory of a per-batch and a histogram-only run; `-j 2` against `-j 1` on that
fleet; and the default `bcgtune suggest-buckets` against `python -c pass`.

Every child process runs in benchmarks/_work/, never in the source tree, so `bcgtune` is the
installed package (the one the first line names: its folder and whether its compiled line
scanner is built); the commands are the `bcgtune` script installed beside this Python.

--real-mb: first, the public SGLang log excerpts of tests/data/sglang-logs/ repeated to that
size, parsed histogram-only and with per-batch columns (one process each), beside
`grep -c 'Prefill batch'` on the same file (CPU time of each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model

WORK = Path(__file__).resolve().parent / "_work"
REPO = Path(__file__).resolve().parents[1]


def _block(rng: np.random.Generator, n_lines: int, t0: int) -> bytes:
    """n_lines of a loaded server: prefill / decode / access / other lines."""
    kinds = rng.choice(4, size=n_lines, p=[0.35, 0.35, 0.25, 0.05])
    sizes = np.minimum(rng.lognormal(6.5, 1.2, size=n_lines).astype(int) + 1, 8192)
    out = []
    for i, k in enumerate(kinds.tolist()):
        t = t0 + i // 20
        stamp = f"[2026-08-27 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d} TP0]"
        if k == 0:
            n = int(sizes[i])
            out.append(
                f"{stamp} Prefill batch, #new-seq: {1 + n // 900}, #new-token: {n}, #cached-token: {n // 3}, "
                f"token usage: 0.{i % 97:02d}, #running-req: {i % 64}, #queue-req: {i % 7}, #pending-token: 0, "
                f"cuda graph: {'True' if n <= 8192 and n > 2 else 'False'}, input throughput (token/s): {n * 13.37:.2f}"
            )
        elif k == 1:
            out.append(
                f"{stamp} Decode batch, #running-req: {i % 64}, #token: {i * 7 % 400000}, token usage: 0.{i % 89:02d}, "
                f"cuda graph: True, gen throughput (token/s): {i % 5000 + 0.25:.2f}, #queue-req: 0"
            )
        elif k == 2:
            out.append(f'{stamp[:21]}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK')
        else:
            out.append(f"{stamp[:21]}] Cache flushed successfully! #queue-req: 0, #running-req: 0 (tokenizer manager)")
    return ("\n".join(out) + "\n").encode()


def _varied_block(rng: np.random.Generator, n_lines: int, t0: int) -> bytes:
    """n_lines of a busy DP-attention server logging milliseconds: 8 ranks, and counts
    of widely varying width (a few dozen thousand distinct field layouts per 100 MB)."""
    n = n_lines // 2
    seqs, tok = rng.integers(1, 300, n), np.minimum(rng.lognormal(7, 1.5, n).astype(int) + 1, 16384)
    cached, run = rng.lognormal(6, 3, n).astype(int), rng.integers(0, 512, n)
    queue, pend, thr = rng.lognormal(2, 2, n).astype(int), rng.lognormal(5, 4, n).astype(int), rng.lognormal(9, 2, n)
    out = []
    for i in range(n):
        t = t0 + i // 30
        stamp = f"[2026-08-27 {t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}.{i % 1000:03d} DP{i % 8} TP{i % 8}]"
        out.append(
            f"{stamp} Prefill batch, #new-seq: {seqs[i]}, #new-token: {tok[i]}, #cached-token: {cached[i]}, "
            f"token usage: 0.{i % 97:02d}, #running-req: {run[i]}, #queue-req: {queue[i]}, #pending-token: {pend[i]}, "
            f"cuda graph: {bool(i % 3)}, input throughput (token/s): {thr[i]:.2f}"
        )
        out.append(
            f"{stamp} Decode batch, #running-req: {run[i]}, #token: {i * 7 % 400000}, token usage: 0.{i % 89:02d}, "
            f"cuda graph: True, gen throughput (token/s): {thr[i] / 7:.2f}, #queue-req: {queue[i]}"
        )
    return ("\n".join(out) + "\n").encode()


def generate(path: Path, mb: float, seed: int, block=None) -> None:
    if path.exists() and path.stat().st_size >= mb * 1e6:
        return
    rng = np.random.default_rng(seed)
    blocks = [(block or _block)(rng, 40_000, 3600 * k) for k in range(4)]
    target = int(mb * 1e6)
    tmp = path.with_suffix(".tmp")
    written = 0
    with open(tmp, "wb") as fh:
        i = 0
        while written < target:
            b = blocks[i % len(blocks)]
            if written + len(b) > target:  # cut the last block at a line end
                fh.write(b[: b.rfind(b"\n", 0, target - written) + 1])
                break
            fh.write(b)
            written += len(b)
            i += 1
    os.replace(tmp, path)


# jobs 0: parse_logs without a jobs argument (also what a version without one accepts)
CHILD = r"""
import hashlib, json, resource, sys, time
from bcgtune.adapters.sglang.log import parse_logs
jobs, files = int(sys.argv[1]), sys.argv[2:]
flags = {f for f in files if f.startswith("--")}
files = [f for f in files if not f.startswith("--")]
hist = "--histogram-only" in flags
kw = {}
if "--numpy" in flags:  # the fast path on numpy, not the compiled line scanner
    from bcgtune.adapters.sglang.log import ParseOptions
    kw["options"] = ParseOptions(compiled=False)
r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
t0 = time.perf_counter()
tr = parse_logs(files, **({"jobs": jobs} if jobs else {}), **({"histogram_only": True} if hist else {}), **kw)
dt = time.perf_counter() - t0
r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) + (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
digest = hashlib.sha256(tr.sizes.tobytes() + tr.counts.tobytes())
for k in sorted(tr.batches or {}):
    digest.update(k.encode() + tr.batches[k].tobytes())
print(json.dumps({"seconds": dt, "cpu_seconds": cpu, "batches": tr.n_batches, "lines": tr.parse_stats["lines"],
                  "decode_lines": tr.parse_stats["decode_lines"], "digest": digest.hexdigest(),
                  "column_bytes": sum(v.nbytes for v in (tr.batches or {}).values()),
                  "peak_rss_kb": r1.ru_maxrss, "worker_peak_rss_kb": c1.ru_maxrss}))
"""


def parse_in_child(files: list[Path], jobs: int, repeat: int, histogram_only: bool = False, numpy_path: bool = False) -> dict:
    """Best (least wall time) of `repeat` runs, each in a fresh process."""
    best = None
    flag = ["--histogram-only"] * histogram_only + ["--numpy"] * numpy_path
    for _ in range(repeat):
        out = subprocess.run(  # run from WORK: `python -c` puts its folder first on sys.path (never the source tree)
            [sys.executable, "-c", CHILD, str(jobs), *flag, *map(str, files)], cwd=WORK, capture_output=True, check=True
        )
        r = json.loads(out.stdout)
        if best is None or r["seconds"] < best["seconds"]:
            best = r
    return best


def grep_count(path: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    out = subprocess.run(["grep", "-c", "Prefill batch", str(path)], capture_output=True)  # exit 1: none
    return int(out.stdout), time.perf_counter() - t0


def grep_cpu(path: Path, repeat: int) -> tuple[int, float, float]:
    """(count, best wall s, best CPU s) of `grep -c 'Prefill batch'` (CPU from the child's
    rusage: on a shared machine wall time also counts other sessions' work)."""
    import resource

    best_wall = best_cpu = float("inf")
    n = 0
    for _ in range(repeat):
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(["grep", "-c", "Prefill batch", str(path)], capture_output=True)  # exit 1: none
        wall = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best_wall = min(best_wall, wall)
        best_cpu = min(best_cpu, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        n = int(out.stdout)
    return n, best_wall, best_cpu


def real_logs(a: argparse.Namespace) -> None:
    """The public SGLang log excerpts of tests/data/sglang-logs/ concatenated and repeated to
    --real-mb MB: real lines (startup, capture, server_args, decode and prefill lines of
    many SGLang versions), every line of an excerpt repeated as often as the excerpt."""
    src = sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log"))
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in src)
    path = WORK / f"real_excerpts_{int(a.real_mb)}mb.log"
    if not path.exists() or path.stat().st_size < a.real_mb * 1e6:
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            for _ in range(int(a.real_mb * 1e6 // len(blob)) + 1):
                fh.write(blob)
        os.replace(tmp, path)
    print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB ({len(src)} public excerpts, {len(blob):,} bytes, repeated)")
    both_paths(path, a.repeat)


def both_paths(path: Path, repeat: int) -> None:
    """`grep -c 'Prefill batch'` and parse_logs of one file (histogram-only and per-batch
    columns) through the compiled line scanner (where built) and the numpy path, each in a
    fresh process, CPU time; checks that both paths give the same trace."""
    size_mb = path.stat().st_size / 1e6
    n_grep, g_wall, g_cpu = grep_cpu(path, repeat)
    print(f"  grep -c 'Prefill batch': {n_grep:,} lines; {g_wall:.2f} s wall; {g_cpu:.3f} s CPU = {size_mb / g_cpu:.0f} MB/s")
    from bcgtune.adapters.sglang.log.fastpath import LineTable

    paths = [(False, "compiled line scanner")] if LineTable is not None else []
    digests: dict[bool, set] = {True: set(), False: set()}
    for numpy_path, engine in paths + [(True, "numpy fast path")]:
        for hist in (True, False):
            r = parse_in_child([path], 1, repeat, histogram_only=hist, numpy_path=numpy_path)
            digests[hist].add(r["digest"])
            print(
                f"  {engine}, parse_logs({'histogram_only=True' if hist else 'per-batch columns'}): {r['batches']:,} "
                f"batches; {r['seconds']:.2f} s wall; {r['cpu_seconds']:.2f} s CPU = {size_mb / r['cpu_seconds']:.1f} MB/s "
                f"({r['cpu_seconds'] / g_cpu:.1f}x grep's CPU); peak RSS {r['peak_rss_kb'] / 1024:.0f} MiB"
            )
    cli_cpu, start_cpu = cli_cpu_seconds(path, repeat)
    print(
        f"  the command, `bcgtune trace --log LOG --histogram-only -o trace.json -q`: {cli_cpu:.2f} s CPU "
        f"({cli_cpu / g_cpu:.1f}x grep's CPU), of which start-up {start_cpu:.2f} s (the same command on a "
        f"{SMALLEST.stat().st_size:,}-byte log: Python, numpy, typer, pydantic); without it {cli_cpu - start_cpu:.2f} s "
        f"({(cli_cpu - start_cpu) / g_cpu:.1f}x)"
    )
    same = all(len(d) == 1 for d in digests.values())
    print(f"  both paths give the same trace: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit("the compiled line scanner and the numpy path gave different traces")


SMALLEST = REPO / "tests" / "data" / "sglang-logs" / "26_doc_hand_wrapped_prefill.log"


def cli_cpu_seconds(path: Path, repeat: int) -> tuple[float, float]:
    """Best CPU time (the process and its children) of `bcgtune trace --log path
    --histogram-only -o ... -q` run as a user runs it, and of the same command on the
    smallest excerpt (its start-up)."""
    import resource

    def best(log: Path) -> float:
        out = WORK / "cli_trace.json"
        cmd = [sys.executable, "-m", "bcgtune", "trace", "--log", str(log), "--histogram-only", "-o", str(out), "-q"]
        cpu = float("inf")
        for _ in range(repeat):
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(cmd, cwd=WORK, capture_output=True, check=True)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = min(cpu, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        return cpu

    return best(path), best(SMALLEST)


def single_process(a: argparse.Namespace) -> None:
    big, small = WORK / f"synthetic_{int(a.mb)}mb.log", WORK / f"synthetic_{int(a.small_mb)}mb.log"
    generate(big, a.mb, a.seed)
    generate(small, a.small_mb, a.seed)
    results = {}
    for label, path in (("small", small), ("big", big)):
        size_mb = path.stat().st_size / 1e6
        r = parse_in_child([path], 0, a.repeat)
        n_grep, grep_s = grep_count(path)
        r.update(size_mb=size_mb, grep_count=n_grep, grep_s=grep_s)
        results[label] = r
        print(
            f"{path.name}: {size_mb:.1f} MB, {r['lines']:,} lines, {r['batches']:,} prefill batches "
            f"(grep -c: {n_grep:,}), {r['decode_lines']:,} decode lines\n"
            f"  parse_logs: {r['seconds']:.2f} s wall = {size_mb / r['seconds']:.1f} MB/s; "
            f"{r['cpu_seconds']:.2f} s CPU = {size_mb / r['cpu_seconds']:.1f} MB/s; "
            f"grep -c 'Prefill batch': {grep_s:.2f} s = {size_mb / grep_s:.0f} MB/s\n"
            f"  peak RSS {r['peak_rss_kb'] / 1024:.1f} MiB; per-batch columns {r['column_bytes'] / 2**20:.1f} MiB"
        )
        if r["batches"] != n_grep:
            print("  MISMATCH: parser and grep disagree on the prefill line count", file=sys.stderr)
    varied = WORK / f"synthetic_varied_{int(a.varied_mb)}mb.log"
    generate(varied, a.varied_mb, a.seed, _varied_block)
    r = parse_in_child([varied], 0, a.repeat)
    size_mb = varied.stat().st_size / 1e6
    print(
        f"{varied.name}: {size_mb:.1f} MB, {r['batches']:,} prefill batches (8 DP ranks, millisecond stamps, "
        f"varied field widths)\n  parse_logs: {r['seconds']:.2f} s wall = {size_mb / r['seconds']:.1f} MB/s; "
        f"{r['cpu_seconds']:.2f} s CPU = {size_mb / r['cpu_seconds']:.1f} MB/s"
    )
    s, b = results["small"], results["big"]
    growth = (b["peak_rss_kb"] - s["peak_rss_kb"]) / 1024
    col_growth = (b["column_bytes"] - s["column_bytes"]) / 2**20
    ratio = b["size_mb"] / s["size_mb"]
    print(
        f"peak RSS: {s['peak_rss_kb'] / 1024:.1f} MiB ({s['size_mb']:.0f} MB log) -> {b['peak_rss_kb'] / 1024:.1f} MiB "
        f"({b['size_mb']:.0f} MB log, x{ratio:.1f} input): +{growth:.1f} MiB, of which per-batch columns "
        f"+{col_growth:.1f} MiB"
    )
    # No line is kept: RSS may grow by the columns (collected per chunk, then joined once,
    # and numpy's temporaries for the histogram), never by the input size.
    limit = 3 * col_growth + 16
    verdict = "FLAT (bounded by per-batch columns)" if growth <= limit else "NOT FLAT"
    print(f"memory check: growth {growth:.1f} MiB <= {limit:.1f} MiB allowed: {verdict}")
    if growth > limit:
        sys.exit(1)


def several_files(a: argparse.Namespace) -> None:
    files = [WORK / f"synthetic_{int(a.file_mb)}mb_seed{a.seed + 1 + k}.log" for k in range(a.files)]
    for k, f in enumerate(files):
        generate(f, a.file_mb, a.seed + 1 + k)
    total = sum(f.stat().st_size for f in files) / 1e6
    print(f"{a.files} files x {a.file_mb:.0f} MB = {total:.0f} MB:")
    digests, base = set(), None
    for jobs in a.jobs:
        r = parse_in_child(files, jobs, a.repeat)
        digests.add(r["digest"])
        base = base or r["seconds"]
        print(
            f"  jobs={jobs}: {r['seconds']:.2f} s wall = {total / r['seconds']:.0f} MB/s "
            f"(x{base / r['seconds']:.2f} vs jobs={a.jobs[0]}); {r['cpu_seconds']:.2f} s CPU in all processes; "
            f"peak RSS {r['peak_rss_kb'] / 1024:.0f} MiB, largest worker {r['worker_peak_rss_kb'] / 1024:.0f} MiB"
        )
    print(f"  same trace for every jobs value: {'yes' if len(digests) == 1 else 'NO'}")
    if len(digests) != 1:
        sys.exit(1)


# ---- the goals, as a user meets them ---------------------------------------------------------------
WHICH = r"""
import importlib.util, json, bcgtune
from bcgtune.adapters.sglang.log.fastpath import LineTable
print(json.dumps({"path": bcgtune.__file__, "compiled": LineTable is not None, "version": bcgtune.__version__}))
"""


# As a user's install runs: Python's bytecode cache written and read (a pip install compiles
# it; with PYTHONDONTWRITEBYTECODE set, every start compiles bcgtune, numpy, typer and pydantic
# from source again: 0.3 s on the 2-core machine)
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS KiB) of one command and the processes it waited for (its
    workers), its output read through a pipe (grep stops at the first match when it writes
    to /dev/null). The peak RSS is GNU time's (a child forked from this process counts this
    process's memory as its own until it execs); NaN without /usr/bin/time."""
    import tempfile

    gnu_time = Path("/usr/bin/time")
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        wrap = [str(gnu_time), "-f", "%M", "-o", rss.name] if gnu_time.exists() else []
        t0 = time.perf_counter()
        p = subprocess.Popen([*wrap, *cmd], cwd=WORK, stdout=subprocess.PIPE, stderr=err, env=_ENV)
        assert p.stdout is not None
        while p.stdout.read(1 << 20):
            pass
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):  # grep exits 1 when nothing matches
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.read().decode(errors='replace')[-800:]}")
        text = rss.read().split()
        peak = float(text[-1]) if wrap and text and text[-1].isdigit() else float("nan")
    return wall, ru.ru_utime + ru.ru_stime, peak


def _bcgtune() -> list[str]:
    """The installed `bcgtune` script beside this Python (else `python -m bcgtune`)."""
    script = Path(sys.executable).parent / "bcgtune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bcgtune"]


def _real_file(mb: float) -> Path:
    src = sorted((REPO / "tests" / "data" / "sglang-logs").glob("*.log"))
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in src)
    path = WORK / f"real_excerpts_{int(mb)}mb.log"
    if not path.exists() or path.stat().st_size < mb * 1e6:
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            for _ in range(int(mb * 1e6 // len(blob)) + 1):
                fh.write(blob)
        os.replace(tmp, path)
    return path


def _fleet(mb: float) -> list[Path]:
    from fleet_gen import demo_fleet

    folder = WORK / f"fleet_{int(mb)}mb"
    done = folder / "DONE"
    if not done.exists():
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        probe = demo_fleet(WORK / "fleet_probe", batches=2000, seed=7)[1].bytes
        shutil.rmtree(WORK / "fleet_probe")
        demo_fleet(folder, batches=2000, seed=7, repeat=max(1, round(mb * 1e6 / probe)))
        done.write_text("")
    return sorted(p for p in folder.iterdir() if p.name != "DONE")


def _cache(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(16 << 20):
                pass


def goals(a: argparse.Namespace) -> None:
    which = json.loads(subprocess.run([sys.executable, "-c", WHICH], cwd=WORK, capture_output=True, check=True, env=_ENV).stdout)
    bc = _bcgtune()
    print(
        f"bcgtune {which['version']} timed from {Path(which['path']).parent} (compiled line scanner: "
        f"{'yes' if which['compiled'] else 'NO: the numpy path'}); commands: {' '.join(bc)}"
    )
    real = _real_file(a.goal_mb)
    fleet = _fleet(a.fleet_mb)
    real_mb, fleet_mb = real.stat().st_size / 1e6, sum(p.stat().st_size for p in fleet) / 1e6
    print(f"real lines: {real.name}, {real_mb:,.0f} MB; fleet: {len(fleet)} files, {fleet_mb:,.0f} MB")
    out = WORK / "goal_out"
    out.mkdir(exist_ok=True)
    fleet_dir = str(fleet[0].parent)
    cases = {
        "grep -c, real lines": ["grep", "-c", "Prefill batch", str(real)],
        "histogram-only (-o h.json)": [*bc, "trace", "--log", str(real), "--histogram-only", "-o", str(out / "h.json"), "-q"],
        "per-batch, -o trace (its form chosen)": [*bc, "trace", "--log", str(real), "-o", str(out / "trace"), "-q"],
        "per-batch, -o trace.json": [*bc, "trace", "--log", str(real), "-o", str(out / "trace.json"), "-q"],
        "per-batch, -o trace.npz": [*bc, "trace", "--log", str(real), "-o", str(out / "trace.npz"), "-q"],
        "grep -c, fleet": ["grep", "-c", "Prefill batch", *map(str, fleet)],
        "fleet per-batch -j 1": [*bc, "trace", "--log", fleet_dir, "-o", str(out / "f1"), "-q", "-j", "1"],
        "fleet per-batch -j 2": [*bc, "trace", "--log", fleet_dir, "-o", str(out / "f2"), "-q", "-j", "2"],
        "fleet histogram-only -j 1": [
            *bc,
            "trace",
            "--log",
            fleet_dir,
            "--histogram-only",
            "-o",
            str(out / "h1.json"),
            "-q",
            "-j",
            "1",
        ],  # fmt: skip
        "fleet histogram-only -j 2": [
            *bc,
            "trace",
            "--log",
            fleet_dir,
            "--histogram-only",
            "-o",
            str(out / "h2.json"),
            "-q",
            "-j",
            "2",
        ],  # fmt: skip
        "python -c pass": [sys.executable, "-c", "pass"],
        "suggest-buckets (default)": [*bc, "suggest-buckets", "-q"],
    }
    best: dict[str, list[float]] = {k: [float("inf")] * 3 for k in cases}
    for cmd in cases.values():  # a warm-up: the bytecode caches written, the files read once
        _run(cmd)
    for r in range(a.rounds):
        _cache([real, *fleet])
        for name, cmd in cases.items():
            wall, cpu, rss = _run(cmd)
            b = best[name]
            best[name] = [min(b[0], wall), min(b[1], cpu), min(b[2], rss / 1024)]
        print(f"  round {r + 1}/{a.rounds} done, load average {os.getloadavg()[0]:.1f}")
    print("best of each (wall s, CPU s, peak RSS MiB):")
    for name, (wall, cpu, rss) in best.items():
        print(f"  {name:40s} {wall:7.3f} {cpu:7.3f} {rss:8.0f}")

    def ratio(x: str, y: str) -> str:
        return f"{best[x][1] / best[y][1]:.2f}x CPU, {best[x][0] / best[y][0]:.2f}x wall"

    g = "grep -c, real lines"
    print("goals (ratios of this run's best figures):")
    print(f"  histogram-only, {real_mb:,.0f} MB of real lines, whole command / grep -c: {ratio('histogram-only (-o h.json)', g)} "
          "(goal: within 5x)")  # fmt: skip
    for k in ("per-batch, -o trace (its form chosen)", "per-batch, -o trace.npz", "per-batch, -o trace.json"):
        print(f"  {k} / grep -c: {ratio(k, g)} (goal: within 5x)")
    fg = "grep -c, fleet"
    print(f"  fleet of {fleet_mb:,.0f} MB, per-batch -j 1 / grep -c over its files: {ratio('fleet per-batch -j 1', fg)}")
    print(f"  fleet per-batch -j 2 / grep -c over its files: {ratio('fleet per-batch -j 2', fg)} (goal: within 5x)")
    print(
        f"  fleet peak memory, per-batch / histogram-only: {best['fleet per-batch -j 1'][2]:.0f} / "
        f"{best['fleet histogram-only -j 1'][2]:.0f} MiB (goal: the same order)"
    )
    for kind in ("per-batch", "histogram-only"):
        j1, j2 = best[f"fleet {kind} -j 1"][0], best[f"fleet {kind} -j 2"][0]
        print(f"  fleet {kind}, -j 1 / -j 2 wall: {j1 / j2:.2f}x (goal: near 2x on 2 cores)")
    p, sg = best["python -c pass"][0], best["suggest-buckets (default)"][0]
    print(
        f"  suggest-buckets default: {sg:.3f} s wall, {sg / p:.1f}x `python -c pass` ({p:.3f} s) in this run (goal: under 0.5 s)"
    )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--small-mb", type=float, default=20)
    ap.add_argument("--varied-mb", type=float, default=100)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-mb", type=float, default=50)
    ap.add_argument("--jobs", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-mb", type=float, default=200, help="the public excerpts repeated to this size (0: skip)")
    ap.add_argument("--only-real", action="store_true", help="measure only the public excerpts repeated")
    ap.add_argument("--file", type=Path, nargs="*", help="measure only these logs, by both paths, beside grep")
    ap.add_argument("--goals", action="store_true", help="the speed goals as a user meets them (see the module's doc)")
    ap.add_argument("--goal-mb", type=float, default=1000, help="--goals: MB of real lines (the excerpts repeated)")
    ap.add_argument("--fleet-mb", type=float, default=300, help="--goals: MB of the generated fleet")
    ap.add_argument("--rounds", type=int, default=3, help="--goals: rounds of every command, interleaved")
    a = ap.parse_args()
    WORK.mkdir(exist_ok=True)
    print(
        f"machine: nproc={os.cpu_count()}, cpu={cpu_model()}, python={platform.python_version()}, "
        f"numpy={np.__version__}, load average {os.getloadavg()[0]:.1f} at start"
    )
    if a.goals:
        goals(a)
        return
    if a.file:
        for f in a.file:
            print(f"{f.name}: {f.stat().st_size / 1e6:.1f} MB")
            both_paths(f, a.repeat)
        return
    if a.real_mb > 0:
        real_logs(a)
    if a.only_real:
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return
    single_process(a)
    if a.jobs:
        several_files(a)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
