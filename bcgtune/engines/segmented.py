"""Segmented CUDA-graph capture with eager break points: the semantics of SGLang's
BreakableCUDAGraph, BreakableCUDAGraphCapture and eager_on_graph
(srt/model_executor/runner_backend_utils/breakable_cuda_graph/breakable_cuda_graph.py,
sglang 0.5.23), and the loader that prefers SGLang's own classes where they import.

What the semantics are (and what this file reimplements, for machines where SGLang's module
does not import, e.g. without its server dependencies or sgl_kernel):
  * a capture is a chain of torch.cuda.CUDAGraph segments, all in one memory pool;
  * a function decorated with `eager_on_graph`, called during capture, ends the current
    segment, runs once eagerly (so its outputs exist at fixed addresses), records a replay
    closure over its arguments and starts a new segment;
  * the closure holds weak references to tensor arguments (storage stays valid because the
    pool lives as long as any segment does), so per-layer intermediates are not kept alive
    per graph and a later, smaller capture reuses the pool's memory;
  * replay = segment 0, break 0, segment 1, break 1, ..., last segment; a break reads the
    batch's state at execution time (the caller's job), never a capture-time copy.
Not reproduced: SGLang's side-stream auto-join (the models here fork no streams during
capture), segment deduplication, and the rank barrier (one GPU).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, get_args

import torch

from bcgtune.engines.choices import GraphImplName

_current: ContextVar[SegmentedCapture | None] = ContextVar("bcgtune_segmented_capture", default=None)


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """A view of `t`'s memory that does not keep it alive (sgl_kernel.weak_ref_tensor's
    behaviour, built on the storage-from-pointer call torch's own CUDA-graph trees use)."""
    st = t.untyped_storage()
    weak = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return torch.empty((0,), dtype=t.dtype, device=t.device).set_(weak, t.storage_offset(), t.size(), t.stride())


def _weak(x):
    if torch.is_tensor(x):
        return x if x.numel() == 0 or x.device.type == "cpu" else weak_ref_tensor(x)
    if isinstance(x, tuple):
        return tuple(_weak(e) for e in x)
    if isinstance(x, list):
        return [_weak(e) for e in x]
    return x


def _copy_output(dst, src):
    if torch.is_tensor(dst) and torch.is_tensor(src):
        dst.copy_(src)
        return dst
    if isinstance(dst, (tuple, list)) and isinstance(src, (tuple, list)) and len(dst) == len(src):
        out = [_copy_output(d, s) for d, s in zip(dst, src)]
        return tuple(out) if isinstance(dst, tuple) else out
    return src


def eager_on_graph(inner: Callable) -> Callable:
    """Mark `inner` as a break point: eager between captured segments, plain call otherwise."""

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        capture = _current.get()
        if capture is None:
            return inner(*args, **kwargs)
        capture.end_segment()
        output = inner(*args, **kwargs)
        w_args = tuple(_weak(a) for a in args)
        w_kwargs = {k: _weak(v) for k, v in kwargs.items()}

        def replay_fn():
            return _copy_output(output, inner(*w_args, **w_kwargs))

        capture.graph.break_fns.append(replay_fn)
        capture.begin_segment()
        return output

    return wrapper


class SegmentedGraph:
    """One torch.cuda.CUDAGraph per segment plus the eager break between consecutive ones."""

    def __init__(self) -> None:
        self.segments: list[torch.cuda.CUDAGraph] = []
        self.break_fns: list[Callable[[], Any]] = []

    def replay(self) -> None:
        for i, seg in enumerate(self.segments):
            seg.replay()
            if i < len(self.break_fns):
                self.break_fns[i]()


class SegmentedCapture:
    """Context manager: capture the enclosed forward as segments of `graph` in `pool`, on
    `stream` (capture cannot run on the default stream)."""

    def __init__(self, graph: SegmentedGraph, pool=None, stream: torch.cuda.Stream | None = None):
        self.graph = graph
        self.pool = pool
        self.stream = stream
        self._stream_ctx: Any = None
        self._token: Token[SegmentedCapture | None] | None = None
        self._seg: torch.cuda.CUDAGraph | None = None

    def __enter__(self):
        if self.stream is not None:
            self._stream_ctx = torch.cuda.stream(self.stream)
            self._stream_ctx.__enter__()
        self._token = _current.set(self)
        self.begin_segment()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.end_segment()
            elif self._seg is not None:  # unwind a failed capture without masking its error
                try:
                    self._seg.capture_end()
                except RuntimeError:
                    pass
                self._seg = None
        finally:
            if self._token is not None:
                _current.reset(self._token)
            if self._stream_ctx is not None:
                self._stream_ctx.__exit__(exc_type, exc, tb)
        return False

    def begin_segment(self) -> None:
        seg = torch.cuda.CUDAGraph()
        seg.capture_begin(pool=self.pool, capture_error_mode="global")
        self._seg = seg

    def end_segment(self) -> None:
        seg = self._seg
        assert seg is not None
        with warnings.catch_warnings():  # back-to-back breaks leave empty segments: no-ops
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            seg.capture_end()
        self.graph.segments.append(seg)
        self._seg = None


# ---------------------------------------------------------------------------------------
# which implementation captures
# ---------------------------------------------------------------------------------------
SGLANG_MODULE = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
IMPLEMENTATIONS: tuple[str, ...] = get_args(GraphImplName)


@dataclass(frozen=True)
class GraphImpl:
    """The capture machinery an engine uses: SGLang's own classes or this module's."""

    name: str  # "sglang" or "bcgtune"
    eager_on_graph: Callable
    new_graph: Callable[[], Any]
    capture: Callable[..., Any]  # capture(graph, pool, stream) -> context manager
    segments: Callable[[Any], list]  # the graph's segment CUDAGraphs, in order
    note: str = ""


def bcgtune_impl(note: str = "") -> GraphImpl:
    return GraphImpl(
        "bcgtune",
        eager_on_graph,
        SegmentedGraph,
        lambda g, pool, stream: SegmentedCapture(g, pool=pool, stream=stream),
        lambda g: g.segments,
        note,
    )


def sglang_impl_from(module, note: str = "") -> GraphImpl:
    """GraphImpl over an imported breakable_cuda_graph module of SGLang."""
    return GraphImpl(
        "sglang",
        module.eager_on_graph,
        module.BreakableCUDAGraph,
        lambda g, pool, stream: module.BreakableCUDAGraphCapture(cuda_graph=g, pool=pool, stream=stream),
        lambda g: g._segments,
        note,
    )


def import_sglang_breakable():
    """SGLang's breakable_cuda_graph module, or (None, why not) in one line."""
    import importlib

    try:
        return importlib.import_module(SGLANG_MODULE), ""
    except Exception as exc:  # noqa: BLE001  (any import-time failure means: not usable here)
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def resolve_impl(choice: str = "auto") -> GraphImpl:
    """auto: SGLang's classes when its module imports, else this module's (same semantics);
    sglang: SGLang's or an error; bcgtune: this module's."""
    from bcgtune.errors import ExternalError, InputError

    if choice not in IMPLEMENTATIONS:
        raise InputError(f"unknown graph implementation {choice!r} ({', '.join(IMPLEMENTATIONS)})")
    if choice == "bcgtune":
        return bcgtune_impl("chosen")
    module, why = import_sglang_breakable()
    if module is not None:
        return sglang_impl_from(module, "SGLang's own classes")
    if choice == "sglang":
        raise ExternalError(f"SGLang's breakable graph module does not import here: {why}")
    return bcgtune_impl(f"SGLang's module does not import ({why})")
