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

import gc
import itertools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.engines.attention import varlen_attention
from bcgtune.engines.torch_graphs import GIB, CaptureRecord, PrefillInputs, sdpa_context
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


def _flash_varlen_works(device: torch.device, dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
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


class BreakablePrefillEngine:
    runner = RUNNER_NAME

    def __init__(
        self,
        model,
        device: torch.device,
        max_tokens: int,
        sdpa_backend: str = "auto",
        warmup: int = 2,
        padding_factor: float = DEFAULT_PADDING_FACTOR,
        graph_impl: str = "auto",
    ):
        from bcgtune.engines.segmented import GraphImpl, resolve_impl

        if max_tokens < 1:
            raise InputError(f"max tokens must be positive, got {max_tokens}")
        if not hasattr(model, "body"):
            raise InputError("the breakable runner needs a model with a separate body and logits tail")
        self.model = model
        self.device = device
        self.sdpa_backend = sdpa_backend
        self.graphs_enabled = device.type == "cuda"
        self.mode = "breakable-cuda-graph" if self.graphs_enabled else "padded-eager"
        if not self.graphs_enabled:
            self.impl = None
        else:
            self.impl = graph_impl if isinstance(graph_impl, GraphImpl) else resolve_impl(graph_impl)
        self.warmup = max(0, int(warmup))
        self.padding_factor = padding_factor
        self.max_tokens = int(max_tokens)
        self.graphs: dict[int, object] = {}
        self.capture_count = 0
        self.pool = torch.cuda.graph_pool_handle() if self.graphs_enabled else None
        # One capture stream for every bucket: the caching allocator reuses a pool's freed
        # blocks only on the stream that allocated them, so a stream per capture would give
        # each graph memory of its own (SGLang captures a whole session on one stream).
        self.capture_stream = torch.cuda.Stream(device) if self.graphs_enabled else None
        self.meta: BatchMeta | None = None
        self._skip_breaks = False
        kind = getattr(model, "input_kind", "ids")
        mrope = kind == "embeds" and getattr(getattr(model, "cfg", None), "vision", None) is not None
        dtype = next(model.parameters()).dtype
        cfg = getattr(model, "cfg", None)
        heads = getattr(cfg, "num_heads", None) or getattr(cfg, "num_attention_heads", 1)
        kv = getattr(cfg, "num_kv_heads", None) or getattr(cfg, "num_key_value_heads", None) or heads
        hd = getattr(cfg, "head_dim", None) or model.hidden_size // heads
        self.attention_kind = "flash-varlen" if _flash_varlen_works(device, dtype, heads, kv, hd) else "sdpa-per-request"
        with torch.no_grad():
            if kind == "ids":
                self.s_inp = torch.zeros(self.max_tokens, dtype=torch.long, device=device)
            else:
                self.s_inp = torch.zeros(self.max_tokens, model.hidden_size, dtype=dtype, device=device)
            self.s_pos = torch.zeros((3, self.max_tokens) if mrope else (self.max_tokens,), dtype=torch.long, device=device)
            # one output buffer for every bucket, as SGLang's breakable backend keeps
            self.s_out = torch.zeros(self.max_tokens, model.hidden_size, dtype=dtype, device=device)
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
            with sdpa_context(self.sdpa_backend, self.device):
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
    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def attention(self):
        return varlen_attention(self._attend)

    def _body(self, b: int):
        hidden = self.model.body(self.s_inp[:b], self.s_pos[..., :b])
        self.s_out[:b].copy_(hidden)
        return hidden

    def _fill(self, x: PrefillInputs, b: int) -> None:
        n = x.n
        self.s_inp[:n].copy_(x.inp)
        self.s_inp[n:b].zero_()
        self.s_pos[..., :n].copy_(x.positions)
        self.s_pos[..., n:b].zero_()

    def bucket_for(self, n: int) -> int | None:
        """SGLang's rule over the captured buckets: smallest b >= n, and b <= factor * n."""
        if not self.graphs:
            return None
        chosen, replay = assign_buckets([n], sorted(self.graphs), self.padding_factor)
        return int(chosen[0]) if bool(replay[0]) else None

    def _reserved(self) -> float:
        if not self.graphs_enabled:
            return 0.0
        self.sync()
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device) / GIB

    def _tail(self, hidden: torch.Tensor) -> torch.Tensor:
        """The eager logits tail: each request's last row through the LM head."""
        return self.model.logits(hidden.index_select(0, self.meta.last_rows))

    # ---- eager ----------------------------------------------------------------------
    @torch.no_grad()
    def eager(self, x: PrefillInputs):
        """(hidden [n, H], logits of each request's last row [r, V])."""
        self.meta = self.prepare(x.lengths)
        with self.attention():
            hidden = self.model.body(x.inp, x.positions)
        return hidden, self._tail(hidden)

    # ---- capture --------------------------------------------------------------------
    @torch.no_grad()
    def capture(self, buckets, record_attention: bool = True, on_record=None) -> list[CaptureRecord]:
        """Capture one breakable graph per bucket, largest first, into the shared pool. A
        failure is recorded with torch's message and the next bucket is tried."""
        bl = sorted({int(b) for b in buckets}, reverse=True)
        if not bl:
            raise InputError("no buckets to capture")
        if bl[0] > self.max_tokens:
            raise InputError(f"bucket {bl[0]} exceeds the engine's static buffers ({self.max_tokens} tokens)")
        if bl[-1] < 1:
            raise InputError(f"bucket {bl[-1]} is not positive")
        records = []
        for b in bl:
            if b in self.graphs:
                continue
            rec = CaptureRecord(bucket=b, ok=False)
            # capture as SGLang does: one request slot holding the whole bucket
            self.s_inp[:b].zero_()
            self.s_pos[..., :b].copy_(torch.arange(b, device=self.device))
            self.meta = self.prepare((b,))
            before = self._reserved()
            t0 = time.perf_counter()
            try:
                with self.attention():
                    if self.graphs_enabled:
                        side = self.capture_stream
                        side.wait_stream(torch.cuda.current_stream(self.device))
                        with torch.cuda.stream(side):
                            for _ in range(max(1, self.warmup)):
                                self._body(b)
                        torch.cuda.current_stream(self.device).wait_stream(side)
                        self.sync()
                        t1 = time.perf_counter()
                        graph = self.impl.new_graph()
                        with self.impl.capture(graph, self.pool, side):
                            self._body(b)
                        torch.cuda.current_stream(self.device).wait_stream(side)
                        self.sync()
                        rec.record_s = time.perf_counter() - t1
                        self.graphs[b] = graph
                    else:
                        for _ in range(max(1, self.warmup)):
                            self._body(b)
                        self.graphs[b] = None
                rec.ok = True
                self.capture_count += 1
            except torch.cuda.OutOfMemoryError as exc:
                rec.error = "out of memory: " + str(exc).splitlines()[0]
            except RuntimeError as exc:
                rec.error = " ".join(str(exc).split())[:500]
            rec.capture_s = time.perf_counter() - t0
            if self.graphs_enabled:
                rec.pool_growth_gib = self._reserved() - before
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        return records

    def segment_count(self, bucket: int) -> int:
        g = self.graphs.get(bucket)
        return len(self.impl.segments(g)) if g is not None and self.impl is not None else 0

    def release(self) -> None:
        """Drop every graph and the pool (memory goes back to the caching allocator)."""
        self.graphs.clear()
        self.meta = None
        self.pool = torch.cuda.graph_pool_handle() if self.graphs_enabled else None
        gc.collect()
        if self.graphs_enabled:
            torch.cuda.empty_cache()

    # ---- replay ---------------------------------------------------------------------
    def _check_bucket(self, n: int, bucket: int | None) -> int:
        b = bucket if bucket is not None else self.bucket_for(n)
        if b is None or b not in self.graphs:
            raise InputError(f"no captured bucket replays {n} tokens (buckets {sorted(self.graphs)})")
        if n > b:
            raise InputError(f"{n} tokens do not fit bucket {b}")
        return b

    def _run(self, b: int) -> None:
        if self.graphs_enabled:
            self.graphs[b].replay()
        else:
            with self.attention():
                self._body(b)

    @torch.no_grad()
    def replay(self, x: PrefillInputs, bucket: int | None = None):
        """Padded replay: (hidden [n, H], logits of each request's last row [r, V], bucket).
        hidden is a view of the shared output buffer, valid until the next replay."""
        b = self._check_bucket(x.n, bucket)
        self._fill(x, b)
        self.meta = self.prepare(x.lengths)
        self._run(b)
        hidden = self.s_out[: x.n]
        return hidden, self._tail(hidden), b

    @torch.no_grad()
    def replay_segments(self, bucket: int) -> None:
        """The bucket's captured segments alone, breaks skipped (what the bucket costs
        whatever the batch): graph replays on a GPU, the padded forward without attention
        in padded-eager mode."""
        if bucket not in self.graphs:
            raise InputError(f"bucket {bucket} is not captured")
        if self.graphs_enabled:
            for seg in self.impl.segments(self.graphs[bucket]):
                seg.replay()
        else:
            self._skip_breaks = True
            try:
                with self.attention():
                    self._body(bucket)
            finally:
                self._skip_breaks = False

    # ---- timing ---------------------------------------------------------------------
    def _time(self, fn, warmup: int, repeats: int) -> dict:
        from bcgtune.engines.torch_graphs import time_calls

        return time_calls(fn, self.device, warmup, repeats)

    @torch.no_grad()
    def time_eager(self, x: PrefillInputs, warmup: int = 2, repeats: int = 10) -> dict:
        return self._time(lambda: self.eager(x), warmup, repeats)

    @torch.no_grad()
    def time_replay(self, x: PrefillInputs, bucket: int | None = None, warmup: int = 2, repeats: int = 10) -> dict:
        b = self._check_bucket(x.n, bucket)
        return self._time(lambda: self.replay(x, b), warmup, repeats)

    @torch.no_grad()
    def time_segments(self, bucket: int, warmup: int = 2, repeats: int = 10) -> dict:
        return self._time(lambda: self.replay_segments(bucket), warmup, repeats)


