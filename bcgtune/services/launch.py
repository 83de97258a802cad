"""What SGLang will capture for a launch: the one answer every command prices with.

Today the answer is bcgtune's model of SGLang's resolution pipeline
(bcgtune.core.ladder.resolve_prefill_capture); its docstring lists the rules the model
cannot check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bcgtune.core.ladder import PrefillCapture, resolve_prefill_capture


def capture_for_flags(
    flags: Mapping[str, Any],
    *,
    platform: str = "cuda",
    buckets: list[int] | tuple[int, ...] | None = None,
    model_path: str = "",
    gpu_memory_gib: float | None = None,
) -> PrefillCapture:
    """The prefill graphs SGLang captures for a launch given as flags (a profile's [server]
    table, or the layout flags of suggest-buckets), with the profile's bucket list."""
    from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags

    launch = prefill_launch_from_server_flags(
        flags, platform=platform, buckets=buckets, model_path=model_path, gpu_memory_gib=gpu_memory_gib
    )
    return resolve_prefill_capture(launch)
