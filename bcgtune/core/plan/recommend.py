"""The time objective's rows as a user reads them: every row's predicted time with its 95%
interval and its paired difference from the recommended row, the recommendation rule, what
the predictions rest on, and what to measure next. Pure: works on a BucketPlan
(bcgtune.core.plan.bucket_plan) and its pricer; bcgtune.core.plan.predict computes the intervals.

The rule: among the lists that meet every constraint of the optimum (the exact optimum for
each number of buckets, which the plan's curve holds, and the comparison rows that meet
them; no graphs at all too), recommend the fewest graphs whose time is shown to be within a
margin of the best: the upper end of the 95% paired interval of (its time - the best's) is
at most `tolerance_pct` % of the best's predicted time (DEFAULT_TOLERANCE_PCT when not
given); then the least capture time (the calibration's per-bucket times), then the least
graph memory, then the least predicted time. Wide noise is not evidence that two lists are
equal: a wider interval raises its upper end, so it can only move the recommendation toward
the best (more graphs, or the best itself), never to a list that may be slower by more than
the margin. The candidates for fewer graphs are the optimum of each number of buckets (the
curve) and the comparison rows: a list of g graphs other than the optimum of g could have a
narrower interval and pass where that optimum does not, so the count is the fewest among
those candidates, never fewer than the rule allows. With one timed round there is no
interval: the optimum is recommended, unless a tolerance is given, which is then applied to
the predicted time alone (and the rule says so).
"""

from __future__ import annotations

from bcgtune.core.plan.optimizer import candidate_rows
from bcgtune.core.plan.plan_types import BucketPlan, PlanRow, RecommendRule, Refinement, TimeInfo, count_text
from bcgtune.core.plan.predict import TimeModel
from bcgtune.core.plan.pricer import Pricer
from bcgtune.core.sglang.constants import DEFAULT_TOLERANCE_PCT
from bcgtune.core.stats import CONFIDENCE, Interval

# ---- time: intervals, the recommendation, what to measure next ------------------------
RECOMMENDABLE = ("optimal", "eager", "compare", "captured", "quantile", "kmeans", "sglang-default")


def price_with_intervals(plan: BucketPlan, pricer: Pricer, explore: PlanRow | None) -> None:
    """Every row's interval, the recommended row (time objective), each row's paired
    difference from it and its standing against the best, and what to measure next."""
    model = pricer.model
    assert model is not None
    req, cal = plan.request, req_cal(plan)
    for row in plan.rows:
        row.interval = model.total(row.buckets)
        row.unmeasured = model.unmeasured(row.buckets)
        row.capture_s = cal.capture_s_of(row.buckets)
    if req.objective == "time":
        rec, reason = _recommend(plan, pricer)
        if all(rec is not row for row in plan.rows):
            plan.rows.insert(1, rec)
        plan.recommended, plan.recommended_reason = rec, reason
    opt = plan.rows[0]
    for row in plan.rows:
        row.vs_recommended = model.difference(row.buckets, plan.recommended.buckets)
        row.vs_best = _standing(model.difference(row.buckets, opt.buckets), row is opt)
    if req.objective == "time":
        for c in plan.curve:
            d = model.difference(c.buckets, plan.recommended.buckets)
            c.vs_recommended_ms, c.vs_recommended_half_ms = d.center, d.half
    plan.time = _time_info(plan, model)
    if req.objective == "time":
        plan.refine = _refinement(plan, model, explore)


def req_cal(plan: BucketPlan):
    return plan.request.calibration


def _standing(d: Interval, is_best: bool) -> str:
    if is_best:
        return "best"
    if d.half is None:
        return "unknown"
    if d.center - d.half > 0:
        return "slower"
    if d.center + d.half < 0:
        return "faster"
    return "within noise"


def _allowed(plan: BucketPlan, row: PlanRow) -> bool:
    """Whether a list meets every constraint of the optimum (so the rule may recommend it)."""
    req = plan.request
    b = row.buckets
    if row.omitted_unused or len(b) > req.max_buckets or any(x % req.align for x in b):
        return False
    if req.max_bucket is not None and b and max(b) > req.max_bucket:
        return False
    if plan.candidate_set == "calibration" and not set(b) <= set(candidate_rows(req.calibration).tolist()):
        return False
    if req.max_graph_mem_gib is not None and b and (row.graph_mem_gib is None or row.graph_mem_gib > req.max_graph_mem_gib):
        return False
    return True


