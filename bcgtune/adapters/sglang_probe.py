"""Ask the installed SGLang itself, on a machine without its GPU: a child process that
bcgtune.adapters.sglang_resolve starts, with a deadline, and whose output is never
shown (it is kept only to quote the last line of a crash).

    python -m bcgtune.adapters.sglang_probe REQUEST.json RESULT.json

It answers, with SGLang's own code:
  * launches: SGLang's parser and `prepare_server_args`, then `ServerArgs.resolve_once`
    (srt/arg_groups/pipeline.py runs every resolution hook), then `publish` and
    `get_cuda_graph_batch_size_alignment` for the capture alignment. The device queries
    SGLang makes are answered from the profile's GPU: `torch.cuda.is_available`,
    `device_count`, `get_device_capability`, `get_device_properties`, `get_device_name`,
    `torch.version.cuda` / `torch.version.hip` (CUDA vs ROCm), and the GPU memory that
    `utils/common.py` reads through nvidia-smi / rocminfo. Hugging Face stays offline.
  * flags: bcgtune's own `check_command_flags` (the check `serve` runs).
  * runner: the prefill runner's own `__init__` and `can_replay_locally`
    (model_executor/runner/prefill_cuda_graph_runner.py, or a copy given as a file) on a
    Qwen4-Exp model, for an image batch and a text batch, with speculative decoding off
    and on. The runner is built on the CPU with stand-ins for what a GPU server provides
    (the model runner, the attention backend, the tensor-parallel group); its graph
    capture is skipped. Every statement of its `__init__` up to capture runs.

GPU-only packages that are not installed (torchvision's CUDA build, the GPU kernel
packages) are replaced by inert placeholder modules, only when the real import fails;
the result lists which were.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import traceback
import types
from typing import Any

# Packages that exist only as GPU builds. A placeholder is used only when the real
# package cannot be found.
GPU_ONLY_PACKAGES = (
    "torchvision",
    "sgl_kernel",
    "flashinfer",
    "deep_ep",
    "deep_gemm",
    "flash_mla",
    "flash_attn",
    "flash_attn_interface",
    "aiter",
    "humming",
    "quack",
    "tilelang",
    "cutlass",
    "cuda",
    "nvshmem",
    "torch_memory_saver",
    "triton_kernels",
    "mooncake",
    "nixl",
    "mori",
    "pplx_kernels",
)
RUNNER_MODULE = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
# A version string for placeholders that libraries compare (transformers checks
# torchvision's version).
_PLACEHOLDER_VERSION = "0.28.0"


# --------------------------------------------------------------------------- placeholders
class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        return super().__call__()

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls


def _placeholder(qualname: str) -> type:
    def _getattr(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{qualname}.{name}")

    return _PlaceholderMeta(
        qualname.rsplit(".", 1)[-1],
        (),
        {
            "__qualname__": qualname,
            "__module__": "bcgtune_placeholder",
            "__getattr__": _getattr,
            "__call__": lambda self, *a, **k: self,
            "__init__": lambda self, *a, **k: None,
        },
    )


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: consulted only when no real package was found."""

    def __init__(self, roots):
        self.roots = frozenset(roots)
        self.used: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        root = fullname.split(".")[0]
        if root in self.roots:
            self.used.add(root)
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod: Any = _PlaceholderModule(spec.name)
        mod.__path__ = []
        mod.__version__ = _PLACEHOLDER_VERSION
        return mod

    def exec_module(self, module):
        return None


# --------------------------------------------------------------------------- the device
def fake_device(device: dict) -> None:
    """Answer torch's device queries as the profile's GPU would. Must run before sglang
    is imported (several of its modules read the platform at import)."""
    import torch

    known = device.get("memory_gib") is not None
    mem_bytes = int(float(device["memory_gib"]) * 2**30) if known else 80 * 2**30
    major, minor = (int(x) for x in device["capability"])
    props = types.SimpleNamespace(
        name=device["name"],
        total_memory=mem_bytes,
        major=major,
        minor=minor,
        multi_processor_count=int(device.get("multi_processor_count", 132)),
        gcnArchName=device.get("gcn_arch", ""),
        L2_cache_size=64 * 2**20,
        is_integrated=False,
        warp_size=64 if device["platform"] == "rocm" else 32,
    )
    count = int(device.get("count", 8))
    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: count,
        "current_device": lambda: 0,
        "get_device_capability": lambda d=None: (major, minor),
        "get_device_properties": lambda d=None: props,
        "get_device_name": lambda d=None: props.name,
        "mem_get_info": lambda d=None: (mem_bytes, mem_bytes),
        "set_device": lambda d=None: None,
    }
    for name, fn in answers.items():
        setattr(torch.cuda, name, fn)
    rocm = device["platform"] == "rocm"
    version: Any = torch.version
    version.hip = str(device.get("hip_version", "7.2.0")) if rocm else None
    version.cuda = None if rocm else str(device.get("cuda_version", "12.9"))


