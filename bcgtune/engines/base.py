"""What both prefill runners share (SGLang's breakable and full backends, engines/breakable.py
and engines/full.py).

* One graph per token bucket, all in one shared memory pool
  (`torch.cuda.graph_pool_handle()`), captured largest bucket first so later, smaller graphs
  reuse the pool the first one sized.
* Static input buffers sized for the largest bucket, allocated once before capture; every
  graph reads a prefix slice of them.
* Padded replay copies a batch's real inputs into the static buffers, zero-fills the padding
  (token 0 / zero embeddings, position 0) and runs the bucket's graph.
* Side inputs beside the tokens: a model with DeepStack (Qwen3-VL) gets a static DeepStack
  slot, registered before capture so every graph reads it, and copied at replay with its
  padded tail zeroed; a text batch (no DeepStack) zeroes it, so no previous image's
  contribution leaks into it. That is the fix SGLang's breakable runner needed ("preserve
  Qwen3-VL DeepStack inputs during replay", sglang pull request 33726): in sglang 0.5.23 its
  replay closure copies only `input_embeds` into a static slot
  (srt/model_executor/runner/prefill_cuda_graph_runner.py, `_execute_body_capture`,
  `_fill_input_embeds_slot`), so an image batch replays as if it had no DeepStack.
  `fault` rebuilds that bug on purpose (a negative control for `validate`): "drop-deepstack"
  registers no slot, "stale-deepstack" never zeroes it.
* SGLang's replay rule over the captured buckets (bcgtune.core.sglang.replay).

Runs through `torch.cuda`, so CUDA and ROCm (HIP) builds alike; on a machine without a GPU
"capture" records nothing and "replay" runs the same padded static-buffer path eagerly
(mode "padded-eager"), so the comparison logic is testable on CPU.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from bcgtune.core.sglang.replay import assign_buckets
from bcgtune.engines.choices import FaultName, GraphMode, SideInputName
from bcgtune.engines.inputs import PrefillInputs
from bcgtune.engines.records import CaptureRecord
from bcgtune.engines.timing import TimeSummary, time_calls
from bcgtune.errors import InputError

GIB = float(2**30)

# The inputs a captured forward reads beside its weights, by name, as reports show them.
SIDE_INPUT_LABELS: dict[SideInputName, str] = {
    "input_ids": "input ids",
    "input_embeds": "input embeddings",
    "positions": "positions",
    "mrope_positions": "M-RoPE positions",
    "deepstack": "DeepStack (per-layer visual embeddings)",
}


class StaticPrefillEngine:
    """The shared base of both runners: static input buffers sized for the largest bucket,
    of which every graph reads a prefix; one memory pool filled largest bucket first;
    SGLang's replay rule over the captured buckets; the capture loop's bookkeeping (a record
    per bucket, a failure kept and the next bucket tried, the pool's growth); padded replay
    and timing. A runner supplies how one bucket is captured (`_capture_one`), what capture
    needs beside the neutral inputs (`_prepare_capture`), how a filled bucket runs
    (`_replay_filled`) and its eager forward (`eager`)."""

    runner = ""
    mode: GraphMode = "padded-eager"
    simulated = False  # engines/sim: a simulated device's engine (times from a recorded calibration)

    def __init__(
        self,
        model: Any,
        device: torch.device,
        max_tokens: int,
        sdpa_backend: str,
        warmup: int,
        padding_factor: float,
        fault: FaultName = "none",
    ):
        if max_tokens < 1:
            raise InputError(f"max tokens must be positive, got {max_tokens}")
        self.deepstack_layers = int(getattr(model, "deepstack_layers", 0))
        if fault != "none" and not self.deepstack_layers:
            raise InputError(f"{fault} needs a model with DeepStack (qwen3-vl-tiny, qwen3-vl-8b)", "--inject-fault")
        self.fault = fault
        self.model = model
        self.device = device
        self.sdpa_backend = sdpa_backend
        self.graphs_enabled = device.type == "cuda"
        self.warmup = max(0, int(warmup))
        self.padding_factor = padding_factor
        self.max_tokens = int(max_tokens)
        self.graphs: dict[int, Any] = {}
        self.capture_count = 0
        self.pool = torch.cuda.graph_pool_handle() if self.graphs_enabled else None
        self.dtype = next(model.parameters()).dtype
        kind = getattr(model, "input_kind", "ids")
        mrope = kind == "embeds" and getattr(getattr(model, "cfg", None), "vision", None) is not None
        with torch.no_grad():
            if kind == "ids":
                self.s_inp = torch.zeros(self.max_tokens, dtype=torch.long, device=device)
            else:
                self.s_inp = torch.zeros(self.max_tokens, model.hidden_size, dtype=self.dtype, device=device)
            self.s_pos = torch.zeros((3, self.max_tokens) if mrope else (self.max_tokens,), dtype=torch.long, device=device)
            self.s_deepstack: torch.Tensor | None = None
            if self.deepstack_layers and fault != "drop-deepstack":
                width = model.hidden_size * self.deepstack_layers
                self.s_deepstack = torch.zeros(self.max_tokens, width, dtype=self.dtype, device=device)

    @property
    def graph_impl(self) -> str:
        """The capture machinery, as reports name it."""
        raise NotImplementedError

    # ---- helpers ------------------------------------------------------------------
    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _fill(self, x: PrefillInputs, b: int) -> None:
        """The batch's real inputs into the static buffers, the padding up to b zeroed
        (token 0 / zero embeddings, position 0, no DeepStack); a batch without DeepStack
        zeroes the whole slot."""
        n = x.n
        self.s_inp[:n].copy_(x.inp)
        self.s_inp[n:b].zero_()
        self.s_pos[..., :n].copy_(x.positions)
        self.s_pos[..., n:b].zero_()
        ds = self.s_deepstack
        if ds is not None:
            zero_from = b if self.fault == "stale-deepstack" else 0
            if x.deepstack is not None:
                ds[:n].copy_(x.deepstack)
                zero_from = max(zero_from, n)
            ds[zero_from:b].zero_()

    def static_inputs(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What bucket b's forward reads: (inputs, positions, DeepStack or None), prefixes of
        the static buffers, the same tensors at capture and replay."""
        ds = None if self.s_deepstack is None else self.s_deepstack[:b]
        return self.s_inp[:b], self.s_pos[..., :b], ds

    def side_inputs(self) -> list[SideInputName]:
        """The model's side inputs by name (SIDE_INPUT_LABELS), whether or not this engine
        gives its graphs a slot for each."""
        names: list[SideInputName] = ["input_ids" if self.s_inp.dtype == torch.long else "input_embeds"]
        names.append("mrope_positions" if self.s_pos.dim() == 2 else "positions")
        if self.deepstack_layers:
            names.append("deepstack")
        return names

    def _neutralize(self, name: SideInputName, b: int) -> None:
        """Zero side input `name` in the static buffers up to b (after a fill), so a replay
        shows whether its graph reads it."""
        if name in ("input_ids", "input_embeds"):
            self.s_inp[:b].zero_()
        elif name in ("positions", "mrope_positions"):
            self.s_pos[..., :b].zero_()
        elif name == "deepstack":
            if self.s_deepstack is not None:
                self.s_deepstack[:b].zero_()
        else:
            raise InputError(f"unknown side input {name!r} ({', '.join(SIDE_INPUT_LABELS)})")

    def bucket_for(self, n: int) -> int | None:
        """SGLang's rule over the captured buckets: smallest b >= n, and b <= factor * n."""
        if not self.graphs:
            return None
        chosen, replay = assign_buckets(np.asarray([n]), sorted(self.graphs), self.padding_factor)
        return int(chosen[0]) if bool(replay[0]) else None

    def reserved_gib(self) -> float:
        """GiB the caching allocator still reserves after a collection (0 without a GPU)."""
        if not self.graphs_enabled:
            return 0.0
        self.sync()
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device) / GIB

    # ---- eager --------------------------------------------------------------------
    def eager(self, x: PrefillInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [n, H], logits of each request's last row [r, V]), run eagerly."""
        raise NotImplementedError

    # ---- capture ------------------------------------------------------------------
    def _capture_order(self, buckets: Iterable[int]) -> list[int]:
        bl = sorted({int(b) for b in buckets}, reverse=True)
        if not bl:
            raise InputError("no buckets to capture")
        if bl[0] > self.max_tokens:
            raise InputError(f"bucket {bl[0]} exceeds the engine's static buffers ({self.max_tokens} tokens)")
        if bl[-1] < 1:
            raise InputError(f"bucket {bl[-1]} is not positive")
        return bl

    def _prepare_capture(self, b: int) -> None:
        """What the runner's capture of bucket b reads beside the neutral inputs."""

    def _warm_up_on(self, side: Any, forward: Callable[[int], object], b: int, recorder: Any = None) -> None:
        """Warm-up forwards of bucket b (at least one) on the capture stream `side`, under
        `recorder` when given, then the device idle: what runs before each capture."""
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), recorder if recorder is not None else contextlib.nullcontext():
            for _ in range(max(1, self.warmup)):
                forward(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()

    def _capture_one(self, b: int, rec: CaptureRecord, record_attention: bool) -> None:
        """Warm up and capture bucket b into the pool (padded-eager: run it), storing the
        graph in self.graphs; raises torch's error on failure."""
        raise NotImplementedError

    @torch.no_grad()
    def capture(
        self, buckets: Iterable[int], record_attention: bool = True, on_record: Callable[[CaptureRecord], None] | None = None
    ) -> list[CaptureRecord]:
        """Capture one graph per bucket, largest first, into the shared pool. A failure is
        recorded with torch's message and the next bucket is tried."""
        records = []
        for b in self._capture_order(buckets):
            if b in self.graphs:
                continue
            rec = CaptureRecord(bucket=b, ok=False)
            # neutral static contents, as SGLang captures: one request slot holding the
            # whole bucket, a causal sequence of token 0
            self.s_inp[:b].zero_()
            self.s_pos[..., :b].copy_(torch.arange(b, device=self.device))
            self._prepare_capture(b)
            before = self.reserved_gib()
            t0 = time.perf_counter()
            try:
                self._capture_one(b, rec, record_attention)
                rec.ok = True
                self.capture_count += 1
            except torch.cuda.OutOfMemoryError as exc:
                rec.error = "out of memory: " + str(exc).splitlines()[0]
            except RuntimeError as exc:
                rec.error = " ".join(str(exc).split())[:500]
            rec.capture_s = time.perf_counter() - t0
            if self.graphs_enabled:
                rec.pool_growth_gib = self.reserved_gib() - before
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        return records

    def declare(self, buckets: Iterable[int]) -> None:
        """Without a GPU only (padded-eager): make `buckets` replayable with no capture run,
        their padded forward running at replay. For a caller whose next step runs every
        bucket anyway (a calibration's timed rounds), where a capture run would repeat it."""
        if self.graphs_enabled:
            raise RuntimeError("declare() is for padded-eager engines; capture() the buckets on a GPU")
        for b in self._capture_order(buckets):
            self.graphs.setdefault(b, None)

    def release(self) -> None:
        """Drop every graph and the pool (memory goes back to the caching allocator)."""
        self.graphs.clear()
        self.pool = torch.cuda.graph_pool_handle() if self.graphs_enabled else None
        gc.collect()
        if self.graphs_enabled:
            torch.cuda.empty_cache()

    # ---- replay -------------------------------------------------------------------
    def _check_bucket(self, n: int, bucket: int | None) -> int:
        b = bucket if bucket is not None else self.bucket_for(n)
        if b is None or b not in self.graphs:
            raise InputError(f"no captured bucket replays {n} tokens (buckets {sorted(self.graphs)})")
        if n > b:
            raise InputError(f"{n} tokens do not fit bucket {b}")
        return b

    def _replay_filled(self, x: PrefillInputs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run bucket b on the filled static buffers: (hidden of the real rows, logits)."""
        raise NotImplementedError

    @torch.no_grad()
    def replay(
        self, x: PrefillInputs, bucket: int | None = None, neutral: tuple[SideInputName, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Padded replay: (hidden [n, H], logits of each request's last row [r, V], bucket).
        The outputs are views of graph memory, valid until the next replay. `neutral`: side
        inputs zeroed after the fill (a probe of what the graph reads)."""
        b = self._check_bucket(x.n, bucket)
        self._fill(x, b)
        for name in neutral:
            self._neutralize(name, b)
        hidden, logits = self._replay_filled(x, b)
        return hidden, logits, b

    # ---- timing -------------------------------------------------------------------
    def inputs(self, n: int, seed: int = 0, requests: int = 1) -> PrefillInputs:
        """A seeded text batch of n tokens from `requests` requests, as every timing makes its
        batches (the simulated device's engine makes its own, without torch)."""
        from bcgtune.engines.inputs import text_inputs

        return text_inputs(self.model, n, self.device, seed=seed, requests=requests)

    def replay_call(self, x: PrefillInputs, b: int) -> Callable[[], object]:
        """A no-argument call replaying batch x in bucket b, as every timing of a replay runs it."""
        return functools.partial(self.replay, x, b)

    def eager_call(self, x: PrefillInputs) -> Callable[[], object]:
        """A no-argument call running one eager forward of batch x, as every timing of
        eager time (time_eager, calibrate, the replay benchmark) runs it."""
        return functools.partial(self.eager, x)

    @torch.no_grad()
    def time_eager(self, x: PrefillInputs, warmup: int = 2, repeats: int = 10) -> TimeSummary:
        return time_calls(self.eager_call(x), self.device, warmup, repeats)

    @torch.no_grad()
    def time_replay(self, x: PrefillInputs, bucket: int | None = None, warmup: int = 2, repeats: int = 10) -> TimeSummary:
        b = self._check_bucket(x.n, bucket)
        return time_calls(lambda: self.replay(x, b), self.device, warmup, repeats)
