"""What SGLang 0.5.23 captures for a whole launch, as pure functions: bcgtune's model of
SGLang's launch resolution, and the answer type every command prices with (from SGLang
itself or from this model).

Must match SGLang: the steps of srt/arg_groups/pipeline.py listed in PIPELINE_STEPS, each
citing the SGLang function it mirrors, then
model_executor/model_runner_components/cuda_graph_setup.py (capture_prefill_graph: buckets
above request rows x context length dropped; an empty list captures nothing) and
model_executor/runner/prefill_cuda_graph_runner.py (get_prefill_num_tokens_to_capture).
What this model cannot evaluate for a launch it names in the answer's `unchecked`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from bcgtune.core.sglang.ladder import (
    DEEPEP_BUCKET_MULTIPLE,
    PP_BREAKABLE_PREFILL_MAX_BS,
    PREFILL_BACKENDS,
    ParallelLayout,
    PrefillBackend,
    align_buckets,
    ceil_to,
    deepep_round,
    default_chunked_prefill_size,
    layout_alignment,
    sglang_default_ladder,
)
from bcgtune.core.sglang.model_rules import DEEPSEEK_FAMILY_ARCHS, DEEPSEEK_V3_ARCH, ModelFacts
from bcgtune.core.sglang.tables import DEEPEP_V2_ARCHS, FLAG_CHOICES, FLASHINFER_MEGAMOE_ARCHS
from bcgtune.errors import InputError

# --------------------------------------------------------------------------- what a launch captures
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
# attention_hook.py, handle_attention_backend_compatibility: attention backends that turn
# every CUDA graph off, even a chosen one
GRAPHLESS_ATTENTION_BACKENDS = ("torch_native", "flex_attention")
# speculative_hook.py: every speculative algorithm sets --max-running-requests to 48 when
# it is not given
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
# mem_cache/kv_cache_configurator.py, resolve_max_num_reqs: without --max-running-requests
# the request pool is at most this many rows (it depends on the KV cache, known at start-up)
MAX_DEFAULT_REQUEST_POOL = 4096
# model_executor/model_runner_components/cuda_graph_setup.py, capture_prefill_graph: full
# prefill graphs capture max(chunk // 512, 1) request rows unless the JSON config says
FULL_PREFILL_TOKENS_PER_REQUEST_ROW = 512

# Launch flags whose rules on prefill graphs this model does not evaluate: when a launch sets
# one, its answer names the rule as not checked.
# Each names the SGLang file and function that apply the rule.
FLAG_RULES: dict[str, str] = {
    "speculative_algorithm": "speculative decoding's own settings and checks (srt/arg_groups/speculative_hook.py, "
    "handle_speculative_decoding: _handle_ngram, _handle_eagle_family)",
    "enable_lora": "LoRA: at start-up SGLang runs prefill eager when its LoRA setup does not support graphs "
    "(model_runner_components/cuda_graph_setup.py, capture_prefill_graph)",
    "lora_paths": "LoRA: at start-up SGLang runs prefill eager when its LoRA setup does not support graphs "
    "(model_runner_components/cuda_graph_setup.py, capture_prefill_graph)",
    "dllm_algorithm": "diffusion LLM inference (srt/arg_groups/dllm_hook.py, handle_dllm_inference)",
    "enable_unified_memory": "the unified memory pool with full prefill graphs "
    "(srt/arg_groups/kv_cache_hook.py, handle_unified_memory_pool)",
    "enable_deterministic_inference": "deterministic inference's attention backend "
    "(srt/arg_groups/attention_hook.py, handle_deterministic_inference)",
    "enable_cp_tp_group_sharing": "CP-TP group sharing (srt/arg_groups/cp_tp_group_sharing_hook.py, resolve_cp_tp_group_sharing)",
    "elastic_ep_backend": "elastic EP's capture alignment (srt/utils/common.py, require_mlp_tp_gather)",
    "model_impl": "the transformers implementation's multimodal detection (srt/configs/model_config.py, ModelConfig)",
    "enable_mis": "SGLang refuses multi-item scoring unless the attention backend is flashinfer "
    "(srt/arg_groups/attention_hook.py, handle_multi_item_scoring)",
    "enable_kv_cache_sharding": "SGLang accepts KV cache sharding only on PD prefill workers "
    "(srt/arg_groups/kv_shard_hook.py, handle_kv_cache_sharding)",
    "language_model_only": "SGLang accepts --language-model-only for a few architectures only "
    "(srt/arg_groups/model_hook.py, handle_model_specific_adjustments)",
    "enable_dynamic_chunking": "dynamic chunking's prefill buffer under pipeline parallelism "
    "(srt/arg_groups/overrides.py, max_prefill_buffer_tokens)",
}
# srt/environ.py, SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK's default: MoRI refuses a
# larger chunk per rank (moe_hook.py, handle_a2a_moe)
MORI_MAX_DISPATCH_TOKENS_PER_RANK = 4096
# srt/utils/common.py, is_blackwell: CUDA compute capability majors SGLang calls Blackwell
BLACKWELL_CAPABILITY_MAJORS = (10, 11, 12)
# MoE all-to-all backends whose own checks this model does not run
A2A_RULES = {
    "flashinfer": "SGLang refuses MoE runners, quantizations and dispatch settings the flashinfer all-to-all backend "
    "does not support (srt/arg_groups/moe_hook.py, handle_a2a_moe; validate_flashinfer_a2a_token_budget)",
    "megamoe": "MegaMoE's per-model token budget and decode capacity "
    "(srt/arg_groups/mega_moe_hook.py, validate_mega_moe_token_budget_for_model)",
}
# srt/environ.py, SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK's default: DeepEP v2's per-rank
# communication buffer (moe_hook.py, validate_deepep_v2_dispatch_token_budget refuses more)
DEEPEP_V2_MAX_DISPATCH_TOKENS_PER_RANK = 128
# srt/arg_groups/fields/schedule.py, max_prefill_tokens' default
DEFAULT_MAX_PREFILL_TOKENS = 16384
# srt/layers/cp/bcg/__init__.py, PREFILL_CP_BCG_SUPPORTED_COMBINATIONS: the (--cp-strategy, prefill
# attention backend) pairs whose prefill context parallelism captures breakable graphs
PREFILL_CP_BCG_COMBINATIONS = (("zigzag", "trtllm_mha"), ("interleave", "dsa"))
# srt/layers/cp/bcg/interleave_bcg.py, InterleaveCPBCGInput.supports: the model it is validated for
INTERLEAVE_CP_BCG_ARCH = "Glm5NextForConditionalGeneration"
# srt/arg_groups/parallel_hook.py, handle_context_parallelism: the one model prefill CP runs on HIP
HIP_PREFILL_CP_ARCH = "DeepseekV4ForCausalLM"
# srt/utils/common.py, is_sm90_supported / is_sm100_supported / is_sm120_supported: the CUDA
# capability majors SGLang's TRTLLM MHA checks accept (attention_hook.py)
TRTLLM_MHA_CAPABILITY_MAJORS = (9, 10, 12)


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
    `gpu_memory_gib`; -1 or 0 turns chunked prefill off). `mla`: the model uses multi-head
    latent attention. `model_path`: only its name matters here ("llama-2" caps the
    ladder). `model`: what SGLang reads from the model's config (None: the config is not
    on this machine, and the rules on it are named as not checked). `gpu_capability`: the
    GPU's compute capability, when known. `flags`: the snake-case names of every flag the
    launch sets (rules on flags this model does not evaluate are named from them).
    `allow_longer_context`: SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set. Other
    fields: as SGLang names its flags.
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
    model: ModelFacts | None = None
    gpu_capability: tuple[int, int] | None = None
    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    speculative_algorithm: str | None = None
    debug_tensor_dump: bool = False
    enable_mis: bool = False
    kv_cache_sharding: bool = False
    dllm_algorithm: str | None = None
    full_prefill_max_req: int | None = None
    flags: frozenset[str] = frozenset()
    allow_longer_context: bool = False
    moe_runner_backend: str | None = None
    single_batch_overlap: bool = False
    # SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK from the launch's environment (None: SGLang's default)
    mori_max_dispatch_tokens: int | None = None
    # the string values of the flags the launch sets (SGLang's parser restricts some to a list)
    flag_values: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    cp_strategy: str | None = None
    kv_cache_dtype: str | None = None
    max_prefill_tokens: int | None = None
    nnodes: int = 1
    deepep_v2_mode: str | None = None
    enforce_shared_experts_fusion: bool = False
    speculative_moe_a2a_backend: str | None = None
    # SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK from the launch's environment (None: the default)
    deepep_v2_max_dispatch_tokens: int | None = None
    disable_decode_graphs: bool = False
    enable_dynamic_chunking: bool = False


MODEL_SOURCE = "bcgtune model"
# Whether SGLang itself judged a launch: never "ok" without it.
LaunchCheck = Literal["checked", "not checked"]


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

    @property
    def checked(self) -> bool:
        """SGLang itself answered for this launch (its resolution, cached or asked now)."""
        return self.source.kind == "sglang"

    @property
    def launch_check(self) -> LaunchCheck:
        """ "checked": the answer is SGLang's own; "not checked": bcgtune's model answered."""
        return "checked" if self.checked else "not checked"

    @property
    def not_checked_reason(self) -> str | None:
        """Why SGLang's own answer is missing (None when it answered)."""
        if self.checked:
            return None
        return self.source.not_asked or "SGLang was not asked"

    def to_json(self) -> dict:
        return {
            "launch_check": self.launch_check,
            "launch_check_reason": self.not_checked_reason,
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
    `a2a`: the MoE all-to-all backend as resolution sees it (handle_a2a_moe may reset it).
    `unchecked`: rules that apply to this launch and that this model cannot evaluate;
    `refused`: SGLang refuses the launch, and why.
    """

    launch: PrefillLaunch
    backend: PrefillBackend
    reason: str
    locked_backend: bool
    buckets: list[int] | None
    locked_buckets: bool
    max_bs: int | None
    locked_max: bool
    a2a: str = "none"
    chunk: int | None = None
    max_running_requests: int | None = None
    notes: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    arch_rules: list[str] = field(default_factory=list)
    refused: str | None = None
    attention_resolved: bool = False  # SGLang has chosen its default attention backend

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

    @property
    def model(self) -> ModelFacts | None:
        return self.launch.model

    def disable(self, reason: str) -> None:
        self.backend, self.reason = "disabled", reason

    def cannot_check(self, what: str) -> None:
        if what not in self.unchecked:
            self.unchecked.append(what)

    def arch_unchecked(self, rule: str) -> None:
        """A rule on the model's architecture, when its config is not on this machine (all
        of them are named in one entry, ARCH_UNCHECKED, at the end)."""
        if rule not in self.arch_rules:
            self.arch_rules.append(rule)

    def all_unchecked(self) -> tuple[str, ...]:
        if not self.arch_rules:
            return tuple(self.unchecked)
        return (ARCH_UNCHECKED + "; ".join(self.arch_rules), *self.unchecked)


# how an answer names the rules on the model it could not check
ARCH_UNCHECKED = "the model's config is not on this machine, so SGLang's rules on it: "


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
    state = _Resolution(
        launch=launch,
        backend=cast(PrefillBackend, backend),
        reason=reason,
        locked_backend=launch.backend is not None or launch.backend_forced_off,
        buckets=list(launch.buckets) if launch.buckets is not None else None,
        locked_buckets=launch.buckets is not None,
        max_bs=launch.max_bs,
        locked_max=launch.max_bs is not None,
        a2a=(launch.layout.moe_a2a_backend or "none").lower(),
        max_running_requests=launch.max_running_requests,
    )
    _parser_refusal(state)
    _context_length_check(state)
    for flag in sorted(launch.flags):
        if flag in FLAG_RULES and _flag_rule_applies(launch, flag):
            state.cannot_check(f"--{flag.replace('_', '-')}: {FLAG_RULES[flag]}")
    if state.a2a in A2A_RULES:
        state.cannot_check(f"--moe-a2a-backend {state.a2a}: {A2A_RULES[state.a2a]}")
    return state


def parser_choice_refusal(flag_values) -> str | None:
    """srt/server_args.py, prepare_server_args (SGLang's argument parser): a flag whose values
    the parser restricts to a list (srt/arg_groups/fields/, Arg(choices=...): FLAG_CHOICES)
    given another value is refused before anything resolves; the parser's own message."""
    for flag, value in flag_values:
        choices = FLAG_CHOICES.get(flag)
        if choices is None:
            continue
        for v in value if isinstance(value, tuple) else (value,):
            if v not in choices:
                listed = ", ".join(repr(c) for c in choices)
                return (
                    f"SGLang's parser refused the launch: argument --{flag.replace('_', '-')}: invalid choice: {v!r} "
                    f"(choose from {listed}) (srt/server_args.py, prepare_server_args)"
                )
    return None


def _parser_refusal(state: _Resolution) -> None:
    why = parser_choice_refusal(state.launch.flag_values)
    if why is not None:
        _refuse(state, why)


def _flag_rule_applies(launch: PrefillLaunch, flag: str) -> bool:
    if flag == "dllm_algorithm":
        return launch.platform != "rocm"  # on ROCm its rule is modelled (_handle_dllm_inference)
    return True


def _context_length_check(state: _Resolution) -> None:
    """configs/model_config.py, ModelConfig._derive_context_length: a --context-length
    above what the model's config allows is refused (unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set)."""
    launch, facts = state.launch, state.launch.model
    if launch.context_length is None or launch.allow_longer_context:
        return
    if facts is None:
        state.arch_unchecked("a --context-length above the model's own is refused")
    elif launch.context_length > facts.context_len:
        state.refused = (
            f"--context-length {launch.context_length} is greater than the model's context length {facts.context_len} "
            "(configs/model_config.py; SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 allows it)"
        )


CP_BCG_RULE = "srt/layers/cp/bcg/__init__.py, supports_prefill_cp_bcg"


def _default_prefill_attention(state: _Resolution) -> str | None:
    """model_override_base.py, get_default_attn_backend, as far as the prefill context
    parallelism check needs it: "trtllm_mha" (SM100 GPUs, MHA models, no speculative
    decoding), "dsa" (DeepSeek sparse attention models, overrides.py), "other" for every
    other default, None when it cannot be told (the model's config is not on this machine)."""
    launch, facts = state.launch, state.model
    if facts is None:
        return None
    if facts.dsa:
        return "dsa"
    cap = launch.gpu_capability
    if launch.platform == "cuda" and cap is not None and cap[0] == 10 and not facts.mla:
        return None if launch.speculative_algorithm else "trtllm_mha"
    return "other" if launch.platform == "rocm" or cap is not None else None


def prefill_cp_supports_breakable(state: _Resolution, *, attention_resolved: bool) -> bool | None:
    """srt/layers/cp/bcg/__init__.py, supports_prefill_cp_bcg: prefill context parallelism
    over the whole TP group (attn_cp_size == tp_size, no pipeline parallelism) with a
    (--cp-strategy, prefill attention backend) pair it validated (zigzag with trtllm_mha;
    interleave with DSA, on GLM-5.3 Flash without DP or EP: interleave_bcg.py,
    InterleaveCPBCGInput.supports). `attention_resolved`: SGLang has chosen its default
    attention backend by then (attention_hook.py, handle_attention_backend_compatibility);
    before, a backend not given is none of the validated ones (DSA models aside, whose
    backend a model override sets). None when the prefill attention backend cannot be told."""
    launch, lay = state.launch, state.launch.layout
    if not launch.enable_prefill_cp or launch.pp_size != 1 or lay.attn_cp_size != lay.tp:
        return False
    _, prefill = _resolved_attention_backend(state)
    if prefill is None:
        prefill = _default_prefill_attention(state)
        if prefill is None:
            return None
        if not attention_resolved and prefill != "dsa":
            return False
    pair = (launch.cp_strategy, prefill)
    if pair not in PREFILL_CP_BCG_COMBINATIONS:
        return False
    if pair[0] == "interleave":
        if state.model is None:
            return None
        if lay.replica_dp_size != 1 or lay.attn_cp_size <= 1 or INTERLEAVE_CP_BCG_ARCH not in state.model.architectures:
            return False
        return None  # and ep_size == 1, which SGLang resolves from the MoE settings: named
    return True


def _cp_supported(state: _Resolution, rule: str) -> bool | None:
    """prefill_cp_supports_breakable at this step of the resolution, with an answer it
    cannot give named under `rule`."""
    supported = prefill_cp_supports_breakable(state, attention_resolved=state.attention_resolved)
    if supported is None:
        state.cannot_check(
            f"whether this prefill context parallelism keeps breakable graphs ({CP_BCG_RULE}; {rule}): "
            "its prefill attention backend is SGLang's default, which depends on the model and the GPU"
        )
    return supported


def _breakable_incompatibility(state: _Resolution) -> str | None:
    """cuda_graph_hook.py, disable_breakable_cudagraph_if_incompatible: the first rule (in
    SGLang's order) that turns breakable graphs off, or None. Rules on the model's
    architecture are named as not checked when its config is not on this machine, and so is
    prefill context parallelism's support of breakable graphs when it cannot be told."""
    launch, lay, facts = state.launch, state.launch.layout, state.model
    needs_cp = (facts is not None and facts.deepseek_v4) or lay.attn_cp_size > 1
    rule = "cuda_graph_hook.py, disable_breakable_cudagraph_if_incompatible"
    cp_supported = _cp_supported(state, rule) if needs_cp else False
    if facts is None:
        state.arch_unchecked("KDA attention, DeepSeek-V4 and multimodal models outside its allowlist turn breakable graphs off")
    elif facts.kda:
        return "KDA hybrid linear attention"
    elif facts.deepseek_v4 and cp_supported is False:
        return "DeepSeek-V4 (heavy capture-pool memory pressure)"
    if lay.attn_cp_size > 1 and cp_supported is False:
        if launch.enable_prefill_cp:
            return "this prefill context parallelism (no breakable graphs for its strategy, attention backend and layout)"
        return "attention context parallelism without prefill context parallelism"
    if launch.dcp_size > 1:
        return "decode context parallelism (--dcp-size > 1)"
    if lay.two_batch_overlap:
        return "two-batch overlap"
    if state.a2a not in BREAKABLE_VALIDATED_A2A:
        return f"MoE all-to-all backend {state.a2a!r}, not validated with breakable graphs"
    if facts is not None and facts.multimodal and not facts.multimodal_breakable:
        return f"multimodal model {facts.arch} (not on SGLang's breakable allowlist)"
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
    mla = launch.mla or (state.model is not None and state.model.mla)
    max_bs = min(MLA_PREFILL_MAX_BS, state.chunk) if mla else state.chunk
    if launch.pp_size > 1 and state.backend == "breakable" and not state.locked_buckets:
        max_bs = min(max_bs, PP_BREAKABLE_PREFILL_MAX_BS)
    if launch.max_total_tokens is not None:
        max_bs = min(max_bs, launch.max_total_tokens)
    if "llama-2" in launch.model_path.lower():
        max_bs = min(max_bs, LLAMA2_PREFILL_MAX_BS)
    state.max_bs = max_bs


def _handle_model_specific_adjustments(state: _Resolution) -> None:
    """model_hook.py, handle_model_specific_adjustments, and the per-model overrides
    (arg_groups/model_overrides/): settings SGLang changes for particular architectures.
    Those this model does not cover are named as not checked."""
    if state.model is None:
        state.arch_unchecked("settings for particular architectures")
        return
    for site in state.model.arch_rules:
        state.cannot_check(f"SGLang's settings for {site}")
    _deepseek_prefill_cp(state)


def _deepseek_prefill_cp(state: _Resolution) -> None:
    """model_hook.py, handle_model_specific_adjustments, for the DeepSeek family
    (DEEPSEEK_FAMILY_ARCHS) with --enable-prefill-cp: an MLA model runs prefill eager, even
    with graphs chosen; a DeepSeek sparse attention model keeps them only when breakable and
    its prefill context parallelism supports them (on CUDA and ROCm GPUs)."""
    facts, launch = state.model, state.launch
    state.launch = _deepseek_family_overrides(launch)
    if state.launch is not launch:
        state.a2a = state.launch.layout.moe_a2a_backend
    if facts is None or not launch.enable_prefill_cp or state.backend == "disabled":
        return
    if not set(facts.architectures[:1]) & set(DEEPSEEK_FAMILY_ARCHS):
        return
    rule = "model_hook.py, handle_model_specific_adjustments"
    if facts.dsa:
        supported = _cp_supported(state, rule)
        if supported is False or (supported and state.backend != "breakable"):
            state.disable("SGLang turns prefill graphs off for this DeepSeek sparse attention prefill context parallelism")
    elif facts.mla:
        state.disable("SGLang turns prefill graphs off for an MLA DeepSeek-family model with prefill context parallelism")


def _resolved_attention_backend(state: _Resolution) -> tuple[str | None, str | None]:
    """(attention_backend, prefill attention backend) as resolution sees them
    (overrides.py, _attention_backend_default; model_override_base.py,
    attention_backends_of): a split backend given for both phases is the backend;
    DeepSeek-V3 on an sm100 GPU with no backend given gets trtllm_mla
    (model_overrides/deepseek_v2.py). None: SGLang's platform default, which is neither
    torch_native nor flex_attention on CUDA or ROCm."""
    launch = state.launch
    attn = launch.attention_backend
    pre, dec = launch.prefill_attention_backend, launch.decode_attention_backend
    if pre is not None and pre == dec:
        attn = pre
    if attn is None and pre is None and dec is None and state.model is not None:
        sm100 = launch.platform == "cuda" and launch.gpu_capability is not None and launch.gpu_capability[0] == 10
        if sm100 and state.model.arch == DEEPSEEK_V3_ARCH:
            attn = "trtllm_mla"
    return attn, (pre or attn)


def _trtllm_mha_refusal(state: _Resolution) -> None:
    """attention_hook.py, handle_attention_backend_compatibility: TRTLLM MHA attention for
    prefill or decode needs a Hopper (SM90), Blackwell (SM100) or SM120 CUDA GPU; on SM120
    its prefill refuses an fp8_e4m3 KV cache; with prefill context parallelism (attn_cp_size
    > 1) its prefill needs SM100."""
    launch = state.launch
    attn = launch.attention_backend
    prefill = launch.prefill_attention_backend or attn
    decode = launch.decode_attention_backend or attn
    if "trtllm_mha" not in (prefill, decode):
        return
    where = "(srt/arg_groups/attention_hook.py, handle_attention_backend_compatibility)"
    cap = launch.gpu_capability
    if launch.platform == "cuda" and cap is None:
        state.cannot_check(f"TRTLLM MHA attention needs an SM90, SM100 or SM120 GPU (the GPU is unknown) {where}")
        return
    major = cap[0] if launch.platform == "cuda" and cap is not None else None
    if prefill == "trtllm_mha" and major not in TRTLLM_MHA_CAPABILITY_MAJORS:
        _refuse(state, f"TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs {where}")
    elif prefill == "trtllm_mha" and major == 12 and launch.kv_cache_dtype == "fp8_e4m3":
        _refuse(state, f"TRTLLM FMHAv2 prefill on SM120 does not support fp8_e4m3 KV cache {where}")
    elif decode == "trtllm_mha" and major not in TRTLLM_MHA_CAPABILITY_MAJORS:
        _refuse(state, f"TRTLLM MHA backend for decode is only supported on SM90, SM100 and SM120 GPUs {where}")
    elif prefill == "trtllm_mha" and major != 10 and launch.layout.attn_cp_size > 1:
        _refuse(state, f"Prefill context parallelism with the TRTLLM MHA prefill backend requires SM100 {where}")


def _handle_attention_backend_compatibility(state: _Resolution) -> None:
    """attention_hook.py, handle_attention_backend_compatibility: torch_native and
    flex_attention turn CUDA graphs off, even chosen ones; flex_attention refuses
    speculative decoding; TRTLLM MHA's GPU requirements (_trtllm_mha_refusal)."""
    _trtllm_mha_refusal(state)
    state.attention_resolved = True
    attn, _ = _resolved_attention_backend(state)
    if attn not in GRAPHLESS_ATTENTION_BACKENDS:
        return
    state.disable(f"SGLang turns CUDA graphs off with the {attn} attention backend")
    if attn == "flex_attention" and state.launch.speculative_algorithm:
        state.refused = "speculative decoding is not supported with the flex_attention backend (attention_hook.py)"


def _disable_for_deepseek_trtllm_mla(state: _Resolution) -> None:
    """cuda_graph_hook.py, disable_prefill_cuda_graph_for_deepseek_trtllm_mla: DeepSeek-V3
    with trtllm_mla prefill attention (its default on sm100 GPUs) runs prefill eager unless
    the prefill backend was chosen."""
    if state.locked_backend or state.backend == "disabled":
        return
    if state.model is None:
        state.arch_unchecked("DeepSeek-V3 with trtllm_mla attention runs prefill eager")
        return
    if DEEPSEEK_V3_ARCH not in state.model.architectures:
        return
    _, prefill_attn = _resolved_attention_backend(state)
    if prefill_attn == "trtllm_mla":
        state.disable("SGLang turns prefill graphs off for DeepSeek-V3 with trtllm_mla attention (its default on sm100)")


def _handle_multi_item_scoring(state: _Resolution) -> None:
    """attention_hook.py, handle_multi_item_scoring: --enable-mis turns CUDA graphs off."""
    if state.launch.enable_mis and state.backend != "disabled":
        state.disable("SGLang turns CUDA graphs off with multi-item scoring (--enable-mis)")


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


def _handle_kv_cache_sharding(state: _Resolution) -> None:
    """kv_shard_hook.py, handle_kv_cache_sharding: prefill graphs are incompatible with
    --enable-kv-cache-sharding."""
    if state.launch.kv_cache_sharding and state.backend != "disabled":
        state.disable("SGLang turns prefill graphs off with KV cache sharding (--enable-kv-cache-sharding)")


def _handle_a2a_moe(state: _Resolution) -> None:
    """moe_hook.py, handle_a2a_moe: DeepEP normal dispatch and DeepEP v2 turn prefill
    graphs off, even when chosen; ascend_tp is reset to no all-to-all backend (which the
    capture alignment then sees)."""
    if state.a2a == "ascend_tp":
        state.a2a = "none"
    _a2a_refusals(state)
    if state.backend == "disabled":
        return
    if state.a2a == "deepep" and state.launch.deepep_mode == "normal":
        state.disable("SGLang turns CUDA graphs off with DeepEP normal dispatch (--deepep-mode normal)")
    elif state.a2a == "deepep_v2":
        state.disable("SGLang turns prefill CUDA graphs off with DeepEP v2 (its prefill is not capturable)")


def _refuse(state: _Resolution, why: str) -> None:
    if state.refused is None:
        state.refused = why


def _a2a_refusals(state: _Resolution) -> None:
    """moe_hook.py, handle_a2a_moe (and validate_flashinfer_megamoe_model): the MoE
    all-to-all backends' own checks that refuse a launch, whatever its prefill graphs."""
    launch, a2a = state.launch, state.a2a
    if a2a == "deepep_v2":
        _deepep_v2_refusals(state)
    elif a2a == "flashinfer":
        _flashinfer_a2a_topology(state)
    elif a2a == "mori":
        # the per-rank dispatch tokens (the chunk per rank) must fit MoRI's dispatch buffer
        limit = launch.mori_max_dispatch_tokens or MORI_MAX_DISPATCH_TOKENS_PER_RANK
        chunk = state.chunk_size
        if chunk > 0 and launch.disaggregation_mode != "decode" and chunk > limit:
            _refuse(
                state,
                f"SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default {MORI_MAX_DISPATCH_TOKENS_PER_RANK}) must be >= "
                f"the per-rank MoRI dispatch tokens (chunked_prefill_size by default): {chunk} > {limit} "
                "(srt/arg_groups/moe_hook.py, handle_a2a_moe)",
            )
    elif a2a == "pplx":
        if launch.deepep_mode == "normal":
            _refuse(state, "moe_a2a_backend='pplx' only supports low-latency mode (srt/arg_groups/moe_hook.py)")
        elif launch.layout.attn_dp_size < 2:
            _refuse(
                state,
                "moe_a2a_backend='pplx' requires attention DP with at least 2 groups (--attn-dp-size >= 2) "
                "(srt/arg_groups/moe_hook.py, handle_a2a_moe)",
            )
        elif (launch.moe_runner_backend or "auto") not in ("deep_gemm", "auto"):
            _refuse(state, "moe_a2a_backend='pplx' is only supported with --moe-runner-backend deep_gemm (or auto)")
        else:
            state.cannot_check(
                "--moe-a2a-backend pplx: its per-rank dispatch tokens against SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK "
                "(srt/arg_groups/moe_hook.py, handle_a2a_moe)"
            )
    elif a2a == "megamoe":
        # mega_moe_hook.py, check_mega_moe_compat
        cap = launch.gpu_capability
        if launch.layout.two_batch_overlap or launch.single_batch_overlap:
            _refuse(
                state,
                "--moe-a2a-backend megamoe has no two-batch / single-batch overlap decomposition "
                "(srt/arg_groups/mega_moe_hook.py, check_mega_moe_compat)",
            )
        elif launch.platform == "cuda" and cap is not None and cap[0] not in (9, 10):
            _refuse(
                state,
                "--moe-a2a-backend megamoe needs a CUDA SM90 GPU or an SM100-class GPU "
                "(srt/arg_groups/mega_moe_hook.py, check_mega_moe_compat)",
            )
    elif a2a == "flashinfer_megamoe":
        if state.model is None:
            state.arch_unchecked("FlashInfer MegaMOE refuses architectures it has not validated")
        elif not set(state.model.architectures) & set(FLASHINFER_MEGAMOE_ARCHS):
            _refuse(
                state,
                f"FlashInfer MegaMOE is not validated for model architectures {list(state.model.architectures)} "
                "(srt/arg_groups/moe_hook.py, validate_flashinfer_megamoe_model)",
            )
        else:
            state.cannot_check(
                "--moe-a2a-backend flashinfer_megamoe: its quantization, environment and runner checks "
                "(srt/arg_groups/moe_hook.py, handle_a2a_moe; validate_flashinfer_megamoe_model)"
            )


def _deepep_v2_refusals(state: _Resolution) -> None:
    """moe_hook.py, handle_a2a_moe with --moe-a2a-backend deepep_v2, in SGLang's order: the
    model's architecture must be registered for DeepEP v2 (validate_deepep_v2_model_architecture,
    DEEPEP_V2_ARCHS), the MoE runner deep_gemm (auto resolves to it), no two- or single-batch
    overlap, no --enforce-shared-experts-fusion, and --deepep-v2-mode direct on one node."""
    launch, facts = state.launch, state.model
    where = "(srt/arg_groups/moe_hook.py, handle_a2a_moe)"
    if facts is None:
        state.arch_unchecked("DeepEP v2 refuses architectures it has not registered")
    elif facts.arch not in DEEPEP_V2_ARCHS:
        _refuse(
            state,
            f"DeepEP v2 MoE is not validated for {facts.arch!r}: SGLang registers {', '.join(DEEPEP_V2_ARCHS)} "
            "(srt/arg_groups/moe_hook.py, validate_deepep_v2_model_architecture)",
        )
    runner = launch.moe_runner_backend or "auto"
    if runner not in ("auto", "deep_gemm"):
        _refuse(state, f"DeepEP v2 MoE currently supports only --moe-runner-backend deep_gemm, got {runner!r} {where}")
    elif launch.layout.two_batch_overlap or launch.single_batch_overlap:
        _refuse(state, f"DeepEP v2 MoE has not implemented the TBO/SBO overlap hooks {where}")
    elif launch.enforce_shared_experts_fusion:
        _refuse(state, f"DeepEP v2 MoE has not validated fused shared experts (--enforce-shared-experts-fusion) {where}")
    elif launch.deepep_v2_mode == "direct" and launch.nnodes > 1:
        _refuse(state, f"--deepep-v2-mode direct is NVLink-only and cannot run across nodes {where}")


def _validate_deepep_v2_speculative_draft(state: _Resolution) -> None:
    """moe_hook.py, validate_deepep_v2_speculative_draft: a speculative draft model inherits
    the DeepEP v2 backend unless its own is given (ngram has no draft model), and SGLang
    refuses DeepEP v2 as a draft backend."""
    launch = state.launch
    draft = launch.speculative_moe_a2a_backend
    spec = (launch.speculative_algorithm or "").upper()
    if draft is None and spec and spec != "NONE" and spec != "NGRAM":
        draft = state.a2a
    if draft == "deepep_v2":
        _refuse(
            state,
            "DeepEP v2 MoE is not validated as a speculative draft backend: select another --speculative-moe-a2a-backend "
            "(srt/arg_groups/moe_hook.py, validate_deepep_v2_speculative_draft)",
        )


def deepep_v2_prefill_tokens_per_rank(chunk_per_dp_rank: int, max_prefill_tokens: int, tp_size: int, attn_dp_size: int) -> int:
    """moe_hook.py, required_deepep_v2_prefill_tokens_per_rank (with no model-registered
    sizing, srt/configs/moe_model_registry.py): the prefill-buffer ceiling (the chunk per
    attention-DP rank when chunked prefill is on, else --max-prefill-tokens; overrides.py,
    max_prefill_buffer_tokens) scattered over tp_size // attn_dp_size ranks."""
    ceiling = chunk_per_dp_rank if chunk_per_dp_rank > 0 else max_prefill_tokens
    ranks = max(1, tp_size // max(1, attn_dp_size))
    return -(-ceiling // ranks)


def _validate_deepep_v2_dispatch_token_budget(state: _Resolution) -> None:
    """moe_hook.py, validate_deepep_v2_dispatch_token_budget: the per-rank prefill dispatch
    (unless a decode-only server) and the largest decode CUDA graph's tokens must fit
    SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128 by default). The decode graph's
    size is bounded here only through --max-running-requests; otherwise it is named."""
    launch = state.launch
    if state.a2a != "deepep_v2" or state.refused is not None:
        return
    where = "(srt/arg_groups/moe_hook.py, validate_deepep_v2_dispatch_token_budget)"
    capacity = launch.deepep_v2_max_dispatch_tokens or DEEPEP_V2_MAX_DISPATCH_TOKENS_PER_RANK
    lay = launch.layout
    if launch.disaggregation_mode != "decode":
        if launch.enable_dynamic_chunking and launch.pp_size > 1:
            state.cannot_check(f"DeepEP v2's prefill budget with dynamic chunking {where}")
            return
        need = deepep_v2_prefill_tokens_per_rank(
            state.chunk_size, launch.max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS, lay.tp, lay.attn_dp_size
        )
        if need > capacity:
            _refuse(
                state,
                f"DeepEP v2 per-rank prefill budget exceeds SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK: "
                f"required={need}, capacity={capacity} {where}",
            )
            return
    if launch.disaggregation_mode == "prefill" or launch.disable_decode_graphs:
        return
    per_request = 1
    if launch.speculative_algorithm and launch.speculative_algorithm.upper() != "NONE":
        state.cannot_check(f"DeepEP v2's decode CUDA graph budget with speculative decoding's draft tokens {where}")
        return
    rows = state.max_running_requests
    if rows is None or max(1, rows // max(1, lay.attn_dp_size)) * per_request > capacity:
        state.cannot_check(
            f"DeepEP v2's largest decode CUDA graph (SGLang's decode batch ladder) against "
            f"SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK={capacity} {where}"
        )


def _flashinfer_a2a_topology(state: _Resolution) -> None:
    """moe_hook.py, handle_a2a_moe (_flashinfer_a2a_topology_is_supported): the flashinfer
    all-to-all backend needs attention DP over the whole TP group (--attn-dp-size equal to
    --tp-size), except Muse Spark's prefill sequence parallelism (named when it may apply)."""
    lay, facts = state.launch.layout, state.model
    if lay.attn_dp_size > 1 and lay.attn_dp_size == lay.tp:
        return
    if facts is None or facts.arch == "MuseSparkForConditionalGeneration":
        state.cannot_check(
            "--moe-a2a-backend flashinfer: Muse Spark's TP4/EP4 and TP8/EP8 exception to attention DP over the whole "
            "TP group (srt/arg_groups/moe_hook.py, handle_a2a_moe)"
        )
        return
    _refuse(
        state,
        "Flashinfer MoE A2A requires --attn-dp-size equal to --tp-size (srt/arg_groups/moe_hook.py, handle_a2a_moe)",
    )


def _deepseek_family_overrides(launch: PrefillLaunch) -> PrefillLaunch:
    """model_overrides/deepseek_v2.py, _deepseek_family_overrides (declared for the DeepSeek
    family, applied by the time model_hook.py's handle_model_specific_adjustments runs: the
    prefill graph rules before it saw the launch as given): an MLA DeepSeek-family model (not a
    DeepSeek sparse attention one) with --enable-prefill-cp runs its data-parallel groups as
    attention DP (context_parallel_attn_dp_size), attention context parallelism over the rest
    of the TP group, DeepEP all-to-all and a dense-MoE TP of 1."""
    facts, lay = launch.model, launch.layout
    if facts is None or not launch.enable_prefill_cp or not facts.mla or facts.dsa:
        return launch
    if not set(facts.architectures[:1]) & set(DEEPSEEK_FAMILY_ARCHS):
        return launch
    attn_dp = lay.attn_dp_size * lay.replica_dp_size
    layout = replace(
        lay,
        attn_dp=attn_dp,
        dp=1,
        enable_dp_attention=False,
        moe_a2a_backend="deepep",
        moe_dense_tp_size=1,
        attn_cp_size=max(1, lay.tp // max(1, attn_dp)),
    )
    return replace(launch, layout=layout)


def _post_process_refusals(state: _Resolution) -> None:
    """Checks SGLang runs after its pipeline that refuse a launch: overrides.py,
    _mla_kv_cache_dtype_checks (trtllm_mla attention only on Blackwell GPUs) and
    srt/layers/moe/utils.py, initialize_moe_config (single-batch overlap refused on SM90
    CUDA GPUs)."""
    launch = state.launch
    cap = launch.gpu_capability
    cuda = launch.platform == "cuda"
    attn, _ = _resolved_attention_backend(state)
    if "trtllm_mla" in (attn, launch.decode_attention_backend):
        if not cuda:
            _refuse(
                state,
                "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x) (srt/arg_groups/overrides.py, "
                "_mla_kv_cache_dtype_checks)",
            )
        elif cap is None:
            state.cannot_check("trtllm_mla attention is refused on GPUs other than Blackwell (the GPU is unknown)")
        elif cap[0] not in BLACKWELL_CAPABILITY_MAJORS:
            _refuse(
                state,
                "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x) (srt/arg_groups/overrides.py, "
                "_mla_kv_cache_dtype_checks)",
            )
    if launch.single_batch_overlap and cuda:
        if cap is None:
            state.cannot_check("--enable-single-batch-overlap is refused on SM90 GPUs (the GPU is unknown)")
        elif cap[0] == 9:
            _refuse(
                state,
                "SBO (single batch overlap) is not supported on SM90 GPUs with latest sgl-deep-gemm wheel "
                "(srt/layers/moe/utils.py, initialize_moe_config)",
            )


def _handle_speculative_decoding(state: _Resolution) -> None:
    """speculative_hook.py, handle_speculative_decoding: --max-running-requests defaults to
    48 under speculative decoding (its other settings are named as not checked)."""
    spec = state.launch.speculative_algorithm
    if spec and spec.upper() != "NONE" and state.max_running_requests is None:
        state.max_running_requests = SPECULATIVE_MAX_RUNNING_REQUESTS


def _handle_dllm_inference(state: _Resolution) -> None:
    """dllm_hook.py, handle_dllm_inference: diffusion LLM inference runs without CUDA
    graphs on AMD GPUs."""
    if state.launch.dllm_algorithm and state.launch.platform == "rocm" and state.backend != "disabled":
        state.disable("SGLang turns CUDA graphs off for diffusion LLM inference on AMD GPUs")


def _handle_other_validations(state: _Resolution) -> None:
    """serving_hook.py, handle_other_validations: tensor dump mode
    (--debug-tensor-dump-output-folder) turns CUDA graphs off."""
    if state.launch.debug_tensor_dump and state.backend != "disabled":
        state.disable("SGLang turns CUDA graphs off in tensor dump mode (--debug-tensor-dump-output-folder)")


def _capture_limit(state: _Resolution) -> tuple[int | None, str]:
    """model_executor/model_runner_components/cuda_graph_setup.py, capture_prefill_graph:
    the largest bucket capture can represent, request rows x the context length, and how it
    was found. Request rows: the request pool (mem_cache/kv_cache_configurator.py,
    resolve_max_num_reqs: --max-running-requests per attention-DP rank, which the KV
    cache's capacity can lower further at start-up), and for full graphs also the JSON
    config's full_prefill_max_req or max(chunk // 512, 1). None when it cannot be bounded."""
    launch, facts = state.launch, state.model
    ctx = launch.context_length if launch.context_length is not None else (facts.context_len if facts else None)
    mrr = state.max_running_requests
    pool = max(1, mrr // max(1, launch.layout.attn_dp_size)) if mrr is not None else None
    rows, why = (pool, "the request pool") if pool is not None else (MAX_DEFAULT_REQUEST_POOL, "the largest default request pool")
    if state.backend == "full":
        full_rows = launch.full_prefill_max_req or max(state.chunk_size // FULL_PREFILL_TOKENS_PER_REQUEST_ROW, 1)
        if full_rows < rows:
            rows, why = full_rows, "full graphs' request rows"
    if ctx is None:
        return None, why
    return rows * ctx, f"{why} ({rows}) x the context length ({ctx})"


def _capture_filter(state: _Resolution, listed: list[int]) -> list[int]:
    """Buckets above the capture limit are dropped before alignment; the rest is said."""
    limit, how = _capture_limit(state)
    mrr_given = state.max_running_requests is not None
    if limit is None:
        if state.model is None:
            state.arch_unchecked("buckets above request rows x its context length are not captured")
        return listed
    kept = [b for b in listed if b <= limit]
    if len(kept) < len(listed):
        state.notes.append(
            f"capture drops {len(listed) - len(kept)} buckets above {limit} tokens: {how}"
            + ("; a smaller KV cache, known at start-up, can lower the request pool further" if mrr_given else "")
        )
    return kept


def _final_capture(state: _Resolution) -> PrefillCapture:
    """prefill_cuda_graph_runner.py, get_prefill_num_tokens_to_capture (the list, or the
    ladder, each bucket aligned) and cuda_graph_setup.py, capture_prefill_graph (buckets
    above the capture limit dropped first; an empty list captures nothing, so SGLang
    disables prefill graphs)."""
    layout = replace(state.launch.layout, moe_a2a_backend=state.a2a)
    align = layout_alignment(layout)
    max_bs, chunk = state.ladder_max, state.chunk_size
    listed = _ladder_or_empty(max_bs) if state.buckets is None else list(state.buckets)
    captured: tuple[int, ...] = ()
    if state.refused is not None:
        state.disable(f"SGLang refuses this launch: {state.refused}")
    elif state.backend != "disabled" and not listed:
        why = (
            f"chunked prefill is off (--chunked-prefill-size {state.launch.chunked_prefill_size})"
            if chunk < 1
            else f"the ladder's maximum {max_bs} is below its first bucket"
        )
        state.disable(f"no bucket to capture: {why}; SGLang disables prefill CUDA graphs")
    elif state.backend != "disabled":
        kept = _capture_filter(state, listed)
        if not kept:
            state.disable("no bucket fits the capture limit (request rows x context length): SGLang captures nothing")
        else:
            captured = tuple(align_buckets(sorted(kept), align))
    return PrefillCapture(
        backend=state.backend,
        reason=state.reason,
        buckets=None if state.buckets is None else tuple(state.buckets),
        max_bs=max_bs,
        alignment=align,
        captured=captured,
        chunked_prefill_size=chunk,
        notes=tuple(state.notes),
        unchecked=state.all_unchecked(),
        refused=state.refused,
    )


def _handle_context_parallelism(state: _Resolution) -> None:
    """parallel_hook.py, handle_context_parallelism: with --enable-prefill-cp, SGLang refuses
    prefill context parallelism on ROCm (HIP) for any model but DeepSeek-V4, zigzag for
    DeepSeek V3.2, any strategy but zigzag for MiMo V2, and a launch without --cp-strategy
    (in that order)."""
    launch, facts = state.launch, state.model
    if not launch.enable_prefill_cp:
        return
    where = "(srt/arg_groups/parallel_hook.py, handle_context_parallelism)"
    arch = facts.arch if facts is not None else None
    if facts is None:
        state.arch_unchecked("prefill context parallelism is refused for some models (parallel_hook.py)")
    elif launch.platform == "rocm" and arch != HIP_PREFILL_CP_ARCH:
        _refuse(state, f"Prefill CP on HIP (ROCm) is only supported for {HIP_PREFILL_CP_ARCH}, got {arch!r} {where}")
    elif arch == "DeepseekV32ForCausalLM" and launch.cp_strategy == "zigzag":
        _refuse(state, f"DeepSeek V3.2 prefill CP does not support --cp-strategy zigzag {where}")
    elif arch in ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM") and launch.cp_strategy != "zigzag":
        _refuse(state, f"MiMo V2 prefill CP only supports --cp-strategy zigzag {where}")
    if launch.cp_strategy is None:
        _refuse(state, f"--cp-strategy must be set when --enable-prefill-cp is enabled {where}")


def _apply_prefill_cp_default(state: _Resolution) -> None:
    """cuda_graph_hook.py, apply_prefill_cp_cuda_graph_default (with --enable-prefill-cp,
    after the attention backend resolved): a prefill context parallelism that supports
    breakable graphs gets them unless the backend was chosen, and SGLang's compatibility,
    disaggregation and DeepEP rules run again on them."""
    if not state.launch.enable_prefill_cp or state.locked_backend or state.refused is not None:
        return
    rule = "cuda_graph_hook.py, apply_prefill_cp_cuda_graph_default"
    if _cp_supported(state, rule):
        state.backend, state.reason = "breakable", "breakable: SGLang's default for this prefill context parallelism"
        _apply_cuda_graph_compatibility(state)
        _apply_cuda_graph_disaggregation_roles(state)
        _apply_deepep_adjustments(state)


# The steps of SGLang's resolution pipeline this model follows, in SGLang's order
# (arg_groups/pipeline.py, run_resolution_pipeline; the cuda_graph_hook steps up to
# apply_cuda_graph_disaggregation_roles run inside its handle_cuda_graph_config, after
# parse_cuda_graph_config), each with the SGLang function it mirrors.
PIPELINE_STEPS: tuple[tuple[str, Callable[[_Resolution], None]], ...] = (
    ("cuda_graph_hook.apply_cuda_graph_compatibility", _apply_cuda_graph_compatibility),
    ("cuda_graph_hook.apply_deepep_adjustments", _apply_deepep_adjustments),
    ("cuda_graph_hook.apply_cuda_graph_disaggregation_roles", _apply_cuda_graph_disaggregation_roles),
    ("memory_hook.handle_gpu_memory_settings", _handle_gpu_memory_settings),
    ("model_hook.handle_model_specific_adjustments", _handle_model_specific_adjustments),
    ("attention_hook.handle_attention_backend_compatibility", _handle_attention_backend_compatibility),
    ("cuda_graph_hook.disable_prefill_cuda_graph_for_deepseek_trtllm_mla", _disable_for_deepseek_trtllm_mla),
    ("attention_hook.handle_multi_item_scoring", _handle_multi_item_scoring),
    ("parallel_hook.handle_data_parallelism", _handle_data_parallelism),
    ("parallel_hook.handle_context_parallelism", _handle_context_parallelism),
    ("cuda_graph_hook.apply_prefill_cp_cuda_graph_default", _apply_prefill_cp_default),
    ("kv_shard_hook.handle_kv_cache_sharding", _handle_kv_cache_sharding),
    ("moe_hook.handle_a2a_moe", _handle_a2a_moe),
    ("speculative_hook.handle_speculative_decoding", _handle_speculative_decoding),
    ("dllm_hook.handle_dllm_inference", _handle_dllm_inference),
    ("serving_hook.handle_other_validations", _handle_other_validations),
    ("moe_hook.validate_deepep_v2_speculative_draft", _validate_deepep_v2_speculative_draft),
    ("moe_hook.validate_deepep_v2_dispatch_token_budget", _validate_deepep_v2_dispatch_token_budget),
)


def resolve_prefill_capture(launch: PrefillLaunch) -> PrefillCapture:
    """SGLang 0.5.23's prefill capture for a launch, following its resolution pipeline
    (arg_groups/pipeline.py) step by step: parse_cuda_graph_config, then PIPELINE_STEPS,
    then the capture and its filter. Every rule this model cannot evaluate for this launch
    (the model's config not on this machine, a flag in FLAG_RULES, a model-specific
    setting) is named in the answer's `unchecked`."""
    state = _parse_cuda_graph_config(launch)
    for _mirrors, step in PIPELINE_STEPS:
        step(state)
    _post_process_refusals(state)
    return _final_capture(state)
