"""A fleet's logs: memory of long logs, the Dask run's scaling, the reducer's memory.

Generates synthetic SGLang server logs (seeded, the blocks of parse_throughput.py, with a
startup and server_args line per file) in a temporary folder, deletes them at the end,
and measures, each command in a fresh child process (peak RSS from ru_maxrss):
  * memory: a --long-mb log through `bcgtune trace --log L`, `trace --log L -o t.json`,
    `trace --log L --histogram-only -o t.json` and `drift --profile h200 --log L`, with the
    bcgtune given by --repo (default: this checkout; another checkout measures "before");
  * scaling: --scale-mb of logs in --scale-files files parsed on a Dask LocalCluster of N
    worker processes for each N of --workers (`--cluster local:N`, histogram-only), wall
    time and MB/s, beside N plain processes parsing the same files at once, and the serial
    parse of the same files on one core for reference; --rounds R repeats every N R times,
    Dask and the plain processes taking turns to go first, and prints the paired ratios;
  * reducer: --reduce-gb of logs (written on the fly as --reduce-files files) parsed on a
    LocalCluster into one histogram-only trace: the peak RSS of the client (where the
    final merge result lands) and of every worker (where the map and the pairwise merges
    run), against the 500 MB bound.

Usage: python benchmarks/fleet_logs.py [--long-mb 2000] [--scale-mb 1000] [--scale-files 8]
           [--reduce-gb 10] [--reduce-files 40] [--workers 1 2] [--rounds 1] [--repo PATH]
           [--skip memory,scaling,reduce] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model
from parse_throughput import _block

REPO = Path(__file__).resolve().parents[1]
HEAD = (
    "[2026-08-27 00:00:00] server_args={'model_path': 'org/Model-8B', 'tp_size': 1, 'dp_size': 1, "
    "'enable_dp_attention': False, 'chunked_prefill_size': 8192}\n"
    "[2026-08-27 00:00:01 TP0] max_total_num_tokens=392920, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=4096, context_len=40960, available_gpu_mem=10.54 GB\n"
).encode()


def write_log(path: Path, mb: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks = [_block(rng, 40_000, 3600 * k) for k in range(4)]
    target = int(mb * 1e6)
    with open(path, "wb") as fh:
        fh.write(HEAD)
        written, i = len(HEAD), 0
        while written < target:
            b = blocks[i % len(blocks)]
            if written + len(b) > target:
                fh.write(b[: b.rfind(b"\n", 0, target - written) + 1])
                break
            fh.write(b)
            written += len(b)
            i += 1


RUN = r"""
import json, resource, sys, time
sys.argv = ["bcgtune", *sys.argv[1:]]
from bcgtune.cli.app import run
t0 = time.perf_counter()
code = run(sys.argv[1:])
dt = time.perf_counter() - t0
self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("\n@@" + json.dumps({"code": code, "seconds": dt, "rss_kb": self_kb, "children_rss_kb": kids_kb}), file=sys.stderr)
"""


def bcgtune(args: list[str], repo: Path, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", RUN, *args], cwd=cwd, env=env, capture_output=True, text=True)
    tail = out.stderr.rsplit("@@", 1)
    result = json.loads(tail[1]) if len(tail) == 2 else None
    if result is None or result["code"] != 0:
        raise SystemExit(f"bcgtune {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return result


def memory(a, tmp: Path) -> None:
    log = tmp / "long.log"
    write_log(log, a.long_mb, 1)
    size = log.stat().st_size / 1e6
    out = tmp / "t.json"
    print(f"memory: one log of {size:,.0f} MB (bcgtune from {a.repo})")
    cases = [
        ("trace --log L", ["trace", "--log", str(log), "--quiet"]),
        ("trace --log L -o t.json", ["trace", "--log", str(log), "-o", str(out), "--quiet"]),
        ("trace --log L --histogram-only -o t.json", ["trace", "--log", str(log), "--histogram-only", "-o", str(out), "--quiet"]),
        ("drift --profile h200 --log L", ["drift", "--profile", "h200", "--log", str(log), "--quiet"]),
    ]
    for label, args in cases:
        r = bcgtune(args, Path(a.repo), tmp)
        if r["code"] not in (0, 1) and "--histogram-only" in args:
            print(f"  {label}: not supported by this bcgtune (exit {r['code']})")
            continue
        extra = f"; trace file {out.stat().st_size / 1e6:,.0f} MB" if "-o" in args and out.exists() else ""
        print(f"  {label}: exit {r['code']}, {r['seconds']:.1f} s, peak RSS {r['rss_kb'] / 1024:,.0f} MiB{extra}")
        out.unlink(missing_ok=True)
    log.unlink()


SCALE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from bcgtune.services.trace import _client, trace_on_cluster
workers, files = int(sys.argv[1]), sys.argv[2:]
client, cluster = _client(f"local:{workers}")
# workers warm: the parse's imports done before the clock starts, as the plain processes do theirs
client.run(lambda: [__import__(m) for m in ("bcgtune.services.trace", "bcgtune.adapters.sglang.log.build",
                                            "bcgtune.adapters.sglang.log.columns")])
start = time.perf_counter() - t0
cpu0 = sum(client.run(time.process_time).values())
t1 = time.perf_counter()
trace = trace_on_cluster(files, cluster.scheduler_address)
dt = time.perf_counter() - t1
cpu = sum(client.run(time.process_time).values()) - cpu0
client.close(); cluster.close()
print("@@" + json.dumps({"start": start, "seconds": dt, "cpu": cpu, "batches": trace.n_batches}))
"""


