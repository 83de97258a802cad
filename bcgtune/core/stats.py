"""Statistics of weighted samples, kept once for every table that reports them."""

from __future__ import annotations

import math
from dataclasses import dataclass
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


# ---- intervals over timed rounds -------------------------------------------------------
# Student's t quantile at 0.975 (two-sided 95%) for 1..30 degrees of freedom (standard
# tables, 4 decimals); beyond 30 the Cornish-Fisher expansion below is within 1e-5 of it.
CONFIDENCE = 0.95
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z975 = 1.959963984540054


def t_quantile_975(df: float) -> float:
    """Student's t quantile at 0.975 with `df` degrees of freedom (df >= 1; a fractional df
    from Welch-Satterthwaite rounds down, which widens the interval)."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    n = int(math.floor(df))
    if n <= len(_T975):
        return _T975[n - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * n)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * n**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * n**3)
    )


@dataclass(frozen=True)
class Interval:
    """A 95% interval around `center`: center +- half. `rounds` is how many timed rounds it
    rests on; `se` the standard error of the rounds' mean. half None: too few rounds (one)
    to give an interval."""

    center: float
    half: float | None
    se: float | None
    rounds: int
    # the part of `half` that is the time model's own error, measured by a replay of the
    # trace (core.plan.model_check); None: not included (the model error was not checked)
    model_half: float | None = None

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.center - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.center + self.half

    def contains(self, x: float) -> bool | None:
        if self.half is None:
            return None
        return self.center - self.half <= x <= self.center + self.half

    def to_dict(self) -> dict:
        return {"center": self.center, "half": self.half, "se": self.se, "rounds": self.rounds, "model_half": self.model_half}

    def widened(self, extra: float) -> "Interval":
        """This interval with `extra` (the model error) added to its half-width; one without
        a half-width (one round) stays without one."""
        if self.half is None:
            return self
        return Interval(self.center, self.half + float(extra), self.se, self.rounds, float(extra))


def round_interval(center: float, per_round) -> Interval:
    """The 95% t-interval of a quantity from its value in each timed round: centered on
    `center` (the prediction, a sum of per-size medians), half-width t(0.975, R - 1) x
    sd(per-round values) / sqrt(R). Rounds of one calibration run every size once each, in
    a shuffled order, so a round's value is one complete measurement of the quantity and
    the rounds are its repeats; a difference of two lists taken round by round is paired
    (the same batches in the same rounds) and this gives its paired interval. One round: no
    interval (half None)."""
    x = np.asarray(per_round, dtype=np.float64).ravel()
    r = int(x.size)
    if r < 2:
        return Interval(float(center), None, None, r)
    se = float(np.std(x, ddof=1)) / math.sqrt(r)
    return Interval(float(center), t_quantile_975(r - 1) * se, se, r)


def distinct(values) -> np.ndarray:
    """The distinct values of an integer array, ascending: np.unique(values) without its
    check for masked arrays, which imports numpy.ma (about 35 ms of a command's start-up)."""
    s = np.sort(np.asarray(values).ravel())
    if s.size < 2:
        return s
    keep = np.empty(s.size, np.bool_)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
