"""Whole-forward prefill CUDA graphs in torch: SGLang's `full` prefill backend
(`--cuda-graph-backend-prefill full`) with one request slot. The breakable runner, SGLang's
default on CUDA, is engines/breakable.py.

* One graph per token bucket, all in one shared memory pool
  (`torch.cuda.graph_pool_handle()`), captured largest bucket first so later, smaller graphs
  reuse the pool the first one sized.
* Static input buffers sized for the largest bucket, allocated once before capture; every
  graph reads a prefix slice of them.
* Warm-up (eager runs on a side stream) before each capture.
* Padded replay copies a batch's real inputs into the static buffers, zero-fills the padding
  (token 0 / zero embeddings, position 0), writes the last real row's index into a 1-element
  buffer and replays. Padding sits at the end of the one causal sequence, so no real token
  attends to a pad: `check_pad_invariance` verifies it bit for bit.
* The SDPA backend is pinned (`torch.nn.attention.sdpa_kernel`) around eager runs, warm-up
  and capture alike, and every SDPA call's arguments and chosen backend are recorded in both
  phases: a graph whose attention calls differ from eager's is flagged, not timed blindly.

Runs through `torch.cuda`, so CUDA and ROCm (HIP) builds alike; on a machine without a GPU
"capture" records nothing and "replay" runs the same padded static-buffer path eagerly
(mode "padded-eager"), so the comparison logic is testable on CPU.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from bcgtune.core.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.errors import InputError

GIB = float(2**30)

SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math", "none")


# ---------------------------------------------------------------------------------------
# SDPA: pinning and recording
# ---------------------------------------------------------------------------------------
def sdpa_context(name: str, device: torch.device):
    """Context pinning SDPA to one backend. 'auto': flash on a GPU, math on CPU.
    'none': no pin (torch picks per call, as a plain transformers model does)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in SDPA_BACKENDS:
        raise InputError(f"unknown SDPA backend {name!r} ({', '.join(SDPA_BACKENDS)})", "--sdpa-backend")
    if name == "none":
        return contextlib.nullcontext()
    if name == "auto":
        name = "flash" if device.type == "cuda" else "math"
    table = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([table[name]])


def resolved_sdpa_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flash" if device.type == "cuda" else "math"
    return name


_BACKEND_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