def scaling(a, tmp: Path) -> None:
    files = [tmp / f"scale{k}.log" for k in range(a.scale_files)]
    for k, f in enumerate(files):
        write_log(f, a.scale_mb / a.scale_files, 10 + k)
    total = sum(f.stat().st_size for f in files) / 1e6
    print(f"scaling: {len(files)} logs, {total:,.0f} MB in all")
    r = bcgtune(["trace", "--log", *map(str, files), "--histogram-only", "-j", "1", "--quiet"], REPO, tmp)
    print(f"  serial parse, one process (histogram-only): {r['seconds']:.1f} s = {total / r['seconds']:.0f} MB/s")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    dask: dict[int, list[float]] = {n: [] for n in a.workers}
    plain: dict[int, list[float]] = {n: [] for n in a.workers}
    for rnd in range(a.rounds):
        if a.rounds > 1:
            print(f"  round {rnd + 1}/{a.rounds} ({'Dask' if rnd % 2 == 0 else 'plain processes'} first)")
        order = (dask_run, processes_alone) if rnd % 2 == 0 else (processes_alone, dask_run)
        for fn in order:
            out = dask if fn is dask_run else plain
            for n in a.workers:
                out[n].append(fn(a, n, files, total, env, tmp, base=out[a.workers[0]][-1] if out[a.workers[0]] else None))
    if a.rounds > 1:
        print(f"  Dask / plain processes (plain time over Dask time, paired by round), {a.rounds} rounds:")
        for n in a.workers:
            ratios = [p / d for p, d in zip(plain[n], dask[n])]
            print(
                f"    N={n}: Dask {np.median(dask[n]):.2f} s, plain {np.median(plain[n]):.2f} s (medians); "
                f"ratio median {np.median(ratios):.2f}, rounds " + ", ".join(f"{x:.2f}" for x in ratios)
            )
    for f in files:
        f.unlink()


def dask_run(a, n: int, files: list[Path], total: float, env: dict, tmp: Path, base: float | None) -> float:
    cmd = [sys.executable, "-c", SCALE, str(n), *map(str, files)]
    out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    if "@@" not in out.stdout:
        raise SystemExit(out.stderr[-3000:])
    r = json.loads(out.stdout.rsplit("@@", 1)[1])
    base = base or r["seconds"]
    print(
        f"  Dask LocalCluster, {n} worker(s): {r['seconds']:.1f} s = {total / r['seconds']:.0f} MB/s, "
        f"x{base / r['seconds']:.2f} vs {a.workers[0]} worker(s); {r['cpu']:.1f} CPU s in the workers "
        f"(cluster start, not counted: {r['start']:.1f} s)"
    )
    return float(r["seconds"])


PARSE = r"""
import sys, time
from bcgtune.adapters.sglang.log import parse_logs
start_at = float(sys.argv[1])
while time.time() < start_at:  # every process imported: all start parsing together
    time.sleep(0.001)
c0 = time.process_time()
parse_logs(sys.argv[2:], histogram_only=True, jobs=1)
print("@@", time.process_time() - c0, time.time())
"""


