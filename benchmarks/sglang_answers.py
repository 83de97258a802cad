"""Wall time and peak memory of the commands that ask the installed SGLang, as a user runs
them (a fresh process each time): the first run with an empty answer cache, then repeated
runs that find their answers there.

  * `bcgtune doctor --profile P` (SGLang's resolution, its parser and its prefill runner)
  * `bcgtune serve --profile P --dry-run` (its parser and its resolution)
  * `bcgtune serve --profile P --dry-run --no-sglang-probe` (never starts SGLang)
  * `bcgtune suggest-buckets T --base-profile P --write-profile W` (asks SGLang by default)
  * `bcgtune drift --profile P --trace T` (asks SGLang by default)
  * `bcgtune suggest-buckets` (the default: the cache only, never SGLang)

With `--differential`, instead: bcgtune's model against SGLang's own answers on the seeded
launches of tests/test_sglang_differential.py (live where SGLang is installed, else its
recording), the counts per class as a Markdown table, and the run's wall time.

P is the built-in h200 profile with its model replaced by a local config folder (Qwen3-0.6B's
config.json, shipped in bcgtune/data/sglang_probe), so that SGLang can resolve the launch.

    python benchmarks/sglang_answers.py [--python PY] [--repeat 3]
    python benchmarks/sglang_answers.py --differential [--seed N] [--launches N]

`--python`: the interpreter whose bcgtune and SGLang are measured (e.g. a virtual
environment without sglang, for the figures without it). Each measurement uses a fresh
BCGTUNE_CACHE_DIR; GNU time reports the peak memory of the process and its children.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROBE_CONFIG = REPO / "bcgtune" / "data" / "sglang_probe"


def _machine(python: str) -> str:
    sys.path.insert(0, str(HERE))
    from _machine import cpu_model

    has = subprocess.run(
        [python, "-c", "import importlib.util as u; print(bool(u.find_spec('sglang')))"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()[0]
    return (
        f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, sglang installed: {has}, "
        f"load average {load:.1f} at start"
    )


def _run(python: str, args: list[str], cache: Path, cwd: Path) -> tuple[float, float, int, float]:
    """(wall seconds, peak MiB, exit code, CPU seconds of the process and its children) of
    one `bcgtune ARGS` in a fresh process. On a shared machine the CPU time is the steadier
    figure: wall time grows with other sessions' load."""
    env = dict(os.environ, BCGTUNE_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    env.pop("BCGTUNE_SGLANG_PROBE", None)
    timer = shutil.which("time") or "/usr/bin/time"
    t0 = time.perf_counter()
    r = subprocess.run(
        [timer, "-f", "%M %U %S", python, "-m", "bcgtune", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    try:
        peak, user, system = r.stderr.strip().splitlines()[-1].split()
        peak_kib, cpu = int(peak), float(user) + float(system)
    except (ValueError, IndexError):
        peak_kib, cpu = 0, float("nan")
    return wall, peak_kib / 1024, r.returncode, cpu


def _profile(folder: Path) -> Path:
    text = (REPO / "profiles" / "h200.toml").read_text()
    lines = [f'model = "{PROBE_CONFIG}"' if ln.startswith("model =") else ln for ln in text.splitlines()]
    path = folder / "bench.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _differential(seed: int | None, n: int | None) -> int:
    """tests/test_sglang_differential.py's comparison, timed, with its table."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    import test_sglang_differential as diff

    launches = diff.seeded_launches(n or diff.N_LAUNCHES, diff.SEED if seed is None else seed)
    t0 = time.perf_counter()
    answers, how = (diff.live_answers(launches), "asked now") if diff.sglang_installed() else (None, "recorded")
    if answers is None:
        answers = diff.recorded_answers(launches)[1]
    asked = time.perf_counter() - t0
    got = diff.compare(launches, answers)
    print(f"{len(launches)} launches (seed {diff.SEED if seed is None else seed}), SGLang's answers {how} in {asked:.0f} s")
    print(diff.markdown(got))
    for row in got.of("unnamed"):
        print(diff._row_text(row)[:2000])
    return 1 if got.of("unnamed") or got.written_by_default() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter to measure (default: this one)")
    ap.add_argument("--repeat", type=int, default=3, help="repeated runs after the first (default 3)")
    ap.add_argument("--differential", action="store_true", help="the model against SGLang's answers, counts per class")
    ap.add_argument("--seed", type=int, default=None, help="with --differential: another draw (default: the test's)")
    ap.add_argument("--launches", type=int, default=None, help="with --differential: how many (default: the test's)")
    args = ap.parse_args()
    print("machine:", _machine(args.python))
    if args.differential:
        return _differential(args.seed, args.launches)
    with tempfile.TemporaryDirectory(prefix="bcgtune-bench-") as tmp:
        folder = Path(tmp)
        prof = str(_profile(folder))
        trace = str(folder / "t.json")
        Path(trace).write_text("[100, 200, 300, 700, 1500, 3000, 100, 200, 300, 700, 1500, 3000]")
        commands = {
            "doctor --profile P": ["doctor", "--profile", prof],
            "serve --profile P --dry-run": ["serve", "--profile", prof, "--dry-run"],
            "serve --profile P --dry-run --no-sglang-probe": ["serve", "--profile", prof, "--dry-run", "--no-sglang-probe"],
            "suggest-buckets T --base-profile P --write-profile W": [
                "suggest-buckets", trace, "--base-profile", prof, "--write-profile", str(folder / "w.toml"), "-k", "4",
            ],
            "drift --profile P --trace T": ["drift", "--profile", prof, "--trace", trace],
            "suggest-buckets": ["suggest-buckets"],
        }  # fmt: skip
        for i, (name, argv) in enumerate(commands.items()):
            cache = folder / f"cache{i}"
            first = _run(args.python, argv, cache, folder)
            again = [_run(args.python, argv, cache, folder) for _ in range(args.repeat)]
            walls = [a[0] for a in again]
            print(
                f"{name}: first {first[0]:.2f} s wall, {first[3]:.2f} s CPU, {first[1]:.0f} MiB (exit {first[2]}); "
                f"repeated: median {statistics.median(walls):.2f} s wall (best {min(walls):.2f}), "
                f"{statistics.median(a[3] for a in again):.2f} s CPU, {max(a[1] for a in again):.0f} MiB"
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
