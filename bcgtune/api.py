"""bcgtune as a library: the trace, the optimizer and the evaluation as typed functions. The
command line is built on these; each raises bcgtune.errors.InputError (bad input, naming
the field or file) rather than printing.

    import bcgtune
    trace = bcgtune.trace_from_logs(["server.log"])        # or load_trace / simulate_workload
    plan = bcgtune.suggest_buckets(trace, max_buckets=8, align=64)
    print(plan.recommended.buckets, plan.recommended.metrics.hit_rate_pct)
    print(bcgtune.evaluate(trace, [256, 512, 1024]).waste_pct)

Every argument is checked at this door as the command line checks its options: a value of
the wrong type or out of bounds (a path where a trace is expected, None, NaN, a string of
digits where a list is expected) is an InputError naming the argument, never a TypeError
from deep inside. Lists of integers may be lists, tuples, ranges or numpy integer arrays;
numpy scalars count as the Python numbers they hold.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, Sequence

from pydantic import Field

from bcgtune import _API
from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.plan.drift import DriftReport
from bcgtune.core.plan.plan_types import MAX_BUCKETS_LIMIT, BucketPlan
from bcgtune.core.schema import DP_RANKS_MAX, GIB_MAX, TOKENS_MAX, Seed, Tokens, validate
from bcgtune.core.sglang.constants import DEFAULT_PADDING_FACTOR, DEFAULT_THRESHOLD_PCT
from bcgtune.core.sglang.replay import ListMetrics, evaluate_list, parse_bucket_list
from bcgtune.core.trace.groups import MAX_GROUPS as _MAX_GROUPS
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.core.trace.summary import TraceSummary
from bcgtune.errors import InputError, quote
from bcgtune.files import trace_file as _trace_file
from bcgtune.files.calibration_file import load_calibration as _load_calibration

__all__ = list(_API)

# strict: a number is a number here (not '4', True or 4.0 for a count), as on the command line
_Factor = Annotated[float, Field(strict=True, ge=1.0, le=1e6, allow_inf_nan=False)]
_Align = Annotated[int, Field(strict=True, ge=1, le=TOKENS_MAX)]
_Ranks = Annotated[int, Field(strict=True, ge=1, le=DP_RANKS_MAX)]
_Threshold = Annotated[float, Field(strict=True, ge=0, le=100, allow_inf_nan=False)]
_Group = Annotated[int, Field(strict=True, ge=0, le=_MAX_GROUPS)]
_MaxBuckets = Annotated[int, Field(strict=True, ge=1, le=MAX_BUCKETS_LIMIT)]
_Chunk = Annotated[int, Field(strict=True, ge=-1, le=TOKENS_MAX)]  # -1: chunked prefill off
_GiB = Annotated[float, Field(strict=True, gt=0, le=GIB_MAX, allow_inf_nan=False)]
_MAX_MERGE = 100_000  # traces one merge takes (a fleet's logs are parsed, then merged, in far fewer)


# ---- the checks at the door -------------------------------------------------------------
def _plain(value: Any) -> Any:
    """numpy scalars and arrays as the Python numbers and lists they hold."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _check(schema: Any, value: Any, name: str) -> Any:
    return validate(schema, _plain(value), field=name)


def _optional(schema: Any, value: Any, name: str) -> Any:
    return None if value is None else _check(schema, value, name)


def _int_list(value: Any, name: str) -> list[Any]:
    """A list of integers from a list, tuple, range, set or numpy array (each item then
    checked by the caller's schema); a string, bytes, a mapping or a scalar is refused."""
    value = _plain(value)
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise InputError(f"must be a list of integers (a list, tuple or numpy array), got {_kind(value)}", field=name)
    items = [_plain(v) for v in value]
    if any(isinstance(v, (list, tuple, dict)) for v in items):
        raise InputError("must be a flat list of integers, got a nested list", field=name)
    return items


def _buckets(value: Any, name: str) -> list[int]:
    return parse_bucket_list(_int_list(value, name), name, field=name)


def _trace(value: Any, name: str = "trace") -> PrefillTrace:
    if not isinstance(value, PrefillTrace):
        hint = " (bcgtune.load_trace(path) reads a trace file)" if isinstance(value, (str, os.PathLike)) else ""
        raise InputError(f"must be a PrefillTrace, got {_kind(value)}{hint}", field=name)
    return value


def _calibration(value: Any) -> Calibration | None:
    if value is not None and not isinstance(value, Calibration):
        hint = " (bcgtune.load_calibration(path) reads one)" if isinstance(value, (str, os.PathLike)) else ""
        raise InputError(f"must be a Calibration or None, got {_kind(value)}{hint}", field="calibration")
    return value


