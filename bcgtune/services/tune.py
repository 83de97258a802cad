"""`bcgtune tune`: the whole GPU loop in one pipeline, each step resumable from a state
folder, the whole within a time budget.

    0. plan        a few forwards timed, then what each step measures picked to fit the
                   budget, each step's seconds predicted (services/tune_plan.py); planned
                   again before each later step with what is left
    1. calibrate   the trace's sizes on a bucket grid, with the model check (services/calibrate.py)
    2. optimum     the time objective's list (services/suggest.py, the same plan as suggest-buckets)
    3. measure     the sizes the optimizer wants but the calibration lacks, measured into it
                   (calibrate --extend's arithmetic), then the optimum again; at most
                   `measure_rounds` rounds, until the list holds only measured sizes
    4. validate    the recommended list, replay against eager with side inputs (services/validate.py)
    5. proof       the recommended list, SGLang's ladder and eager replayed on the trace (whole,
                   or a stratified sample of it) in trace order, in interleaved rounds, `passes`
                   independent times (services/tune_proof.py): measured totals on what was
                   replayed beside the predicted ones, and the whole trace's totals, differences
                   and gain estimated from them with intervals that hold the sampling error

The state folder holds `state.json` (which steps are done, with their figures) and
`calibration.json`; both are written atomically after each step, so a tune that is killed
resumes from the last finished step and never measures again what it has. A state of
another trace, model or engine is refused rather than mixed in.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bcgtune.core.plan.measure_defaults import CPU_TUNE_ROUNDS, DEFAULT_CHECK_BATCHES
from bcgtune.engines.spec import EngineSpec
from bcgtune.errors import CheckFailed, InputError
from bcgtune.files.folder_lock import hold_folder
from bcgtune.files.trace_file import MAX_TRACE_BYTES
from bcgtune.services.tune_proof import _differing, margin_counts  # noqa: F401  (the proof's, named here too)

TUNE_KIND = "bcgtune.tune"
STATE_KIND = "bcgtune.tune-state"
STATE_VERSION = 1
STEPS = ("plan", "calibrate", "optimum", "measure", "validate", "proof")
DEFAULT_MEASURE_ROUNDS = 3
Say = Callable[[str], None]

# This process, as the state names it: the model check's error is a property of the process
# that measured it (its clocks, its allocator, its kernels' choices), so a proof run in
# another process (a resumed tune) checks the model again before it predicts a total.
_PROCESS = uuid.uuid4().hex


@dataclass
class TuneRequest:
    """What to tune: a trace file, the engine (model, runner, device ...), an optional launch
    profile the list is priced for, and how much to measure."""

    trace: str
    spec: EngineSpec
    state_dir: str
    profile: Any = None  # files.profile_file.Profile
    # what the steps measure: None is planned to fit the budget (services/tune_plan.py)
    grid: int | None = None
    mix_every: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    memory: bool | None = None
    check_batches: int | None = None
    max_buckets: int = 12
    measure_rounds: int = DEFAULT_MEASURE_ROUNDS
    proof_batches: int | None = None
    passes: int = 1
    proof_warmup: int | None = None
    proof_repeats: int | None = None
    tolerance_pct: float | None = None
    buckets: list[int] | None = None  # a list to tune instead of the optimizer's (measure, validate, prove it)
    budget_s: float | None = None  # device seconds for the whole tune; None: tune_plan.default_budget
    # False: the validate step is recorded as not run (for a harness that studies the timings
    # alone, such as benchmarks/tune_coverage.py); the command line always validates
    validate: bool = True


@dataclass
class TuneResult:
    """Every step's figures (as the state holds them) and the list."""

    state: dict[str, Any]
    state_dir: str
    resumed: list[str] = field(default_factory=list)  # steps taken from the state, not run

    @property
    def steps(self) -> dict[str, Any]:
        return self.state["steps"]

    @property
    def buckets(self) -> list[int]:
        return list(self.steps["measure"]["recommended"]["buckets"])  # after the sizes it wanted were measured

    @property
    def flag(self) -> str:
        return "--cuda-graph-bs-prefill " + " ".join(map(str, self.buckets))

    @property
    def budget(self) -> dict[str, Any]:
        """The budget (device seconds), the plan's total and what the steps spent."""
        plan = self.state.get("plan") or {}
        first = self.state.get("first_plan_s")
        return {
            "limit_s": plan.get("limit_s"),
            "predicted_s": first,
            "spent_s": round(sum(float(st.get("spent_s") or 0.0) for st in self.steps.values()), 3),
            "clock": (self.steps.get("plan") or {}).get("cost", {}).get("clock"),
            "notes": list(plan.get("notes") or []),
        }

    def to_json(self) -> dict[str, Any]:
        from bcgtune.core.document import document_header

        return {
            **document_header(TUNE_KIND),
            "buckets": self.buckets,
            "flag": self.flag if self.buckets else None,
            "state_dir": self.state_dir,
            "resumed": self.resumed,
            "trace": self.state["trace"],
            "engine": self.state["engine"],
            "profile": (self.state.get("plan_settings") or {}).get("profile"),
            "budget": self.budget,
            "plan": self.state.get("plan"),
            "steps": self.steps,
        }


