"""Honest tables: the row called optimal is never beaten on its own objective by a row it
was allowed to be, and every row that beats it is explained by a constraint it breaks (no
normal flow asks the user to report a bug: lists of sizes added to a grid only to be
compared included); SGLang's rows are what SGLang would capture."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.sglang.ladder import align_buckets, sglang_default_ladder

sizes_st = st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=40)


@st.composite
def calibrations(draw, top=6000):
    grid = draw(st.booleans())
    if grid:
        step = draw(st.sampled_from([16, 64, 128]))
        tokens = np.arange(step, top + step, step)
    else:
        tokens = np.unique(np.array(draw(st.lists(st.integers(1, top), min_size=2, max_size=12))))
    added = []
    if grid and draw(st.booleans()):
        # sizes added to the grid only to be compared (calibrate --grid G --sizes LIST)
        added = sorted(set(draw(st.lists(st.integers(1, top), min_size=1, max_size=4))) - set(tokens.tolist()))
        tokens = np.unique(np.concatenate([tokens, np.asarray(added, dtype=np.int64)]))
    eager = np.array([draw(st.floats(0.5, 50.0)) for _ in tokens])
    graph = np.array([draw(st.floats(0.1, 50.0)) for _ in tokens])
    rounds = draw(st.integers(1, 3))
    spread = 1 + np.array([draw(st.floats(0.0, 0.2)) for _ in range(rounds)])
    cal = Calibration(
        tokens=tokens,
        eager_ms=eager,
        graph_ms=graph,
        pool_gib=0.5,
        per_graph_gib=0.01,
        graph_rounds=graph[:, None] * spread / np.median(spread),
        eager_rounds=eager[:, None] * spread / np.median(spread),
    )
    if grid:
        cal.meta["bucket_grid"] = int(tokens[0])
    if added:
        cal.meta["sizes_added"] = added
    return cal


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=sizes_st,
    k=st.integers(1, 6),
    align=st.sampled_from([1, 8, 64, 128]),
    compare=st.lists(st.lists(st.integers(1, 6000), min_size=1, max_size=8), max_size=3),
    added_compare=st.booleans(),
    objective=st.sampled_from(["padding", "time"]),
    cal=calibrations(),
    data=st.data(),
)
def test_optimal_row_is_never_beaten_without_a_reason(sizes, k, align, compare, added_compare, objective, cal, data):
    trace = bcgtune.trace_from_sizes(sizes)
    if added_compare and cal.meta.get("sizes_added"):
        compare = [*compare, list(cal.meta["sizes_added"])]  # a list measured only to be compared
    plan = bcgtune.suggest_buckets(
        trace,
        max_buckets=k,
        align=align,
        objective=objective,
        calibration=cal if objective == "time" else None,
        compare={f"list {i}": lst for i, lst in enumerate(compare)},
    )
    opt = plan.optimal
    assert opt is plan.rows[0]
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


def test_a_list_of_sizes_added_to_the_grid_is_explained_not_a_bug():
    """The H200 case: a grid calibration extended with `--sizes` (a padding list to compare),
    that list predicted faster than the optimum, which picks grid sizes only."""
    from bcgtune.cli.render.plan import render_plan_text

    grid = np.arange(64, 1025, 64)
    added = [100, 300, 700]
    tokens = np.unique(np.concatenate([grid, added]))
    graph = 1.0 + tokens / 256.0
    graph[np.isin(tokens, added)] -= 0.5  # the added sizes measured cheap
    cal = Calibration(
        tokens=tokens, eager_ms=10.0 + tokens / 100.0, graph_ms=graph, meta={"bucket_grid": 64, "sizes_added": added}
    )
    trace = bcgtune.trace_from_sizes([90, 100, 280, 300, 650, 700] * 5)
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, compare={"padding list": added})
    mine = next(r for r in plan.rows if r.name == "padding list")
    assert mine.predicted_ms < plan.optimal.predicted_ms
    (why,) = [x.reasons for x in plan.restrictions if x.row == "padding list"]
    assert any("measured only to be compared" in r for r in why)
    text = render_plan_text(plan)
    assert "report this as a bug" not in text and "measured only to be compared" in text
