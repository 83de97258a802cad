"""Calibrations of the breakable runner (format 2): the per-batch table's lookup rules, the
round trip, old format-1 files read as the full runner, and refusals."""

import json
from pathlib import Path

import numpy as np
import pytest

from bcgtune.core.plan.calibration import BatchTimes, Calibration
from bcgtune.core.trace.mix import BatchMix
from bcgtune.errors import InputError
from bcgtune.files.calibration_file import load_calibration, save_calibration

ROOT = Path(__file__).resolve().parents[1]


def _cal(**kw):
    base = {
        "tokens": [64, 128, 256],
        "eager_ms": None,
        "graph_ms": [1.0, 1.5, 2.5],
        "runner": "breakable",
        "batches": BatchTimes([64, 128, 256, 128, 200], [1, 1, 1, 3, 2], [9.0, 9.2, 12.0, 9.6, 11.0], [0.5, 0.6, 0.9, 0.8, 0.7]),
    }
    base.update(kw)
    return Calibration(**base)


def test_lookup_exact_same_r_then_all_r():
    cal = _cal().validate()
    assert cal.eager_time(128, 3) == pytest.approx(9.6)  # measured pair
    assert cal.break_time(200, 2) == pytest.approx(0.7)
    # r = 1 has three points: interpolate along them
    assert cal.eager_time(192, 1) == pytest.approx((9.2 + 12.0) / 2)
    # r = 2 has one point: off it, the all-r curve (mean where two r share n = 128)
    assert cal.break_time(160, 2) == pytest.approx(np.interp(160, [64, 128, 200, 256], [0.5, 0.7, 0.7, 0.9]))
    # never extrapolated from one r: beyond r = 1's span (64..256) the all-r curve holds
    assert cal.eager_time(1000, 1) == pytest.approx(cal.eager_time(1000, 5))
    assert cal.eager_time(40, 3) == pytest.approx(cal.eager_time(40, 1))
    # vectorized over (n, r)
    out = cal.eager_time(np.array([64, 128, 128]), np.array([1, 1, 3]))
    assert out.tolist() == pytest.approx([9.0, 9.2, 9.6])
    assert cal.graph_time(192) == pytest.approx(2.0)


def test_full_runner_has_no_break_cost():
    cal = Calibration(tokens=[16, 64], eager_ms=[5.0, 6.0], graph_ms=[2.0, 3.0])
    assert cal.runner == "full" and cal.break_time(40, 3) == 0.0
    assert cal.eager_time(40, 7) == pytest.approx(5.5)  # one eager curve whatever the requests


def test_round_trip(tmp_path):
    cal = _cal(pool_gib=0.5, per_graph_gib=0.01, meta={"engine": {"runner": "breakable"}})
    p = tmp_path / "c.json"
    save_calibration(cal, p)
    obj = json.loads(p.read_text())
    assert obj["format_version"] == 4 and obj["runner"] == "breakable" and "eager_ms" not in obj["rows"][0]
    back = load_calibration(p)
    assert back.runner == "breakable" and back.eager_ms is None
    assert back.batches.tokens.tolist() == [64, 128, 128, 200, 256]  # sorted by (n, r)
    assert back.batches.requests.tolist() == [1, 1, 3, 2, 1]
    assert back.eager_time(128, 3) == pytest.approx(9.6) and back.graph_memory_gib([64, 256]) == pytest.approx(0.51)


def test_earlier_whole_forward_calibrations_still_load_as_full():
    for name in ("format1_grid64_qwen3-0.6b_h200.json", "format1_qwen3-8b_h200.json"):
        path = ROOT / "tests" / "data" / "calibrations" / name
        assert json.loads(path.read_text())["format_version"] == 1
        cal = load_calibration(path)
        assert cal.runner == "full" and cal.eager_ms is not None and cal.break_time(1000) == 0.0


@pytest.mark.parametrize(
    "obj,match",
    [
        (
            {
                "format_version": 2,
                "runner": "breakable",
                "rows": [{"tokens": 64, "graph_ms": 1}],
                "batches": {"tokens": [64], "requests": [65], "eager_ms": [1], "breaks_ms": [0]},
            },
            "cannot hold 65 requests",
        ),
        (
            {
                "format_version": 2,
                "runner": "breakable",
                "rows": [{"tokens": 64, "graph_ms": 1}],
                "batches": {"tokens": [64, 64], "requests": [1, 1], "eager_ms": [1, 2], "breaks_ms": [0, 0]},
            },
            "measured twice",
        ),
        (
            {
                "format_version": 2,
                "runner": "breakable",
                "rows": [{"tokens": 64, "graph_ms": 1}],
                "batches": {"tokens": [64], "requests": [1], "eager_ms": [1e308], "breaks_ms": [0]},
            },
            "eager_ms",
        ),
        (
            {
                "format_version": 2,
                "runner": "breakable",
                "rows": [{"tokens": 64, "graph_ms": 1}],
                "batches": {"tokens": [2**40], "requests": [1], "eager_ms": [1], "breaks_ms": [0]},
            },
            r"batches.tokens\[0\]",
        ),
        ({"format_version": 2, "runner": "full", "rows": [{"tokens": 64, "graph_ms": 1}]}, r"rows\[0\].eager_ms"),
        (
            {
                "format_version": 2,
                "runner": "full",
                "rows": [{"tokens": 64, "graph_ms": 1, "eager_ms": 2}],
                "batches": {"tokens": [64], "requests": [1], "eager_ms": [1], "breaks_ms": [0]},
            },
            "runner is full",
        ),
        (
            {
                "format_version": 2,
                "runner": "breakable",
                "rows": [{"tokens": 64, "graph_ms": 1}],
                "batches": {"tokens": [64], "requests": [1], "eager_ms": [1]},
            },
            "breaks_ms",
        ),
    ],
)
def test_bad_breakable_documents(tmp_path, obj, match):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(InputError, match=match):
        load_calibration(p)


