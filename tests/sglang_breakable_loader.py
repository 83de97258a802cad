"""SGLang's own breakable-graph module for the GPU comparison test, from an installed sglang
package (the 0.5.23 wheel installed --no-deps is enough).

First a plain import. Where that fails (the package's import chain pulls its server
dependencies: orjson, zmq, starlette, ... and sgl_kernel, none of which a bare GPU image
has), the module's own file is executed with stand-ins for its two utility imports:
`sglang.srt.utils` (get_device_module / is_hip / is_xpu: torch.cuda and torch.version.hip)
and `...runner_backend_utils.weak_ref_tensor` (sgl_kernel's weak_ref_tensor, reimplemented
in bcgtune.engines.segmented). Everything else — BreakableCUDAGraph,
BreakableCUDAGraphCapture, eager_on_graph, its wait_stream hook, cuda.bindings use — is
SGLang's code, unchanged. `restore()` puts sys.modules back."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

MODULE = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
_PACKAGES = (
    "sglang",
    "sglang.srt",
    "sglang.srt.model_executor",
    "sglang.srt.model_executor.runner_backend_utils",
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph",
)


def load():
    """(module, how, plain-import error or ''), or (None, reason, error) without sglang."""
    how = "plain import"
    if importlib.util.find_spec("sgl_kernel") is None:
        # the module imports weak_ref_tensor (sgl_kernel's) lazily, at its first capture
        sys.modules[_weak_module().__name__] = _weak_module()
        how += ", with a stand-in for weak_ref_tensor (sgl_kernel is not installed)"
    try:
        return importlib.import_module(MODULE), how, ""
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]  # a half-imported chain
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None, "sglang is not installed", error
    import torch

    root = Path(next(iter(spec.submodule_search_locations)))
    parts = [
        "",
        "srt",
        "srt/model_executor",
        "srt/model_executor/runner_backend_utils",
        "srt/model_executor/runner_backend_utils/breakable_cuda_graph",
    ]
    for name, rel in zip(_PACKAGES, parts):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root / rel)]
        sys.modules[name] = pkg
    utils = types.ModuleType("sglang.srt.utils")
    utils.get_device_module = lambda: torch.cuda
    utils.is_hip = lambda: bool(torch.version.hip)
    utils.is_xpu = lambda: False
    sys.modules["sglang.srt.utils"] = utils
    weak = _weak_module()
    sys.modules[weak.__name__] = weak
    module = importlib.import_module(MODULE)  # SGLang's file, with the stand-ins above
    return module, "its file with stand-ins for sglang.srt.utils and weak_ref_tensor", error


def _weak_module() -> types.ModuleType:
    """SGLang's weak_ref_tensor module, on bcgtune's reimplementation of sgl_kernel's op."""
    from bcgtune.engines.segmented import weak_ref_tensor

    weak = types.ModuleType("sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor")

    def weak_ref_tensors(t):
        if isinstance(t, (list, tuple)):
            return type(t)(weak_ref_tensor(x) for x in t)
        return weak_ref_tensor(t)

    weak.weak_ref_tensor = weak_ref_tensor
    weak.weak_ref_tensors = weak_ref_tensors
    return weak


def restore() -> None:
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