def _answer_memory_queries(device: dict) -> None:
    # utils/common.py, get_device_memory_capacity -> get_nvgpu_memory_capacity (nvidia-smi)
    # or get_amdgpu_memory_capacity (rocminfo), in MiB
    from sglang.srt.utils import common

    # unknown memory: the query fails, and SGLang falls back to its own defaults
    mib = float(device["memory_gib"]) * 1024 if device.get("memory_gib") is not None else None
    common.get_nvgpu_memory_capacity = lambda: mib
    common.get_amdgpu_memory_capacity = lambda: mib


# --------------------------------------------------------------------------- launches
class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            self.lines.append(record.getMessage())
        except (TypeError, ValueError):  # a record whose arguments do not format
            self.lines.append(str(record.msg))


_PREFILL_WORDS = ("prefill cuda graph", "breakable", "cuda graph is disabled", "deepep")


def _prefill_messages(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        low = line.lower()
        if any(w in low for w in _PREFILL_WORDS) and line not in out:
            out.append(line.strip()[:300])
    return out


def resolve_launch(argv: list[str]) -> dict:
    """One launch through SGLang's own pipeline; the prefill graph settings it resolves."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import common

    records = _Records()
    sg_logger = logging.getLogger("sglang")
    sg_logger.addHandler(records)
    try:
        server_args = prepare_server_args(list(argv))
        server_args.resolve_once()
        view = resolved_view(server_args)
        prefill = view.cuda_graph_config.prefill
        publish(server_args, role="scheduler")
        initialize_moe_config()
        alignment = int(common.get_cuda_graph_batch_size_alignment())
        bs = [int(b) for b in (prefill.bs or [])]
        backend = str(prefill.backend)
        if backend == "disabled" or not bs:
            captured: list[int] = []
        else:
            captured = _captured_buckets(bs)
        return {
            "ok": True,
            "backend": backend,
            "bs": bs,
            "max_bs": None if prefill.max_bs is None else int(prefill.max_bs),
            "chunked_prefill_size": int(view.chunked_prefill_size),
            "alignment": alignment,
            "captured": captured,
            "messages": _prefill_messages(records.lines),
            "model_path": str(view.model_path),
        }
    except SystemExit as exc:  # argparse
        return {"ok": False, "error": f"SGLang's parser refused the launch (exit {exc.code})"}
    except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        return {"ok": False, "error": _one_line(exc)}
    finally:
        sg_logger.removeHandler(records)


def _captured_buckets(bs: list[int]) -> list[int]:
    """model_executor/runner/prefill_cuda_graph_runner.py, get_prefill_num_tokens_to_capture:
    each bucket rounded up to the capture alignment, deduplicated, sorted. Called from the
    runner module when it is already imported (importing it costs seconds), else the same
    map over utils/common.py's get_cuda_graph_max_batch_size, which it is defined as."""
    runner = sys.modules.get(RUNNER_MODULE)
    fn = getattr(runner, "get_prefill_num_tokens_to_capture", None)
    if fn is not None:
        return [int(b) for b in fn(bs)]
    from sglang.srt.utils.common import get_cuda_graph_max_batch_size

    return sorted({int(get_cuda_graph_max_batch_size(b)) for b in bs})


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# --------------------------------------------------------------------------- flags
def check_flags(req: dict) -> dict:
    from bcgtune.adapters.launcher import FlagSource, ServerCommand, check_command_flags
    from bcgtune.errors import InputError

    sources = [FlagSource(s["flag"], s["origin"], s.get("value"), bool(s.get("from_profile"))) for s in req["sources"]]
    cmd = ServerCommand(list(req["argv"]), {}, sources, [])
    try:
        check_command_flags(cmd)
    except InputError as exc:
        return {"ok": False, "message": exc.what if hasattr(exc, "what") else str(exc), "where": getattr(exc, "where", None)}
    return {"ok": True, "flags": len({s.flag for s in sources})}


# --------------------------------------------------------------------------- the runner gate
QWEN4_EXP_ARCH = "Qwen4ExpForConditionalGeneration"


def _load_runner_module(source: str | None):
    if source is None:
        return importlib.import_module(RUNNER_MODULE)
    # A copy loads under its own name next to the real module, so the real one (and
    # anything that imported it) stays untouched.
    name = RUNNER_MODULE.rsplit(".", 1)[0] + "._bcgtune_checked_copy"
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Group:
    """Stand-in for a torch.distributed process group of one rank."""

    world_size = 1
    rank_in_group = 0
    is_first_rank = True
    is_last_rank = True

    def barrier(self):
        return None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


class _AttnBackend:
    """Stand-in attention backend: the capabilities a plain backend reports."""

    dllm_attention = None
    prefill_cuda_graph_default_max_seq_len = None
    use_captured_forward_metadata_for_breakable_cuda_graph = False
    prefill_cuda_graph_max_batch_size = None
    supports_prefill_cuda_graph_max_context_size = True
    supports_full_cuda_graph_chunked_prefix = False


def _fake_model_runner(server_args, spec_name: str, num_layers: int = 2):
    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    hf_config = types.SimpleNamespace(
        architectures=[QWEN4_EXP_ARCH], model_type="qwen4_exp", hidden_size=64, num_hidden_layers=num_layers
    )
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        hf_text_config=hf_config,
        is_multimodal=True,
        hidden_size=64,
        context_len=8192,
        hc_hidden_size=None,
    )

    class _Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(num_layers))

        def forward(self, input_ids, positions, forward_batch, input_embeds=None):
            return input_ids

    class _Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = _Layers()
            self.quant_config = None

    mr = types.SimpleNamespace()
    mr.device = "cpu"
    mr.server_args = server_args
    mr.model_config = model_config
    mr.model = _Model()
    mr.attn_backend = _AttnBackend()
    mr.lora_manager = None
    mr.is_generation = True
    mr.is_draft_worker = False
    mr.spec_algorithm = SpeculativeAlgorithm.from_string(spec_name)
    mr.req_to_token_pool = types.SimpleNamespace(size=8, req_to_token=torch.zeros((8, 8192), dtype=torch.int32))
    mr.dtype = torch.bfloat16
    mr.pp_group = _Group()
    mr.tp_group = _Group()
    mr.attention_layers = []
    mr.mha_companion_layers = []
    mr.moe_layers = []
    mr.moe_fusions = []
    mr.get_pp_proxy_topk_size = lambda: None
    mr.get_pp_proxy_residual_num_blocks = lambda: None
    mr.get_pp_proxy_dspark_hidden_size = lambda: None
    mr.attn_tp_sequence_sharded = lambda *a, **k: False
    return mr


