"""The proof step of `bcgtune tune`: the recommended list, SGLang's ladder and eager (and the
exact optimum when the recommended list has fewer graphs) replayed on the trace in trace
order, in interleaved rounds, and what that says about the whole trace.

The batches replayed are the whole trace when it fits the proof's share of the budget, else a
stratified sample of it (core.plan.trace_estimate.proof_design: strata by the bucket each
list gives a batch; the batches where the recommended list and the optimum differ always
taken). Two kinds of figure come out, each named for what it covers:
  * on the sample: each list's measured total against its predicted total on the same
    batches, pass by pass (how the model did on what was replayed);
  * on the whole trace: each list's total, recommended minus ladder, recommended minus
    optimum and the gain over the ladder, estimated from the sample with the time model
    (core.plan.trace_estimate), each with a 95% interval that holds the sampling error, the
    run's own noise and the stated allowances (capture offsets, the process's level shift,
    the host's speed for launch-bound eager batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from bcgtune.core.sglang.constants import DEFAULT_TOLERANCE_PCT

if TYPE_CHECKING:
    from bcgtune.engines.config import EngineConfig

Say = Callable[[str], None]
# rounds of the proof run: (warm-up, timed) on a GPU and without one (a dry run of the pipeline)
PROOF_ROUNDS_GPU = (1, 5)
PROOF_ROUNDS_CPU = (0, 2)


def allowances():
    """What one run cannot measure, as bcgtune's noise profile states it."""
    from bcgtune.core.plan.trace_estimate import Allowances
    from bcgtune.engines.sim.noise import FITTED

    return Allowances(capture_sd=FITTED.capture_sd, level_sd=FITTED.level_sd, host_sd=FITTED.host_sd)


def proof_lists(meas: dict[str, Any]) -> dict[str, list[int]]:
    """The lists a proof replays, from the measure step's figures."""
    rec = list(meas["recommended"]["buckets"])
    ladder = list(meas["ladder"]["buckets"])
    lists = {"recommended": rec, "SGLang ladder": ladder, "eager": []}
    opt = list((meas.get("optimal") or {}).get("buckets") or rec)
    if opt != rec and opt != ladder and opt:
        # a list with fewer graphs than the optimum stands for it only within the margin:
        # measured, not only predicted
        lists["optimum"] = opt
    return lists


class TracePricing:
    """Each list's predicted time per trace batch (its graph part, its bucket, the host's part
    of its eager batches), at the calibration's medians."""

    def __init__(self, cal, tok: np.ndarray, req: np.ndarray, lists: dict[str, list[int]]):
        from bcgtune.core.plan.bucket_plan import resolve_candidates
        from bcgtune.core.plan.predict import host_share, per_batch_ms

        cand = resolve_candidates("auto", cal)
        share = host_share(cal, tok, req)
        self.time, self.graph, self.chosen, self.host = {}, {}, {}, {}
        for name, bl in lists.items():
            t, g, c = per_batch_ms(cal, tok, req, bl, cand)
            self.time[name], self.graph[name], self.chosen[name] = t, g, c
            self.host[name] = np.where(c == 0, t * share, 0.0)

    def weight(self) -> np.ndarray:
        """A batch's allocation weight: its predicted time summed over the lists."""
        return np.sum(np.stack(list(self.time.values())), axis=0)


def design_for(pricing: TracePricing, tok: np.ndarray, lists: dict[str, list[int]], budget: int, seed: int):
    from bcgtune.core.plan.trace_estimate import proof_design

    strata_lists = {k: v for k, v in lists.items() if k != "eager"}
    must = ("recommended", "optimum") if "optimum" in lists else None
    return proof_design(tok, strata_lists, pricing.weight(), budget, must_differ=must, seed=seed)


