"""SGLang's default prefill bucket ladder and capture-time alignment, as pure functions.

Must match SGLang exactly (sglang 0.5.23):
  * ladder: srt/arg_groups/cuda_graph_hook.py, generate_prefill_cuda_graph_batch_sizes
  * chunked_prefill_size default by GPU memory: srt/arg_groups/memory_hook.py
  * alignment: srt/utils/common.py, get_cuda_graph_batch_size_alignment (+ require_gathered_buffer)
  * attention widths: srt/runtime_context.py (derive_attn_tp_size), arg_groups/parallel_hook.py
  * what a launch captures, where the rules combine (resolve_prefill_capture):
    arg_groups/pipeline.py (the order), cuda_graph_hook.py (parse_cuda_graph_config,
    apply_cuda_graph_compatibility, disable_breakable_cudagraph_if_incompatible,
    apply_deepep_adjustments, apply_cuda_graph_disaggregation_roles), memory_hook.py
    (handle_gpu_memory_settings), parallel_hook.py (handle_data_parallelism), moe_hook.py
    (handle_a2a_moe), model_executor/runner/prefill_cuda_graph_runner.py
    (get_prefill_num_tokens_to_capture) and model_runner_components/cuda_graph_setup.py
    (capture_prefill_graph: an empty list captures nothing)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from bcgtune.errors import InputError


def ceil_to(x, a: int):
    """x rounded up to a multiple of `a` (an int, or element-wise for a numpy array)."""
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return -(-x // a) * a
    import numpy as np

    return -(-np.asarray(x, dtype=np.int64) // a) * a


def sglang_default_ladder(max_bs: int) -> list[int]:
    """The default `--cuda-graph-bs-prefill` list SGLang captures for a given max
    (which defaults to chunked_prefill_size)."""
    if max_bs < 1:
        raise InputError(f"ladder max must be positive, got {max_bs}")
    import numpy as np

    pieces = [(4, 33, 4), (48, 257, 16), (288, 513, 32), (576, 1025, 64), (1280, 4097, 256), (4608, max_bs + 1, 512)]
    sizes = np.concatenate([np.arange(a, min(b, max_bs + 1), s, dtype=np.int64) for a, b, s in pieces])
    return sizes.tolist()


def deepep_round(buckets) -> list[int]:
    """cuda_graph_hook.py, apply_deepep_adjustments: under DeepEP with breakable graphs
    every bucket is rounded up to a multiple of 8 (capture hangs otherwise), deduplicated."""
    return sorted({ceil_to(int(b), DEEPEP_BUCKET_MULTIPLE) for b in buckets})


def deepep_breakable_ladder(max_bs: int = 2048) -> list[int]:
    """DeepEP + breakable with no explicit list: the ladder for
    `--cuda-graph-max-bs-prefill` or, unset, 2048, rounded by deepep_round."""
    return deepep_round(sglang_default_ladder(max_bs))


def default_chunked_prefill_size(gpu_mem_gib: float | None) -> int:
    """memory_hook.py (_handle_gpu_memory_settings): chunked_prefill_size by GPU memory.
    SGLang compares MiB against N*1024: <20 GiB 2048, <35 4096, <60 4096, <90 8192,
    <160 8192, else 16384; 4096 when the capacity is unknown."""
    if gpu_mem_gib is None:
        return 4096
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


# memory_hook.py: _DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS
PP_BREAKABLE_PREFILL_MAX_BS = 8192
# cuda_graph_hook.py, apply_deepep_adjustments
DEEPEP_BUCKET_MULTIPLE = 8


# MoE all-to-all backends whose DP bookkeeping always needs the gathered buffer under
# attention DP (common.py, require_mlp_tp_gather). "mori" joins them only with
# SGLANG_MORI_RECV_BOUND / SGLANG_MORI_EP_V2 set (ParallelLayout.mori_dp_sync).
_A2A_ALWAYS_DP_SYNC = ("flashinfer", "flashinfer_megamoe")


@dataclass(frozen=True)
class ParallelLayout:
    """The parts of a launch that change capture-time bucket alignment (sglang 0.5.23).

    `dp` + `enable_dp_attention` is the deprecated spelling (`--dp-size N
    --enable-dp-attention`), which SGLang turns into attention-DP groups of N
    (parallel_hook.py, handle_deprecated_dp_attention); `attn_dp` is `--attn-dp-size`.
    """

    tp: int = 1
    dp: int = 1
    enable_dp_attention: bool = False
    two_batch_overlap: bool = False
    moe_a2a_backend: str = "none"
    moe_dense_tp_size: int | None = None
    attn_cp_size: int = 1
    is_hip: bool = False
    attn_dp: int = 1
    enable_dp_lm_head: bool = False
    disable_attn_tp_gather: bool = False
    mori_dp_sync: bool = False

    @property
    def attn_dp_size(self) -> int:
        if self.enable_dp_attention and self.attn_dp == 1:
            return self.dp
        return self.attn_dp

    @property
    def replica_dp_size(self) -> int:
        """Data-parallel replicas (`--dp-size` once the deprecated spelling is resolved)."""
        if self.enable_dp_attention and self.attn_dp == 1:
            return 1
        return self.dp

    @property
    def attn_dp_enabled(self) -> bool:
        return self.attn_dp_size > 1

    @property
    def num_dp_ranks(self) -> int:
        return self.replica_dp_size * self.attn_dp_size

    @property
    def attn_tp_size(self) -> int:
        # runtime_context.py, derive_attn_tp_size: tp // attn_dp_size // attn_cp_size
        div = self.attn_dp_size * max(1, self.attn_cp_size)
        if self.attn_dp_size < 1 or self.tp % div:
            raise InputError(
                f"tensor parallel size {self.tp} is not a multiple of attention DP {self.attn_dp_size}"
                f" x attention CP {self.attn_cp_size}"
            )
        return self.tp // div

    @property
    def gathered_buffer_required(self) -> bool:
        """common.py, require_gathered_buffer = require_mlp_tp_gather or require_attn_tp_gather."""
        a2a = (self.moe_a2a_backend or "none").lower()
        mlp_gather = False
        if self.attn_dp_enabled:
            if self.moe_dense_tp_size is None or not self.enable_dp_lm_head or a2a == "none":
                mlp_gather = True
            elif a2a in _A2A_ALWAYS_DP_SYNC or (a2a == "mori" and self.mori_dp_sync):
                mlp_gather = True
            else:
                mlp_gather = self.moe_dense_tp_size > self.tp // self.num_dp_ranks
        attn_gather = False
        if not self.disable_attn_tp_gather and (a2a != "none" or self.moe_dense_tp_size is not None):
            attn_gather = self.num_dp_ranks < self.tp if self.attn_dp_enabled else True
        return mlp_gather or attn_gather


def layout_alignment(layout: ParallelLayout) -> int:
    """Multiple every captured bucket is rounded up to (common.py,
    get_cuda_graph_batch_size_alignment): x2 under two-batch overlap; x attn_tp_size when a
    gathered buffer is needed; then, off HIP, x attn_cp_size unless the alignment is
    already a multiple of it."""
    align = 1
    if layout.two_batch_overlap:
        align *= 2
    if layout.gathered_buffer_required:
        align *= max(1, layout.attn_tp_size)
    cp = max(1, layout.attn_cp_size)
    if not layout.is_hip and align % cp != 0:
        align *= cp
    return align


def sorted_unique(values):
    """Ascending, without duplicates, as an int64 array (a sort and one pass: faster than
    numpy's hashing unique on the long sorted ladders this module makes)."""
    import numpy as np

    a = np.sort(np.asarray(values, dtype=np.int64).ravel())
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if a.size else a


def align_buckets(buckets, align: int) -> list[int]:
    """What SGLang captures for a given list: each bucket rounded up to `align`, deduped."""
    return sorted_unique(ceil_to(list(buckets), align)).tolist()


# --------------------------------------------------------------------------- what a launch captures
# Prefill graph backends SGLang accepts (model_executor/cuda_graph_config.py,
# ALLOWED_BACKENDS_PER_PHASE); "disabled" captures nothing.
PREFILL_BACKENDS = ("breakable", "full", "disabled")
PrefillBackend = Literal["breakable", "full", "disabled"]
# disable_breakable_cudagraph_if_incompatible: MoE all-to-all backends validated with
# breakable prefill graphs; any other one turns them off unless the backend was chosen.
BREAKABLE_VALIDATED_A2A = ("none", "deepep", "megamoe", "flashinfer")
# apply_deepep_adjustments: with no list, the DeepEP ladder starts from the ladder for
# --cuda-graph-max-bs-prefill or this max.
DEEPEP_DEFAULT_MAX_BS = 2048
# handle_gpu_memory_settings: MLA models cap the ladder at 8192 tokens, "llama-2" model
# paths at 4096.
MLA_PREFILL_MAX_BS = 8192
LLAMA2_PREFILL_MAX_BS = 4096


def _ladder_or_empty(max_bs: int) -> list[int]:
    """generate_prefill_cuda_graph_batch_sizes for any max: SGLang returns [] for a max
    below the first bucket (e.g. --chunked-prefill-size -1)."""
    return sglang_default_ladder(max_bs) if max_bs >= 1 else []


@dataclass(frozen=True)
class PrefillLaunch:
    """The parts of a launch that decide which prefill graphs SGLang captures.

    `backend`: the prefill backend chosen at launch (None: the platform's default,
    breakable on CUDA, disabled on ROCm); `backend_forced_off`: graphs switched off by a
    launch switch (both count as an explicit choice, which SGLang's automatic rules
    respect). `buckets` / `max_bs`: an explicit bucket list / ladder maximum, or None.
    `chunked_prefill_size`: the launch value (None: SGLang's default for
    `gpu_memory_gib`; -1 turns chunked prefill off). `mla`: the model uses multi-head
    latent attention. `model_path`: only its name matters here ("llama-2" caps the
    ladder). `deepep_mode`, `disaggregation_mode`, `dcp_size`: as SGLang names them.
    """

    layout: ParallelLayout = field(default_factory=ParallelLayout)
    platform: str = "cuda"  # "cuda" | "rocm"
    backend: str | None = None
    backend_forced_off: bool = False
    buckets: tuple[int, ...] | None = None
    max_bs: int | None = None
    chunked_prefill_size: int | None = None
    gpu_memory_gib: float | None = None
    pp_size: int = 1
    mla: bool = False
    model_path: str = ""
    max_total_tokens: int | None = None
    deepep_mode: str = "auto"
    disaggregation_mode: str = "null"
    dcp_size: int = 1
    enable_prefill_cp: bool = False


MODEL_SOURCE = "bcgtune model"


@dataclass(frozen=True)
class CaptureSource:
    """Who answered what a launch captures: SGLang's own resolution (`kind` "sglang", its
    version, and when the answer was cached if it came from the answer cache) or bcgtune's
    model of its rules (`kind` "model", with why SGLang's own answer was not used)."""

    kind: Literal["sglang", "model"] = "model"
    sglang_version: str | None = None
    cached_at: str | None = None
    not_asked: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "sglang":
            return f"sglang {self.sglang_version or 'unknown version'}"
        return MODEL_SOURCE


@dataclass(frozen=True)
class PrefillCapture:
    """What SGLang will do with prefill CUDA graphs for one launch.

    `backend`: breakable | full | disabled, and `reason` says why. `buckets`: the list
    SGLang resolves before capture alignment, or None when it is SGLang's default ladder
    up to `max_bs`. `max_bs`: the ladder maximum this layout resolves to (the largest
    bucket worth offering an optimizer). `alignment`: the multiple every bucket is rounded
    up to at capture. `captured`: exactly the buckets captured (empty when graphs are off).
    `chunked_prefill_size`: per attention-DP rank. `notes`: changes SGLang makes to what
    was asked (a rounded list, a regenerated ladder). `unchecked`: SGLang's rules that
    could change this answer and that were not checked (empty when the answer is SGLang's
    own, or when the model checked every rule that applies). `source`: who answered.
    `requested`: the launch's own bucket list (None: SGLang's default ladder). `refused`:
    SGLang refuses the launch (the server would not start) and why; nothing is captured.
    """

    backend: PrefillBackend
    reason: str
    buckets: tuple[int, ...] | None
    max_bs: int | None
    alignment: int
    captured: tuple[int, ...]
    chunked_prefill_size: int | None
    notes: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()
    source: CaptureSource = field(default_factory=CaptureSource)
    requested: tuple[int, ...] | None = None
    refused: str | None = None

    @property
    def graphs_on(self) -> bool:
        return self.backend != "disabled" and bool(self.captured) and self.refused is None

    def to_json(self) -> dict:
        return {
            "backend": self.backend if self.graphs_on else "disabled",
            "reason": self.reason,
            "buckets": list(self.captured),
            "max_bs": self.max_bs,
            "alignment": self.alignment,
            "chunked_prefill_size": self.chunked_prefill_size,
            "source": self.source.label,
            "cached_at": self.source.cached_at,
            "fallback_reason": self.source.not_asked,
            "requested": None if self.requested is None else list(self.requested),
            "notes": list(self.notes),
            "unchecked": list(self.unchecked),
            "refused": self.refused,
        }


@dataclass
class _Resolution:
    """The prefill graph settings as SGLang's pipeline hands them from step to step.

    `locked_*`: the value was chosen at launch (SGLang's `_cuda_graph_config_locked`),
    which its automatic rules respect. `buckets` None: SGLang's default ladder up to
    `max_bs`. `max_bs` and `chunk` are None until handle_gpu_memory_settings fills them.
    """

    launch: PrefillLaunch
    backend: PrefillBackend
    reason: str
    locked_backend: bool
    buckets: list[int] | None
    locked_buckets: bool
    max_bs: int | None
    locked_max: bool
    chunk: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def a2a(self) -> str:
        return (self.launch.layout.moe_a2a_backend or "none").lower()

    @property
    def ladder_max(self) -> int:
        if self.max_bs is None:
            raise RuntimeError("the ladder maximum is read before handle_gpu_memory_settings resolved it")
        return self.max_bs

    @property
    def chunk_size(self) -> int:
        if self.chunk is None:
            raise RuntimeError("the chunk is read before handle_gpu_memory_settings resolved it")
        return self.chunk

    def disable(self, reason: str) -> None:
        self.backend, self.reason = "disabled", reason


def _parse_cuda_graph_config(launch: PrefillLaunch) -> _Resolution:
    """cuda_graph_hook.py, parse_cuda_graph_config: the backend, list and maximum from the
    launch or the platform's default; explicit choices are locked against automatic rules."""
    backend: str
    if launch.backend is not None:
        backend = launch.backend
        reason = f"{backend}, chosen at launch"
    elif launch.backend_forced_off:
        backend = "disabled"
        reason = "prefill CUDA graphs switched off at launch"
    elif launch.platform == "cuda":
        backend = "breakable"
        reason = "breakable, SGLang's default on CUDA"
    else:
        backend = "disabled"
        reason = f"SGLang's default on {launch.platform.upper()} (breakable prefill graphs are opt-in there)"
    if backend not in PREFILL_BACKENDS:
        raise InputError(f"prefill backend must be one of {', '.join(PREFILL_BACKENDS)}, got {backend!r}", "backend")
    return _Resolution(
        launch=launch,
        backend=cast(PrefillBackend, backend),
        reason=reason,
        locked_backend=launch.backend is not None or launch.backend_forced_off,
        buckets=list(launch.buckets) if launch.buckets is not None else None,
        locked_buckets=launch.buckets is not None,
        max_bs=launch.max_bs,
        locked_max=launch.max_bs is not None,
    )


def _breakable_incompatibility(state: _Resolution) -> str | None:
    """cuda_graph_hook.py, disable_breakable_cudagraph_if_incompatible: the first rule
    (in SGLang's order) that turns breakable graphs off, or None. The rules on the model's
    architecture (KDA, DeepSeek-V4, multimodal) are not modelled; whether prefill context
    parallelism supports breakable graphs is noted as unchecked."""
    launch, lay = state.launch, state.launch.layout
    if lay.attn_cp_size > 1 and not launch.enable_prefill_cp:
        return "attention context parallelism without prefill context parallelism"
    if lay.attn_cp_size > 1:
        state.notes.append("prefill context parallelism: whether it supports breakable graphs is not checked here")
    if launch.dcp_size > 1:
        return "decode context parallelism (--dcp-size > 1)"
    if lay.two_batch_overlap:
        return "two-batch overlap"
    if state.a2a not in BREAKABLE_VALIDATED_A2A:
        return f"MoE all-to-all backend {state.a2a!r}, not validated with breakable graphs"
    return None


def _apply_cuda_graph_compatibility(state: _Resolution) -> None:
    """cuda_graph_hook.py, apply_cuda_graph_compatibility (skipped when the backend was
    chosen): breakable graphs are opt-in under pipeline parallelism, and off with the
    configurations disable_breakable_cudagraph_if_incompatible lists. Full graphs have
    no such rules in 0.5.23."""
    if state.locked_backend or state.backend != "breakable":
        return
    if state.launch.pp_size > 1:
        state.disable("pipeline parallelism (--pp-size > 1): breakable prefill graphs are opt-in there")
        return
    off = _breakable_incompatibility(state)
    if off is not None:
        state.disable(f"SGLang turns breakable prefill graphs off with {off}")


def _apply_deepep_adjustments(state: _Resolution) -> None:
    """cuda_graph_hook.py, apply_deepep_adjustments: under DeepEP with breakable graphs the
    list (or, with none, the ladder for the maximum or 2048) is rounded up to multiples of
    8, and the maximum becomes its last bucket."""
    if state.a2a != "deepep" or state.backend != "breakable":
        return
    src = state.buckets if state.buckets is not None else _ladder_or_empty(state.max_bs or DEEPEP_DEFAULT_MAX_BS)
    rounded = deepep_round(src)
    if rounded == sorted(src):
        return
    if state.locked_buckets:
        moved = [f"{b}->{ceil_to(int(b), DEEPEP_BUCKET_MULTIPLE)}" for b in sorted(set(src)) if b % DEEPEP_BUCKET_MULTIPLE]
        state.notes.append(f"DeepEP rounds every bucket up to a multiple of {DEEPEP_BUCKET_MULTIPLE}: " + ", ".join(moved))
    state.buckets, state.max_bs = rounded, rounded[-1]


def _apply_cuda_graph_disaggregation_roles(state: _Resolution) -> None:
    """cuda_graph_hook.py, apply_cuda_graph_disaggregation_roles: a decode-only server
    turns prefill graphs off unless the backend was chosen."""
    if state.launch.disaggregation_mode == "decode" and not state.locked_backend and state.backend != "disabled":
        state.disable("a decode-only server (disaggregation mode decode) runs no prefill")


def _handle_gpu_memory_settings(state: _Resolution) -> None:
    """memory_hook.py, handle_gpu_memory_settings: the chunk (by GPU memory when unset)
    and, when unset, the ladder maximum: the chunk, capped for MLA models, breakable
    graphs under pipeline parallelism with no list, --max-total-tokens and "llama-2"
    model paths."""
    launch = state.launch
    state.chunk = launch.chunked_prefill_size
    if state.chunk is None:
        state.chunk = default_chunked_prefill_size(launch.gpu_memory_gib)
    if state.max_bs is not None:
        return
    max_bs = min(MLA_PREFILL_MAX_BS, state.chunk) if launch.mla else state.chunk
    if launch.pp_size > 1 and state.backend == "breakable" and not state.locked_buckets:
        max_bs = min(max_bs, PP_BREAKABLE_PREFILL_MAX_BS)
    if launch.max_total_tokens is not None:
        max_bs = min(max_bs, launch.max_total_tokens)
    if "llama-2" in launch.model_path.lower():
        max_bs = min(max_bs, LLAMA2_PREFILL_MAX_BS)
    state.max_bs = max_bs


def _handle_data_parallelism(state: _Resolution) -> None:
    """parallel_hook.py, handle_data_parallelism: under attention DP the chunk is per rank,
    and an unchosen ladder maximum above it follows it (a list SGLang derived, e.g. the
    DeepEP ladder, is regenerated as the plain ladder)."""
    dp = state.launch.layout.attn_dp_size
    if dp <= 1:
        return
    state.chunk = chunk = state.chunk_size // dp
    if state.backend == "disabled" or state.ladder_max <= chunk or state.locked_max:
        return
    if state.buckets is not None and not state.locked_buckets:
        state.notes.append(
            f"the chunk per attention-DP rank ({chunk}) is below the DeepEP ladder's maximum: "
            f"SGLang regenerates the plain ladder up to {chunk}"
        )
    state.max_bs = chunk
    if not state.locked_buckets:
        state.buckets = None


def _handle_a2a_moe(state: _Resolution) -> None:
    """moe_hook.py, handle_a2a_moe: DeepEP normal dispatch and DeepEP v2 turn prefill
    graphs off, even when chosen."""
    if state.backend == "disabled":
        return
    if state.a2a == "deepep" and state.launch.deepep_mode == "normal":
        state.disable("SGLang turns CUDA graphs off with DeepEP normal dispatch (--deepep-mode normal)")
    elif state.a2a == "deepep_v2":
        state.disable("SGLang turns prefill CUDA graphs off with DeepEP v2 (its prefill is not capturable)")


def _final_capture(state: _Resolution) -> PrefillCapture:
    """prefill_cuda_graph_runner.py, get_prefill_num_tokens_to_capture (the list, or the
    ladder, each bucket aligned) and cuda_graph_setup.py, capture_prefill_graph (an empty
    list captures nothing, so SGLang disables prefill graphs)."""
    align = layout_alignment(state.launch.layout)
    max_bs, chunk = state.ladder_max, state.chunk_size
    listed = _ladder_or_empty(max_bs) if state.buckets is None else list(state.buckets)
    captured: tuple[int, ...] = ()
    if state.backend != "disabled" and not listed:
        why = (
            "chunked prefill is off (--chunked-prefill-size -1)"
            if chunk < 1
            else f"the ladder's maximum {max_bs} is below its first bucket"
        )
        state.disable(f"no bucket to capture: {why}; SGLang disables prefill CUDA graphs")
    elif state.backend != "disabled":
        captured = tuple(align_buckets(listed, align))
    return PrefillCapture(
        backend=state.backend,
        reason=state.reason,
        buckets=None if state.buckets is None else tuple(state.buckets),
        max_bs=max_bs,
        alignment=align,
        captured=captured,
        chunked_prefill_size=chunk,
        notes=tuple(state.notes),
    )


# The steps of SGLang's resolution pipeline this model follows, in SGLang's order
# (arg_groups/pipeline.py, run_resolution_pipeline; the cuda_graph_hook steps run inside
# its handle_cuda_graph_config, after parse_cuda_graph_config), each with the SGLang
# function it mirrors.
PIPELINE_STEPS: tuple[tuple[str, Callable[[_Resolution], None]], ...] = (
    ("cuda_graph_hook.apply_cuda_graph_compatibility", _apply_cuda_graph_compatibility),
    ("cuda_graph_hook.apply_deepep_adjustments", _apply_deepep_adjustments),
    ("cuda_graph_hook.apply_cuda_graph_disaggregation_roles", _apply_cuda_graph_disaggregation_roles),
    ("memory_hook.handle_gpu_memory_settings", _handle_gpu_memory_settings),
    ("parallel_hook.handle_data_parallelism", _handle_data_parallelism),
    ("moe_hook.handle_a2a_moe", _handle_a2a_moe),
)


def resolve_prefill_capture(launch: PrefillLaunch) -> PrefillCapture:
    """SGLang 0.5.23's prefill capture for a launch, following its resolution pipeline
    (arg_groups/pipeline.py) step by step: parse_cuda_graph_config, then PIPELINE_STEPS,
    then the capture. Rules that depend on the model's architecture beyond MLA (KDA
    hybrid attention, DeepSeek-V4, multimodal models outside SGLang's allowlist,
    DeepSeek-V3 on trtllm_mla) are not modelled; prefill context parallelism support is
    reported as unchecked."""
    state = _parse_cuda_graph_config(launch)
    for _mirrors, step in PIPELINE_STEPS:
        step(state)
    return _final_capture(state)
