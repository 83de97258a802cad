"""Where SGLang's first answer spends its time: one launch question per GPU kind, asked of a
fresh child process (bcgtune.adapters.sglang.resolve.run_probe, no answer cache), its wall
time and the CPU time of the child and everything it started; optionally with
tvm-ffi's optional torch DLPack add-on build allowed (what the child did before it set
TVM_FFI_DISABLE_TORCH_C_DLPACK=1) and with `python -X importtime` (the slowest imports).

    python benchmarks/probe_first_answer.py [--kinds h200,mi355x] [--with-addon-build] [--importtime]

The launch: the GPU kind's default, on Qwen3-0.6B's config.json (bcgtune/data/sglang_probe).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(kind: str, *, addon: bool, importtime: bool) -> str:
    from bcgtune.adapters.sglang import resolve as sr
    from bcgtune.files.profile_file import parse_profile

    platform = sr.gpu_for(kind).platform
    prof = parse_profile(
        f'[profile]\nname = "b"\nplatform = "{platform}"\nhardware = "{kind}"\nmodel = "{sr.PROBE_CONFIG_DIR}"\n', "b.toml"
    )
    cmd = sr.build_server_command(prof)
    argv = list(cmd.argv[3:])
    device, _ = sr.device_for(prof)
    q = sr.launch_question(argv, device, sr.PROBE_CONFIG_DIR)
    saved = dict(sr.PROBE_CHILD_ENV)
    if addon:
        sr.PROBE_CHILD_ENV.pop("TVM_FFI_DISABLE_TORCH_C_DLPACK", None)
    if importtime:
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    cpu0, t0 = _children_cpu(), time.perf_counter()
    result = sr.run_probe(sr._request([q], device), timeout=900)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    sr.PROBE_CHILD_ENV.clear()
    sr.PROBE_CHILD_ENV.update(saved)
    os.environ.pop("PYTHONPROFILEIMPORTTIME", None)
    launches = result.get("launches") or [{}]
    ok = "answered" if launches[0].get("ok") or launches[0].get("refused") else f"no answer: {result.get('error')}"
    return (
        f"{kind:8s} addon build {'allowed' if addon else 'off    '}: {wall:6.1f} s wall, {cpu:6.1f} s CPU (child and its "
        f"children), {ok}; load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="h100,h200,b200,mi300x,mi355x")
    ap.add_argument("--with-addon-build", action="store_true", help="also each kind with the add-on build allowed")
    ap.add_argument("--importtime", action="store_true")
    a = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for kind in a.kinds.split(","):
        print(one(kind, addon=False, importtime=a.importtime), flush=True)
        if a.with_addon_build:
            print(one(kind, addon=True, importtime=a.importtime), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