def _build_runner(module, server_args, spec_name: str):
    """The runner class's own __init__ on a stand-in model runner; capture is skipped
    (it needs a GPU and is not part of the gate)."""
    from sglang.srt import runtime_context

    cls = module.PrefillCudaGraphRunner
    real_get_parallel = runtime_context.get_parallel

    class _Parallel:
        def __init__(self, inner):
            self._inner = inner

        tp_group = _Group()
        attn_tp_group = _Group()

        def __getattr__(self, name):
            return getattr(self._inner, name)

    probe_cls = type("PrefillCudaGraphRunnerProbe", (cls,), {"capture": lambda self: None})
    saved = {}
    for mod_name in (module.__name__, "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend"):
        mod: Any = sys.modules.get(mod_name)
        if mod is not None and hasattr(mod, "get_parallel"):
            saved[mod] = mod.get_parallel
            mod.get_parallel = lambda: _Parallel(real_get_parallel())
    try:
        return probe_cls(_fake_model_runner(server_args, spec_name))
    finally:
        for patched, fn in saved.items():
            patched.get_parallel = fn


def _ask(runner, *, image: bool) -> bool:
    import inspect

    num_tokens = int(runner.capture_num_tokens[0])
    offered = {
        "batch_size": 1,
        "num_tokens": num_tokens,
        "input_embeds": None,
        "replace_embeds": None,
        "prefix_lens": [0],
        "is_target_verify": False,
        "capture_hidden_mode": None,
        "return_logprob": False,
        "lora_ineligible": False,
        "is_mixed": False,
        "batch_max_context_len": num_tokens,
        "contains_mm_inputs": image,
    }
    params = inspect.signature(runner.can_replay_locally).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in offered]
        if missing:
            raise TypeError(f"can_replay_locally needs arguments this check does not know: {', '.join(missing)}")
        kwargs = {k: v for k, v in offered.items() if k in params}
    else:
        kwargs = offered
    if "contains_mm_inputs" not in params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise TypeError("can_replay_locally takes no contains_mm_inputs argument")
    return bool(runner.can_replay_locally(**kwargs))