# ---------------------------------------------------------------------------------------
# the state on disk
# ---------------------------------------------------------------------------------------
# The files of a state folder: the state, the calibration its steps rest on, and (with --log)
# the logs' trace
STATE_FILE, CALIBRATION_FILE, TRACE_FILE = "state.json", "calibration.json", "trace.json"
# a trace given on standard input or a pipe, kept (a resumed tune compares its bytes); the lock that
# keeps a second tune out of the folder while one works in it (files/folder_lock.py)
STDIN_TRACE_FILE, LOCK_FILE = "trace-from-stdin", ".tune.lock"
STATE_FILES = (STATE_FILE, CALIBRATION_FILE, TRACE_FILE, STDIN_TRACE_FILE, LOCK_FILE)
STATE_MAX_BYTES = 64 << 20  # a state holds each step's figures: tens of kB


def _one_tune_at_a_time(folder_of: Callable[..., str]) -> Callable:
    """The decorated function holds the tune's state folder: another tune there is refused,
    naming the one that works in it."""
    return hold_folder(folder_of, LOCK_FILE, "tune state folder")


def _paths(state_dir: str | Path) -> tuple[Path, Path]:
    d = Path(state_dir)
    return d / STATE_FILE, d / CALIBRATION_FILE


def _identity(req: TuneRequest, trace_sha: str) -> dict[str, Any]:
    """What a state must agree on to be resumed: the trace's bytes, the engine, the launch."""
    spec = dataclasses.asdict(req.spec)
    return {
        "trace": {"path": req.trace, "sha256": trace_sha},
        "engine": spec,
        "settings": {"grid": req.grid, "mix_every": req.mix_every, "check_batches": req.check_batches},
        "plan_settings": _plan_settings(req),
    }


def _plan_settings(req: TuneRequest) -> dict[str, Any]:
    """What the steps after the calibration depend on: another value re-runs them on the
    same calibration."""
    return {
        "profile": None if req.profile is None else {"name": req.profile.name, "where": req.profile.where},
        "max_buckets": req.max_buckets,
        "tolerance_pct": req.tolerance_pct,
        "list": req.buckets,
        "measure_rounds": req.measure_rounds,
        "proof_batches": req.proof_batches,
        "passes": req.passes,
        "proof_repeats": req.proof_repeats,
        "budget_s": req.budget_s,
        "validate": req.validate,
    }


