"""Runs the real `sglang.benchmark.serving` client on a CPU-only machine (tests only).

The client module itself imports nothing GPU-bound, except one constant: it does
`from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST`, and that module pulls in
SGLang's model configs, torchvision and the GPU kernel packages (tvm_ffi, ...), which PyPI
has no CPU builds of. This shim pre-registers that one module with the constant read
from the installed SGLang source (ast, no import), then runs the client's real `__main__`
unchanged with the given arguments. Everything else (datasets, tokenizer, HTTP, metrics,
the --output-file JSON line) is SGLang's own code.

    python tests/standin/bench_client.py <bench_serving args>
"""

from __future__ import annotations

import ast
import importlib.util
import runpy
import sys
import types
from pathlib import Path


def _fake_bootstrap_host() -> str:
    spec = importlib.util.find_spec("sglang")
    src = Path(spec.origin).parent / "srt" / "disaggregation" / "utils.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAKE_BOOTSTRAP_HOST" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"FAKE_BOOTSTRAP_HOST not found in {src}")


def main() -> None:
    mod = types.ModuleType("sglang.srt.disaggregation.utils")
    mod.FAKE_BOOTSTRAP_HOST = _fake_bootstrap_host()
    sys.modules["sglang.srt.disaggregation.utils"] = mod
    sys.argv = ["sglang.benchmark.serving", *sys.argv[1:]]
    runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