def trace_figures(
    design,
    pricing: TracePricing,
    calls: dict[str, np.ndarray],
    lists: dict[str, list[int]],
    tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
) -> dict[str, Any]:
    """Every whole-trace estimate of the proof (core.plan.trace_estimate), as JSON. The
    recommended list's distance from the optimum is judged here, on the whole trace, against
    the margin of `tolerance_pct` of the optimum's total: a stratified sample over-represents
    the batches the two lists run differently, so its own difference is no verdict."""
    from bcgtune.core.plan.trace_estimate import estimate_difference, estimate_total, gain_pct, per_bucket_graph

    allow = allowances()
    totals = {}
    for name in lists:
        totals[name] = estimate_total(
            design,
            pricing.time[name],
            calls[name],
            graph_by_bucket=per_bucket_graph(pricing.chosen[name], pricing.graph[name]),
            host_ms=float(pricing.host[name].sum()),
            allow=allow,
        )

    def diff(a: str, b: str):
        differ = pricing.chosen[a] != pricing.chosen[b]
        net: dict[int, float] = {}
        for name, sign in ((a, 1.0), (b, -1.0)):
            for bk, g in per_bucket_graph(np.where(differ, pricing.chosen[name], 0), pricing.graph[name]).items():
                net[bk] = net.get(bk, 0.0) + sign * g
        host = float(np.sum(np.where(differ, pricing.host[a] - pricing.host[b], 0.0)))
        return estimate_difference(
            design,
            pricing.time[a],
            pricing.time[b],
            calls[a],
            calls[b],
            differ,
            net_graph_by_bucket=net,
            host_ms=abs(host),
            allow=allow,
        ), int(differ.sum())

    d_lad, n_lad = diff("recommended", "SGLang ladder")
    g, gh = gain_pct(d_lad, totals["SGLang ladder"])
    out: dict[str, Any] = {
        "design": design.to_json(),
        "allowances": allow.to_json(),
        "lists": {n: t.to_json() for n, t in totals.items()},
        "recommended_minus_ladder": d_lad.to_json() | {"differing_batches": n_lad},
        "gain": {"gain_pct": g, "half_pct": gh},
        "recommended_minus_optimum": None,
    }
    if "optimum" in lists:
        d_opt, n_opt = diff("recommended", "optimum")
        o = d_opt.to_json()
        margin = tolerance_pct / 100.0 * float(totals["optimum"].center)
        out["recommended_minus_optimum"] = o | {
            "differing_batches": n_opt,
            "tolerance_pct": tolerance_pct,
            "margin_ms": margin,
            "within_margin": bool(o["center"] <= margin),
            # the 95% interval reaches down to the margin: no evidence of more than the margin
            "not_beyond_margin": bool(o["center"] - o["half"] <= margin),
        }
    return out