def _load_state(path: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The state of an earlier run of the same tune, or None when the folder holds none; a
    state of another tune is refused (its measurements describe another trace or engine)."""
    from bcgtune.fileio import parse_json, read_input

    if not path.exists():
        return None
    where = str(path)
    if path.is_dir():
        raise InputError("is a folder, not a tune state", where)
    obj = parse_json(read_input(where, "tune state", limit=STATE_MAX_BYTES).decode("utf-8", errors="replace"), where)
    if not isinstance(obj, dict) or obj.get("kind") != STATE_KIND or obj.get("format_version") != STATE_VERSION:
        raise InputError("not a bcgtune tune state (kind bcgtune.tune-state, format 1)", where)
    for key in ("trace", "engine", "settings"):
        was, now = obj.get(key), ident[key]
        if key == "trace":
            was = (was or {}).get("sha256") if isinstance(was, dict) else None
            now = now["sha256"]
        if was != now:
            raise InputError(
                f"this state folder holds a tune of {_WHAT[key]} ({_short(was)} there, {_short(now)} now): "
                "give another --state-dir, or remove this one to start again",
                where,
            )
    if "seal" in obj and obj["seal"] != _seal(obj):
        raise InputError(
            "changed since bcgtune wrote it (its content does not match its seal): remove it to run the steps again "
            "(a calibration.json beside it is kept), or give another --state-dir",
            where,
        )
    if not isinstance(obj.get("steps"), dict):
        raise InputError("tune state has no steps table", where)
    recorded = obj.get("calibration_sha256")
    # killed between a step's new calibration and its state: the calibration is taken as found (and recorded
    # when the state is next written)
    pending = obj.pop("calibration_pending", False)
    if recorded is not None and obj["steps"] and not pending:
        from bcgtune.fileio import sha256_file

        cal = _paths(path.parent)[1]
        if not cal.is_file():
            raise InputError(
                "its calibration.json is gone: remove this state.json too to start again, or give another --state-dir",
                where,
            )
        if sha256_file(str(cal)) != recorded:
            raise InputError(
                "its calibration.json changed since this tune recorded it: remove this state.json to run the steps "
                "again on the changed calibration (it is kept), or give another --state-dir",
                where,
            )
    if obj.get("plan_settings") != ident["plan_settings"]:
        # the same calibration, other settings for what follows it: those steps run again
        obj["steps"] = {k: v for k, v in obj["steps"].items() if k in ("plan", "calibrate")}
        obj["plan_settings"] = ident["plan_settings"]
        obj["replanned"] = True
    return obj


_WHAT = {"trace": "another trace", "engine": "another engine", "settings": "other calibration settings"}


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _seal(state: dict[str, Any]) -> str:
    """The sha256 of a state's content (all but its seal): a state edited by hand, or
    damaged, no longer matches it, and its kept figures are refused instead of used."""
    import hashlib
    import json

    body = json.loads(json.dumps({k: v for k, v in state.items() if k != "seal"}))  # as read back (str keys, lists)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _write_calibration(cal, cal_path: Path, state: dict[str, Any]) -> None:
    """A step's new calibration written beside a state that expects it: a tune killed
    between the two writes leaves `calibration_pending`, and its resume takes the
    calibration as it finds it instead of calling it changed by hand."""
    from bcgtune.files.calibration_file import save_calibration

    state_path = _paths(cal_path.parent)[0]
    state["calibration_pending"] = True
    _save_state(state_path, state)
    save_calibration(cal, cal_path)
    state.pop("calibration_pending")
    _save_state(state_path, state)


def _save_state(path: Path, state: dict[str, Any]) -> None:
    from bcgtune.fileio import atomic_write_json, sha256_file

    cal = _paths(path.parent)[1]  # what the kept steps were computed from
    state["calibration_sha256"] = sha256_file(str(cal)) if cal.is_file() else None
    state["seal"] = _seal(state)
    atomic_write_json(path, state)


# ---------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------
@_one_tune_at_a_time(lambda logs, state_dir, **k: state_dir)
def trace_of_logs(
    logs: list[str],
    state_dir: str,
    *,
    group: int | None = None,
    launch: dict[str, Any] | None = None,
    mixed_chunk: bool = False,
    say: Say | None = None,
) -> str:
    """The trace of SGLang server logs (as `bcgtune trace --log LOGS [--group N]` makes it),
    kept as trace.json in the state folder, and its path. A resumed tune parses the logs
    again and keeps the file when the trace is the same (its creation time aside), so the
    state still knows it; logs that changed make another trace, which the state refuses."""
    import re

    from bcgtune.fileio import atomic_write_text
    from bcgtune.files.trace_file import json_text_chunks
    from bcgtune.services.trace import trace_logs

    say = say or (lambda m: None)
    trace = trace_logs(logs, mixed_chunk=mixed_chunk, launch=launch, group=group)
    if len(trace.groups) > 1:
        raise InputError(
            f"the logs hold {len(trace.groups)} server configurations ({trace.describe_groups()}): "
            "give --group N to tune one of them",
            "--log",
        )
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    path = Path(state_dir) / TRACE_FILE
    text = "".join(json_text_chunks(trace))
    undated = re.compile(r'"created":"[^"]*"')
    if path.is_file() and undated.sub("", path.read_text(errors="replace"), 1) == undated.sub("", text, 1):
        say(f"the logs' trace: {trace.n_batches:,} batches, the same as {path} holds (kept)")
    else:
        atomic_write_text(path, text)
        say(f"the logs' trace: {trace.n_batches:,} batches, written to {path}")
    return str(path)


def check_fit(req: TuneRequest):
    """The trace, read and checked against the model and the chunk before anything runs:
    a trace that is empty, larger than the chunk or the model's context is refused."""
    from bcgtune.engines.preflight import check_run, model_shape
    from bcgtune.files.trace_file import load_trace

    trace = load_trace(req.trace)
    trace.validate(req.trace)
    if trace.n_batches == 0:
        raise InputError("the trace holds no prefill batches", req.trace)
    if len(trace.groups) > 1:
        raise InputError(
            f"the trace mixes {len(trace.groups)} server configurations ({trace.describe_groups()}): tune one at a time "
            "(`bcgtune trace --log LOGS --group N -o one.json` writes configuration N's trace on its own)",
            req.trace,
        )
    chunk, largest = trace.chunked_prefill_size(), int(trace.sizes[-1])
    if chunk is not None and 0 < chunk < largest:  # the logs contradict themselves: no launch forms such batches
        raise InputError(
            f"the trace's batches reach {largest:,} tokens, above the chunk its server logged ({chunk:,})", req.trace
        )
    model_shape(req.spec.model)  # an unknown model is the model's error, not the trace's
    try:
        check_run(req.spec, trace.sizes.tolist(), what="trace batch")
    except InputError as exc:
        raise InputError(f"the trace does not fit this model and launch: {exc.what}", req.trace) from None
    return trace


@_one_tune_at_a_time(lambda req, *a, **k: req.state_dir)
def tune(req: TuneRequest, say: Say | None = None) -> TuneResult:
    """Run (or resume) every step; returns the figures. A failed validation stops the tune
    (CheckFailed) with the state kept. A trace on stdin (`-`) or a pipe is kept in the state
    folder (it is read more than once)."""
    from bcgtune.fileio import keep_input, path_kind, sha256_file

    say = say or (lambda m: None)
    if req.trace == "-" or path_kind(req.trace) == "other":
        req = dataclasses.replace(
            req, trace=keep_input(req.trace, Path(req.state_dir) / STDIN_TRACE_FILE, "trace", MAX_TRACE_BYTES)
        )
    trace = check_fit(req)
    state_path, cal_path = _paths(req.state_dir)
    Path(req.state_dir).mkdir(parents=True, exist_ok=True)
    ident = _identity(req, sha256_file(req.trace))
    state = _load_state(state_path, ident)
    resumed: list[str] = []
    if state is not None and state.pop("replanned", False):
        say(f"other settings than {state_path} was made with: the calibration is kept, the steps after it run again")
    if state is None:
        state = {"kind": STATE_KIND, "format_version": STATE_VERSION, **ident, "steps": {}}
    _save_state(state_path, state)  # new, or as loaded: the calibration it now rests on recorded, and sealed
    steps = state["steps"]
    from bcgtune.services.tune_plan import clock_of

    clock = clock_of(req.spec)
    for name in STEPS:
        if name in steps and steps[name].get("done"):
            resumed.append(name)
            say(f"[{name}] done in an earlier run ({steps[name].get('wall_s', 0):.1f} s): kept from {state_path}")
            continue
        if name != "plan":
            _replan(name, req, trace, state, cal_path, say)
        predicted = (state.get("plan") or {}).get("predicted", {}).get(name)
        t0, c0 = time.perf_counter(), clock()
        say(f"[{name}] started" + (f" (predicted {predicted:.1f} s)" if predicted is not None else ""))
        out = _STEP_FUNCS[name](req, trace, state, cal_path, say)
        out["done"] = out.get("ok") is not False  # a failed validation is run again next time, never skipped
        out["wall_s"] = round(time.perf_counter() - t0 + float(out.get("wall_s", 0.0)), 3)
        out["spent_s"] = round(clock() - c0 + float(out.get("spent_s", 0.0)), 3)
        out["predicted_s"] = None if predicted is None else round(float(predicted), 3)
        steps[name] = out
        _save_state(state_path, state)
        say(f"[{name}] done in {out['spent_s']:.1f} s" + (f" of device time ({out['wall_s']:.1f} s wall)" if _sim(req) else ""))
        if name == "validate" and out.get("ok") is False:
            raise CheckFailed("validation failed: " + "; ".join(out.get("problems") or ["see the state's validate step"]))
    return TuneResult(state, req.state_dir, resumed)


def on_cpu(spec: EngineSpec) -> bool:
    """Does the run go to the CPU (a dry run of the pipeline, whose times describe no GPU)?
    The simulated device is a GPU for this purpose."""
    from bcgtune.engines.spec import is_simulated

    if is_simulated(spec):
        return False
    from bcgtune.engines.runtime import resolve_device

    return resolve_device(spec.device).type == "cpu"


def _step_calibrate(req: TuneRequest, trace, state, cal_path: Path, say: Say) -> dict[str, Any]:
    from bcgtune.files.calibration_file import save_calibration
    from bcgtune.services import calibrate

    if cal_path.exists():
        # written by a run that stopped before it recorded the step: its measurements are kept
        from bcgtune.files.calibration_file import load_calibration

        say(f"  {cal_path} was written by an earlier run: kept, not measured again")
        return _calibration_figures(load_calibration(str(cal_path)), cal_path)
    tp = _plan(state)
    plan = calibrate.calibration_sizes(None, req.spec.chunked_prefill_size, tp.grid, req.trace, mix_every=tp.mix_every)
    result = calibrate.calibrate(
        plan,
        req.spec,
        warmup=tp.warmup,
        repeats=tp.repeats,
        memory=tp.memory,
        progress=lambda m: say("  " + m),
        model_check=True,
        check_batches=tp.check_batches,
        check_eager=True,  # the proof judges eager too: its error is measured, not borrowed
    )
    save_calibration(result.calibration, cal_path)
    state["model_checked_in"] = _PROCESS
    return _calibration_figures(result.calibration, cal_path)


def _calibration_figures(cal, cal_path: Path) -> dict[str, Any]:
    mc = cal.model_check
    return {
        "file": str(cal_path),
        "sizes": len(cal.tokens),
        "batches": int(cal.batches.tokens.size) if cal.batches is not None else None,
        "rounds": cal.rounds,
        "device": (cal.meta.get("gpu") or {}).get("gpu_name") or "cpu",
        "model_check": None if mc is None else mc.to_json() | {"summary": mc.summary()},
    }


def _suggest(req: TuneRequest, trace, cal_path: Path):
    from bcgtune.files.calibration_file import load_calibration
    from bcgtune.services.suggest import SuggestRequest, suggest

    cal = load_calibration(str(cal_path))
    res = suggest(
        SuggestRequest(
            trace=trace,
            objective="time",
            calibration=cal,
            max_buckets=req.max_buckets,
            profile=req.profile,
            chunked_prefill_size=req.spec.chunked_prefill_size if req.profile is None else None,
            tolerance_pct=req.tolerance_pct,
            baselines=False,
            compare=[] if req.buckets is None else [(GIVEN, list(req.buckets))],
        )
    )
    if res.plan is None:
        raise InputError(f"this launch captures no prefill graphs ({res.capture.reason}): nothing to tune")
    return res, cal


GIVEN = "the list given (--list)"


def _row(row) -> dict[str, Any]:
    iv = row.interval
    return {
        "name": row.name,
        "buckets": list(row.buckets),
        "graphs": len(row.buckets),
        "predicted_ms": row.predicted_ms,
        "predicted_half_ms": None if iv is None else iv.half,
        "model_half_ms": None if iv is None else iv.model_half,
        "graph_mem_gib": row.graph_mem_gib,
        "capture_s": row.capture_s,
        "replayed_batches": row.metrics.replayed_batches,
        "batches": row.metrics.batches,
    }


def _chosen(plan, given: bool):
    """The row the tune carries on: the recommended list, or the list given (--list)."""
    if given:
        return next(r for r in plan.rows if r.name == GIVEN)
    return plan.recommended


def _ladder_row(plan):
    """The plan's row of SGLang's default ladder (every time plan has one)."""
    return next(r for r in plan.rows if r.kind == "sglang-default")


def _plan_figures(res, given: bool = False) -> dict[str, Any]:
    plan = res.plan
    ladder = _ladder_row(plan)
    eager = next((r for r in plan.rows if r.kind == "eager"), None)
    chosen = _chosen(plan, given)
    d = plan.model.difference(chosen.buckets, ladder.buckets)
    return {
        "recommended": _row(chosen),
        "given": given,
        "optimizer_recommended": _row(plan.recommended),
        "optimal": _row(plan.optimal or plan.rows[0]),
        "ladder": _row(ladder),
        "eager": None if eager is None else _row(eager),
        "reason": plan.recommended_reason,
        "recommended_minus_ladder": d.to_dict(),
        "unmeasured_wanted": list(chosen.unmeasured) if given else ([] if plan.refine is None else list(plan.refine.sizes)),
        "model_check": plan.model_check_json(),
        "launch_flags": {k: v for k, v in res.server_flags.items()},
    }


def _step_optimum(req: TuneRequest, trace, state, cal_path: Path, say: Say) -> dict[str, Any]:
    res, _ = _suggest(req, trace, cal_path)
    out = _plan_figures(res, req.buckets is not None)
    rec = out["recommended"]
    say(f"  time optimum: {out['optimal']['buckets']}; recommended {rec['graphs']} graphs: {rec['buckets']}")
    if out["unmeasured_wanted"]:
        say(f"  the optimizer also wants sizes the calibration did not measure: {out['unmeasured_wanted']}")
    return out


def _step_measure(req: TuneRequest, trace, state, cal_path: Path, say: Say) -> dict[str, Any]:
    """Measure what the optimizer wants until the list holds only measured sizes (or the
    rounds run out); each round's extension is saved, and recorded, before the next."""
    from bcgtune.services import calibrate

    steps = state["steps"]
    refused = None
    partial = steps.get("measure") or {"rounds": []}
    rounds: list[dict[str, Any]] = partial["rounds"]
    given = req.buckets is not None
    res, _ = _suggest(req, trace, cal_path)

    def wanted() -> list[int]:
        if given:  # the given list's own buckets that the calibration did not measure
            return list(_chosen(res.plan, True).unmeasured)
        return [] if res.plan.refine is None else list(res.plan.refine.sizes)

    while wanted() and len(rounds) < _plan(state).measure_rounds:
        sizes = wanted()
        if rounds and not _round_fits(req, trace, state, cal_path, sizes, say):
            refused = "the budget: another round and the steps after it are predicted beyond it"
            break
        say(f"  round {len(rounds) + 1}/{req.measure_rounds}: measuring {sizes}")
        t0 = time.perf_counter()
        try:
            ext = calibrate.extend(str(cal_path), sizes, progress=lambda m: say("    " + m))
        except InputError as exc:
            # e.g. the rows timed again moved beyond what one scale can put right: the sizes
            # stay unmeasured, and the list keeps to measured ones
            refused = f"measuring {sizes} refused: {exc}"
            say("  " + refused)
            break
        _write_calibration(ext.calibration, cal_path, state)
        rounds.append(
            {
                "sizes": ext.added,
                "anchors": ext.anchors,
                "scale_graph": ext.scale_graph,
                "wall_s": round(time.perf_counter() - t0, 3),
            }
        )
        steps["measure"] = {"rounds": rounds, "done": False}
        _save_state(_paths(req.state_dir)[0], state)
        res, _ = _suggest(req, trace, cal_path)
    rechecked = None
    if rounds:
        res, rechecked = _recheck(req, trace, res, cal_path, given, say, state)
    left = wanted()
    out = _plan_figures(res, given)
    out.update(
        rounds=rounds, max_rounds=_plan(state).measure_rounds, measured_only=not left, still_unmeasured=left, refused=refused
    )
    out["model_rechecked"] = rechecked
    say(
        f"  {len(rounds)} of at most {_plan(state).measure_rounds} measuring rounds; "
        + ("the list holds only measured sizes" if not left else f"sizes still wanted and unmeasured: {left}")
        + f"; recommended {out['recommended']['buckets']}"
    )
    return out


def _recheck(req: TuneRequest, trace, res, cal_path: Path, given: bool, say: Say, state: dict[str, Any]):
    """After sizes were added, replay the trace's sample again under SGLang's ladder and the
    list now recommended, and keep that model check in the calibration: an added size that
    the optimizer picked was picked because its rounds came out fast, so the check made
    before it was measured says nothing about the list that holds it. The plan is priced
    again with the new check's model error."""
    plan = res.plan
    ladder = _ladder_row(plan)
    chosen = list(_chosen(plan, given).buckets)
    lists = {"SGLang ladder": list(ladder.buckets), "recommended": chosen}
    say(f"  the model checked again on the list now recommended ({len(chosen)} graphs), SGLang's ladder and eager")
    figures = _check_model_here(req, trace, cal_path, lists, say, state)
    res, _ = _suggest(req, trace, cal_path)
    return res, figures


def _check_model_here(req: TuneRequest, trace, cal_path: Path, lists: dict[str, list[int]], say: Say, state):
    """Replay the trace's sample under `lists` and eager in this process and keep that model
    check in the calibration (services/calibrate.recheck_model); the state records the
    process. Eager is replayed because the proof judges it too: its error is its own."""
    from bcgtune.files.calibration_file import load_calibration
    from bcgtune.services import calibrate

    check = calibrate.recheck_model(
        str(cal_path), trace, lists, _plan(state).check_batches or DEFAULT_CHECK_BATCHES, progress=lambda m: say("    " + m),
        eager=True,
    )  # fmt: skip
    cal = load_calibration(str(cal_path))
    cal.model_check = check
    _write_calibration(cal, cal_path, state)
    state["model_checked_in"] = _PROCESS
    return check.to_json() | {"summary": check.summary()}


def _step_validate(req: TuneRequest, trace, state, cal_path: Path, say: Say) -> dict[str, Any]:
    from bcgtune.services.validate import run_validate

    buckets = state["steps"]["measure"]["recommended"]["buckets"]
    if not req.validate:
        say("  not run: the caller asked for no validation (its replay against eager is not checked)")
        return {"ok": None, "buckets": buckets, "batches_checked": 0, "note": "not run (the caller asked for none)"}
    if not buckets:
        say("  the recommended list has no graphs: nothing to validate")
        return {"ok": True, "buckets": [], "batches_checked": 0, "note": "no graphs: prefill runs eager"}
    rep = run_validate(
        buckets, req.spec, sizes_per_bucket=2, progress=lambda e: say(f"  bucket {e.bucket}: {'ok' if e.ok else 'FAIL'}")
    )
    return {
        "ok": rep.ok,
        "buckets": rep.buckets,
        "batches_checked": rep.batches_checked,
        "bitwise_batches": rep.bitwise_batches,
        "side_inputs": list(rep.side_inputs),
        "failed_buckets": rep.failed_buckets,
        "problems": rep.problems(),
        "image_sweep": rep.image_sweep is not None,
    }


def _step_proof(req: TuneRequest, trace, state, cal_path: Path, say: Say) -> dict[str, Any]:
    """The proof run (services/tune_proof.py): the recommended list, SGLang's ladder and eager
    (and the exact optimum, when the recommended list has fewer graphs: it must measure within
    the margin of it) replayed on the trace, whole or a stratified sample of it, in trace
    order, in interleaved rounds, `passes` times; the whole trace's figures estimated from it."""
    from bcgtune.services.tune_proof import proof_lists, run_proof

    lists = proof_lists(state["steps"]["measure"])
    rec, ladder, opt = lists["recommended"], lists["SGLang ladder"], lists.get("optimum", lists["recommended"])
    rechecked = None
    if state.get("model_checked_in") != _PROCESS:
        # a resumed tune: the model's error was measured by another process, and a level
        # shift between processes (about 1.5% on an H200, every list alike) is not in it
        say("  the model check ran in an earlier process: checked again in this one, whose totals are predicted")
        check_lists = {"SGLang ladder": ladder} | ({"recommended": rec} if rec else {"optimum": opt} if opt else {})
        rechecked = _check_model_here(req, trace, cal_path, check_lists, say, state)
        _save_state(_paths(req.state_dir)[0], state)
    tp = _plan(state)
    budget = tp.proof_batches if tp.proof_batches is not None else trace.n_batches
    return run_proof(req, trace, str(cal_path), lists, budget, say, rechecked, (tp.proof_warmup, tp.proof_repeats))


# ---------------------------------------------------------------------------------------
# the budget: the plan, and the plan again before each later step
# ---------------------------------------------------------------------------------------
def _sim(req: TuneRequest) -> bool:
    from bcgtune.engines.spec import is_simulated

    return is_simulated(req.spec)


def _plan(state: dict[str, Any]):
    from bcgtune.services.tune_plan import TunePlan

    return TunePlan.from_json(state["plan"])


def _gpu_like(req: TuneRequest) -> bool:
    """A GPU or the simulated one (graphs captured; the GPU's budget)."""
    return not on_cpu(req.spec)


def _step_plan(req: TuneRequest, trace, state: dict[str, Any], say: Say) -> dict[str, Any]:
    """Time a few forwards, then plan every step to fit the budget (services/tune_plan.py)."""
    from bcgtune.services import tune_plan

    gpu = _gpu_like(req)
    limit = float(req.budget_s) if req.budget_s is not None else tune_plan.default_budget(gpu)
    view = tune_plan.TracePlanView.of(trace, req.spec.chunked_prefill_size, req.spec.seed)
    clock = tune_plan.clock_of(req.spec)
    c0 = clock()
    cost = tune_plan.probe(req.spec, view.tokens, say)
    probe_s = clock() - c0
    plan = tune_plan.initial_plan(_cpu_rounds(req), cost, view, limit, probe_s, gpu)
    state["plan"] = plan.to_json()
    state["first_plan_s"] = round(sum(plan.predicted.values()), 3)
    say("  " + plan.describe(int(view.tokens.size)))
    for n in plan.notes:
        say("  note: " + n)
    return {"cost": cost.to_json(), "limit_s": limit}


def _cpu_rounds(req: TuneRequest) -> TuneRequest:
    """On the CPU (a dry run of the pipeline) the rounds are the dry run's unless given."""
    if _gpu_like(req):
        return req
    from bcgtune.services.tune_proof import PROOF_ROUNDS_CPU

    return dataclasses.replace(
        req,
        warmup=CPU_TUNE_ROUNDS[0] if req.warmup is None else req.warmup,
        repeats=CPU_TUNE_ROUNDS[1] if req.repeats is None else req.repeats,
        proof_warmup=PROOF_ROUNDS_CPU[0] if req.proof_warmup is None else req.proof_warmup,
        proof_repeats=PROOF_ROUNDS_CPU[1] if req.proof_repeats is None else req.proof_repeats,
    )


def _cost(state: dict[str, Any]):
    from bcgtune.services.tune_plan import CostModel

    return CostModel.from_json(state["steps"]["plan"]["cost"])


def _spent(state: dict[str, Any]) -> float:
    return sum(float(st.get("spent_s") or 0.0) for st in state["steps"].values())


def _replan(name: str, req: TuneRequest, trace, state: dict[str, Any], cal_path: Path, say: Say) -> None:
    """Before a step: its prediction, and the steps after it fitted to what is left, from the
    calibration once there is one."""
    if name in ("calibrate", "optimum") or "calibrate" not in state["steps"]:
        return
    tp = _plan(state)
    if name == "measure":
        tp.predicted["measure"] = _predict_measure(req, trace, state, cal_path)
    if name in ("measure", "validate"):
        buckets = (state["steps"].get("measure") or state["steps"]["optimum"])["recommended"]["buckets"]
        from bcgtune.services.tune_plan import predict_validate

        tp.predicted["validate"] = predict_validate(_cost(state), list(buckets), _gpu_like(req)) if req.validate else 0.0
    if name in ("validate", "proof"):
        _fit_proof(req, trace, state, cal_path, tp, name, say)
    state["plan"] = tp.to_json()


def _fit_proof(req: TuneRequest, trace, state, cal_path: Path, tp, name: str, say: Say) -> None:
    """The proof's batches and rounds: the richest that fit what is left of the budget."""
    from bcgtune.core.plan.model_check import trace_sequence
    from bcgtune.files.calibration_file import load_calibration
    from bcgtune.services.tune_plan import PLAN_TARGET, proof_fit
    from bcgtune.services.tune_proof import TracePricing, proof_lists

    if "measure" not in state["steps"]:
        return
    lists = proof_lists(state["steps"]["measure"])
    tok, rq, _ = trace_sequence(trace, seed=req.spec.seed)
    if req.spec.runner == "full":
        rq = np.ones_like(rq)
    pricing = TracePricing(load_calibration(str(cal_path)), tok, rq, lists)
    ahead = 0.0 if name == "proof" else float(tp.predicted.get("validate", 0.0))
    left = tp.limit_s * PLAN_TARGET - _spent(state) - ahead
    again = 0.0
    if state.get("model_checked_in") != _PROCESS:  # the model checked again in this process first
        again = _check_seconds(req, trace, state, cal_path, lists["recommended"], [])
    fit = proof_fit(_cost(state), pricing, tok, lists, _cpu_rounds(req), left - again, _gpu_like(req), req.spec.seed)
    (batches, rounds, _design, seconds), fits = fit
    seconds += again
    tp.proof_batches, (tp.proof_warmup, tp.proof_repeats) = batches, rounds
    tp.predicted["proof"] = seconds
    if not fits and name == "proof":
        say(f"  note: the leanest proof is predicted {seconds:.0f} s, beyond the {max(left, 0):.0f} s left of the budget")


def _predict_measure(req: TuneRequest, trace, state, cal_path: Path) -> float:
    """The measuring step: its first round (the sizes the optimum wants, with their anchors)
    and the model check again (ladder, list, eager on the check's batches)."""
    wanted = list(state["steps"]["optimum"].get("unmeasured_wanted") or [])
    if not wanted or _plan(state).measure_rounds <= 0:
        return 0.0
    from bcgtune.services.tune_plan import EXTRA_ROUNDS

    rec = state["steps"]["optimum"]["recommended"]["buckets"]
    first = _round_seconds(req, trace, state, cal_path, wanted, rec)
    check = _check_seconds(req, trace, state, cal_path, list(rec), wanted)
    return first + (first - check) * EXTRA_ROUNDS * (_plan(state).measure_rounds - 1)


def _round_seconds(req: TuneRequest, trace, state, cal_path: Path, sizes: list[int], rec: list[int]) -> float:
    from bcgtune.core.plan.calibration_extend import extension_anchors
    from bcgtune.files.calibration_file import load_calibration

    cost, gpu = _cost(state), _gpu_like(req)
    cal = load_calibration(str(cal_path))
    measure = np.asarray(sorted(set(sizes) | set(extension_anchors(cal, sizes))), dtype=np.int64)
    warmup = _cal_warmup(cal)
    timed = (warmup + cal.rounds) * float(np.asarray(cal.graph_time(measure)).sum()) / 1e3
    seconds = cost.build_s + timed + (float(cost.capture(measure).sum()) if gpu else 0.0)
    return seconds + _check_seconds(req, trace, state, cal_path, list(rec), list(sizes))


def _cal_warmup(cal) -> int:
    first = cal.sessions[0] if cal.sessions else {}
    w = first.get("warmup")
    return w if isinstance(w, int) else 3


def _check_seconds(req: TuneRequest, trace, state, cal_path: Path, rec: list[int], more: list[int]) -> float:
    """A model check again (services/calibrate.recheck_model): a build, the ladder's and the
    list's graphs captured, the ladder, the list and eager on the check's batches."""
    from bcgtune.core.plan.model_check import sample_every, trace_sequence
    from bcgtune.files.calibration_file import load_calibration
    from bcgtune.services.tune_plan import predict_check
    from bcgtune.services.tune_proof import TracePricing

    cal = load_calibration(str(cal_path))
    tok, rq, _ = trace_sequence(trace, seed=req.spec.seed)
    every = sample_every(tok.size, _plan(state).check_batches or DEFAULT_CHECK_BATCHES)
    st, sr = tok[::every], rq[::every]
    ladder = state["steps"]["optimum"]["ladder"]["buckets"]
    pricing = TracePricing(cal, st, sr, {"ladder": ladder, "rec": sorted(set(rec) | set(more)), "eager": []})
    rows = np.sum(np.stack([pricing.time[k] for k in pricing.time]), axis=0)
    used = np.unique(np.concatenate([pricing.chosen[k] for k in ("ladder", "rec")]))
    cost = _cost(state)
    return cost.build_s + predict_check(cost, rows, (_cal_warmup(cal), cal.rounds), used[used > 0], _gpu_like(req))


def _round_fits(req: TuneRequest, trace, state, cal_path: Path, sizes: list[int], say: Say) -> bool:
    """Another measuring round only while it, validation and the leanest proof fit the budget."""
    tp = _plan(state)
    rec = state["steps"]["optimum"]["recommended"]["buckets"]
    need = _round_seconds(req, trace, state, cal_path, sizes, rec) + float(tp.predicted.get("validate", 0.0))
    need += 0.25 * float(tp.predicted.get("proof", 0.0))
    left = tp.limit_s * 0.9 - _spent(state) - float(state["steps"].get("measure", {}).get("spent_s") or 0.0)
    if need > left:
        say(f"  another round ({need:.0f} s with what follows) does not fit the {max(left, 0):.0f} s left of the budget")
        return False
    return True


_STEP_FUNCS: dict[str, Callable[..., dict[str, Any]]] = {
    "plan": lambda req, trace, state, cal_path, say: _step_plan(req, trace, state, say),
    "calibrate": _step_calibrate,
    "optimum": _step_optimum,
    "measure": _step_measure,
    "validate": _step_validate,
    "proof": _step_proof,
}


# ---------------------------------------------------------------------------------------
# the profile's [tuned] record
# ---------------------------------------------------------------------------------------
def tuned_record(result: TuneResult) -> dict[str, Any]:
    """What a profile's [tuned] table records of this tune: the list, the gain over SGLang's
    ladder on the whole trace with its interval (core.plan.trace_estimate), the gain measured
    on the batches replayed (mean over passes, the half-width the widest pass's), graphs,
    capture time, graph memory, the calibration file's hash, the device, torch and the date."""
    from bcgtune import __version__
    from bcgtune.fileio import sha256_file

    proof = result.steps["proof"]
    d = proof["recommended_minus_ladder"]
    halves = [h for h in d["measured_gain_half_pct"] if h is not None]
    est = proof.get("trace_estimate") or {}
    out: dict[str, Any] = {
        "list": result.buckets,
        "trace_gain_pct": None if est.get("gain_pct") is None else round(float(est["gain_pct"]), 4),
        "trace_gain_half_pct": None if est.get("half_pct") is None else round(float(est["half_pct"]), 4),
        "trace_batches": est.get("trace_batches"),
        "measured_gain_pct": round(float(np.mean(d["measured_gain_pct"])), 4),
        "predicted_gain_pct": None if d["predicted_gain_pct"] is None else round(float(d["predicted_gain_pct"]), 4),
        "passes": int(proof["passes"]),
        "batches": int(proof["batches"]),
        "graphs": len(result.buckets),
        "calibration_sha256": sha256_file(str(_paths(result.state_dir)[1])),
        "device": str(proof["device"]),
        "torch": str(proof["torch"]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
    }
    if halves:
        out["measured_gain_half_pct"] = round(max(halves), 4)
    if d["predicted_gain_half_pct"] is not None:
        out["predicted_gain_half_pct"] = round(float(d["predicted_gain_half_pct"]), 4)
    if proof["recommended_capture_s"] is not None:
        out["capture_s"] = round(float(proof["recommended_capture_s"]), 3)
    if proof["recommended_graph_mem_gib"] is not None:
        out["graph_mem_gib"] = round(float(proof["recommended_graph_mem_gib"]), 4)
    return {k: v for k, v in out.items() if v is not None}
