"""Wall time, CPU time and peak memory of the torch engine's CPU dry run: `capture` and
`calibrate` with `--model tiny --device cpu`, in the forms the README and the commands' help
show, each the real CLI in a fresh child process (interpreter start and torch import
included).

    python benchmarks/engine_cpu_dry_run.py [--threads N] [--only NAME]

Forms:
  capture-help      capture --buckets '256 512 1024 2048' (the help's example list)
  capture-profile   capture --profile mi355x (the hand-tuned list, 11 buckets up to 5376)
  capture-ladder    capture --buckets <SGLang's default ladder up to 8192: 58 buckets>
  calibrate         calibrate -o cal.json (the default sizes, 16 ... 8192)
  calibrate-grid    calibrate --sizes-from trace.json --grid 64 -o cal.json (the README's
                    trace from its server log excerpt: 14 batches, 110 grid sizes)

Peak RSS is the child's own (wait4), CPU is its user + system time. On a machine shared with
other work, wall time exceeds CPU time by the load: the load average is printed with each
form. `--threads N` sets OMP_NUM_THREADS for the children (default: torch's own choice).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOG = REPO / "tests" / "data" / "sglang-logs" / "24_newest_decode_graph_end_startup_and_load.log"
TARGET_S = 15.0
TARGET_GIB = 1.0


def _machine() -> str:
    sys.path.insert(0, str(HERE))
    import torch
    from _machine import cpu_model

    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, torch {torch.__version__}"


def _forms(work: Path) -> dict[str, list[str]]:
    sys.path.insert(0, str(REPO))
    from bcgtune.core.sglang.ladder import sglang_default_ladder

    ladder = " ".join(str(b) for b in sglang_default_ladder(8192))
    tiny = ["--model", "tiny", "--device", "cpu", "--quiet"]
    return {
        "capture-help": ["capture", "--buckets", "256 512 1024 2048", *tiny],
        "capture-profile": ["capture", "--profile", "mi355x", *tiny],
        "capture-ladder": ["capture", "--buckets", ladder, *tiny],
        "calibrate": ["calibrate", "-o", str(work / "cal.json"), *tiny],
        "calibrate-grid": [
            "calibrate",
            "--sizes-from",
            str(work / "trace.json"),
            "--grid",
            "64",
            "-o",
            str(work / "cal-grid.json"),
            *tiny,
        ],
    }


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS GiB) of `python -m bcgtune ARGS` in a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bcgtune", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bcgtune {' '.join(args)} exited {proc.returncode}: {err.strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the children")
    ap.add_argument("--only", action="append", help="run only this form (repeatable)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    print(f"machine: {_machine()}; OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "bcgtune", "trace", "--log", str(LOG), "-o", str(work / "trace.json"), "--quiet"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        worst = 0.0, 0.0
        for name, cli in _forms(work).items():
            if args.only and name not in args.only:
                continue
            load = os.getloadavg()[0]
            wall, cpu, rss = _run(cli, env)
            worst = max(worst[0], wall), max(worst[1], rss)
            print(f"{name:16s} wall {wall:6.1f} s  cpu {cpu:6.1f} s  peak RSS {rss:5.2f} GiB  (load {load:.1f} at start)")
        print(f"slowest {worst[0]:.1f} s (target {TARGET_S:.0f} s), largest {worst[1]:.2f} GiB (target {TARGET_GIB:.0f} GiB)")


if __name__ == "__main__":
    main()
