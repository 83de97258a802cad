"""SGLang's default prefill bucket ladder and capture-time alignment, as pure functions.

Must match SGLang exactly (sglang 0.5.23):
  * ladder: srt/arg_groups/cuda_graph_hook.py, generate_prefill_cuda_graph_batch_sizes
  * chunked_prefill_size default by GPU memory: srt/arg_groups/memory_hook.py
  * alignment: srt/utils/common.py, get_cuda_graph_batch_size_alignment
"""

from __future__ import annotations

from dataclasses import dataclass

from bcgtune.errors import InputError


def sglang_default_ladder(max_bs: int) -> list[int]:
    """The default `--cuda-graph-bs-prefill` list SGLang captures for a given max
    (which defaults to chunked_prefill_size)."""
    if max_bs < 1:
        raise InputError(f"ladder max must be positive, got {max_bs}")
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def deepep_breakable_ladder() -> list[int]:
    """DeepEP + breakable with no explicit list: the ladder for max 2048, every bucket
    rounded up to a multiple of 8 (deduplicated)."""
    return sorted({-(-s // 8) * 8 for s in sglang_default_ladder(2048)})


def default_chunked_prefill_size(gpu_mem_gib: float) -> int:
    """memory_hook.py: chunked_prefill_size by GPU memory (GiB)."""
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


@dataclass(frozen=True)
class ParallelLayout:
    """The parts of a launch that change capture-time bucket alignment."""

    tp: int = 1
    dp: int = 1
    enable_dp_attention: bool = False
    two_batch_overlap: bool = False
    moe_a2a_backend: str = "none"
    moe_dense_tp_size: int | None = None
    attn_cp_size: int = 1
    is_hip: bool = False

    @property
    def attn_tp_size(self) -> int:
        # With DP attention, attention TP is tp / dp (srt/layers/dp_attention.py).
        if self.enable_dp_attention:
            if self.dp < 1 or self.tp % self.dp:
                raise InputError(f"--tp-size {self.tp} is not a multiple of --dp-size {self.dp}")
            return self.tp // self.dp
        return self.tp


def layout_alignment(layout: ParallelLayout) -> int:
    """Multiple every captured bucket is rounded up to (get_cuda_graph_batch_size_alignment):
    1 for plain TP/EP; x2 under two-batch overlap; x attn_tp_size when a gathered buffer is
    needed (DP attention, MoE a2a backend != none, moe_dense_tp_size set); x attn_cp_size
    with context parallel (not on HIP)."""
    align = 1
    if layout.two_batch_overlap:
        align *= 2
    gathered = layout.enable_dp_attention or layout.moe_a2a_backend not in ("", "none", None) or (
        layout.moe_dense_tp_size is not None
    )
    if gathered:
        align *= max(1, layout.attn_tp_size)
    if layout.attn_cp_size > 1 and not layout.is_hip:
        align *= layout.attn_cp_size
    return align


def align_buckets(buckets: list[int], align: int) -> list[int]:
    """What SGLang captures for a given list: each bucket rounded up to `align`, deduped."""
    return sorted({-(-int(b) // align) * align for b in buckets})
