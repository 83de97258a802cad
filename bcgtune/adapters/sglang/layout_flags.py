"""SGLang's launch flags that change how it aligns and caps the captured prefill buckets,
declared once: each flag's name (snake case, SGLang's `dest`), its type, SGLang 0.5.23's
default (srt/arg_groups/fields/parallel.py, exec_.py), the spellings bcgtune's commands take
and a help line. bcgtune/adapters/sglang/flags.py reads launches with these defaults, and the
command line's layout options are generated from this table (bcgtune/cli/options.py).

Import-light on purpose: the command line builds its options from it before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bcgtune.core.sglang.ladder import PREFILL_BACKENDS


@dataclass(frozen=True)
class LayoutFlag:
    name: str
    kind: type
    default: Any
    spellings: tuple[str, ...]  # command-line spellings, the one shown first first
    help: str
    choices: tuple[str, ...] | None = None  # SGLang's closed set of values, if it has one


LAYOUT_FLAGS: tuple[LayoutFlag, ...] = (
    LayoutFlag("tp_size", int, 1, ("--tp", "--tp-size"), "Tensor parallel size."),
    LayoutFlag("dp_size", int, 1, ("--dp", "--dp-size"), "Data parallel size."),
    LayoutFlag(
        "enable_dp_attention",
        bool,
        False,
        ("--dp-attention", "--enable-dp-attention"),
        "DP attention: --dp ranks of attention data parallelism.",
    ),
    LayoutFlag("attn_dp_size", int, 1, ("--attn-dp-size",), "Attention data parallel size (the newer spelling of DP attention)."),
    LayoutFlag(
        "enable_two_batch_overlap",
        bool,
        False,
        ("--enable-two-batch-overlap", "--two-batch-overlap"),
        "Two-batch overlap (buckets x2).",
    ),
    LayoutFlag("moe_a2a_backend", str, "none", ("--moe-a2a-backend",), "MoE all-to-all backend (none, deepep, mooncake, ...)."),
    LayoutFlag("moe_dense_tp_size", int, None, ("--moe-dense-tp-size",), "Dense-layer TP size under MoE (unset: none)."),
    LayoutFlag("attn_cp_size", int, 1, ("--attn-cp-size",), "Attention context parallel size."),
    LayoutFlag(
        "cuda_graph_backend_prefill",
        str,
        None,
        ("--cuda-graph-backend-prefill",),
        "The prefill graph backend chosen at launch (breakable, full, disabled). Default: SGLang's (breakable on CUDA).",
        PREFILL_BACKENDS,
    ),
)

LAYOUT_DEFAULTS: dict[str, Any] = {f.name: f.default for f in LAYOUT_FLAGS}