def runner_gates(req: dict) -> list[dict]:
    """For each runner (the installed one: source None; or a copy's file), the four
    answers: (image | text batch) x (speculative decoding off | on)."""
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    base = [
        "--model-path",
        req["config_dir"],
        "--cuda-graph-backend-prefill",
        "breakable",
        "--cuda-graph-bs-prefill",
        "256",
        "512",
        "1024",
        "--device",
        "cpu",
    ]
    launches = {}
    for spec_label, spec_name, extra in (("off", "NONE", []), ("on", "NGRAM", ["--speculative-algorithm", "NGRAM"])):
        server_args = prepare_server_args(base + extra)
        server_args.resolve_once()
        launches[spec_label] = (spec_name, server_args)
    out = []
    for source in req["sources"]:
        out.append(_runner_gate(source, launches, publish))
    return out


def _runner_gate(source: str | None, launches: dict, publish) -> dict:
    try:
        module = _load_runner_module(source)
    except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        return {"ok": False, "imported": False, "error": f"the runner module does not import: {_one_line(exc)}"}
    if not hasattr(module, "PrefillCudaGraphRunner"):
        return {"ok": False, "imported": True, "error": "the runner module has no PrefillCudaGraphRunner"}
    answers: dict[str, bool] = {}
    for spec_label, (spec_name, server_args) in launches.items():
        try:
            publish(server_args, role="scheduler")
            runner = _build_runner(module, server_args, spec_name)
            for kind in ("image", "text"):
                answers[f"{kind}_spec_{spec_label}"] = _ask(runner, image=kind == "image")
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            traceback.print_exc()  # to the child's captured stderr, for diagnosis
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return {
                "ok": False,
                "imported": True,
                "error": f"cannot run the runner (speculative decoding {spec_label}): {_one_line(exc)}"
                f" at {os.path.basename(where.filename)}:{where.lineno}",
                "answers": answers,
            }
    return {"ok": True, "imported": True, "answers": answers, "module_file": getattr(module, "__file__", None)}


# --------------------------------------------------------------------------- main
def run(request: dict) -> dict:
    result: dict[str, Any] = {}
    finder = _PlaceholderFinder(GPU_ONLY_PACKAGES)
    sys.meta_path.append(finder)
    try:
        fake_device(request["device"])
        import sglang

        try:
            from importlib.metadata import version

            result["sglang_version"] = version("sglang")
        except Exception:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            result["sglang_version"] = getattr(sglang, "__version__", "unknown")
        _answer_memory_queries(request["device"])
    except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        result["error"] = f"sglang does not import here: {_one_line(exc)}"
        result["placeholders"] = sorted(finder.used)
        return result
    if "flags" in request:
        try:
            result["flags"] = check_flags(request["flags"])
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            result["flags"] = {"ok": None, "error": _one_line(exc)}
    if "runners" in request:
        try:
            result["runners"] = runner_gates(request["runners"])
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            err = {"ok": False, "imported": None, "error": f"cannot prepare the runner check: {_one_line(exc)}"}
            result["runners"] = [err for _ in request["runners"]["sources"]]
    if "launches" in request:
        result["launches"] = [resolve_launch(argv) for argv in request["launches"]]
    result["placeholders"] = sorted(finder.used)
    return result


def main(argv: list[str]) -> int:
    req_path, out_path = argv[1], argv[2]
    with open(req_path, encoding="utf-8") as fh:
        request = json.load(fh)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    result = run(request)
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
