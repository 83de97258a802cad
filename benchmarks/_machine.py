"""What machine a benchmark ran on, for the recorded results (shared by the scripts here)."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_line() -> str:
    """One line: cores, CPU, Python, and the load when the line was written."""
    import os

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return f"machine: nproc={os.cpu_count()}, cpu={cpu_model()}, python={platform.python_version()}, load average {load:.1f}"
