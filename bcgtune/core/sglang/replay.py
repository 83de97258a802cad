"""SGLang's replay rule and the padding metrics of a bucket list on a trace.

Rule (srt/model_executor/runner/prefill_cuda_graph_runner.py, sglang 0.5.23): a batch of n
forward tokens picks the smallest bucket b >= n (bisect_left over the sorted list); it
replays iff such a bucket exists and b <= factor * n with
_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR = 2; otherwise it runs eager.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from bcgtune.core.sglang.constants import DEFAULT_PADDING_FACTOR  # prefill_cuda_graph_runner.py
from bcgtune.core.stats import distinct, nearest_rank
from bcgtune.errors import InputError, quote


def replays(n, bucket, factor: float = DEFAULT_PADDING_FACTOR):
    """Whether a batch of n forward tokens may replay in `bucket` (n <= bucket <= factor * n).
    Scalars or numpy arrays."""
    return np.logical_and(np.less_equal(n, bucket), np.less_equal(bucket, np.multiply(factor, n)))


def smallest_replaying_size(bucket: int, factor: float = DEFAULT_PADDING_FACTOR) -> int:
    """The fewest tokens a batch may hold and still replay in `bucket`: ceil(bucket / factor)."""
    import math

    n = max(1, math.ceil(bucket / factor))
    while n > 1 and bucket <= factor * (n - 1):  # guard against float rounding
        n -= 1
    while bucket > factor * n:
        n += 1
    return n


def check_bucket_list(buckets, where: str = "bucket list") -> list[int]:
    """A bucket list as written in a file: token counts, unique and ascending (SGLang would
    sort and deduplicate, so a list that is not is most likely a typo)."""
    from bcgtune.core.schema import Tokens, parse_int_list

    if isinstance(buckets, (str, bool)) or not isinstance(buckets, (list, tuple)):
        raise InputError(f"must be a list of integers, got {quote(buckets)}", where)
    out = parse_int_list(list(buckets), where, item=Tokens)
    for a, b in zip(out, out[1:]):
        if b <= a:
            raise InputError(f"buckets must be unique and ascending ({a} then {b})", where)
    return out


def parse_bucket_list(text, where: str = "bucket list", field: str | None = None) -> list[int]:
    """'256 512 1024' or '256,512,1024' (what users paste) -> sorted unique token counts."""
    from bcgtune.core.schema import Tokens, parse_int_list

    return parse_int_list(text, where, item=Tokens, sort_unique=True, field=field)


def assign_buckets(sizes: np.ndarray, buckets, factor: float = DEFAULT_PADDING_FACTOR):
    """For each size: the bucket it would use (0 when above every bucket) and whether it
    replays. Vectorized bisect_left, exactly SGLang's lookup."""
    b = np.asarray(sorted(buckets), dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if b.size == 0:
        return np.zeros_like(sizes), np.zeros(sizes.shape, dtype=bool)
    idx = np.searchsorted(b, sizes, side="left")
    has = idx < b.size
    chosen = np.where(has, b[np.minimum(idx, b.size - 1)], 0)
    replay = has & (chosen <= factor * sizes)
    return chosen, replay


@dataclass
class ListMetrics:
    name: str
    buckets: list[int]
    graphs: int
    batches: int
    replayed_batches: int
    eager_batches: int
    hit_rate_pct: float  # replayed batches / batches
    replayed_tokens: int  # real tokens of replayed batches
    padded_tokens: int  # sum over replayed batches of (bucket - n)
    waste_pct: float  # padded_tokens / replayed_tokens
    mean_pad: float  # mean padding per replayed batch
    p99_pad: int  # 99th percentile padding per replayed batch (nearest rank)
    unused_buckets: int  # buckets no traced batch replays in

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_counts(
        cls,
        name: str,
        buckets: list[int],
        batches: int,
        replayed: int,
        replayed_tokens: int,
        padded: int,
        p99_pad: int,
        unused: int,
    ) -> ListMetrics:
        """The metrics from the counts; the rates and means are derived here, once."""
        return cls(
            name=name,
            buckets=buckets,
            graphs=len(buckets),
            batches=batches,
            replayed_batches=replayed,
            eager_batches=batches - replayed,
            hit_rate_pct=100.0 * replayed / batches if batches else 0.0,
            replayed_tokens=replayed_tokens,
            padded_tokens=padded,
            waste_pct=100.0 * padded / replayed_tokens if replayed_tokens else 0.0,
            mean_pad=padded / replayed if replayed else 0.0,
            p99_pad=p99_pad,
            unused_buckets=unused,
        )


def evaluate_list(
    sizes: np.ndarray, counts: np.ndarray, buckets, name: str = "", factor: float = DEFAULT_PADDING_FACTOR
) -> ListMetrics:
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    bl = sorted(int(x) for x in buckets)
    chosen, replay = assign_buckets(sizes, bl, factor)
    rc = counts[replay]
    pad = (chosen - sizes)[replay]
    n_rep = int(rc.sum())
    padded = int((pad * rc).sum())
    rep_tokens = int((sizes[replay] * rc).sum())
    p99 = int(nearest_rank(pad, rc, 99)) if n_rep else 0
    bl_arr = np.asarray(bl, dtype=np.int64)
    used = distinct(chosen[replay])  # (np.isin would import numpy.ma: 35 ms of start-up)
    if used.size:
        unused = int((used[np.minimum(np.searchsorted(used, bl_arr), used.size - 1)] != bl_arr).sum())
    else:
        unused = len(bl)
    return ListMetrics.from_counts(name, bl, int(counts.sum()), n_rep, rep_tokens, padded, p99, unused)
