"""Whole-forward prefill CUDA graphs in torch: SGLang's `full` prefill backend
(`--cuda-graph-backend-prefill full`) with one request slot. The breakable runner, SGLang's
default on CUDA, is engines/breakable.py; what both share is engines/base.py.

* Warm-up (eager runs on a side stream) before each capture.
* Padded replay writes the last real row's index into a 1-element buffer the graph reads.
  Padding sits at the end of the one causal sequence, so no real token attends to a pad:
  `check_pad_invariance` (engines/compare.py) verifies it bit for bit.
* The SDPA backend is pinned (engines/sdpa.py) around eager runs, warm-up and capture alike,
  and every SDPA call's arguments and chosen backend are recorded in both phases: a graph
  whose attention calls differ from eager's is flagged, not timed blindly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR
from bcgtune.engines.base import CaptureRecord, StaticPrefillEngine
from bcgtune.engines.choices import FaultName
from bcgtune.engines.inputs import PrefillInputs
from bcgtune.engines.sdpa import SdpaRecorder, maybe, sdpa_context


class FullPrefillEngine(StaticPrefillEngine):
    """SGLang's `full` prefill backend with one request slot: one whole-forward graph per
    bucket, the last real row's index in a 1-element buffer the graph reads."""

    runner = "full"

    def __init__(
        self,
        model: Any,
        device: torch.device,
        max_tokens: int,
        sdpa_backend: str = "auto",
        warmup: int = 1,
        padding_factor: float = DEFAULT_PADDING_FACTOR,
        fault: FaultName = "none",
    ):
        super().__init__(model, device, max_tokens, sdpa_backend, warmup, padding_factor, fault)
        self.mode = "cuda-graph" if self.graphs_enabled else "padded-eager"
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad():
            self.s_last = torch.zeros(1, dtype=torch.long, device=device)

    @property
    def graph_impl(self) -> str:
        return "torch.cuda.CUDAGraph, whole forward"

    def attention(self) -> contextlib.AbstractContextManager[Any]:
        return sdpa_context(self.sdpa_backend)

    def _fwd(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        inp, pos, deepstack = self.static_inputs(b)
        with self.padding_bound():
            return self.model(inp, pos, self.s_last, deepstack)

    def _fill(self, x: PrefillInputs, b: int) -> None:
        super()._fill(x, b)
        self.s_last.fill_(x.n - 1)

    # ---- eager --------------------------------------------------------------------
    @torch.no_grad()
    def eager(self, x: PrefillInputs) -> tuple[torch.Tensor, torch.Tensor]:
        last = torch.tensor([x.n - 1], device=self.device)
        with self.attention():
            return self.model(x.inp, x.positions, last, x.deepstack)

    # ---- capture ------------------------------------------------------------------
    def _prepare_capture(self, b: int) -> None:
        self.s_last.fill_(b - 1)

    def _capture_one(self, b: int, rec: CaptureRecord, record_attention: bool) -> None:
        """Warm-up on a side stream, then one graph of the whole forward; every SDPA call
        recorded in both phases when `record_attention`."""
        eager_rec = SdpaRecorder() if record_attention else None
        cap_rec = SdpaRecorder() if record_attention else None
        with self.attention():
            if self.graphs_enabled:
                self._warm_up_on(torch.cuda.Stream(self.device), self._fwd, b, eager_rec)
                t1 = time.perf_counter()
                graph = torch.cuda.CUDAGraph()
                with maybe(cap_rec), torch.cuda.graph(graph, pool=self.pool):
                    out = self._fwd(b)
                self.sync()
                rec.record_s = time.perf_counter() - t1
                self.graphs[b] = graph
                self.outputs[b] = out
            else:
                with maybe(eager_rec):
                    for _ in range(max(1, self.warmup)):
                        self._fwd(b)
                with maybe(cap_rec):  # padded-eager: the "graph" is the same forward
                    self._fwd(b)
                self.graphs[b] = None
        if eager_rec is not None and cap_rec is not None:
            rec.attention_eager = eager_rec.summary()
            rec.attention_capture = cap_rec.summary()

    def release(self) -> None:
        self.outputs.clear()
        super().release()

    # ---- replay -------------------------------------------------------------------
    def _replay_filled(self, x: PrefillInputs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [n, H], last_logits [1, V]): views of graph memory on a GPU."""
        if self.graphs_enabled:
            self.graphs[b].replay()
            hidden, logits = self.outputs[b]
        else:
            with self.attention():
                hidden, logits = self._fwd(b)
        return hidden[: x.n], logits

    # ---- timing -------------------------------------------------------------------
    @torch.no_grad()
    def eager_call(self, x: PrefillInputs) -> Callable[[], object]:
        """One eager forward of the model (its last row's logits), the last-row index
        copied to the device once, here, not inside the timed call."""
        last = torch.tensor([x.n - 1], device=self.device)

        @torch.no_grad()
        def call() -> object:
            with self.attention():
                return self.model(x.inp, x.positions, last, x.deepstack)

        return call
