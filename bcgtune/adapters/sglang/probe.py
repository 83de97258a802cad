"""Ask the installed SGLang itself, on a machine without its GPU: a child process that
bcgtune.adapters.sglang.resolve starts, with a deadline, and whose output is never
shown (it is kept only to quote the last line of a crash).

    python -m bcgtune.adapters.sglang.probe REQUEST.json RESULT.json

It answers, with SGLang's own code, each question importing only what it needs:
  * launches: SGLang's parser and `prepare_server_args`, then `ServerArgs.resolve_once`
    (srt/arg_groups/pipeline.py runs every resolution hook), then `publish` and
    `get_cuda_graph_batch_size_alignment` for the capture alignment, and the capture
    step's own filter (buckets above request rows x the model's context length) from the
    values SGLang resolved. The device queries
    SGLang makes are answered from the profile's GPU: `torch.cuda.is_available`,
    `device_count`, `get_device_capability`, `get_device_properties`, `get_device_name`,
    `torch.version.cuda` / `torch.version.hip` (CUDA vs ROCm), and the GPU memory that
    `utils/common.py` reads through nvidia-smi / rocminfo. Hugging Face stays offline.
  * flags: bcgtune's own `check_command_flags` (the check `serve` runs) on SGLang's parser.
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
    # the installed torch's own version where it is a build for the platform: the packages
    # built against it check it at import (torchvision refuses a CUDA major other than its own)
    version.hip = str(device.get("hip_version") or version.hip or "7.2.0") if rocm else None
    version.cuda = None if rocm else str(device.get("cuda_version") or version.cuda or "12.9")


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
    """One launch through SGLang's own pipeline; the prefill graph settings it resolves and
    the buckets its capture step keeps. A launch SGLang's own code refuses (its parser, or
    an assertion or ValueError raised in its resolution) is answered as refused, with the
    parser's own message or the SGLang file, line and function that raised, and the
    resolution step it was in (`rule`); any other failure is an error (SGLang could not be
    asked). `applied`: the resolution steps that changed the prefill graph settings or the
    chunk (RuleTrace), each as `file:function`."""
    from sglang.srt.arg_groups.overrides import model_config_of, resolved_view
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import get_parallel, publish
    from sglang.srt.utils import common

    records = _Records()
    sg_logger = logging.getLogger("sglang")
    sg_logger.addHandler(records)
    trace = RuleTrace.installed()
    trace.start()
    try:
        server_args = _parse(argv)
        server_args.resolve_once()
        view = resolved_view(server_args)
        prefill = view.cuda_graph_config.prefill
        publish(server_args, role="scheduler")
        initialize_moe_config()
        alignment = int(common.get_cuda_graph_batch_size_alignment())
        bs = [int(b) for b in (prefill.bs or [])]
        backend = str(prefill.backend)
        chunk = int(view.chunked_prefill_size)
        limit = _capture_limit(
            backend,
            max_running_requests=view.max_running_requests,
            attn_dp_size=int(get_parallel().attn_dp_size),
            context_len=int(model_config_of(server_args).context_len),
            chunk=chunk,
            full_rows=getattr(prefill, "full_prefill_max_req", None),
        )
        kept = [b for b in bs if b <= limit["tokens"]]
        captured = [] if backend == "disabled" or not kept else _captured_buckets(kept)
        return {
            "ok": True,
            "backend": backend,
            "bs": bs,
            "kept": kept,
            "max_bs": None if prefill.max_bs is None else int(prefill.max_bs),
            "chunked_prefill_size": chunk,
            "alignment": alignment,
            "captured": captured,
            "capture_limit": limit,
            "messages": _prefill_messages(records.lines),
            "model_path": str(view.model_path),
            "applied": trace.applied,
        }
    except _ParserRefused as exc:
        return {"ok": False, "refused": str(exc), "where": PARSER_WHERE, "rule": PARSER_RULE, "applied": []}
    except (AssertionError, ValueError, NotImplementedError) as exc:
        where = _sglang_frame(exc)
        if where is None:
            return {"ok": False, "error": _one_line(exc)}
        return {
            "ok": False,
            "refused": _one_line(exc),
            "where": where[0],
            "function": where[1],
            "rule": trace.failed_in,
            "applied": trace.applied,
        }
    except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        return {"ok": False, "error": _one_line(exc)}
    finally:
        trace.stop()
        sg_logger.removeHandler(records)


# how a refusal by SGLang's argument parser is located (srt/server_args.py, prepare_server_args
# builds the parser from the flag tables in srt/arg_groups/fields/)
PARSER_WHERE = "srt/server_args.py (its argument parser)"
PARSER_RULE = "srt/server_args.py:prepare_server_args"


class _ParserRefused(Exception):
    """SGLang's argument parser refused the launch; the message is the parser's own."""


def _parse(argv: list[str]):
    """server_args.py, prepare_server_args: SGLang's parser on the launch. A refusal (argparse
    prints its message and exits) is _ParserRefused with the parser's own message."""
    import contextlib
    import io

    from sglang.srt.server_args import prepare_server_args

    sink = io.StringIO()
    try:
        with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
            return prepare_server_args(list(argv))
    except SystemExit as exc:
        lines = [ln.strip() for ln in sink.getvalue().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error:" in ln]
        said = (errors or lines or [f"exit {exc.code}"])[-1]
        said = said.split("error:", 1)[1].strip() if "error:" in said else said
        raise _ParserRefused(f"SGLang's parser refused the launch: {said[:300]}") from None


class RuleTrace:
    """Which of SGLang's resolution steps changed the prefill graph settings (backend,
    bucket list, ladder maximum) or the chunk, and which step was running when a launch was
    refused: the rule SGLang applied, named as `file:function` (the file relative to the
    sglang package). Every step of srt/arg_groups/pipeline.py runs through
    resolution_hooks.run_hook, which SGLang lets plugins wrap (register_resolution_hook);
    the rules srt/arg_groups/cuda_graph_hook.py runs inside handle_cuda_graph_config and
    apply_prefill_cp_cuda_graph_default are wrapped where that module looks them up. The
    wrappers only read the settings before and after the step, and always run it."""

    _instance: RuleTrace | None = None
    # the module whose inner rules are wrapped too, and the prefixes of those rules' names
    INNER_RULES = ("sglang.srt.arg_groups.cuda_graph_hook", ("apply_", "disable_", "parse_cuda_graph_config"))

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.stack: list[str] = []
        self.failed_in: str | None = None
        self.active = False

    @classmethod
    def installed(cls) -> RuleTrace:
        if cls._instance is None:
            cls._instance = cls()
            try:
                cls._instance._install()
            except Exception:  # noqa: BLE001 (tracing is an aid: without it the answer stands)
                traceback.print_exc()
        return cls._instance

    def start(self) -> None:
        self.applied, self.stack, self.failed_in, self.active = [], [], None, True

    def stop(self) -> None:
        self.active = False

    @staticmethod
    def _settings(server_args) -> Any:
        from sglang.srt.arg_groups.overrides import resolving_view

        try:
            view = resolving_view(server_args)
            cfg = view.cuda_graph_config
            prefill = cfg.prefill if cfg is not None else None
            graphs = None if prefill is None else (str(prefill.backend), tuple(prefill.bs or ()), prefill.max_bs)
            return graphs, view.chunked_prefill_size
        except Exception:  # noqa: BLE001 (a view not readable yet: nothing to compare)
            return None

    def _run(self, key: str, step, server_args, *args, **kwargs):
        if not self.active:
            return step(server_args, *args, **kwargs)
        before = self._settings(server_args)
        self.stack.append(key)
        try:
            result = step(server_args, *args, **kwargs)
        except BaseException:
            if self.failed_in is None:
                self.failed_in = key
            raise
        finally:
            self.stack.pop()
        after = self._settings(server_args)
        # the first step that creates the settings is not a rule applied to them
        if before is not None and before[0] is not None and after != before and key not in self.applied:
            self.applied.append(key)
        return result

    def _install(self) -> None:
        import functools
        import inspect

        from sglang.srt.arg_groups import resolution_hooks

        root = _sglang_root()

        def key_of(fn) -> str:
            fn = inspect.unwrap(fn)
            code = getattr(fn, "__code__", None)
            path = os.path.realpath(code.co_filename) if code is not None else ""
            rel = os.path.relpath(path, root) if root and path.startswith(root + os.sep) else os.path.basename(path)
            return f"{rel}:{getattr(fn, '__name__', '?')}"

        def step_wrapper(server_args, previous):
            return self._run(key_of(previous), previous, server_args)

        for name in sorted(getattr(resolution_hooks, "_OVERRIDABLE_HOOKS", ())):
            resolution_hooks.register_resolution_hook(name)(step_wrapper)
        module_name, prefixes = self.INNER_RULES
        module = importlib.import_module(module_name)
        for name, fn in list(vars(module).items()):
            if callable(fn) and name.startswith(prefixes) and getattr(fn, "__module__", None) == module_name:

                def inner(server_args, *args, _fn=fn, _key=key_of(fn), **kwargs):
                    return self._run(_key, _fn, server_args, *args, **kwargs)

                setattr(module, name, functools.wraps(fn)(inner))


def _resolve_item(item) -> dict:
    """One launch of a request: its argv, or {"argv": [...], "env": {...}} with the
    environment the server would start with (set for this launch only: SGLang reads its
    SGLANG_* settings when it resolves, srt/environ.py)."""
    if isinstance(item, dict):
        argv, env = item.get("argv") or [], item.get("env") or {}
    else:
        argv, env = item, {}
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update({str(k): str(v) for k, v in env.items()})
        return resolve_launch(list(argv))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# mem_cache/kv_cache_configurator.py, resolve_max_num_reqs: the request pool without
# --max-running-requests is at most 4096 rows
_MAX_DEFAULT_REQUEST_POOL = 4096
# model_executor/model_runner_components/cuda_graph_setup.py, capture_prefill_graph
_FULL_PREFILL_TOKENS_PER_REQUEST_ROW = 512


def _capture_limit(
    backend: str, *, max_running_requests, attn_dp_size: int, context_len: int, chunk: int, full_rows
) -> dict[str, Any]:
    """cuda_graph_setup.py, capture_prefill_graph: buckets above request rows x the
    model's context length are dropped before capture. Request rows: the request pool
    (kv_cache_configurator.py, resolve_max_num_reqs: --max-running-requests per attention-DP
    rank, which the KV cache's capacity known at start-up can only lower; at most 4096
    without it), and for full graphs full_prefill_max_req or max(chunk // 512, 1)."""
    pool_known = max_running_requests is not None
    rows = max(1, int(max_running_requests) // max(1, attn_dp_size)) if pool_known else _MAX_DEFAULT_REQUEST_POOL
    if backend == "full":
        full = int(full_rows) if full_rows else max(chunk // _FULL_PREFILL_TOKENS_PER_REQUEST_ROW, 1)
        rows = min(rows, full)
    return {"rows": rows, "context_len": context_len, "tokens": rows * context_len, "pool_known": pool_known}


def _sglang_frame(exc: BaseException) -> tuple[str, str] | None:
    """(`file:line` relative to the sglang package, function) of the innermost frame of
    SGLang's own code that raised `exc`, or None when it was raised elsewhere."""
    root = _sglang_root()
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if root and frame.filename.startswith(root + os.sep):
            return f"{os.path.relpath(frame.filename, root)}:{frame.lineno}", frame.name
    return None


def _sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.realpath(locations[0]) if locations else ""


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
    from bcgtune.adapters.sglang.launcher import FlagSource, ServerCommand, check_command_flags
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
DEEPSTACK_LAYERS = 3


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

    # a model with DeepStack visual inputs (as Qwen3-VL declares them), so that a runner that
    # registers a capture slot for them only for such models shows it
    hf_config = types.SimpleNamespace(
        architectures=[QWEN4_EXP_ARCH],
        model_type="qwen4_exp",
        hidden_size=64,
        num_hidden_layers=num_layers,
        vision_config=types.SimpleNamespace(deepstack_visual_indexes=list(range(DEEPSTACK_LAYERS))),
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
        num_deepstack_embeddings = DEEPSTACK_LAYERS

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


def _ask(runner, *, image: bool, said: dict | None = None) -> bool:
    """The runner's own can_replay_locally for one batch (an image or a text batch of its
    smallest bucket, nothing else that forces eager). `said` gets the line of
    can_replay_locally whose `return` gave the answer, and its text (traced as it runs)."""
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
    code = getattr(inspect.unwrap(type(runner).can_replay_locally), "__code__", None)
    returned: list[int] = []

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "return":
            returned.append(frame.f_lineno)
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        answer = bool(runner.can_replay_locally(**kwargs))
    finally:
        sys.settrace(previous)
    if said is not None and returned and code is not None:
        said["line"] = returned[-1]
        said["text"] = _returned_under(type(runner).can_replay_locally, returned[-1])
    return answer


def _returned_under(fn, line: int) -> str:
    """The `return` statement at `line` of `fn`, with the conditions of the `if`s it sits
    under (what made the runner answer as it did)."""
    import ast
    import inspect
    import linecache

    fn = inspect.unwrap(fn)
    text = linecache.getline(fn.__code__.co_filename, line).strip()[:120]
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(_dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return text
    conds: list[str] = []

    def walk(body, under):
        for st in body:
            if isinstance(st, ast.Return) and st.lineno + start - 1 == line:
                conds.extend(under)
            elif isinstance(st, ast.If):
                walk(st.body, [*under, ast.unparse(st.test)])
                walk(st.orelse, [*under, f"not ({ast.unparse(st.test)})"])
            elif isinstance(getattr(st, "body", None), list):
                walk(st.body, under)  # a with, for, while or try block

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            walk(node.body, [])
    return (f"{text} under: {' and '.join(conds)}" if conds else text)[:300]


def _dedent(src: str) -> str:
    import textwrap

    return textwrap.dedent(src)


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
        return {
            "ok": False,
            "imported": False,
            "error": f"the runner module does not import: {_one_line(exc)}",
            "stops_server": _stops_server(exc),
        }
    missing = [(name, where) for name, where in sglang_imports_from_runner() if not hasattr(module, name)]
    if missing:
        names = ", ".join(sorted({n for n, _ in missing}))
        wheres = ", ".join(sorted({w for _, w in missing}))
        return {
            "ok": False,
            "imported": False,
            "error": f"SGLang imports {names} from the runner module ({wheres}), which it does not define: "
            "the server would not start",
            "stops_server": True,
        }
    if not hasattr(module, "PrefillCudaGraphRunner"):
        return {"ok": False, "imported": True, "error": "the runner module has no PrefillCudaGraphRunner"}
    answers: dict[str, bool] = {}
    lines: dict[str, dict] = {}
    slots: list[str] | None = None
    for spec_label, (spec_name, server_args) in launches.items():
        try:
            publish(server_args, role="scheduler")
            runner = _build_runner(module, server_args, spec_name)
            for kind in ("image", "text"):
                key = f"{kind}_spec_{spec_label}"
                lines[key] = {}
                answers[key] = _ask(runner, image=kind == "image", said=lines[key])
            if slots is None:
                slots = _capture_slots(runner)
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
    return {
        "ok": True,
        "imported": True,
        "answers": answers,
        "lines": lines,
        "slots": slots,
        "module_file": getattr(module, "__file__", None),
    }


def _stops_server(exc: BaseException) -> bool:
    """A runner copy's import failure that stops any server, not only this machine's
    stand-ins: a syntax error, or a name SGLang itself does not have. (A module that is not
    installed here, or an error the module's own code raises at import, may be the stand-in
    environment's doing: then the runner is only not checked.)"""
    if isinstance(exc, SyntaxError):
        return True
    if isinstance(exc, ImportError):
        name = exc.name or ""
        return name == "sglang" or name.startswith("sglang.")
    return False


def sglang_imports_from_runner() -> list[tuple[str, str]]:
    """(name, file relative to the sglang package) for every name SGLang's own code imports
    from the runner module at run time (`from ...prefill_cuda_graph_runner import X`, not
    under `if TYPE_CHECKING:`): a runner copy that lacks one stops the server at import,
    whatever its gate does."""
    import ast

    root = _sglang_root()
    if not root:
        return []
    needle = RUNNER_MODULE.rsplit(".", 1)[1]
    out: list[tuple[str, str]] = []
    for folder, _dirs, files in os.walk(root):
        for fname in files:
            if not fname.endswith(".py"):
                continue
            path = os.path.join(folder, fname)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError):
                continue
            if needle not in text or path.endswith(needle + ".py"):
                continue
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                continue
            skip = {
                id(n)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)
            }
            rel = os.path.relpath(path, root)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == RUNNER_MODULE and id(node) not in skip:
                    out += [(a.name, rel) for a in node.names if a.name != "*"]
    return out


def _capture_slots(runner) -> list[str] | None:
    """The inputs the runner registers a static capture slot for (its buffer registry,
    model_executor/cuda_graph_buffer_registry.py): what replay copies into the graph."""
    registry = getattr(runner, "buffer_registry", None)
    names = getattr(registry, "slot_names", None)
    if not callable(names):
        return None
    try:
        return [str(n) for n in names()]
    except Exception:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        return None


# --------------------------------------------------------------------------- main
def load_sglang() -> str:
    """Make `sglang` importable without running its package __init__, which imports the
    frontend language API and patches transformers (seconds that no answer here needs):
    the package's folder is registered as `sglang` and its submodules import as usual.
    What the __init__ does that the server's resolution relies on is done where needed:
    the third-party cache redirection here, the transformers patches before a model
    config is read (_prepare_resolution). Returns sglang's version."""
    from importlib.metadata import PackageNotFoundError, version

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    pkg: Any = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules["sglang"] = pkg
    from sglang.srt.environ import redirect_third_party_caches

    redirect_third_party_caches()
    try:
        pkg.__version__ = version("sglang")
    except PackageNotFoundError:
        from sglang.version import __version__ as source_version

        pkg.__version__ = source_version
    return str(pkg.__version__)


def _prepare_resolution(device: dict) -> None:
    """Before SGLang reads a model's config: the transformers patches sglang's package
    __init__ applies (utils/hf_transformers_patches.py), and the GPU memory queries."""
    from sglang.srt.utils.hf_transformers_patches import apply_all

    apply_all()
    _answer_memory_queries(device)


def sglang_files() -> list[list[Any]]:
    """[path, size, mtime_ns] of every SGLang source file imported so far: what an answer
    given now was read from."""
    root = _sglang_root()
    out = []
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not root:
            continue
        real = os.path.realpath(path)
        if not real.startswith(root + os.sep):
            continue
        try:
            st = os.stat(real)
        except OSError:
            continue
        out.append([real, st.st_size, st.st_mtime_ns])
    return sorted(out)


def run(request: dict) -> dict:
    """Answer what `request` asks, each question importing only what it needs: the flag
    check SGLang's parser, a launch its resolution pipeline, a runner its module. Every
    answer records the SGLang files it was read from (`files`, per question kind)."""
    result: dict[str, Any] = {"files": {}}
    finder = _PlaceholderFinder(GPU_ONLY_PACKAGES)
    sys.meta_path.append(finder)
    try:
        fake_device(request["device"])
        result["sglang_version"] = load_sglang()
    except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
        result["error"] = f"sglang does not import here: {_one_line(exc)}"
        result["placeholders"] = sorted(finder.used)
        return result
    if "flags" in request:
        try:
            result["flags"] = check_flags(request["flags"])
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            result["flags"] = {"ok": None, "error": _one_line(exc)}
        result["files"]["flags"] = sglang_files()
    if "launches" in request or "runners" in request:
        try:
            _prepare_resolution(request["device"])
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            result["error"] = f"SGLang's resolution does not load here: {_one_line(exc)}"
            result["placeholders"] = sorted(finder.used)
            return result
    if "launches" in request:
        result["launches"] = [_resolve_item(item) for item in request["launches"]]
        result["files"]["launches"] = sglang_files()
    if "runners" in request:
        try:
            result["runners"] = runner_gates(request["runners"])
        except Exception as exc:  # noqa: BLE001 (the probe reports any failure of SGLang's code as an answer)
            err = {"ok": False, "imported": None, "error": f"cannot prepare the runner check: {_one_line(exc)}"}
            result["runners"] = [err for _ in request["runners"]["sources"]]
        result["files"]["runners"] = sglang_files()
    result["placeholders"] = sorted(finder.used)
    return result


# Packages that SGLang's imports pull in without its resolution, parser or prefill runner
# using them: transformers imports scikit-learn (assisted generation's candidate generator,
# transformers/generation/candidate_generator.py) whenever it is installed, which costs
# seconds of CPU per first answer (profiled with `python -X importtime`: benchmarks/RESULTS.md).
# Marking them absent (sys.modules[name] = None) makes transformers' own availability check
# (importlib.util.find_spec) say so, and it skips them.
UNUSED_PACKAGES = ("sklearn",)


def skip_unused_imports() -> None:
    """Mark UNUSED_PACKAGES absent in this child, and keep tvm-ffi from compiling its
    optional torch DLPack add-on (TVM_FFI_DISABLE_TORCH_C_DLPACK, read by
    tvm_ffi/_optional_torch_c_dlpack.py at import: without a cached build it runs a compiler
    at every import, and under a stand-in ROCm GPU none is ever cached)."""
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    for name in UNUSED_PACKAGES:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    req_path, out_path = argv[1], argv[2]
    with open(req_path, encoding="utf-8") as fh:
        request = json.load(fh)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    skip_unused_imports()
    result = run(request)
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