def _flags(value: Any, name: str = "server_flags") -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InputError(f"must be a mapping of SGLang flag names to values, got {_kind(value)}", field=name)
    return {k: _plain(v) for k, v in value.items()}


def _path(value: Any, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(f"must be a file path (str or os.PathLike), got {_kind(value)}", field=name)
    path = os.fspath(value)
    if not isinstance(path, str):
        raise InputError("must be a text path, not bytes", field=name)
    return path


def _group(value: Any, trace: PrefillTrace | None) -> int | None:
    """`group`, checked against the trace's server configurations: a trace that mixes
    several is refused without one (naming them, and `group=N`)."""
    from bcgtune.core.trace.groups import check_group_index
    from bcgtune.services.suggest import select_group

    group = _optional(_Group, value, "group")
    if trace is not None:
        if group is None:
            select_group(trace, None, how="group=N")
        else:
            check_group_index(trace.groups, group, "group")
    return group


def _name_of(value: Any, name: str = "compare") -> str:
    """A list's name in `compare`: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"names a list by a non-empty string, got {quote(value)} ({_kind(value)})", field=name)
    return value


def _flag(value: Any, name: str) -> bool:
    value = _plain(value)
    if not isinstance(value, bool):
        raise InputError(f"must be True or False, got {quote(value)}", field=name)
    return value


# ---- the API ----------------------------------------------------------------------------
def load_trace(path: str | os.PathLike) -> PrefillTrace:
    """A trace file: JSON from `bcgtune trace -o`, a size,count CSV, a JSON array of sizes or
    one size per line ('-' for stdin, .gz ok)."""
    return _trace_file.load_trace(_path(path, "path"))


def save_trace(trace: PrefillTrace, path: str | os.PathLike) -> None:
    """Write a trace atomically, as `bcgtune trace -o` writes it: versioned JSON for a .json
    name, the binary form for .npz, size,count CSV for .csv; a name without one of these
    suffixes gets the binary form for per-batch columns of 100,000 batches or more, else JSON
    (load_trace reads every form)."""
    _trace_file.save_trace(_trace(trace), _path(path, "path"))


def load_calibration(path: str | os.PathLike) -> Calibration:
    """A calibration from `bcgtune calibrate` (JSON) or a tokens,eager_ms,graph_ms CSV."""
    return _load_calibration(_path(path, "path"))


def trace_from_logs(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    mixed_chunk: bool = False,
    histogram_only: bool = False,
    jobs: int | None = None,
    launch: Mapping[str, Any] | None = None,
    group: int | None = None,
    cluster: str | None = None,
) -> PrefillTrace:
    """A trace from SGLang server logs (one per rank or replica; .gz and '-' work), as
    `bcgtune trace --log` reads them: one location or a list of them, each a file, a folder
    (its logs and their rotated pieces), a glob, or a URL (file://, memory://, http(s)://,
    s3:// ... with fsspec). Each log is read by the launch settings it states; a rotated
    piece that states none continues the launch its older piece ended with.
    `histogram_only`: counts per size and request mixes per configuration instead of
    per-batch columns (memory flat in the logs' length; the same plans). `jobs`: worker
    processes for several files (None: one per core). `launch`: the launch settings of
    logs that state none, as `--launch` takes them ({"chunked_prefill_size": 8192, ...});
    logs given them join the configuration they name. `mixed_chunk`: count the running
    decode rows of launches whose settings do not state enable_mixed_chunk, as
    `--mixed-chunk`. `group`: only this server configuration of the logs, its logs parsed
    on their own (`--group N`). `cluster`: parse on a Dask cluster (`--cluster`: "local",
    "local:N" or a scheduler address; the trace is histogram-only; needs bcgtune[cluster])."""
    from bcgtune.services.trace import trace_logs, trace_on_cluster

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif isinstance(paths, (bytes, Mapping)) or not isinstance(paths, Iterable):
        raise InputError(f"must be a log path or a list of them, got {_kind(paths)}", field="paths")
    files = [_path(p, "paths") for p in paths]
    if not files:
        raise InputError("no log given", field="paths")
    n = _optional(Annotated[int, Field(ge=1, le=4096)], jobs, "jobs")
    given = None
    if launch is not None:
        from bcgtune.core.trace.groups import parse_launch_settings

        if not isinstance(launch, Mapping):
            raise InputError(f"must be a mapping of launch settings, got {_kind(launch)}", field="launch")
        items = [f"{k}={'true' if v is True else 'false' if v is False else v}" for k, v in launch.items()]
        given = parse_launch_settings(items, "launch")
    mixed, hist = _flag(mixed_chunk, "mixed_chunk"), _flag(histogram_only, "histogram_only")
    if mixed and given and given.get("enable_mixed_chunk") is False:
        raise InputError("enable_mixed_chunk=False contradicts mixed_chunk=True: give one of them", field="launch")
    grp = _optional(_Group, group, "group")
    # the services name the command line's flags where they refuse a value: here, the arguments
    flags = {"--group": "group", "--cluster": "cluster", "--log": "paths", "--log -": "paths", "--launch": "launch"}
    if cluster is not None:
        if not isinstance(cluster, str) or not cluster.strip():
            raise InputError(f"must be local, local:N or a scheduler address, got {quote(cluster)}", field="cluster")
        if grp is not None:
            raise InputError("group applies to logs parsed on this machine, not on a cluster", field="group")
        with _arguments_for(flags):
            return trace_on_cluster(files, cluster, mixed_chunk=mixed, launch=given)
    with _arguments_for(flags):
        return trace_logs(files, mixed_chunk=mixed, histogram_only=hist, jobs=n, launch=given, group=grp)


@contextlib.contextmanager
def _arguments_for(flags: Mapping[str, str]) -> Iterator[None]:
    """An InputError that a service raises naming a command-line flag of `flags` (its
    `where`) names the API's argument instead."""
    try:
        yield
    except InputError as exc:
        if exc.where is not None and exc.where in flags:
            raise type(exc)(exc.what, field=flags[exc.where]) from None
        raise


def trace_summary(trace: PrefillTrace) -> TraceSummary:
    """What `bcgtune trace` reports about a trace: counts, percentiles, the graph flag, the
    server configurations and each one's files (`groups`), the captured list's use, and
    the notes, hints and warnings it prints (`notes`, `hints`, `warnings`)."""
    from bcgtune.core.trace.summary import summarize

    return summarize(_trace(trace))


def merge_traces(traces: Sequence[PrefillTrace], *, histogram_only: bool = False) -> PrefillTrace:
    """One trace of several (as `bcgtune trace merge`): batches, sources and server
    configurations kept apart by group; the same log in two inputs is refused (its batches
    would count twice). `histogram_only`: drop the per-batch columns (needed when an input
    has none). Associative: any grouping of the inputs gives the same trace."""
    from bcgtune.core.trace.merge import merge_traces as _merge

    if isinstance(traces, (PrefillTrace, str, bytes, Mapping)) or not isinstance(traces, Iterable):
        raise InputError(f"must be a list of PrefillTrace, got {_kind(traces)}", field="traces")
    items = list(traces)
    if not items:
        raise InputError("no trace to merge", field="traces")
    if len(items) > _MAX_MERGE:
        raise InputError(f"more than {_MAX_MERGE:,} traces", field="traces")
    checked = [_trace(t, f"traces[{i}]") for i, t in enumerate(items)]
    if len({id(t) for t in checked}) < len(checked):
        raise InputError("the same trace is given twice: its batches would count twice", field="traces")
    return _merge(
        checked, names=[f"traces[{i}]" for i in range(len(checked))], histogram_only=_flag(histogram_only, "histogram_only")
    )


def trace_from_sizes(sizes: Sequence[int]) -> PrefillTrace:
    """A trace from per-batch forward sizes (token counts, one per prefill batch)."""
    values = validate(list[Tokens], _int_list(sizes, "sizes"), "sizes")
    return PrefillTrace.from_sizes(values, origin="sizes").validate("sizes")


def simulate_workload(workload: str | os.PathLike | None = "mi355x-multimodal-pr", **options: Any) -> PrefillTrace:
    """Simulate a bench_serving run against SGLang's scheduler: a workload TOML or preset,
    with bench_serving / SGLang options (snake_case names, e.g. num_prompts="40,160")."""
    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.files.workload_file import workload_from_options

    if workload is not None:
        workload = _path(workload, "workload")
    return simulate(workload_from_options(workload=workload, **{k: _plain(v) for k, v in options.items()}))


def suggest_buckets(
    trace: PrefillTrace | None = None,
    *,
    max_buckets: int = 12,
    align: int | None = None,
    max_bucket: int | None = None,
    objective: str = "padding",
    calibration: Calibration | None = None,
    padding_factor: float = DEFAULT_PADDING_FACTOR,
    compare: Mapping[str, Sequence[int]] | None = None,
    chunked_prefill_size: int | None = None,
    attention_dp_size: int | None = None,
    server_flags: Mapping[str, Any] | None = None,
    max_graph_mem_gib: float | None = None,
    candidates: str = "auto",
    kmeans: bool = False,
    baselines: bool = True,
    seed: int = 0,
    tolerance_pct: float | None = None,
    group: int | None = None,
) -> BucketPlan:
    """The optimal bucket list for `trace` (None: the built-in workload, simulated) and its
    comparison rows (SGLang's default ladder, `compare` lists, the server's captured list,
    quantiles); see BucketPlan. The same decisions as `bcgtune suggest-buckets`: `align` and
    `max_bucket` default to what SGLang captures for the launch (`server_flags`, SGLang's
    launch flags in snake case, e.g. {"tp_size": 8, "enable_dp_attention": True, "dp_size":
    8}; None: the layout the trace records). `attention_dp_size` N is short for a launch with
    N attention-DP ranks ({"tp_size": N, "attn_dp_size": N}): the trace's records are grouped
    into steps across ranks and every list is priced per step (`plan.dp_attention` says how,
    or why it stayed per batch). `tolerance_pct` (time objective): recommend fewer graphs than
    the best only when the upper end of their paired 95% interval against it is within this %
    of the best's predicted time (None: 0.5%; `plan.rule` states the rule as applied);
    `plan.optimal` is the exact optimum either way. `group`: which server
    configuration of a trace from several (`trace.groups`) to price; a trace that mixes
    configurations is refused without it. Raises InputError when the launch runs no prefill
    graphs."""
    from bcgtune.services.suggest import SuggestRequest, suggest

    if compare is not None and not isinstance(compare, Mapping):
        raise InputError(f"must be a mapping of names to bucket lists, got {_kind(compare)}", field="compare")
    flags = _flags(server_flags) or {}
    if attention_dp_size is not None:
        ranks = _check(_Ranks, attention_dp_size, "attention_dp_size")
        if ranks > 1:
            flags.setdefault("attn_dp_size", ranks)
            flags.setdefault("tp_size", ranks)
    req = SuggestRequest(
        trace=None if trace is None else _trace(trace),
        max_buckets=_check(_MaxBuckets, max_buckets, "max_buckets"),
        align=_optional(_Align, align, "align"),
        max_bucket=_optional(_Align, max_bucket, "max_bucket"),
        padding_factor=_check(_Factor, padding_factor, "padding_factor"),
        objective=_plain(objective),
        calibration=_calibration(calibration),
        max_graph_mem_gib=_optional(_GiB, max_graph_mem_gib, "max_graph_mem_gib"),
        candidates=_plain(candidates),
        seed=_check(Seed, seed, "seed"),
        compare=[(_name_of(name), _buckets(lst, str(name))) for name, lst in (compare or {}).items()],
        chunked_prefill_size=_optional(_Chunk, chunked_prefill_size, "chunked_prefill_size"),
        kmeans=_flag(kmeans, "kmeans"),
        baselines=_flag(baselines, "baselines"),
        server_flags=flags or None,
        tolerance_pct=_optional(_Threshold, tolerance_pct, "tolerance_pct"),
        group=_group(group, None if trace is None else _trace(trace)),
    )
    result = suggest(req)
    if result.plan is None:
        raise InputError(f"prefill graphs are off for this launch: {result.capture.reason}", field="server_flags")
    return result.plan


def evaluate(trace: PrefillTrace, buckets: Sequence[int], *, padding_factor: float = DEFAULT_PADDING_FACTOR) -> ListMetrics:
    """How a bucket list does on a trace under SGLang's replay rule: replay share, eager
    batches, padding."""
    t = _trace(trace)
    factor = _check(_Factor, padding_factor, "padding_factor")
    return evaluate_list(t.sizes, t.counts, _buckets(buckets, "buckets"), name="buckets", factor=factor)


def drift(
    trace: PrefillTrace,
    deployed: Sequence[int] | None = None,
    *,
    profiles: Sequence[str | os.PathLike] | None = None,
    matches: Mapping[str, int | Sequence[int]] | None = None,
    align: int | None = None,
    server_flags: Mapping[str, Any] | None = None,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    group: int | None = None,
    tolerance_pct: float | None = None,
) -> DriftReport | Any:
    """Is `deployed` still right for `trace`? Compared with the optimum of as many buckets,
    both as SGLang captures them for the launch `server_flags` (snake-case launch flags; None:
    the layout the trace records, as suggest_buckets takes it), aligned to its capture
    alignment unless `align` is given, and priced as suggest_buckets prices that launch.
    `group`: which server configuration of a trace from several to judge it on.
    `tolerance_pct`: suggest_buckets' margin (None: 0.5% of today's optimum's predicted time);
    with a calibration, keep when the deployed list's paired 95% upper bound against today's
    optimum is within it, or the gain's upper end is within `threshold_pct`; else re-tune
    (DriftReport.reason says whether a gain above the threshold is shown).

    `profiles` instead of `deployed` (profile files or built-in names, as `drift -p A -p
    B`): each profile's list is judged on the configurations of `trace` whose logged launch
    settings it agrees with, one row each (a FleetDrift: `rows`, `verdict`, `unjudged`);
    `matches` ({profile name, file or position: group or groups}, as `--match`) pairs a
    profile with configurations whatever their settings say; `group` judges only that one."""
    from bcgtune.services.drift import drift_for_list
    from bcgtune.services.suggest import select_group

    t = _trace(trace)
    cal = _calibration(calibration)
    threshold = _check(_Threshold, threshold_pct, "threshold_pct")
    tolerance = _optional(_Threshold, tolerance_pct, "tolerance_pct")
    if profiles is not None:
        if deployed is not None or server_flags is not None or align is not None:
            raise InputError("give deployed (with server_flags, align) or profiles, not both", field="profiles")
        return _drift_profiles(t, profiles, matches, cal, threshold, tolerance, _optional(_Group, group, "group"))
    if matches is not None:
        raise InputError("matches pairs profiles with configurations: give profiles", field="matches")
    t = select_group(t, _group(group, t))
    if deployed is None:
        raise InputError("give the deployed list, or profiles", field="deployed")
    buckets = _buckets(deployed, "deployed")
    flags = _flags(server_flags) or {}
    if align is not None:
        align = _check(_Align, align, "align")
    return drift_for_list(
        t, buckets, server_flags=flags, align=align, calibration=cal, threshold_pct=threshold, tolerance_pct=tolerance
    )


def _drift_profiles(trace: PrefillTrace, profiles: Any, matches: Any, cal, threshold: float, tolerance, group) -> Any:
    """drift(profiles=...): `bcgtune drift -p ...` as a call (services.drift.drift_fleet)."""
    from bcgtune.core.trace.groups import check_group_index
    from bcgtune.files.profile_file import load_profile
    from bcgtune.services.drift import drift_fleet, parse_matches

    if isinstance(profiles, (str, bytes, os.PathLike, Mapping)) or not isinstance(profiles, Iterable):
        raise InputError(f"must be a list of profile files or built-in names, got {_kind(profiles)}", field="profiles")
    names = [_path(p, "profiles") for p in profiles]
    if not names:
        raise InputError("no profile given", field="profiles")
    loaded = [load_profile(n) for n in names]
    for prof, name in zip(loaded, names):
        prof.given_as = name  # type: ignore[attr-defined]  # matches may name a profile as it was given
    texts = []
    if matches is not None:
        if not isinstance(matches, Mapping):
            raise InputError(f"must be a mapping of profile names to groups, got {_kind(matches)}", field="matches")
        for who, groups in matches.items():
            who = _plain(who)
            if isinstance(who, bool) or not isinstance(who, (str, int)) or (isinstance(who, str) and not who.strip()):
                raise InputError(
                    f"names a profile by its [profile] name, its file or its position 0, 1, ..., got {quote(who)}",
                    field="matches",
                )
            groups = _plain(groups)
            for g in groups if isinstance(groups, (list, tuple, range)) else [groups]:
                if not isinstance(g, int) or isinstance(g, bool) or g < 0:
                    raise InputError(f"{quote(who)}: a group is an integer 0, 1, ..., got {quote(g)}", field="matches")
                texts.append(f"{who}={g}")
    n = len(trace.groups) or 1
    with _arguments_for({"--match": "matches"}):
        pairs = parse_matches(texts, loaded, n)
    if group is not None:
        check_group_index(trace.groups, group, "group")
    return drift_fleet(
        loaded, trace, groups=None if group is None else [group], matches=pairs, calibration=cal,
        threshold_pct=threshold, tolerance_pct=tolerance,
    )  # fmt: skip


def _door(fn: Any) -> Any:
    """`fn` whose call with an argument it does not take (a misspelt keyword, one positional
    too many, a missing trace) is an InputError naming the argument, as every other bad value
    at this door is, instead of Python's TypeError."""
    import functools
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            unknown = next((k for k in kwargs if k not in sig.parameters), None)
            what = str(exc).removeprefix(f"{fn.__name__}() ")
            raise InputError(what, field=unknown or fn.__name__) from None
        return fn(*args, **kwargs)

    return call


for _name in _API:
    _fn = globals().get(_name)
    if callable(_fn) and getattr(_fn, "__module__", None) == __name__ and not isinstance(_fn, type):
        globals()[_name] = _door(_fn)
del _name, _fn
