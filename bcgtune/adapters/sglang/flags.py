"""SGLang launch flags (a profile's [server] table, keys normalized by
`bcgtune.files.profile_file.snake`) turned into the domain objects of `bcgtune.core.sglang.ladder`:
the parallel layout and the prefill launch that `resolve_prefill_capture` resolves.

Defaults are SGLang 0.5.23's (srt/arg_groups/fields/parallel.py, exec_.py, memory.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from bcgtune.adapters.sglang.layout_flags import LAYOUT_DEFAULTS
from bcgtune.core.sglang.capture import PREFILL_BACKENDS, PrefillLaunch
from bcgtune.core.sglang.ladder import ParallelLayout
from bcgtune.core.sglang.model_rules import ModelFacts, model_facts, model_launch_defaults
from bcgtune.errors import InputError
from bcgtune.files.profile_file import snake

# Bounds that make sense for a launch (SGLang counts tokens in int32).
_INT32_MAX = 2**31 - 1
# an integer written as a flag's value: ASCII digits only (Python's int() also takes '１' and '1_0')
_ASCII_INT = re.compile(r"\s*[-+]?[0-9]{1,20}\s*\Z")


def _norm(flags: Mapping[str, Any]) -> dict[str, Any]:
    return {snake(str(k)): v for k, v in flags.items()}


def _flag_int(flags: Mapping[str, Any], key: str, default: int | None, *, minimum: int = 1) -> int | None:
    v = flags.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, str) and not _ASCII_INT.match(v)):
        raise InputError(f"{key} must be an integer, got {v!r}"[:120], key)
    n = int(v)
    if n < minimum or n > _INT32_MAX:
        raise InputError(f"{key} must be in {minimum}..{_INT32_MAX}, got {n}", key)
    return n


def _flag_count(flags: Mapping[str, Any], key: str, default: int = 1) -> int:
    """A size flag that always has a value (SGLang's default when absent)."""
    n = _flag_int(flags, key, default)
    return default if n is None else n


def _flag_bool(flags: Mapping[str, Any], key: str) -> bool:
    v = flags.get(key, False)
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _flag_str(flags: Mapping[str, Any], key: str, default: str | None) -> str | None:
    v = flags.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str):
        raise InputError(f"{key} must be a string, got {v!r}"[:120], key)
    return v


def layout_from_server_flags(flags: Mapping[str, Any], *, is_hip: bool = False) -> ParallelLayout:
    """A ParallelLayout from SGLang launch flags as a dict (keys snake or kebab case,
    with or without leading dashes, short forms such as `tp` included): tp_size, dp_size,
    attn_dp_size, enable_dp_attention, enable_two_batch_overlap, moe_a2a_backend,
    moe_dense_tp_size, attn_cp_size, enable_dp_lm_head, disable_attn_tp_gather.
    Flags that are absent take SGLang's defaults. `is_hip`: ROCm (context-parallel
    alignment is skipped there)."""
    norm = _norm(flags)
    d = LAYOUT_DEFAULTS
    a2a = _flag_str(norm, "moe_a2a_backend", d["moe_a2a_backend"])
    layout = ParallelLayout(
        tp=_flag_count(norm, "tp_size", d["tp_size"]),
        dp=_flag_count(norm, "dp_size", d["dp_size"]),
        enable_dp_attention=_flag_bool(norm, "enable_dp_attention"),
        two_batch_overlap=_flag_bool(norm, "enable_two_batch_overlap"),
        moe_a2a_backend=(a2a or d["moe_a2a_backend"]),
        moe_dense_tp_size=_flag_int(norm, "moe_dense_tp_size", d["moe_dense_tp_size"]),
        attn_cp_size=_flag_count(norm, "attn_cp_size", d["attn_cp_size"]),
        is_hip=is_hip,
        attn_dp=_flag_count(norm, "attn_dp_size", d["attn_dp_size"]),
        enable_dp_lm_head=_flag_bool(norm, "enable_dp_lm_head"),
        disable_attn_tp_gather=_flag_bool(norm, "disable_attn_tp_gather"),
    )
    if layout.attn_dp > 1 and layout.dp > 1:
        # parallel_hook.py refuses this combination at launch
        raise InputError(
            f"--dp-size {layout.dp} with --attn-dp-size {layout.attn_dp}: replicas combined "
            "with attention DP are not supported by SGLang",
            "attn_dp_size",
        )
    _ = layout.attn_tp_size  # raises when tp is not a multiple of attention DP x CP
    return layout