def _recommend(plan: BucketPlan, pricer: Pricer) -> tuple[PlanRow, str]:
    """The fewest graphs shown within the margin of the best (see the module docstring),
    then the least capture time, then the least memory, then the least predicted time; with
    the line that says why. Sets `plan.rule`."""
    model, req = pricer.model, plan.request
    assert model is not None
    opt = plan.rows[0]
    pool: list[PlanRow] = [r for r in plan.rows if r.kind in RECOMMENDABLE and _allowed(plan, r)]
    if opt not in pool:
        pool.insert(0, opt)
    known = {tuple(r.buckets) for r in pool}
    for c in plan.curve:
        if tuple(c.buckets) not in known and c.buckets:
            known.add(tuple(c.buckets))
            row = pricer.row("bcgtune (recommended)", "recommended", c.buckets)
            row.interval = model.total(row.buckets)
            row.capture_s = req.calibration.capture_s_of(row.buckets)
            if _allowed(plan, row):
                pool.append(row)
    best = min(pool, key=lambda r: (r.predicted_ms, len(r.buckets)))
    rounds = model.rounds
    rule = recommend_rule(req.tolerance_pct, float(best.predicted_ms or 0.0), rounds)
    plan.rule = rule

    def gap(r: PlanRow) -> Interval:
        return model.difference(r.buckets, best.buckets)

    if rule.bound == "none":
        return opt, (
            "the optimum: the calibration kept one value per size (one round), so no interval bounds how much slower "
            "a list with fewer graphs may be (give --tolerance PCT to accept fewer graphs predicted within PCT % of it)"
        )
    ok = [r for r in pool if r is best or rule.admits(gap(r))]

    def key(r: PlanRow):
        return (
            len(r.buckets),
            r.capture_s if r.capture_s is not None else float("inf"),
            r.graph_mem_gib if r.graph_mem_gib is not None else float("inf"),
            r.predicted_ms,
        )

    rec = min(ok, key=key)
    if rec.kind == "recommended":
        rec.name = f"bcgtune (recommended, {count_text(len(rec.buckets), 'graph')})"
    if rec is best:
        fewer = [r for r in pool if len(r.buckets) < len(best.buckets)]
        if not fewer:
            return rec, f"the optimum ({count_text(len(rec.buckets), 'graph')}): no allowed list has fewer graphs"
        nearest = min(fewer, key=lambda r: (-len(r.buckets), r.predicted_ms))
        return rec, (
            f"the optimum ({count_text(len(rec.buckets), 'graph')}): no list with fewer graphs {rule.none_text}; the "
            f"best with {len(nearest.buckets)} is {_gap_text(gap(nearest))}"
        )
    return rec, (
        f"{count_text(len(rec.buckets), 'graph')} instead of the optimum's {len(best.buckets)}: the fewest graphs "
        f"{rule.text} ({_gap_text(gap(rec))})"
    )


def recommend_rule(tolerance_pct: float | None, best_ms: float, rounds: int) -> RecommendRule:
    """The rule for a best list predicted at `best_ms` from a calibration of `rounds` timed
    rounds; `tolerance_pct` None: DEFAULT_TOLERANCE_PCT."""
    given = tolerance_pct is not None
    pct = DEFAULT_TOLERANCE_PCT if tolerance_pct is None else float(tolerance_pct)
    bound = "upper" if rounds >= 2 else ("predicted" if given else "none")
    return RecommendRule(pct, pct / 100.0 * max(0.0, best_ms), given, bound, rounds)


def _gap_text(d: Interval) -> str:
    """'+12.0 ± 30.0 ms against it, at most +42.0 ms'."""
    if d.half is None:
        return f"{d.center:+,.1f} ms against it"
    return f"{d.center:+,.1f} ± {d.half:,.1f} ms against it, at most {d.center + d.half:+,.1f} ms"


def _time_info(plan: BucketPlan, model: TimeModel) -> TimeInfo:
    cal = plan.request.calibration
    rounds = model.rounds
    why = None
    if rounds < 2:
        fmt = cal.meta.get("format_version") if isinstance(cal.meta, dict) else None
        why = (
            "one round: a calibration CSV keeps one value per size"
            if isinstance(cal.meta, dict) and cal.meta.get("format") == "csv"
            else f"one round: a format-{fmt} calibration keeps one value per size"
            if fmt in (1, 2)
            else "one round: the calibration timed each size once"
        )
    widest = None
    rel = [r.interval.half / r.interval.center for r in plan.rows if r.interval and r.interval.half and r.interval.center > 0]
    if rel:
        widest = 100.0 * max(rel)
    units, of, lo, hi = model.outside()
    scaled = [
        s
        for s in (cal.sessions or [])[1:]
        if isinstance(s, dict) and any(s.get(k) not in (None, 1.0) for k in ("scale_graph", "scale_eager"))
    ]
    return TimeInfo(
        rounds=rounds,
        confidence=CONFIDENCE,
        statistic="t over per-round totals, centered on the sum of per-size medians (bcgtune.core.plan.predict)",
        why_none=why,
        host_bound=model.host_bound(),
        outside=(units, of, lo, hi) if units else None,
        widest_pct=widest,
        scaled_sessions=scaled,
    )


def _refinement(plan: BucketPlan, model: TimeModel, explore: PlanRow | None) -> Refinement | None:
    """The sizes to measure next: the exploring search's unmeasured buckets, or the
    recommended list's own unmeasured buckets (any-size candidates)."""
    cal = plan.request.calibration
    model_row = explore if explore is not None else plan.recommended
    sizes = model_row.unmeasured
    if not sizes:
        return None
    gain = None
    if explore is not None:
        gain = model.difference(plan.rows[0].buckets, explore.buckets)  # how much faster the exploring list is
    src = cal.meta.get("source") if isinstance(cal.meta, dict) else None
    if cal.engine_options is None or cal.graph_rounds is None:
        return Refinement(
            sizes,
            model_row.name,
            gain,
            None,
            why_no_command="this calibration records no rounds or engine options to extend (written before format 3): "
            "run bcgtune calibrate again, then extend it",
        )
    path = src if isinstance(src, str) and src and src != "-" else "CAL.json"
    return Refinement(
        sizes, model_row.name, gain, f"bcgtune calibrate --extend {_shell_word(path)} --sizes {','.join(map(str, sizes))}"
    )


def _shell_word(text: str) -> str:
    import shlex

    return shlex.quote(text)