def test_batch_mix_sampling_and_histogram():
    mix = BatchMix.from_batches([10, 10, 20, 30, 30, 30, 40], [1, 2, 1, 1, 1, 3, 2])
    assert mix.tokens.tolist() == [10, 10, 20, 30, 30, 40] and mix.counts.tolist() == [1, 1, 1, 2, 1, 1]
    s = mix.sample(2)
    assert s.tokens.tolist() == [10, 20, 30] and s.counts.tolist() == [2, 3, 2] and s.n_batches == mix.n_batches
    sizes, counts = mix.histogram()
    assert sizes.tolist() == [10, 20, 30, 40] and counts.tolist() == [2, 1, 3, 1]
    unknown = BatchMix.from_batches([10, 20], [-1, 2])  # a log line without #new-seq
    assert not unknown.requests_known and unknown.requests.tolist() == [1, 2]
    with pytest.raises(InputError, match="cannot hold"):
        BatchMix([5], [6], [1])


def test_sizes_added_to_a_grid_are_priced_not_picked():
    """A size measured only to price a list (`calibrate --grid G --sizes LIST`) is never a
    candidate bucket: one-off sizes would let the optimizer chase measurement noise."""
    from bcgtune.core.plan.optimizer import optimal_buckets_time, predicted_time_ms

    tokens = np.array([64, 100, 128, 192, 256])
    graph = np.array([1.0, 0.5, 1.2, 1.4, 1.6])  # 100 measured implausibly cheap
    batches = BatchTimes(np.array([90, 120, 250]), np.array([1, 1, 1]), np.array([9.0, 9.0, 9.0]), np.array([0.1, 0.1, 0.1]))
    cal = Calibration(tokens=tokens, eager_ms=None, graph_ms=graph, runner="breakable", batches=batches, meta={"bucket_grid": 64})
    sizes, counts = np.array([90, 120, 250]), np.array([5, 1, 1])
    picked = optimal_buckets_time(sizes, counts, 3, cal, candidates="calibration").buckets
    assert 100 in picked
    cal.meta["sizes_added"] = [100]
    assert cal.candidate_tokens().tolist() == [64, 128, 192, 256]
    picked = optimal_buckets_time(sizes, counts, 3, cal, candidates="calibration").buckets
    assert 100 not in picked and set(picked) <= {64, 128, 192, 256}
    # ... yet a list holding it is priced at its measured time
    assert predicted_time_ms(sizes, counts, [100, 128, 256], cal, candidates="calibration") == pytest.approx(
        5 * (0.5 + 0.1) + (1.2 + 0.1) + (1.6 + 0.1)
    )


@pytest.mark.parametrize("added", ["abc", [True, 1.5, "128", [64], -5, 2**40], [64, 128, 192, 256]])
def test_hostile_or_total_sizes_added_leave_a_candidate_set(added):
    tokens = np.array([64, 128, 192, 256])
    cal = Calibration(
        tokens=tokens,
        eager_ms=None,
        graph_ms=np.ones(4),
        runner="breakable",
        batches=BatchTimes(np.array([100]), np.array([1]), np.array([5.0]), np.array([0.1])),
        meta={"sizes_added": added},
    )
    assert cal.candidate_tokens().tolist() == [64, 128, 192, 256]


def test_calibrate_refuses_too_many_sizes_before_loading_anything(tmp_path):
    from cli_helpers import assert_one_line_error, cli

    sizes = ",".join(str(i) for i in range(1, 5000))
    for extra in (["--grid", "64"], []):
        r = cli(["calibrate", "--sizes", sizes, *extra, "--model", "tiny", "-o", tmp_path / "c.json"])
        assert r.code == 2 and "sizes to measure (at most 4,096)" in r.err and "--sizes" in r.err, r.err
        assert_one_line_error(r)
    assert not (tmp_path / "c.json").exists()