def run_proof(
    req,
    cfg: EngineConfig,
    trace,
    cal_path: str,
    lists: dict[str, list[int]],
    budget_batches: int,
    say: Say,
    rechecked: Any = None,
    rounds: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Replay `lists` on the proof's batches (`budget_batches` at most, the whole trace when
    it fits) in `rounds` (warm-up, timed; the options given win) on the tune's engine `cfg`
    (resolved: engines/config.py) and return every figure, on the sample and on the whole
    trace."""
    from bcgtune.core.plan.bucket_plan import resolve_candidates
    from bcgtune.core.plan.model_check import trace_sequence
    from bcgtune.core.plan.predict import TimeModel
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.trace_replay import replay_in_order
    from bcgtune.files.calibration_file import load_calibration

    tok, rq, ordered = trace_sequence(trace, seed=cfg.seed)
    if cfg.runner == "full":
        rq = np.ones_like(rq)
    cal = load_calibration(str(cal_path))
    pricing = TracePricing(cal, tok, rq, lists)
    design = design_for(pricing, tok, lists, budget_batches, cfg.seed)
    st, sr = tok[design.index], rq[design.index]
    mix = BatchMix.from_batches(st, sr)
    sizes, counts = mix.histogram()
    model = TimeModel(sizes, counts, cal, candidates=resolve_candidates("auto", cal), mix=mix)
    largest = max([int(st.max()), *(max(b) for b in lists.values() if b)])
    session = open_engine(cfg.checked([largest], what="proof size"))
    engine = session.engine
    gpu = engine.graphs_enabled
    default = rounds if rounds is not None else (PROOF_ROUNDS_GPU if gpu else PROOF_ROUNDS_CPU)
    warmup = req.proof_warmup if req.proof_warmup is not None else default[0]
    repeats = req.proof_repeats if req.proof_repeats is not None else default[1]
    rec = lists["recommended"]
    capture_s, mem = _capture_recommended(engine, rec, say) if rec and gpu else (None, None)
    what = "the whole trace" if design.whole else f"a sample stratified by {design.key}"
    say(
        f"  {st.size:,} of {tok.size:,} trace batches ({what}{'' if ordered else '; shuffled: the trace keeps no order'}), "
        f"{len(lists)} lists, {repeats} rounds after {warmup} warm-up, {req.passes} pass{'es' if req.passes != 1 else ''}"
    )
    runs: dict[str, dict[str, list]] = {n: {"totals_ms": [], "round_totals_ms": [], "calls": []} for n in lists}
    got: dict[str, Any] = {}
    for p in range(req.passes):
        t1 = time.perf_counter()
        got = replay_in_order(engine, lists, st, sr, warmup, repeats, seed=cfg.seed + 1000 * (p + 1))
        for n, r in got.items():
            runs[n]["totals_ms"].append(r.measured_ms)
            runs[n]["round_totals_ms"].append(r.round_totals_ms.tolist())
            runs[n]["calls"].append(r.calls_ms)
        say(
            f"  pass {p + 1}/{req.passes} in {time.perf_counter() - t1:.1f} s: "
            + ", ".join(f"{n} {got[n].measured_ms / 1e3:.3f} s" for n in lists)
        )
    replayed = {n: int(r.replayed) for n, r in got.items()}
    engine.release()
    out = _sample_figures(req, model, lists, runs, replayed, st, tok, cal)
    calls = {n: np.concatenate(runs[n]["calls"], axis=1) for n in lists}
    tol = DEFAULT_TOLERANCE_PCT if req.tolerance_pct is None else float(req.tolerance_pct)
    trace_est = trace_figures(design, pricing, calls, lists, tol)
    out.update(
        batches=int(st.size),
        of=int(tok.size),
        every=None,
        sample=design.to_json(),
        ordered=ordered,
        passes=req.passes,
        warmup=warmup,
        repeats=repeats,
        device=session.environment.gpu_name or engine.device.type,
        torch=session.environment.torch or ("none: the simulated device" if engine.device.type == "sim" else None),
        timer=_timer(engine),
        trace=trace_est,
        trace_estimate={
            "gain_pct": trace_est["gain"]["gain_pct"],
            "half_pct": trace_est["gain"]["half_pct"],
            "sampled_batches": int(st.size),
            "trace_batches": int(tok.size),
        },
        model_rechecked=rechecked,
        recommended_capture_s=capture_s,
        recommended_graph_mem_gib=mem,
    )
    for name, est in trace_est["lists"].items():
        out["lists"][name]["trace_estimate"] = est
    return out


def _timer(engine) -> str:
    t = engine.device.type
    return "cuda events" if t == "cuda" else "simulated clock" if t == "sim" else "perf_counter"


def _capture_recommended(engine, rec: list[int], say: Say) -> tuple[float, float]:
    """The recommended list captured first, in a fresh pool: its capture time and memory."""
    from bcgtune.errors import ExternalError

    before = engine.reserved_gib()
    t0 = _now(engine)
    recs = engine.capture(rec, record_attention=False)
    capture_s = _now(engine) - t0
    mem = engine.reserved_gib() - before
    bad = [r for r in recs if not r.ok]
    if bad:
        raise ExternalError(f"capture of the recommended list failed at {bad[0].bucket} tokens: {bad[0].error}")
    say(f"  recommended list: {len(rec)} graphs captured in {capture_s:.2f} s, {mem:.3f} GiB")
    return capture_s, mem


def _now(engine) -> float:
    """Seconds on the engine's clock: the simulated device's own, else wall time."""
    if engine.device.type == "sim":
        return float(engine.device.now_s())
    return time.perf_counter()


def _sample_figures(req, model, lists, runs, replayed, st, tok, cal) -> dict[str, Any]:
    """What the proof measured on the batches it replayed, pass by pass, beside the model's
    prediction for the same batches."""
    from bcgtune.core.stats import round_interval

    latest_check = cal.model_check
    in_check = {tuple(int(b) for b in c.buckets) for c in latest_check.lists} if latest_check is not None else set()
    per_list = {}
    for n, bl in lists.items():
        pred = model.total(bl)
        meas_iv = [round_interval(c, rt) for c, rt in zip(runs[n]["totals_ms"], runs[n]["round_totals_ms"])]
        per_list[n] = {
            "buckets": bl,
            "graphs": len(bl),
            "replayed_batches": replayed[n],
            "predicted": pred.to_dict(),
            "measured": [iv.to_dict() for iv in meas_iv],
            "inside": None if pred.half is None else sum(bool(pred.contains(x)) for x in runs[n]["totals_ms"]),
            # replayed by the model check (its error measured on this list), or priced from the calibration only
            "in_model_check": tuple(int(b) for b in bl) in in_check,
        }
    rec, ladder = lists["recommended"], lists["SGLang ladder"]
    d_pred = model.difference(rec, ladder)
    d_meas = _paired(runs, "recommended", "SGLang ladder", req.passes)
    lad = runs["SGLang ladder"]["totals_ms"]
    gain = [-iv.center / max(lad[i], 1e-9) * 100.0 for i, iv in enumerate(d_meas)]
    gain_half = [None if iv.half is None else iv.half / max(lad[i], 1e-9) * 100.0 for i, iv in enumerate(d_meas)]
    ladder_pred = float(model.totals(ladder)[0])
    vs_opt = None
    if "optimum" in lists:
        opt = lists["optimum"]
        tol = DEFAULT_TOLERANCE_PCT if req.tolerance_pct is None else float(req.tolerance_pct)
        margin = tol / 100.0 * float(model.totals(opt)[0])
        o_meas = _paired(runs, "recommended", "optimum", req.passes)
        vs_opt = {
            "predicted": model.difference(rec, opt).to_dict(),
            "measured": [iv.to_dict() for iv in o_meas],
            "tolerance_pct": tol,
            "margin_ms": margin,
            # batches the two lists run differently (another bucket, or one eager): on the proof's sample and the trace
            "differing_batches": _differing(st, rec, opt),
            "differing_batches_in_trace": _differing(tok, rec, opt),
            **margin_counts(o_meas, margin),
        }
    return {
        "lists": per_list,
        "recommended_minus_ladder": {
            "predicted": d_pred.to_dict(),
            "measured": [iv.to_dict() for iv in d_meas],
            "inside": None if d_pred.half is None else sum(bool(d_pred.contains(iv.center)) for iv in d_meas),
            "measured_gain_pct": gain,
            "measured_gain_half_pct": gain_half,
            "predicted_gain_pct": -d_pred.center / ladder_pred * 100.0 if ladder_pred > 0 else None,
            "predicted_gain_half_pct": None if d_pred.half is None or ladder_pred <= 0 else d_pred.half / ladder_pred * 100.0,
            "ladder_measured_ms": float(np.mean(lad)),
        },
        "recommended_minus_optimum": vs_opt,
    }


def _differing(tokens: np.ndarray, a: list[int], b: list[int]) -> int:
    """How many of these batches two lists run differently: in another bucket, or one of
    them eager (SGLang's lookup, core.sglang.replay.assign_buckets)."""
    from bcgtune.core.sglang.replay import assign_buckets

    ba, ra = assign_buckets(tokens, a)
    bb, rb = assign_buckets(tokens, b)
    return int(np.count_nonzero(np.where(ra, ba, 0) != np.where(rb, bb, 0)))


def margin_counts(measured, margin_ms: float) -> dict[str, int]:
    """How many passes put the recommended list within the margin of the optimum.
    `within_margin`: the measured difference itself is at most the margin.
    `not_beyond_margin`: the pass's 95% interval of the difference reaches down to the margin,
    that is the pass gives no evidence that the recommended list is slower than the optimum
    by more than the margin (a pass without an interval counts by its value alone)."""
    within = sum(iv.center <= margin_ms for iv in measured)
    not_beyond = sum(iv.center - (iv.half or 0.0) <= margin_ms for iv in measured)
    return {"within_margin": int(within), "not_beyond_margin": int(not_beyond)}


def _paired(runs, a: str, b: str, passes: int):
    """Each pass's a - b, paired round by round."""
    from bcgtune.core.stats import round_interval

    out = []
    for p in range(passes):
        ra = np.asarray(runs[a]["round_totals_ms"][p])
        rb = np.asarray(runs[b]["round_totals_ms"][p])
        out.append(round_interval(runs[a]["totals_ms"][p] - runs[b]["totals_ms"][p], ra - rb))
    return out