def processes_alone(a, n: int, files: list[Path], total: float, env: dict, tmp: Path, base: float | None) -> float:
    """The same logs split over N plain processes that start parsing together, no Dask:
    what the machine itself gives N parses at once (its shared caches, memory bandwidth and
    hyperthreads), beside which the cluster's figures are read."""
    shares = [[str(f) for f in files[i::n]] for i in range(n)]
    start_at = time.time() + 3.0  # after every interpreter has started and imported
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PARSE, repr(start_at), *share], cwd=tmp, env=env, stdout=subprocess.PIPE, text=True
        )
        for share in shares
    ]
    cpu, end = 0.0, start_at
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0 or "@@" not in out:
            raise SystemExit(f"a plain parse process failed (exit {p.returncode})")
        c, e = out.rsplit("@@", 1)[1].split()
        cpu, end = cpu + float(c), max(end, float(e))
    dt = end - start_at
    base = base or dt
    print(
        f"  {n} plain process(es), no Dask: {dt:.1f} s = {total / dt:.0f} MB/s, x{base / dt:.2f} vs {a.workers[0]}; "
        f"{cpu:.1f} CPU s parsing"
    )
    return dt


REDUCE = r"""
import json, resource, sys, time
from bcgtune.services.trace import _client, trace_on_cluster
files, workers = sys.argv[2:], int(sys.argv[1])
client, cluster = _client(f"local:{workers}")
t0 = time.perf_counter()
trace = trace_on_cluster(files, cluster.scheduler_address)
dt = time.perf_counter() - t0
peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
client.close(); cluster.close()
print("@@" + json.dumps({"seconds": dt, "batches": trace.n_batches, "sizes": int(trace.sizes.size),
      "pairs": int(sum(g.mix_tokens.size for g in trace.groups)), "client_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      "worker_kb": list(peaks.values())}))
"""


def reduce(a, tmp: Path) -> None:
    n = a.reduce_files
    per_mb = a.reduce_gb * 1000 / n
    first = tmp / "r0.log"
    write_log(first, per_mb, 100)
    files = [first]
    for k in range(1, n):  # copies of one generated log (fast to write), each its own source
        f = tmp / f"r{k}.log"
        shutil.copyfile(first, f)
        with open(f, "ab") as fh:  # ... and a line of its own, so no two sources are the same bytes
            fh.write(f"[2026-08-27 23:59:59 TP0] Prefill batch, #new-seq: 1, #new-token: {k + 1}, cuda graph: True\n".encode())
        files.append(f)
    total = sum(f.stat().st_size for f in files) / 1e9
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, "-c", REDUCE, str(max(a.workers)), *map(str, files)], cwd=tmp, env=env, capture_output=True, text=True
    )
    if "@@" not in out.stdout:
        raise SystemExit(out.stderr[-3000:])
    r = json.loads(out.stdout.rsplit("@@", 1)[1])
    worst = max([r["client_kb"], *r["worker_kb"]]) / 1024
    print(
        f"reducer: {len(files)} logs, {total:.1f} GB in all, on {max(a.workers)} workers: {r['seconds']:.0f} s = "
        f"{total * 1000 / r['seconds']:.0f} MB/s; {r['batches']:,} batches, {r['sizes']:,} sizes, "
        f"{r['pairs']:,} (tokens, requests) pairs\n"
        f"  peak RSS: client {r['client_kb'] / 1024:.0f} MiB, workers "
        + ", ".join(f"{kb / 1024:.0f}" for kb in r["worker_kb"])
        + f" MiB: {'under' if worst < 500 * 1e6 / 2**20 else 'OVER'} 500 MB"
    )
    for f in files:
        f.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--long-mb", type=float, default=2000)
    ap.add_argument("--scale-mb", type=float, default=1000)
    ap.add_argument("--scale-files", type=int, default=8)
    ap.add_argument("--reduce-gb", type=float, default=10)
    ap.add_argument("--reduce-files", type=int, default=40)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repo", default=str(REPO))
    ap.add_argument("--skip", default="")
    ap.add_argument("--rounds", type=int, default=1, help="scaling: rounds of every N, Dask or plain first by turns")
    ap.add_argument("--tmp", default=None, help="folder for the generated logs (default: a new temporary folder)")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    print(
        f"machine: nproc={os.cpu_count()}, cpu={cpu_model()}, python={platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    if a.tmp:
        Path(a.tmp).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bcgtune-fleet-", dir=a.tmp))
    try:
        if "memory" not in skip:
            memory(a, tmp)
        if "scaling" not in skip:
            scaling(a, tmp)
        if "reduce" not in skip:
            reduce(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