@torch.no_grad()
def check_pad_invariance_breakable(engine: BreakablePrefillEngine, x: PrefillInputs, bucket: int, seed: int = 1) -> dict:
    """Replay the same batch twice, padding zeros then random garbage: every real row must
    be bit-identical (no request reads a padded row). Returns {"ok", "max_abs_diff"}."""
    from bcgtune.engines.torch_graphs import _rng

    h0, l0, _ = engine.replay(x, bucket)
    h0, l0 = h0.clone(), l0.clone()
    n = x.n
    engine._fill(x, bucket)
    if n < bucket:
        g = _rng(seed)
        if engine.s_inp.dtype == torch.long:
            junk = torch.randint(0, min(engine.model.vocab_size, 150000), (bucket - n,), generator=g)
        else:
            junk = torch.randn((bucket - n, engine.s_inp.shape[1]), generator=g)
        engine.s_inp[n:bucket].copy_(junk.to(engine.s_inp.dtype))
        engine.s_pos[..., n:bucket].copy_(torch.randint(0, 4 * bucket, (bucket - n,), generator=g))
    engine.meta = engine.prepare(x.lengths)
    engine._run(bucket)
    h1 = engine.s_out[:n]
    l1 = engine._tail(h1)
    diff = max(float((h0 - h1).abs().max()), float((l0 - l1).abs().max()))
    return {"ok": diff == 0.0, "max_abs_diff": diff}
