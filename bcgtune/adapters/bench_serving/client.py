"""bench_serving's requests, drawn as it draws them: prompt and output lengths for a seed,
and the prompt tokens each request carries to the server (text, chat template, images).

Checked against SGLang 0.5.23 source (PyPI wheel): sglang/benchmark/datasets/common.py
`compute_random_lens`:
    np.random.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num)
on numpy's legacy global RNG after `np.random.seed(args.seed)` (benchmark/serving.py,
ImageDataset.load reseeds the same way); input lengths are drawn first, then outputs.
`sample_lengths` replays exactly that with `np.random.RandomState(seed)`.
"""

from __future__ import annotations

import numpy as np

from bcgtune.core.sim.image_tokens import image_tokens, parse_random_resolution
from bcgtune.core.sim.workload import Workload


def compute_random_lens(rng: np.random.RandomState, full_len: int, range_ratio: float, num: int) -> np.ndarray:
    """sglang/benchmark/datasets/common.py compute_random_lens, on a given legacy RNG:
    uniform integers on [max(int(full_len * range_ratio), 1), full_len]."""
    if full_len <= 0:
        return np.zeros(num, dtype=np.int64)
    return rng.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num).astype(np.int64)


def sample_lengths(w: Workload, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_lens, output_lens) exactly as bench_serving draws them for --seed: a fresh
    `np.random.seed(seed)` per run, input lengths first, then output lengths."""
    rng = np.random.RandomState(w.seed)
    inp = compute_random_lens(rng, w.random_input_len, w.random_range_ratio, num)
    out = compute_random_lens(rng, w.random_output_len, w.random_range_ratio, num)
    return inp, out


def request_prompt_tokens(w: Workload, input_lens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Server-side prompt tokens per request (text + chat template + image tokens) and the
    number of images per request."""
    n = len(input_lens)
    tokens = input_lens.astype(np.int64) + w.resolved_chat_template_tokens
    if not w.has_images:
        return tokens, np.zeros(n, dtype=np.int64)
    images = np.full(n, w.image_count, dtype=np.int64)
    fixed = w.fixed_image_tokens()
    if fixed is not None:
        return tokens + fixed * w.image_count, images
    # random:hxw-HxW — bench_serving draws sizes from the same global RNG as the random
    # pixel contents, which cannot be replayed without generating the pixels; a separate
    # seeded generator gives the same distribution (uniform width, then height).
    (w0, h0), (w1, h1) = parse_random_resolution(w.image_resolution)  # type: ignore[misc]
    k = n * w.image_count
    widths = rng.integers(w0, w1 + 1, size=k)
    heights = rng.integers(h0, h1 + 1, size=k)
    cache: dict[tuple[int, int], int] = {}
    per = np.empty(k, dtype=np.int64)
    for i, (ww, hh) in enumerate(zip(widths.tolist(), heights.tolist())):
        t = cache.get((ww, hh))
        if t is None:
            t = cache[(ww, hh)] = image_tokens(ww, hh, w.model_family)
        per[i] = t
    return tokens + per.reshape(n, w.image_count).sum(axis=1), images