class SdpaRecorder:
    """Records each scaled_dot_product_attention call's signature: mask kind, is_causal,
    GQA, shapes and the backend torch would choose under the current flags. Patches
    torch.nn.functional for the duration (models look the function up at call time)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._orig = None

    def __enter__(self):
        self._orig = F.scaled_dot_product_attention
        orig = self._orig
        calls = self.calls

        def recorded(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            choice = None
            try:
                if query.is_cuda:
                    choice = _BACKEND_NAMES.get(
                        int(
                            torch._fused_sdp_choice(
                                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
                            )
                        ),
                        "?",
                    )
            except Exception:
                choice = "?"
            mask = None if attn_mask is None else f"{str(attn_mask.dtype).replace('torch.', '')}{list(attn_mask.shape)}"
            calls.append(
                (
                    "mask=" + (mask or "none"),
                    f"is_causal={bool(is_causal)}",
                    f"enable_gqa={bool(enable_gqa)}",
                    f"q_heads={query.shape[-3]}",
                    f"kv_heads={key.shape[-3]}",
                    f"backend={choice}",
                )
            )
            return orig(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )

        F.scaled_dot_product_attention = recorded
        torch.nn.functional.scaled_dot_product_attention = recorded
        return self

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = self._orig
        torch.nn.functional.scaled_dot_product_attention = self._orig
        return False

    def summary(self) -> list[str]:
        """Distinct call signatures with counts, shape-free (masks differ by size only)."""
        out: dict[str, int] = {}
        for c in self.calls:
            key = " ".join(x if not x.startswith("mask=") or x == "mask=none" else x.split("[")[0] for x in c)
            out[key] = out.get(key, 0) + 1
        return [f"{k} x{v}" for k, v in sorted(out.items())]


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------
@dataclass
class PrefillInputs:
    inp: torch.Tensor  # ids [n] (long) or embeds [n, H]
    positions: torch.Tensor  # [n] or [3, n] (long); restart at 0 for each request
    kind: str = "text"  # "text" | "image:<px>"
    visual_tokens: int = 0
    seq_lens: tuple[int, ...] | None = None  # tokens of each request, in order; None: one request

    @property
    def n(self) -> int:
        return int(self.inp.shape[0])

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.seq_lens if self.seq_lens is not None else (self.n,)

    @property
    def requests(self) -> int:
        return len(self.lengths)


def split_tokens(n: int, requests: int, how: str = "even", seed: int = 0) -> tuple[int, ...]:
    """n tokens as `requests` requests of at least one token each: as evenly as possible
    (a prefill batch of similar prompts), or a seeded random composition ("random")."""
    if not 1 <= requests <= n:
        raise InputError(f"a batch of {n} tokens cannot hold {requests} requests")
    if how == "even":
        q, rem = divmod(n, requests)
        return tuple(q + 1 if i < rem else q for i in range(requests))
    if how != "random":
        raise InputError(f"unknown split {how!r} (even or random)")
    rng = np.random.default_rng([seed, n, requests])
    cuts = np.sort(rng.choice(np.arange(1, n), size=requests - 1, replace=False)) if requests > 1 else np.array([], int)
    return tuple(int(x) for x in np.diff(np.concatenate([[0], cuts, [n]])))


def _rng(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def text_inputs(model, n: int, device, seed: int = 0, requests: int = 1, split: str = "even") -> PrefillInputs:
    """n random text tokens (ids, or their embeddings for an embeds-input model) from
    `requests` requests (split_tokens), positions counted from 0 in each request."""
    if n < 1:
        raise InputError(f"token count must be positive, got {n}")
    vocab = model.vocab_size
    ids = torch.randint(0, min(vocab, 150000), (n,), generator=_rng(seed)).to(device)
    lens = split_tokens(n, requests, split, seed)
    pos = torch.cat([torch.arange(length) for length in lens]).to(device)
    seq_lens = lens if requests > 1 else None
    if getattr(model, "input_kind", "ids") == "embeds":
        with torch.no_grad():
            inp = model.embed(ids)
        return PrefillInputs(inp, pos.expand(3, -1).contiguous(), seq_lens=seq_lens)
    return PrefillInputs(ids, pos, seq_lens=seq_lens)


def image_inputs(model, n: int, image_px: int, device, seed: int = 0) -> PrefillInputs | None:
    """A Qwen-VL-style prefill of n tokens: text, <vision_start>, the visual tokens of one
    image_px x image_px image, <vision_end>, text. The vision stub encodes the patches and the
    visual tokens replace the image placeholders in the text embeddings, eagerly, outside any
    graph; the graph sees only input_embeds + 3-axis positions. None if n cannot hold it."""
    from bcgtune.engines.models import image_token_count, mrope_positions

    vc = model.cfg.vision
    if vc is None:
        raise InputError("image inputs need a VL model (e.g. --model qwen3-vl-8b)")
    gh, gw = model.visual.grid(image_px, image_px)
    vis = image_token_count(model, image_px, image_px)
    if n < vis + 3:
        return None
    g = _rng(seed)
    n_before = max(1, (n - vis - 2) // 3)
    n_after = n - vis - 2 - n_before
    text = torch.randint(0, min(model.vocab_size, vc.image_token_id), (n,), generator=g)
    ids = text.clone()
    ids[n_before] = vc.vision_start_id
    ids[n_before + 1 : n_before + 1 + vis] = vc.image_token_id
    ids[n_before + 1 + vis] = vc.vision_end_id
    ids = ids.to(device)
    unit = vc.patch_size * vc.merge_size
    pixels = torch.rand((vc.in_channels, gh * unit, gw * unit), generator=g).to(
        device=device, dtype=model.embed_tokens.weight.dtype
    )
    with torch.no_grad():
        embeds = model.embed(ids)
        visual = model.visual(pixels)
        mask = (ids == vc.image_token_id).unsqueeze(-1)
        embeds = embeds.masked_scatter(mask, visual.to(embeds.dtype))
    pos = mrope_positions(n_before + 1, (gh, gw), n_after + 1).to(device)
    return PrefillInputs(embeds, pos, kind=f"image:{image_px}", visual_tokens=vis)


# ---------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------
@dataclass
class CaptureRecord:
    bucket: int
    ok: bool
    capture_s: float = 0.0  # warm-up + capture, what SGLang's "elapsed" covers
    record_s: float = 0.0  # the capture itself
    pool_growth_gib: float | None = None  # reserved memory still held after empty_cache
    error: str | None = None
    attention_eager: list[str] = field(default_factory=list)
    attention_capture: list[str] = field(default_factory=list)

    @property
    def attention_match(self) -> bool:
        return self.attention_eager == self.attention_capture

    def to_dict(self) -> dict:
        return {
            "bucket": self.bucket,
            "ok": self.ok,
            "capture_s": round(self.capture_s, 4),
            "record_s": round(self.record_s, 4),
            "pool_growth_gib": None if self.pool_growth_gib is None else round(self.pool_growth_gib, 4),
            "error": self.error,
            "attention_match": self.attention_match,
            "attention_eager": self.attention_eager,
            "attention_capture": self.attention_capture,
        }


class StaticPrefillEngine:
    """What both prefill runners share (SGLang's breakable and full backends): static input
    buffers sized for the largest bucket, of which every graph reads a prefix; one memory
    pool filled largest bucket first; SGLang's replay rule over the captured buckets; the
    capture loop's bookkeeping (a record per bucket, a failure kept and the next bucket
    tried, the pool's growth); padded replay and timing. A runner supplies how one bucket is
    captured (`_capture_one`), what capture needs beside the neutral inputs
    (`_prepare_capture`), and how a filled bucket runs (`_replay_filled`)."""

    runner = ""
    mode = ""

    def __init__(self, model, device: torch.device, max_tokens: int, sdpa_backend: str, warmup: int, padding_factor: float):
        if max_tokens < 1:
            raise InputError(f"max tokens must be positive, got {max_tokens}")
        self.model = model
        self.device = device
        self.sdpa_backend = sdpa_backend
        self.graphs_enabled = device.type == "cuda"
        self.warmup = max(0, int(warmup))
        self.padding_factor = padding_factor
        self.max_tokens = int(max_tokens)
        self.graphs: dict[int, object] = {}
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

    # ---- helpers ------------------------------------------------------------------
    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _fill(self, x: PrefillInputs, b: int) -> None:
        """The batch's real inputs into the static buffers, the padding up to b zeroed
        (token 0 / zero embeddings, position 0)."""
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

    # ---- capture ------------------------------------------------------------------
    def _capture_order(self, buckets) -> list[int]:
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

    def _warm_up_on(self, side, forward, b: int, recorder=None) -> None:
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
    def capture(self, buckets, record_attention: bool = True, on_record=None) -> list[CaptureRecord]:
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
            before = self._reserved()
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
                rec.pool_growth_gib = self._reserved() - before
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        return records

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
    def replay(self, x: PrefillInputs, bucket: int | None = None):
        """Padded replay: (hidden [n, H], logits of each request's last row [r, V], bucket).
        The outputs are views of graph memory, valid until the next replay."""
        b = self._check_bucket(x.n, bucket)
        self._fill(x, b)
        hidden, logits = self._replay_filled(x, b)
        return hidden, logits, b

    # ---- timing -------------------------------------------------------------------
    def _time(self, fn, warmup: int, repeats: int) -> dict:
        return time_calls(fn, self.device, warmup, repeats)

    def eager_call(self, x: PrefillInputs):
        """A no-argument call running one eager forward of batch x, as every timing of
        eager time (time_eager, calibrate, the replay benchmark) runs it."""
        return functools.partial(self.eager, x)

    @torch.no_grad()
    def time_eager(self, x: PrefillInputs, warmup: int = 2, repeats: int = 10) -> dict:
        return self._time(self.eager_call(x), warmup, repeats)

    @torch.no_grad()
    def time_replay(self, x: PrefillInputs, bucket: int | None = None, warmup: int = 2, repeats: int = 10) -> dict:
        b = self._check_bucket(x.n, bucket)
        return self._time(lambda: self.replay(x, b), warmup, repeats)


class PrefillGraphEngine(StaticPrefillEngine):
    """SGLang's `full` prefill backend with one request slot: one whole-forward graph per
    bucket, the last real row's index in a 1-element buffer the graph reads."""

    runner = "full"
    graph_impl = "torch.cuda.CUDAGraph, whole forward"

    def __init__(
        self,
        model,
        device: torch.device,
        max_tokens: int,
        sdpa_backend: str = "auto",
        warmup: int = 1,
        padding_factor: float = DEFAULT_PADDING_FACTOR,
    ):
        super().__init__(model, device, max_tokens, sdpa_backend, warmup, padding_factor)
        self.mode = "cuda-graph" if self.graphs_enabled else "padded-eager"
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad():
            self.s_last = torch.zeros(1, dtype=torch.long, device=device)

    def attention(self):
        return sdpa_context(self.sdpa_backend, self.device)

    def _fwd(self, b: int):
        return self.model(self.s_inp[:b], self.s_pos[..., :b], self.s_last)

    def _fill(self, x: PrefillInputs, b: int) -> None:
        super()._fill(x, b)
        self.s_last.fill_(x.n - 1)

    # ---- eager --------------------------------------------------------------------
    @torch.no_grad()
    def eager(self, x: PrefillInputs):
        last = torch.tensor([x.n - 1], device=self.device)
        with self.attention():
            return self.model(x.inp, x.positions, last)

    # ---- capture ------------------------------------------------------------------
    def _prepare_capture(self, b: int) -> None:
        self.s_last.fill_(b - 1)

    def _capture_one(self, b: int, rec: CaptureRecord, record_attention: bool) -> None:
        """Warm-up on a side stream, then one graph of the whole forward; every SDPA call
        recorded in both phases when `record_attention`."""
        eager_rec = SdpaRecorder() if record_attention else contextlib.nullcontext()
        with self.attention():
            if self.graphs_enabled:
                self._warm_up_on(torch.cuda.Stream(self.device), self._fwd, b, eager_rec)
                t1 = time.perf_counter()
                graph = torch.cuda.CUDAGraph()
                cap_rec = SdpaRecorder() if record_attention else contextlib.nullcontext()
                with cap_rec, torch.cuda.graph(graph, pool=self.pool):
                    out = self._fwd(b)
                self.sync()
                rec.record_s = time.perf_counter() - t1
                self.graphs[b] = graph
                self.outputs[b] = out
            else:
                with eager_rec:
                    for _ in range(max(1, self.warmup)):
                        self._fwd(b)
                cap_rec = SdpaRecorder() if record_attention else contextlib.nullcontext()
                with cap_rec:  # padded-eager: the "graph" is the same forward
                    self._fwd(b)
                self.graphs[b] = None
        if record_attention:
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
    def eager_call(self, x: PrefillInputs):
        """One eager forward of the model (its last row's logits), the last-row index
        copied to the device once, here, not inside the timed call."""
        last = torch.tensor([x.n - 1], device=self.device)

        @torch.no_grad()
        def call():
            with self.attention():
                return self.model(x.inp, x.positions, last)

        return call


def time_calls(fn, device: torch.device, warmup: int, repeats: int) -> dict:
    """Median, p10 and p90 (ms) of `repeats` back-to-back calls after `warmup` untimed ones:
    CUDA events on a GPU (host-side launch gaps included when the GPU waits for them),
    perf_counter on CPU. Python's garbage collector is paused for the timed calls: a
    launch-bound forward is Python work, and a collection inside one is noise, not cost."""
    for _ in range(max(0, warmup)):
        fn()
    with _gc_paused():
        return _timed(fn, device, repeats)


@contextlib.contextmanager
def _gc_paused():
    """Python's garbage collector off while timing (and back on after, if it was on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_interleaved(
    groups, device: torch.device, warmup: int, repeats: int, seed: int = 0, on_round=None
) -> list[list[list[float]]]:
    """Times (ms) of every call in `groups`, measured in rounds: each round runs every group
    once, the groups in a fresh shuffled order, the calls of a group back to back (a pair
    such as segments-alone and the full replay of the same bucket lands in the same moment
    of the GPU's clock and power state, so their difference is free of drift). `warmup`
    untimed rounds first; `on_round(done, total)` after each round, warm-up included.
    Returns times[group][call][round]. CUDA events on a GPU; perf_counter
    on CPU. Python's garbage collector is paused while timing, as in `time_calls`.

    Each call starts on an idle GPU (a synchronization before it, none inside it), as a
    server's prefill step does (its scheduler waits for every step's output): the time is
    then the call's own, host launch gaps included. Without it a launch-bound call that
    follows queued work hides its launches behind that work and measures shorter, by how
    much depending on its neighbour (seen on the H200: eager forwards of a 0.6B-shaped model
    16% shorter between graph replays than between other eager forwards).

    Measuring every size in rounds instead of in blocks (all repeats of one size, then the
    next) gives every size the same mix of GPU states: on a long run a block measured while
    the GPU is cool or warm shifts that size alone, which no later average undoes."""
    import random

    with torch.no_grad():
        return _interleaved(groups, device, warmup, repeats, random.Random(seed), on_round or (lambda done, total: None))


def _interleaved(groups, device: torch.device, warmup: int, repeats: int, rng, on_round) -> list[list[list[float]]]:
    order = list(range(len(groups)))
    total = max(0, warmup) + repeats
    for w in range(max(0, warmup)):
        rng.shuffle(order)
        for g in order:
            for fn in groups[g]:
                fn()
        on_round(w + 1, total)
    out: list[list[list[float]]] = [[[] for _ in grp] for grp in groups]
    cuda = device.type == "cuda"
    with _gc_paused():
        for rnd in range(repeats):
            rng.shuffle(order)
            if cuda:
                stream = torch.cuda.current_stream(device)
                marks = []
                for g in order:
                    for i, fn in enumerate(groups[g]):
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        torch.cuda.synchronize(device)  # between calls, never inside one
                        s.record(stream)
                        fn()
                        e.record(stream)
                        marks.append((g, i, s, e))
                torch.cuda.synchronize(device)
                for g, i, s, e in marks:
                    out[g][i].append(s.elapsed_time(e))
            else:
                for g in order:
                    for i, fn in enumerate(groups[g]):
                        t0 = time.perf_counter()
                        fn()
                        out[g][i].append((time.perf_counter() - t0) * 1e3)
            on_round(max(0, warmup) + rnd + 1, total)
    return out


def summarize_ms(times) -> dict:
    """Median, p10 and p90 (ms) of a list of times, as `time_calls` reports them."""
    times = sorted(float(t) for t in times)

    def q(p):
        return times[min(len(times) - 1, int(p * (len(times) - 1) + 0.5))]

    return {"median_ms": statistics.median(times), "p10_ms": q(0.1), "p90_ms": q(0.9), "repeats": len(times)}


def _timed(fn, device: torch.device, repeats: int) -> dict:
    times = []
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        torch.cuda.synchronize(device)
        for s, e in evs:
            s.record(stream)
            fn()
            e.record(stream)
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in evs]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return summarize_ms(times)


# ---------------------------------------------------------------------------------------
# comparisons (validate)
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def compare_logits(
    model,
    hidden_ref: torch.Tensor,
    hidden_test: torch.Tensor,
    last_ref: torch.Tensor,
    last_test: torch.Tensor,
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
    chunk: int = 512,
) -> dict:
    """Every real token's logits, test vs reference (eager). A top-1 flip or a logprob change
    of the reference's top-1 counts as a failure only where the reference's top-1/top-2
    logit gap exceeds `gap_threshold` (vLLM #55944: below ~0.7 flips are bf16 noise)."""
    n = hidden_ref.shape[0]
    agree = 0
    max_abs = 0.0
    max_lp = 0.0
    wide = flips_wide = lp_fail = flips_narrow = 0
    for i in range(0, n, chunk):
        lr = model.logits(hidden_ref[i : i + chunk]).float()
        lt = model.logits(hidden_test[i : i + chunk]).float()
        max_abs = max(max_abs, float((lr - lt).abs().max()))
        top2 = lr.topk(2, dim=-1)
        t1 = top2.indices[:, 0]
        gap = top2.values[:, 0] - top2.values[:, 1]
        # tie-robust: bf16-derived logits often tie at the top, and argmax/topk may then
        # name different indices for identical rows
        same = lt.gather(1, t1[:, None])[:, 0] >= lt.max(-1).values
        agree += int(same.sum())
        lpr = torch.log_softmax(lr, -1).gather(1, t1[:, None])[:, 0]
        lpt = torch.log_softmax(lt, -1).gather(1, t1[:, None])[:, 0]
        dlp = (lpr - lpt).abs()
        max_lp = max(max_lp, float(dlp.max()))
        w = gap > gap_threshold
        wide += int(w.sum())
        flips_wide += int((w & ~same).sum())
        flips_narrow += int((~w & ~same).sum())
        lp_fail += int((w & (dlp > max_logprob_delta)).sum())
    last_diff = float((last_ref.float() - last_test.float()).abs().max())
    return {
        "tokens": n,
        "top1_agree": agree / n if n else 1.0,
        "max_abs_diff": max_abs,
        "max_logprob_delta": max_lp,
        "wide_gap_tokens": wide,
        "wide_gap_flips": flips_wide,
        "wide_gap_logprob_failures": lp_fail,
        "narrow_gap_flips": flips_narrow,
        "last_logits_max_abs_diff": last_diff,
        "ok": flips_wide == 0 and lp_fail == 0 and bool(torch.isfinite(last_test.float()).all()),
    }


@torch.no_grad()
def compare_batch(
    model,
    hidden_ref,
    hidden_test,
    last_ref,
    last_test,
    lengths,
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
) -> dict:
    """compare_logits per request of a batch (rows split by `lengths`, one last-token logits
    row each), summed up: the whole batch's figures plus which requests differ at all
    (any hidden or last-logit difference), which fail the thresholds, and whether the
    batch is bit for bit."""
    agg = {
        "tokens": 0,
        "top1_agree": 0.0,
        "max_abs_diff": 0.0,
        "max_logprob_delta": 0.0,
        "wide_gap_tokens": 0,
        "wide_gap_flips": 0,
        "wide_gap_logprob_failures": 0,
        "narrow_gap_flips": 0,
        "last_logits_max_abs_diff": 0.0,
    }
    differ, fail = [], []
    max_hidden = 0.0
    start = 0
    for i, length in enumerate(lengths):
        end = start + int(length)
        c = compare_logits(
            model,
            hidden_ref[start:end],
            hidden_test[start:end],
            last_ref[i : i + 1],
            last_test[i : i + 1],
            gap_threshold,
            max_logprob_delta,
        )
        dh = float((hidden_ref[start:end].float() - hidden_test[start:end].float()).abs().max())
        max_hidden = max(max_hidden, dh)
        if dh > 0 or c["last_logits_max_abs_diff"] > 0 or c["max_abs_diff"] > 0:
            differ.append(i)
        if not c["ok"]:
            fail.append(i)
        agg["tokens"] += c["tokens"]
        agg["top1_agree"] += c["top1_agree"] * c["tokens"]
        for k in ("max_abs_diff", "max_logprob_delta", "last_logits_max_abs_diff"):
            agg[k] = max(agg[k], c[k])
        for k in ("wide_gap_tokens", "wide_gap_flips", "wide_gap_logprob_failures", "narrow_gap_flips"):
            agg[k] += c[k]
        start = end
    agg["top1_agree"] = agg["top1_agree"] / agg["tokens"] if agg["tokens"] else 1.0
    agg.update(
        requests=len(lengths),
        lengths=[int(x) for x in lengths],
        hidden_max_abs_diff=max_hidden,
        bitwise=max_hidden == 0.0 and agg["last_logits_max_abs_diff"] == 0.0,
        differing_requests=differ,
        failing_requests=fail,
        ok=not fail,
    )
    return agg


@torch.no_grad()
def check_pad_invariance(engine: StaticPrefillEngine, x: PrefillInputs, bucket: int, seed: int = 1) -> dict:
    """Replay the same batch twice, padding zeros then random garbage: every real row must
    be bit-identical (no real token reads a padded row). Either runner. Returns {"ok",
    "max_abs_diff"}."""
    h0, l0, _ = engine.replay(x, bucket)
    h0, l0 = h0.clone(), l0.clone()
    n = x.n
    g = _rng(seed)
    engine._fill(x, bucket)
    if n < bucket:
        if engine.s_inp.dtype == torch.long:
            junk = torch.randint(0, min(engine.model.vocab_size, 150000), (bucket - n,), generator=g)
        else:
            junk = torch.randn((bucket - n, engine.s_inp.shape[1]), generator=g)
        engine.s_inp[n:bucket].copy_(junk.to(engine.s_inp.dtype))
        engine.s_pos[..., n:bucket].copy_(torch.randint(0, 4 * bucket, (bucket - n,), generator=g))
    h1, l1 = engine._replay_filled(x, bucket)
    diff = max(float((h0 - h1).abs().max()), float((l0 - l1).abs().max()))
    return {"ok": diff == 0.0, "max_abs_diff": diff}


def dynamo_counters() -> dict:
    """Snapshot of torch._dynamo's frame/recompile counters (0s when nothing is compiled)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {"unique_graphs": 0, "recompiles": 0}
    stats = counters.get("stats", {})
    recompiles = sum(counters.get("recompiles", {}).values()) if "recompiles" in counters else 0
    return {"unique_graphs": int(stats.get("unique_graphs", 0)), "recompiles": int(recompiles)}
