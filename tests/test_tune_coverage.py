"""The intervals `bcgtune tune` prints for the whole trace hold the truth often enough: 30
simulated tunes (benchmarks/tune_coverage.py's cells: two recorded H200 calibrations, two
traces, each tune its own world and noise), each checked against the simulated device's exact
truth. benchmarks/tune_coverage.py runs 200 and records the coverage of every interval."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from tune_coverage import CALS, TRACES, one_tune, summarize  # noqa: E402

TUNES = 30


def test_the_trace_gain_interval_holds_the_truth_in_at_least_80_percent_of_tunes():
    cells = [(m, str(ROOT / c), tn, str(ROOT / tp)) for m, c in CALS.items() for tn, tp in TRACES.items()]
    rows = []
    for i in range(TUNES):
        m, c, tn, tp = cells[i % len(cells)]
        rows.append(one_tune((500 + i, m, c, tn, tp, 600.0, 8192)))
    table = summarize(rows)
    assert table["trace gain (%)"]["tunes"] == TUNES
    assert table["trace gain (%)"]["coverage_pct"] >= 80.0, table
    # every tune kept to its budget, and its proof says what it replayed
    assert all(r["budget"]["spent_s"] <= r["budget"]["limit_s"] for r in rows)
    assert all(0 < r["sample"]["sampled_batches"] <= r["sample"]["trace_batches"] for r in rows)
