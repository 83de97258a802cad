"""Statistics of weighted samples, kept once for every table that reports them."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def nearest_rank(values, weights, q: float | Fraction, *, presorted: bool = False):
    """The weighted nearest-rank q-th percentile (0 < q <= 100; a float or a Fraction): the smallest value whose
    cumulative weight reaches ceil(q/100 * total). `values` need not be sorted unless
    `presorted`. Raises ValueError on an empty or weightless sample."""
    v = np.asarray(values)
    w = np.asarray(weights, dtype=np.int64)
    if v.size == 0 or w.sum() <= 0:
        raise ValueError("percentile of an empty sample")
    if not presorted:
        order = np.argsort(v, kind="stable")
        v, w = v[order], w[order]
    cum = np.cumsum(w)
    rank = max(1, math.ceil(Fraction(q) * int(cum[-1]) / 100))  # exact: no float rounding at the boundary
    return v[min(int(np.searchsorted(cum, rank)), v.size - 1)].item()
