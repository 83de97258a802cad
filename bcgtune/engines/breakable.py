"""Prefill engine with breakable CUDA graphs: SGLang's default prefill runner on CUDA
(`--cuda-graph-backend-prefill breakable`), in torch.

How SGLang 0.5.23 runs it, and what this engine copies:
  * runner_backend/breakable_cuda_graph_backend.py: per bucket, two warm-up forwards, then
    one capture of the transformer body (not the LM head: the logits tail runs eagerly
    after replay, runner/prefill_cuda_graph_runner.py) into one shared pool, largest
    bucket first; the body's output is copied into one output buffer shared by every
    bucket.
  * layers/radix_attention.py (`_eager_attention`, an `eager_on_graph` break): attention
    runs eagerly between segment replays on the real rows only (`q[:n]`), writes them
    into a buffer the segment allocated, and zeroes the padded rows after them.
  * The break reads the batch (its requests' lengths) when it runs: the metadata of each
    batch (cu_seqlens on the device, the longest request on the host) is prepared before
    replay, so nothing reads a device tensor on the host inside the forward (a sync per
    layer distorts timings several-fold on small batches).
Attention: flash attention's varlen kernel (`torch.ops.aten._flash_attention_forward`,
cu_seqlens) where it runs (CUDA, bf16/fp16), else one causal SDPA call per request; eager
and replay run the same function, so they run the same attention kernels.

Capture machinery: SGLang's own BreakableCUDAGraph / BreakableCUDAGraphCapture /
eager_on_graph when its module imports, else bcgtune's implementation of the same
semantics (engines/segmented.py); `graph_impl` in reports says which.

Runs through `torch.cuda`, so NVIDIA CUDA and AMD ROCm (HIP) builds alike; the ROCm path is
untested (no AMD GPU was available to the project). Without a GPU the engine runs the same
static-buffer forward eagerly on the padded bucket (mode "padded-eager"), attention on the
real rows, so capture/validate/calibrate logic runs on CPU.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR
from bcgtune.engines.attention import varlen_attention
from bcgtune.engines.base import CaptureRecord, StaticPrefillEngine
from bcgtune.engines.choices import FaultName
from bcgtune.engines.inputs import PrefillInputs
from bcgtune.engines.sdpa import sdpa_context
from bcgtune.errors import InputError

RUNNER_NAME = "breakable"


@dataclass
class BatchMeta:
    """What the attention breaks read for the batch in flight (prepared before replay)."""

    n: int  # real tokens
    lengths: tuple[int, ...]  # tokens of each request
    spans: tuple[tuple[int, int], ...]  # each request's rows [start, end)
    max_len: int
    cu_seqlens: torch.Tensor | None  # int32 [r + 1] on the device (flash varlen)
    last_rows: torch.Tensor  # long [r]: each request's last row (the logits tail)


def _config_int(cfg: Any, names: tuple[str, ...], default: int) -> int:
    """The first of `names` the model config sets (built-in or Hugging Face spelling)."""
    for name in names:
        value = getattr(cfg, name, None)
        if value:
            return int(value)
    return default


def flash_varlen_works(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Does aten's flash-attention varlen kernel run here for these shapes (GQA included)?"""
    if device.type != "cuda":
        return False
    try:
        q = torch.randn(8, heads, head_dim, device=device, dtype=dtype)
        k = torch.randn(8, kv_heads, head_dim, device=device, dtype=dtype)
        cu = torch.tensor([0, 3, 8], device=device, dtype=torch.int32)
        torch.ops.aten._flash_attention_forward(q, k, k, cu, cu, 5, 5, 0.0, True, False)
        torch.cuda.synchronize(device)
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _probe_attention(model: Any, device: torch.device, dtype: torch.dtype) -> str:
    """An engine made without a session's probe (tests, benchmarks): the session's probe on
    the model's own attention shape."""
    cfg = getattr(model, "cfg", None)
    dims = getattr(model, "dims", None)
    heads = dims.heads if dims is not None else _config_int(cfg, ("num_heads", "num_attention_heads"), 1)
    kv = dims.kv_heads if dims is not None else _config_int(cfg, ("num_kv_heads", "num_key_value_heads"), heads)
    hd = _config_int(cfg, ("head_dim",), model.hidden_size // heads)
    return "flash-varlen" if flash_varlen_works(device, dtype, heads, kv, hd) else "sdpa-per-request"


class BreakablePrefillEngine(StaticPrefillEngine):
    runner = RUNNER_NAME

    def __init__(
        self,
        model,
        device: torch.device,
        max_tokens: int,
        sdpa_backend: str = "auto",
        warmup: int = 2,
        padding_factor: float = DEFAULT_PADDING_FACTOR,
        graph_impl: Any = "auto",
        fault: FaultName = "none",
        attention_kind: str | None = None,
    ):
        """`graph_impl` and `attention_kind`: what the session's probes answered
        (engines/build.py); probed here only for an engine made without a session."""
        from bcgtune.engines.segmented import GraphImpl, resolve_impl

        if not hasattr(model, "body"):
            raise InputError("the breakable runner needs a model with a separate body and logits tail")
        super().__init__(model, device, max_tokens, sdpa_backend, warmup, padding_factor, fault)
        self.mode = "breakable-cuda-graph" if self.graphs_enabled else "padded-eager"
        if not self.graphs_enabled:
            self.impl = None
        else:
            self.impl = graph_impl if isinstance(graph_impl, GraphImpl) else resolve_impl(graph_impl)
        # One capture stream for every bucket: the caching allocator reuses a pool's freed
        # blocks only on the stream that allocated them, so a stream per capture would give
        # each graph memory of its own (SGLang captures a whole session on one stream).
        self.capture_stream = torch.cuda.Stream(device) if self.graphs_enabled else None
        self.meta: BatchMeta | None = None
        self._skip_breaks = False
        self.attention_kind = attention_kind or _probe_attention(model, device, self.dtype)
        with torch.no_grad():
            # one output buffer for every bucket, as SGLang's breakable backend keeps
            self.s_out = torch.zeros(self.max_tokens, model.hidden_size, dtype=self.dtype, device=device)
        eager_on_graph = self.impl.eager_on_graph if self.impl is not None else (lambda fn: fn)
        self._attention_break = eager_on_graph(self._attention_body)

    @property
    def graph_impl(self) -> str:
        return self.impl.name if self.impl is not None else "none (padded-eager)"

    # ---- the break ------------------------------------------------------------------
    def _attention_body(self, q, k, v, out, scale=None):
        """Attention of the batch in flight on its real rows; padded rows of `out` zeroed
        (radix_attention.py `_eager_attention`)."""
        m = self.meta
        if self._skip_breaks or m is None:  # segments-only timing without graphs
            out.zero_()
            return
        n = m.n
        if self.attention_kind == "flash-varlen":
            o = torch.ops.aten._flash_attention_forward(
                q[:n], k[:n], v[:n], m.cu_seqlens, m.cu_seqlens, m.max_len, m.max_len, 0.0, True, False, scale=scale
            )[0]
            out[:n].copy_(o)
        else:
            rep = q.shape[1] // k.shape[1]
            with sdpa_context(self.sdpa_backend):
                for s, e in m.spans:
                    qs, ks, vs = (z[s:e].transpose(0, 1).unsqueeze(0) for z in (q, k, v))
                    if rep > 1:
                        ks, vs = ks.repeat_interleave(rep, dim=1), vs.repeat_interleave(rep, dim=1)
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
                    out[s:e].copy_(o[0].transpose(0, 1))
        if out.shape[0] > n:
            out[n:].zero_()
        return

    def _attend(self, q, k, v, scale=None):
        out = torch.empty_like(q)  # allocated by the segment before the break, as SGLang does
        self._attention_break(q, k, v, out, scale)
        return out

    # ---- metadata -------------------------------------------------------------------
    def _device_tensor(self, values, dtype) -> torch.Tensor:
        host = torch.tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host

    def prepare(self, lengths: tuple[int, ...]) -> BatchMeta:
        """Host-side metadata of a batch, copied to the device without a host sync."""
        cu = [0]
        for length in lengths:
            cu.append(cu[-1] + int(length))
        spans = tuple(itertools.pairwise(cu))
        cu_dev = self._device_tensor(cu, torch.int32) if self.attention_kind == "flash-varlen" else None
        last = self._device_tensor([e - 1 for e in cu[1:]], torch.long)
        return BatchMeta(cu[-1], tuple(int(x) for x in lengths), spans, max(lengths), cu_dev, last)

    # ---- helpers --------------------------------------------------------------------
    def attention(self):
        return varlen_attention(self._attend)

    def _body(self, b: int):
        with self.padding_bound():
            hidden = self.model.body(*self.static_inputs(b))
        self.s_out[:b].copy_(hidden)
        return hidden

    def _tail(self, hidden: torch.Tensor) -> torch.Tensor:
        """The eager logits tail: each request's last row through the LM head."""
        assert self.meta is not None  # set by eager / replay before the forward
        return self.model.logits(hidden.index_select(0, self.meta.last_rows))

    # ---- eager ----------------------------------------------------------------------
    @torch.no_grad()
    def eager(self, x: PrefillInputs):
        """(hidden [n, H], logits of each request's last row [r, V])."""
        self.meta = self.prepare(x.lengths)
        with self.attention():
            hidden = self.model.body(x.inp, x.positions, x.deepstack)
        return hidden, self._tail(hidden)

    # ---- capture --------------------------------------------------------------------
    def _prepare_capture(self, b: int) -> None:
        self.meta = self.prepare((b,))

    def _capture_one(self, b: int, rec: CaptureRecord, record_attention: bool) -> None:
        """Warm-up forwards on the capture stream, then one breakable graph of the body
        (breaks at every attention). Padded-eager (no GPU): the bucket's segments run once,
        breaks skipped: what a graph of it would hold, at its shapes. Nothing is there to
        warm up, and the attention over the whole bucket that a capture runs once eagerly
        (its cost grows with the square of the bucket) would measure nothing on a CPU; every
        replay runs attention on the real rows of its batch."""
        if not self.graphs_enabled:
            self.graphs[b] = None
            self._segments_alone(b)
            return
        side, impl = self.capture_stream, self.impl
        assert side is not None and impl is not None  # both exist where graphs are enabled
        with self.attention():
            self._warm_up_on(side, self._body, b)
            t1 = time.perf_counter()
            graph = impl.new_graph()
            with impl.capture(graph, self.pool, side):
                self._body(b)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.sync()
            rec.record_s = time.perf_counter() - t1
            self.graphs[b] = graph

    def segment_count(self, bucket: int) -> int:
        g = self.graphs.get(bucket)
        return len(self.impl.segments(g)) if g is not None and self.impl is not None else 0

    def release(self) -> None:
        self.meta = None
        super().release()

    # ---- replay ---------------------------------------------------------------------
    def _run(self, b: int) -> None:
        if self.graphs_enabled:
            self.graphs[b].replay()
        else:
            with self.attention():
                self._body(b)

    def _replay_filled(self, x: PrefillInputs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [n, H], logits of each request's last row [r, V]); hidden is a view of the
        shared output buffer, valid until the next replay."""
        self.meta = self.prepare(x.lengths)
        self._run(b)
        hidden = self.s_out[: x.n]
        return hidden, self._tail(hidden)

    @torch.no_grad()
    def replay_segments(self, bucket: int) -> None:
        """The bucket's captured segments alone, breaks skipped (what the bucket costs
        whatever the batch): graph replays on a GPU, the padded forward without attention
        in padded-eager mode."""
        if bucket not in self.graphs:
            raise InputError(f"bucket {bucket} is not captured")
        if self.impl is not None:  # graphs enabled
            for seg in self.impl.segments(self.graphs[bucket]):
                seg.replay()
        else:
            self._segments_alone(bucket)

    def _segments_alone(self, bucket: int) -> None:
        """The padded forward of `bucket` on the static buffers, attention breaks skipped."""
        self._skip_breaks = True
        try:
            with self.attention():
                self._body(bucket)
        finally:
            self._skip_breaks = False
