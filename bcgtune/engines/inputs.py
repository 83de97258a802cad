"""The batches the engines run: token ids (or merged text+image embeddings) of one or several
requests, with their positions, built from seeded random tokens so runs reproduce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from bcgtune.errors import InputError

Split = Literal["even", "random"]


@dataclass
class PrefillInputs:
    inp: torch.Tensor  # ids [n] (long) or embeds [n, H]
    positions: torch.Tensor  # [n] or [3, n] (long); restart at 0 for each request
    kind: str = "text"  # "text" | "image:<px>"
    visual_tokens: int = 0
    seq_lens: tuple[int, ...] | None = None  # tokens of each request, in order; None: one request
    # Qwen3-VL DeepStack [n, H * deepstack_layers]: zero except on image tokens' rows; None for
    # a text batch (SGLang passes none then: srt/managers/mm_utils.py)
    deepstack: torch.Tensor | None = None

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


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU torch generator seeded with `seed` (inputs are drawn on the CPU, then moved)."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def text_inputs(model: Any, n: int, device, seed: int = 0, requests: int = 1, split: str = "even") -> PrefillInputs:
    """n random text tokens (ids, or their embeddings for an embeds-input model) from
    `requests` requests (split_tokens), positions counted from 0 in each request."""
    if n < 1:
        raise InputError(f"token count must be positive, got {n}")
    vocab = model.vocab_size
    ids = torch.randint(0, min(vocab, 150000), (n,), generator=seeded_generator(seed)).to(device)
    lens = split_tokens(n, requests, split, seed)
    pos = torch.cat([torch.arange(length) for length in lens]).to(device)
    seq_lens = lens if requests > 1 else None
    if getattr(model, "input_kind", "ids") == "embeds":
        with torch.no_grad():
            inp = model.embed(ids)
        return PrefillInputs(inp, pos.expand(3, -1).contiguous(), seq_lens=seq_lens)
    return PrefillInputs(ids, pos, seq_lens=seq_lens)


def image_inputs(model: Any, n: int, image_px: int, device, seed: int = 0) -> PrefillInputs | None:
    """A Qwen-VL-style prefill of n tokens: text, <vision_start>, the visual tokens of one
    image_px x image_px image, <vision_end>, text. The vision stub encodes the patches and the
    visual tokens replace the image placeholders in the text embeddings, eagerly, outside any
    graph; the graph sees input_embeds, 3-axis positions and, for a model with DeepStack, the
    per-layer visual embeddings: zero on every row but the image tokens', as SGLang's
    embed_mm_inputs builds them (srt/managers/mm_utils.py). None if n cannot hold it."""
    from bcgtune.engines.models import image_token_count, mrope_positions

    vc = model.cfg.vision
    if vc is None:
        raise InputError("image inputs need a VL model (e.g. --model qwen3-vl-8b)")
    gh, gw = model.visual.grid(image_px, image_px)
    vis = image_token_count(model, image_px, image_px)
    if n < vis + 3:
        return None
    g = seeded_generator(seed)
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
    h = model.hidden_size
    with torch.no_grad():
        # placeholder ids beyond the vocabulary are clamped before the lookup, as SGLang's
        # embed_mm_inputs does: their rows are replaced by the visual tokens anyway
        embeds = model.embed(ids.clamp(0, model.vocab_size - 1))
        visual = model.visual(pixels).to(embeds.dtype)  # [vis, H * (1 + deepstack)]
        mask = (ids == vc.image_token_id).unsqueeze(-1)
        embeds = embeds.masked_scatter(mask, visual[:, :h])
        deepstack = None
        if model.deepstack_layers:
            deepstack = torch.zeros((n, h * model.deepstack_layers), dtype=embeds.dtype, device=embeds.device)
            deepstack = deepstack.masked_scatter(mask, visual[:, h:])
    pos = mrope_positions(n_before + 1, (gh, gw), n_after + 1).to(device)
    return PrefillInputs(embeds, pos, kind=f"image:{image_px}", visual_tokens=vis, deepstack=deepstack)