def prefill_graph_json(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The `prefill` object of a `cuda-graph-config` JSON flag ({} when absent or not
    JSON); SGLang lets it win over the per-phase flags (cuda_graph_hook.py,
    parse_cuda_graph_config)."""
    cfg = flags.get("cuda_graph_config")
    if not isinstance(cfg, str):
        return {}
    try:
        parsed = json.loads(cfg)
    except ValueError:
        return {}
    if isinstance(parsed, dict) and isinstance(parsed.get("prefill"), dict):
        return parsed["prefill"]
    return {}


def _bucket_list(value: Any, where: str) -> tuple[int, ...]:
    vals = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, str) and not _ASCII_INT.match(v)):
            raise InputError(f"bucket must be an integer, got {v!r}"[:120], where)
        n = int(v)
        if not 1 <= n <= _INT32_MAX:
            raise InputError(f"bucket must be in 1..{_INT32_MAX}, got {n}", where)
        out.append(n)
    return tuple(out)


def _model_facts(norm: Mapping[str, Any], model_config: Mapping[str, Any] | None) -> ModelFacts | None:
    if model_config is None:
        return None
    enable_mm = norm.get("enable_multimodal")
    return model_facts(
        model_config,
        enable_multimodal=None if enable_mm is None else _flag_bool(norm, "enable_multimodal"),
        language_model_only=_flag_bool(norm, "language_model_only"),
    )


def _flags_set(norm: Mapping[str, Any]) -> frozenset[str]:
    """The flags a launch sets: those present and not false (`false` means left out, as in
    serve's command); `model_impl` only when it selects the transformers implementation."""
    out = {k for k, v in norm.items() if v is not False and v is not None}
    if str(norm.get("model_impl", "")).lower() != "transformers":
        out.discard("model_impl")
    return frozenset(out)


def prefill_launch_from_server_flags(
    flags: Mapping[str, Any],
    *,
    platform: str = "cuda",
    gpu_memory_gib: float | None = None,
    buckets: list[int] | tuple[int, ...] | None = None,
    model_path: str = "",
    mla: bool = False,
    model_config: Mapping[str, Any] | None = None,
    gpu_capability: tuple[int, int] | None = None,
    env: Mapping[str, str] | None = None,
) -> PrefillLaunch:
    """A PrefillLaunch from launch flags (as `layout_from_server_flags` takes them).
    `buckets`: the list passed as --cuda-graph-bs-prefill (a profile's [buckets].list);
    a `cuda-graph-config` JSON's prefill keys win, as in SGLang. `model_config`: the
    model's config.json as a dict (None: not on this machine); `gpu_capability`: the GPU's
    compute capability; `env`: the environment the server starts with (a profile's [env])."""
    norm = _norm(flags)
    js = prefill_graph_json(norm)
    facts = _model_facts(norm, model_config)
    backend_flag = _flag_str(norm, "cuda_graph_backend_prefill", None)
    max_bs = _flag_int(norm, "cuda_graph_max_bs_prefill", None)
    backend_flag, max_bs = model_launch_defaults(
        facts, backend_flag=backend_flag, disable_prefill_flag=_flag_bool(norm, "disable_prefill_cuda_graph"), max_bs_flag=max_bs
    )
    backend = str(js["backend"]) if "backend" in js else backend_flag
    if backend is not None and backend not in PREFILL_BACKENDS:
        raise InputError(f"must be one of {', '.join(PREFILL_BACKENDS)}, got {backend!r}"[:120], "cuda_graph_backend_prefill")
    forced_off = _flag_bool(norm, "disable_prefill_cuda_graph") or _flag_bool(norm, "disable_cuda_graph")
    if "cuda_graph_bs_prefill" in norm:
        buckets = _bucket_list(norm["cuda_graph_bs_prefill"], "cuda_graph_bs_prefill")
    if "bs" in js:
        buckets = _bucket_list(js["bs"], "cuda_graph_config prefill.bs")
    if "max_bs" in js:
        max_bs = _flag_int({"max_bs": js["max_bs"]}, "max_bs", None)
    full_rows = (
        _flag_int({"full_prefill_max_req": js["full_prefill_max_req"]}, "full_prefill_max_req", None)
        if ("full_prefill_max_req" in js)
        else None
    )
    # -1 and 0 both turn chunked prefill off (SGLang accepts either)
    chunk = _flag_int(norm, "chunked_prefill_size", None, minimum=-1)
    return PrefillLaunch(
        layout=layout_from_server_flags(norm, is_hip=platform == "rocm"),
        platform=platform,
        backend=backend,
        backend_forced_off=forced_off,
        buckets=tuple(buckets) if buckets is not None else None,
        max_bs=max_bs,
        chunked_prefill_size=chunk,
        gpu_memory_gib=gpu_memory_gib,
        pp_size=_flag_count(norm, "pp_size"),
        mla=mla,
        model_path=model_path,
        max_total_tokens=_flag_int(norm, "max_total_tokens", None),
        deepep_mode=_flag_str(norm, "deepep_mode", "auto") or "auto",
        disaggregation_mode=_flag_str(norm, "disaggregation_mode", "null") or "null",
        dcp_size=_flag_count(norm, "dcp_size"),
        enable_prefill_cp=_flag_bool(norm, "enable_prefill_cp"),
        model=facts,
        gpu_capability=gpu_capability,
        attention_backend=_flag_str(norm, "attention_backend", None),
        prefill_attention_backend=_flag_str(norm, "prefill_attention_backend", None),
        decode_attention_backend=_flag_str(norm, "decode_attention_backend", None),
        max_running_requests=_flag_int(norm, "max_running_requests", None),
        context_length=_flag_int(norm, "context_length", None),
        speculative_algorithm=_flag_str(norm, "speculative_algorithm", None),
        debug_tensor_dump=norm.get("debug_tensor_dump_output_folder") not in (None, False),
        enable_mis=_flag_bool(norm, "enable_mis"),
        kv_cache_sharding=_flag_bool(norm, "enable_kv_cache_sharding"),
        dllm_algorithm=_flag_str(norm, "dllm_algorithm", None),
        full_prefill_max_req=full_rows,
        flags=_flags_set(norm),
        allow_longer_context=str((env or {}).get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "")).lower()
        in ("1", "true", "yes", "on"),
        moe_runner_backend=_flag_str(norm, "moe_runner_backend", None),
        single_batch_overlap=_flag_bool(norm, "enable_single_batch_overlap"),
        mori_max_dispatch_tokens=_env_int(env, "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        flag_values=_flag_values(norm),
        cp_strategy=_flag_str(norm, "cp_strategy", None),
        kv_cache_dtype=_flag_str(norm, "kv_cache_dtype", None),
        max_prefill_tokens=_flag_int(norm, "max_prefill_tokens", None),
        nnodes=_flag_count(norm, "nnodes"),
        deepep_v2_mode=_flag_str(norm, "deepep_v2_mode", None),
        enforce_shared_experts_fusion=_flag_bool(norm, "enforce_shared_experts_fusion"),
        speculative_moe_a2a_backend=_flag_str(norm, "speculative_moe_a2a_backend", None),
        deepep_v2_max_dispatch_tokens=_env_int(env, "SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"),
        disable_decode_graphs=_flag_bool(norm, "disable_cuda_graph") or norm.get("cuda_graph_backend_decode") == "disabled",
        enable_dynamic_chunking=_flag_bool(norm, "enable_dynamic_chunking"),
    )


def _flag_values(norm: Mapping[str, Any]) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """The launch's string-valued flags (a list of strings as a tuple): what SGLang's parser
    checks against a flag's choices."""
    out: list[tuple[str, str | tuple[str, ...]]] = []
    for k, v in sorted(norm.items()):
        if isinstance(v, str):
            out.append((k, v))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            out.append((k, tuple(v)))
    return tuple(out)


def _env_int(env: Mapping[str, str] | None, name: str) -> int | None:
    """An integer from the launch's environment (None: unset or not an integer)."""
    text = str((env or {}).get(name, "")).strip()
    try:
        return int(text) if text else None
    except ValueError:
        return None


def effective_prefill_backend(server: Mapping[str, Any], platform_name: str) -> tuple[str, bool]:
    """(backend, explicit) for a [server] table, by bcgtune's model of SGLang's resolution
    (no SGLang needed): "disabled" whenever nothing would be captured. `explicit`: the
    launch chose the backend or switched graphs off."""
    from bcgtune.core.sglang.capture import resolve_prefill_capture

    launch = prefill_launch_from_server_flags(server, platform=platform_name)
    cap = resolve_prefill_capture(launch)
    return (cap.backend if cap.graphs_on else "disabled"), (launch.backend is not None or launch.backend_forced_off)
