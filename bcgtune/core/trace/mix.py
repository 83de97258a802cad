"""Batch mixes: prefill batches as a server forms them, n forward tokens from r requests.

SGLang's scheduler packs several requests into one prefill batch (its log's `#new-seq`, the
simulator's admissions). The breakable prefill runner's cost depends on both: the captured
segments on the bucket the n tokens pad to, the eager attention between them on the n real
tokens split into r sequences. A `BatchMix` is the histogram of (n, r) pairs of a trace;
`histogram()` folds it back to the forward-size histogram every bucket optimizer reads.
Pure numpy: no torch, no printing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcgtune.errors import InputError


@dataclass(frozen=True)
class BatchMix:
    tokens: np.ndarray  # forward tokens n of each distinct (n, r) pair, ascending by (n, r)
    requests: np.ndarray  # requests r in the batch (1 <= r <= n)
    counts: np.ndarray  # batches with that pair
    requests_known: bool = True  # False: the source carried no request counts (r = 1 assumed)

    def __post_init__(self) -> None:
        t = np.asarray(self.tokens, dtype=np.int64)
        r = np.asarray(self.requests, dtype=np.int64)
        c = np.asarray(self.counts, dtype=np.int64)
        if not (t.ndim == r.ndim == c.ndim == 1 and t.shape == r.shape == c.shape):
            raise InputError("batch mix columns tokens/requests/counts must be flat and of equal length")
        if t.size == 0:
            raise InputError("batch mix is empty: no prefill batches")
        if (t <= 0).any() or (c <= 0).any():
            raise InputError("batch mix tokens and counts must be positive")
        if (r < 1).any() or (r > t).any():
            i = int(np.argmax((r < 1) | (r > t)))
            raise InputError(f"a batch of {int(t[i])} tokens cannot hold {int(r[i])} requests")
        order = np.lexsort((r, t))
        object.__setattr__(self, "tokens", t[order])
        object.__setattr__(self, "requests", r[order])
        object.__setattr__(self, "counts", c[order])

    @classmethod
    def from_batches(cls, tokens, requests=None) -> BatchMix:
        """One entry per batch. `requests` may hold values < 1 for "unknown" (a log line
        without `#new-seq`): those batches count as one request each."""
        t = np.asarray(tokens, dtype=np.int64)
        known = requests is not None
        if requests is None:
            r = np.ones_like(t)
        else:
            r = np.asarray(requests, dtype=np.int64)
            if r.shape != t.shape:
                raise InputError(f"{r.size} request counts for {t.size} batches")
            known = bool((r >= 1).all())
            r = np.where(r >= 1, np.minimum(r, t), 1)
        if t.size == 0:
            raise InputError("batch mix is empty: no prefill batches")
        pairs, counts = np.unique(np.stack([t, r]), axis=1, return_counts=True)
        return cls(pairs[0], pairs[1], counts, requests_known=known)

    @classmethod
    def single_request(cls, sizes, counts) -> BatchMix:
        """A size histogram with every batch one request (traces that carry no counts)."""
        s = np.asarray(sizes, dtype=np.int64)
        return cls(s, np.ones_like(s), np.asarray(counts, dtype=np.int64), requests_known=False)

    @property
    def n_batches(self) -> int:
        return int(self.counts.sum())

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct sizes, batches per size): the forward-size histogram of the mix."""
        sizes, inv = np.unique(self.tokens, return_inverse=True)
        return sizes, np.bincount(inv, weights=self.counts).astype(np.int64)

    def size_index(self, sizes) -> np.ndarray:
        """For each pair, its row in the ascending array `sizes` (which must hold every n)."""
        s = np.asarray(sizes, dtype=np.int64)
        idx = np.searchsorted(s, self.tokens)
        if (idx >= s.size).any() or (s[np.minimum(idx, s.size - 1)] != self.tokens).any():
            raise InputError("batch mix holds a size the histogram does not")
        return idx

    def sample(self, every: int) -> BatchMix:
        """Every `every`-th distinct pair in (n, r) order, each kept pair carrying the
        batches of the pairs dropped after it (a coarser mix of the same batch count)."""
        if every < 1:
            raise InputError(f"sampling step must be >= 1, got {every}")
        if every == 1:
            return self
        keep = np.arange(0, self.tokens.size, every)
        group = np.minimum(np.arange(self.tokens.size) // every, keep.size - 1)
        counts = np.bincount(group, weights=self.counts, minlength=keep.size).astype(np.int64)
        return BatchMix(self.tokens[keep], self.requests[keep], counts, self.requests_known)


def batch_mix(trace) -> BatchMix:
    """The (tokens, requests) mix of a PrefillTrace: from its per-batch columns
    `forward_tokens` and `new_seq` when it has them, else from the mixes its server
    configurations carry (a histogram-only trace), else one request per batch."""
    cols = trace.batches or {}
    tokens = cols.get("forward_tokens")
    if tokens is None or len(tokens) == 0:
        stored = trace.request_mix() if hasattr(trace, "request_mix") else None
        return stored if stored is not None else BatchMix.single_request(trace.sizes, trace.counts)
    return BatchMix.from_batches(tokens, cols.get("new_seq"))
