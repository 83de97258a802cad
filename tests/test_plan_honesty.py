"""Honest tables: the row called optimal is never beaten on its own objective by a row it
was allowed to be, and every row that beats it is explained by a constraint it breaks;
SGLang's rows are what SGLang would capture."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.core.calibration import Calibration
from bcgtune.core.ladder import align_buckets, sglang_default_ladder

sizes_st = st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=40)


@st.composite
def calibrations(draw, top=6000):
    grid = draw(st.booleans())
    if grid:
        step = draw(st.sampled_from([16, 64, 128]))
        tokens = np.arange(step, top + step, step)
    else:
        tokens = np.unique(np.array(draw(st.lists(st.integers(1, top), min_size=2, max_size=12))))
    eager = np.array([draw(st.floats(0.5, 50.0)) for _ in tokens])
    graph = np.array([draw(st.floats(0.1, 50.0)) for _ in tokens])
    cal = Calibration(tokens=tokens, eager_ms=eager, graph_ms=graph, pool_gib=0.5, per_graph_gib=0.01)
    if grid:
        cal.meta["bucket_grid"] = int(tokens[0])
    return cal


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=sizes_st,
    k=st.integers(1, 6),
    align=st.sampled_from([1, 8, 64, 128]),
    compare=st.lists(st.lists(st.integers(1, 6000), min_size=1, max_size=8), max_size=3),
    objective=st.sampled_from(["padding", "time"]),
    cal=calibrations(),
    data=st.data(),
)
def test_optimal_row_is_never_beaten_without_a_reason(sizes, k, align, compare, objective, cal, data):
    trace = bcgtune.trace_from_sizes(sizes)
    plan = bcgtune.suggest_buckets(
        trace,
        max_buckets=k,
        align=align,
        objective=objective,
        calibration=cal if objective == "time" else None,
        compare={f"list {i}": lst for i, lst in enumerate(compare)},
    )
    opt = plan.recommended
    explained = {r.row: r.reasons for r in plan.restrictions}
    for row in plan.rows[1:]:
        m, o = row.metrics, opt.metrics
        if objective == "time":
            beats = row.predicted_ms < opt.predicted_ms - 1e-9 * max(1.0, opt.predicted_ms)
        else:
            beats = (m.eager_batches, m.padded_tokens) < (o.eager_batches, o.padded_tokens)
        if beats:
            assert row.name in explained, (row.name, row.buckets, opt.buckets)
            assert not any("none found" in r for r in explained[row.name]), (row.name, explained[row.name])
        else:
            assert row.name not in explained


def test_sglang_rows_are_what_sglang_captures():
    trace = bcgtune.trace_from_sizes([100, 900, 3000, 7000])
    plan = bcgtune.suggest_buckets(trace, align=128, chunked_prefill_size=16384, compare={"mine": [100, 300]})
    ladder = next(r for r in plan.rows if r.kind == "sglang-default")
    assert ladder.buckets == sglang_default_ladder(16384) and len(ladder.buckets) == 74  # not rounded to --align
    # tp 8 with a dense-layer TP size: SGLang gathers attention output, so buckets align to 8
    launch = {"tp_size": 8, "moe_dense_tp_size": 1}
    plan = bcgtune.suggest_buckets(trace, server_flags=launch, chunked_prefill_size=8192, compare={"mine": [100, 300]})
    mine = next(r for r in plan.rows if r.name == "mine")
    assert mine.buckets == [104, 304] and mine.aligned_from == [100, 300]
    ladder = next(r for r in plan.rows if r.kind == "sglang-default")
    assert ladder.buckets == align_buckets(sglang_default_ladder(8192), 8)
