"""A per-batch trace written as JSON and as the binary form (.npz), from the same logs: file
size, the CPU time and peak memory of writing it, of reading it back, and of the default
`bcgtune suggest-buckets` on it, each in a fresh child process; beside the histogram-only
trace of the same logs.

Usage: python benchmarks/trace_formats.py [--mb 200] [--log FILE]
Default logs: the public SGLang log excerpts of tests/data/sglang-logs/ repeated to --mb MB
(benchmarks/parse_throughput.py writes the same file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
WORK = Path(__file__).resolve().parent / "_work"

_CHILD = r"""
import json, resource, sys, time
t0 = time.process_time()
w0 = time.perf_counter()
what = sys.argv[1]
if what == "cli":
    from bcgtune.cli.app import run
    code = run(sys.argv[2:])
    assert code == 0, code
elif what == "load":
    from bcgtune.files.trace_file import load_trace
    t = load_trace(sys.argv[2])
    assert t.n_batches > 0
ru = resource.getrusage(resource.RUSAGE_SELF)
took = {"cpu": time.process_time() - t0, "wall": time.perf_counter() - w0, "rss_mib": ru.ru_maxrss / 1024}
print(json.dumps(took), file=sys.stderr)
"""


def _run(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env, cwd=REPO)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        raise SystemExit(f"child failed ({' '.join(args)}): {r.stderr[-2000:]}") from None


def _real_log(mb: int) -> Path:
    """The same file as parse_throughput.py --real-mb writes (and reuses)."""
    out = WORK / f"real_excerpts_{mb}mb.log"
    if out.exists() and out.stat().st_size >= mb * 1e6:
        return out
    WORK.mkdir(exist_ok=True)
    logs = sorted((REPO / "tests/data/sglang-logs").glob("*.log"))
    block = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs)
    with open(out, "wb") as fh:
        for _ in range(int(mb * 1e6 // len(block)) + 1):
            fh.write(block)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    log = Path(a.log) if a.log else _real_log(a.mb)
    print(f"machine: nproc={os.cpu_count()}, cpu={cpu_model()}, load average {os.getloadavg()[0]:.1f} at start")
    print(f"logs: {log} ({log.stat().st_size / 1e6:,.1f} MB)")
    rows = []
    for name, extra in (("histogram-only JSON", ["--histogram-only"]), ("per-batch JSON", []), ("per-batch .npz", [])):
        out = WORK / ("trace_" + name.replace(" ", "_").replace(".", "") + (".npz" if "npz" in name else ".json"))
        w = _run("cli", "trace", "--log", str(log), *extra, "-o", str(out), "-q")
        r = _run("load", str(out))
        s = _run("cli", "suggest-buckets", str(out), "--group", "0", "-q")
        rows.append((name, out.stat().st_size, w, r, s))
    print(f"{'trace':22s} {'file':>10s}  {'write (trace --log)':>22s}  {'read':>18s}  {'suggest-buckets':>18s}")
    for name, size, w, r, s in rows:

        def f(x):
            return f"{x['cpu']:6.2f} s {x['rss_mib']:6.0f} MiB"

        print(f"{name:22s} {size / 1e6:8.2f} MB  {f(w):>22s}  {f(r):>18s}  {f(s):>18s}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
