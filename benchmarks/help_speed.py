"""Wall time of `bcgtune --help` and `bcgtune COMMAND --help` as a user runs them: a fresh
process each time (interpreter start, imports, help text), through the installed `bcgtune`
console script when there is one next to this interpreter, else `python -m bcgtune`.

    python benchmarks/help_speed.py [--repeat 7]

Prints the best and median of `--repeat` runs for each, and which of numpy, pydantic, rich
and the command modules the help of each imported (the target: under 0.3 s, no command
module for `bcgtune --help`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
COMMANDS = ["trace", "suggest-buckets", "drift", "capture", "validate", "calibrate", "serve", "doctor", "bench"]
_PROBE = """
import sys
from bcgtune.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = [m for m in ("numpy", "pydantic", "rich") if m in sys.modules]
cmds = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("bcgtune.cli.commands."))
sys.stderr.write("imported: " + (", ".join(heavy) or "none of numpy, pydantic, rich") + "; command modules: "
                 + (", ".join(cmds) or "none") + "\\n")
"""


def _machine() -> str:
    sys.path.insert(0, str(HERE))
    import typer
    from _machine import cpu_model

    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, typer {typer.__version__}"


def _launcher() -> list[str]:
    script = Path(sys.executable).parent / "bcgtune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bcgtune"]


def _time(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def _imports(args: list[str]) -> str:
    p = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True)
    return p.stderr.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    launcher = _launcher()
    print(f"machine: {_machine()}")
    print(f"command: {' '.join(Path(launcher[0]).name if i == 0 else x for i, x in enumerate(launcher))} ... --help")
    _time([sys.executable, "-c", "pass"], 1)  # warm the file cache
    base = _time([sys.executable, "-c", "pass"], a.repeat)
    print(f"python -c pass: best {min(base):.3f} s, median {statistics.median(base):.3f} s")
    for args in [["--help"]] + [[c, "--help"] for c in COMMANDS]:
        t = _time(launcher + args, a.repeat)
        name = "bcgtune " + " ".join(args)
        print(f"{name:<32} best {min(t):.3f} s, median {statistics.median(t):.3f} s  ({_imports(args)})")


if __name__ == "__main__":
    main()
