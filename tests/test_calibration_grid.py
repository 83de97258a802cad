"""Bucket-grid calibration sizes (calibrate --grid / --sizes-from): pure logic, no torch."""

import pytest

from bcgtune.errors import InputError
from bcgtune.services.calibrate import MAX_POOL_SIZES, grid_sizes, pool_subset


def test_plain_grid_runs_to_max_tokens():
    assert grid_sizes(64, max_tokens=256) == [64, 128, 192, 256]
    assert len(grid_sizes(64)) == 8192 // 64
    with pytest.raises(InputError, match="--max-tokens"):
        grid_sizes(64, max_tokens=32)
    with pytest.raises(InputError, match="--grid"):
        grid_sizes(0)


def test_trace_grid_keeps_only_buckets_some_size_can_replay_in():
    # sizes 100 and 1000: a bucket c serves n iff n <= c <= 2n
    got = grid_sizes(100, trace_sizes=[100, 1000])
    assert got == [100, 200, 1000]  # 300..900 replay nothing; none above the largest size
    # unaligned ends are measured too, so eager is never extrapolated inside the trace
    # (126 replays in 126..252, 1290 in 1290..2580; the grid stops at the first multiple >= 1290)
    assert grid_sizes(64, trace_sizes=[126, 1290]) == [126, 128, 192, 1290, 1344]


def test_trace_grid_respects_max_tokens_and_factor():
    assert grid_sizes(10, trace_sizes=[30, 95], max_tokens=60) == [30, 40, 50, 60]
    assert grid_sizes(10, trace_sizes=[30], factor=1.5) == [30]
    with pytest.raises(InputError, match="above --max-tokens"):
        grid_sizes(10, trace_sizes=[500], max_tokens=100)


def test_pool_subset_is_bounded_and_keeps_the_largest():
    sizes = list(range(64, 8193, 64))
    sub = pool_subset(sizes)
    assert len(sub) <= MAX_POOL_SIZES and sub[-1] == 8192 and sub[0] == 64
    assert pool_subset([8, 16]) == [8, 16]
