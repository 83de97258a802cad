"""SGLang's default prefill bucket ladder and capture-time alignment, as pure functions
(what a whole launch captures: bcgtune.core.sglang.capture).

Must match SGLang exactly (sglang 0.5.23):
  * ladder: srt/arg_groups/cuda_graph_hook.py, generate_prefill_cuda_graph_batch_sizes
  * chunked_prefill_size default by GPU memory: srt/arg_groups/memory_hook.py
  * alignment: srt/utils/common.py, get_cuda_graph_batch_size_alignment (+ require_gathered_buffer)
  * attention widths: srt/runtime_context.py (derive_attn_tp_size), arg_groups/parallel_hook.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


# Prefill graph backends SGLang accepts (model_executor/cuda_graph_config.py,
# ALLOWED_BACKENDS_PER_PHASE); "disabled" captures nothing.
PREFILL_BACKENDS = ("breakable", "full", "disabled")
PrefillBackend = Literal["breakable", "full", "disabled"]

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
