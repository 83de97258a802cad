"""The library calls behind `bcgtune capture`, `validate` and `calibrate`: each builds an
engine, runs, and returns a plain dict (rendering is the CLI's job)."""

from __future__ import annotations

import functools
import os
import statistics
import time

import numpy as np

from bcgtune.core.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR
from bcgtune.errors import ExternalError, InputError

DEFAULT_CALIBRATION_SIZES = (16, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192)
DEFAULT_IMAGE_PX = (128, 256, 512)


RUNNERS = ("breakable", "full")
RUNNER_HELP = {
    "breakable": "SGLang's breakable prefill runner (its default on CUDA): captured segments, attention eager between them",
    "full": "SGLang's `full` prefill backend with one request slot: one whole-forward graph per bucket",
}


def check_runner(runner: str) -> str:
    if runner not in RUNNERS:
        raise InputError(f"unknown runner {runner!r} ({', '.join(RUNNERS)})", "--runner")
    return runner


def _setup(
    model_spec,
    device_spec,
    dtype_name,
    sdpa_backend,
    seed,
    max_tokens,
    shape,
    runner="breakable",
    hf_fix_attention=True,
    random_weights=False,
    warmup=None,
    graph_impl="auto",
):
    import torch

    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.preflight import refuse_cpu_for_large
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.torch_graphs import PrefillGraphEngine, resolved_sdpa_backend

    device = resolve_device(device_spec)
    refuse_cpu_for_large(shape, device.type)
    is_hf = model_spec.startswith("hf:") or os.path.isdir(model_spec)
    if runner == "breakable" and is_hf and not hf_fix_attention:
        raise InputError("the breakable runner needs --hf-attention causal (its attention runs per request)", "--hf-attention")
    dtype = parse_dtype(dtype_name, device)
    torch.manual_seed(seed)
    model, desc = load_model(model_spec, device, dtype, sdpa_backend, seed, hf_fix_attention, random_weights)
    if runner == "breakable":
        from bcgtune.engines.breakable import BreakablePrefillEngine

        engine = BreakablePrefillEngine(
            model, device, max_tokens, sdpa_backend=sdpa_backend, warmup=2 if warmup is None else warmup, graph_impl=graph_impl
        )
    else:
        engine = PrefillGraphEngine(model, device, max_tokens, sdpa_backend=sdpa_backend, warmup=1 if warmup is None else warmup)
    env = environment(device)
    env["graph_mode"] = engine.mode
    env["runner"] = runner
    env["runner_matches"] = RUNNER_HELP[runner]
    env["graph_impl"] = engine.graph_impl
    if runner == "breakable":
        env["attention"] = engine.attention_kind
        if engine.impl is not None and engine.impl.note:
            env["graph_impl_note"] = engine.impl.note
    env["sdpa_backend"] = resolved_sdpa_backend(sdpa_backend, device)
    return engine, desc, env


def _header(kind: str, env: dict, desc: dict) -> dict:
    from bcgtune.core.document import document_header

    return {**document_header(kind), "environment": env, "model": desc}


# ---------------------------------------------------------------------------------------
def run_capture(
    buckets,
    model="qwen3-8b",
    device="auto",
    dtype="auto",
    sdpa_backend="auto",
    seed=0,
    warmup=None,
    hf_fix_attention=True,
    random_weights=False,
    progress=None,
    runner="breakable",
    chunked_prefill_size=None,
    graph_impl="auto",
) -> dict:
    from bcgtune.engines.preflight import check_run

    check_runner(runner)
    shape = check_run(model, device, buckets, chunked_prefill_size)
    buckets = sorted({int(b) for b in buckets})
    engine, desc, env = _setup(
        model,
        device,
        dtype,
        sdpa_backend,
        seed,
        max(buckets),
        shape,
        runner,
        hf_fix_attention,
        random_weights,
        warmup,
        graph_impl,
    )
    before = engine._reserved()
    t0 = time.perf_counter()
    recs = engine.capture(buckets, on_record=progress)
    total = time.perf_counter() - t0
    after = engine._reserved()
    out = _header("bcgtune.capture-report", env, desc)
    per = []
    for r in sorted(recs, key=lambda r: r.bucket):
        d = r.to_dict()
        if runner == "breakable":
            d["segments"] = engine.segment_count(r.bucket)
        per.append(d)
    out.update(
        runner=runner,
        buckets=buckets,
        graphs=sum(r.ok for r in recs),
        failed=sum(not r.ok for r in recs),
        capture_s_total=round(total, 3),
        pool_gib_total=round(after - before, 4) if engine.graphs_enabled else None,
        attention_mismatches=sum(1 for r in recs if r.ok and not r.attention_match),
        per_bucket=per,
    )
    return out


# ---------------------------------------------------------------------------------------
def _sizes_in_bucket(b: int, prev: int, k: int, rng) -> list[int]:
    """Sizes that replay in bucket b: (max(b/2, prev), b], ends included, k in all."""
    lo = max(b // 2, prev) + 1
    if lo > b:
        return []
    picks = {lo, b}
    if k > 2 and b - lo > 1:
        picks.update(int(x) for x in rng.integers(lo + 1, b, size=k - 2))
    return sorted(picks)[: max(k, 2)]


DEFAULT_VALIDATE_REQUESTS = (1, 4)


def _request_counts(requests, runner: str) -> list[int]:
    """The request counts each validated size is split into (the full runner holds one)."""
    req_list = sorted({int(r) for r in requests})
    if not req_list or req_list[0] < 1:
        raise InputError("request counts must be positive integers", "--requests")
    return [1] if runner == "full" else req_list


def _replay_vs_eager(engine, x, gap_threshold, max_logprob_delta) -> tuple[dict, int]:
    """One batch run eagerly and replayed: the token-level comparison and the bucket used."""
    from bcgtune.engines.torch_graphs import compare_batch

    he, le = engine.eager(x)
    he, le = he.clone(), le.clone()
    hr, lr, used = engine.replay(x)
    return compare_batch(engine.model, he, hr, le, lr, x.lengths, gap_threshold, max_logprob_delta), used


def _validate_bucket(
    engine, b: int, rec, prev: int, req_list: list[int], rng, *, sizes_per_bucket, seed, gap_threshold, max_logprob_delta
) -> dict:
    """One bucket's entry: text batches of sizes that replay in it (each split into every
    request count that fits) compared with eager, and the pad-invariance check."""
    from bcgtune.engines.torch_graphs import check_pad_invariance, text_inputs

    entry = {
        "bucket": b,
        "captured": rec.ok,
        "error": rec.error,
        "attention_match": rec.attention_match,
        "attention_eager": rec.attention_eager,
        "attention_capture": rec.attention_capture,
        "checks": [],
    }
    if rec.ok:
        sizes = _sizes_in_bucket(b, prev, sizes_per_bucket, rng)
        for n in sizes:
            for r in (r for r in req_list if r <= n):
                x = text_inputs(engine.model, n, engine.device, seed=seed * 7919 + n, requests=r, split="random")
                c, used = _replay_vs_eager(engine, x, gap_threshold, max_logprob_delta)
                c.update(n=n, bucket=used, kind="text")
                entry["checks"].append(c)
        entry["pad_invariance"] = None
        if sizes:
            r_pad = min(req_list[-1], sizes[0])
            x = text_inputs(engine.model, sizes[0], engine.device, seed=seed + 17, requests=r_pad, split="random")
            entry["pad_invariance"] = check_pad_invariance(engine, x, b, seed=seed) | {"requests": r_pad}
        entry["sizes"] = sizes
    ok = (
        rec.ok
        and rec.attention_match
        and all(c["ok"] for c in entry["checks"])
        and (entry.get("pad_invariance") is None or entry["pad_invariance"]["ok"])
    )
    entry["ok"] = bool(ok)
    return entry


def _image_sweep(engine, buckets: list[int], image_px, rng, *, seed, gap_threshold, max_logprob_delta) -> dict:
    """Image batches of each size in `image_px` replayed in every captured bucket they fit:
    compared with eager, and no new capture or torch.compile recompilation on the way."""
    from bcgtune.engines.models import image_token_count
    from bcgtune.engines.torch_graphs import dynamo_counters, image_inputs

    captures_before = engine.capture_count
    dyn_before = dynamo_counters()
    rows = []
    prev = 0
    for b in buckets:
        if b not in engine.graphs:
            prev = b
            continue
        lo = max(b // 2, prev) + 1
        for px in image_px:
            vis = image_token_count(engine.model, px, px)
            n_min = max(lo, vis + 3)
            if n_min > b:
                rows.append({"bucket": b, "image_px": px, "visual_tokens": vis, "skipped": "bucket too small for the image"})
                continue
            n = int(rng.integers(n_min, b + 1))
            x = image_inputs(engine.model, n, px, engine.device, seed=seed + px + b)
            c, used = _replay_vs_eager(engine, x, gap_threshold, max_logprob_delta)
            c.update(n=n, bucket=used, kind=x.kind, visual_tokens=vis, image_px=px)
            rows.append(c)
        prev = b
    dyn_after = dynamo_counters()
    sweep = {
        "image_px": list(image_px),
        "new_captures": engine.capture_count - captures_before,
        "dynamo_recompiles": dyn_after["recompiles"] - dyn_before["recompiles"],
        "dynamo_new_graphs": dyn_after["unique_graphs"] - dyn_before["unique_graphs"],
        "torch_compile_used": False,
        "checks": rows,
    }
    sweep["ok"] = sweep["new_captures"] == 0 and sweep["dynamo_recompiles"] == 0 and all(r.get("ok", True) for r in rows)
    return sweep


def run_validate(
    buckets,
    model="qwen3-8b",
    device="auto",
    dtype="auto",
    sdpa_backend="auto",
    seed=0,
    sizes_per_bucket=3,
    gap_threshold=GAP_THRESHOLD,
    max_logprob_delta=MAX_LOGPROB_DELTA,
    image_px=DEFAULT_IMAGE_PX,
    images=None,
    hf_fix_attention=True,
    random_weights=False,
    progress=None,
    runner="breakable",
    requests=DEFAULT_VALIDATE_REQUESTS,
    chunked_prefill_size=None,
    graph_impl="auto",
) -> dict:
    """Replay vs eager on identical batches, per bucket: sizes in (b/2, b] (ends included),
    each as batches of every request count in `requests` (a seeded random split into
    requests; the full runner holds one request, so it checks r = 1 only). Per batch: the
    token-level comparison (core.accuracy thresholds), whether it is bit for bit, and which
    requests differ or fail; per bucket a pad-invariance check (garbage in the padded rows
    must not change any real row)."""
    from bcgtune.engines.preflight import check_run

    check_runner(runner)
    shape = check_run(model, device, buckets, chunked_prefill_size)
    req_list = _request_counts(requests, runner)
    buckets = sorted({int(b) for b in buckets})
    engine, desc, env = _setup(
        model, device, dtype, sdpa_backend, seed, max(buckets), shape, runner, hf_fix_attention, random_weights, None, graph_impl
    )
    recs = {r.bucket: r for r in engine.capture(buckets)}
    is_vl = (
        getattr(engine.model, "input_kind", "ids") == "embeds"
        and getattr(getattr(engine.model, "cfg", None), "vision", None) is not None
    )
    do_images = is_vl if images is None else bool(images)
    if do_images and not is_vl:
        raise InputError("--images needs a VL model (e.g. --model qwen3-vl-8b)")
    rng = np.random.default_rng(seed)
    thresholds = {"gap_threshold": gap_threshold, "max_logprob_delta": max_logprob_delta}
    per_bucket = []
    for prev, b in zip([0, *buckets], buckets):
        entry = _validate_bucket(
            engine, b, recs[b], prev, req_list, rng, sizes_per_bucket=sizes_per_bucket, seed=seed, **thresholds
        )
        per_bucket.append(entry)
        if progress is not None:
            progress(entry)
    image_sweep = _image_sweep(engine, buckets, image_px, rng, seed=seed, **thresholds) if do_images else None
    checks = [c for e in per_bucket for c in e["checks"]]
    out = _header("bcgtune.validation-report", env, desc)
    out.update(
        runner=runner,
        buckets=buckets,
        requests=req_list,
        gap_threshold=gap_threshold,
        max_logprob_delta=max_logprob_delta,
        batches_checked=len(checks),
        bitwise_batches=sum(1 for c in checks if c["bitwise"]),
        per_bucket=per_bucket,
        image_sweep=image_sweep,
        ok=all(e["ok"] for e in per_bucket) and (image_sweep is None or image_sweep["ok"]),
    )
    return out


# ---------------------------------------------------------------------------------------
MAX_POOL_SIZES = 16  # graph memory alone is measured at most at this many sizes (smooth in n)


MAX_GRID_SIZES = 4096  # a 64-token grid to 16k tokens is 256 sizes; each costs seconds on a GPU


def grid_sizes(step: int, max_tokens: int | None = None, trace_sizes=None, factor: float = DEFAULT_PADDING_FACTOR) -> list[int]:
    """Sizes for a bucket-grid calibration: every multiple of `step` up to `max_tokens`
    (default 8192). With a trace, only the multiples some traced size n can replay in
    (n <= c <= factor * n), none above the first multiple at or past the largest traced size
    (a larger bucket only pads more) nor above `max_tokens`, plus the trace's smallest and largest size so
    eager time is measured, not extrapolated, at the ends. Pure: runs without torch."""
    if step < 1:
        raise InputError(f"--grid must be >= 1, got {step}")
    if trace_sizes is None:
        top = max_tokens or 8192
        if top // step > MAX_GRID_SIZES:
            raise InputError(
                f"--grid {step} up to {top} tokens is {top // step:,} sizes to measure "
                f"(at most {MAX_GRID_SIZES:,}): use a coarser grid or a smaller --max-tokens"
            )
        out = list(range(step, top + 1, step))
        if not out:
            raise InputError(f"--grid {step} is above --max-tokens {top}")
        return out
    s = np.unique(np.asarray(trace_sizes, dtype=np.int64))
    top = int(-(-int(s[-1]) // step) * step)
    if max_tokens is not None:
        top = min(top, max_tokens)
    if top // step > 100 * MAX_GRID_SIZES:  # the scan below holds every multiple up to top
        raise InputError(
            f"--grid {step} up to this trace's largest size ({int(s[-1]):,} tokens) spans "
            f"{top // step:,} multiples: use a coarser grid or --max-tokens"
        )
    c = np.arange(step, top + 1, step, dtype=np.int64)
    # some n with c / factor <= n <= c
    hi = np.searchsorted(s, c, side="right")
    lo = np.searchsorted(s * factor, c.astype(np.float64), side="left")
    keep = set(c[lo < hi].tolist())
    if len(keep) > MAX_GRID_SIZES:
        raise InputError(
            f"--grid {step} over this trace is {len(keep):,} sizes to measure (at most {MAX_GRID_SIZES:,}): use a coarser grid"
        )
    keep.update(int(x) for x in (s[0], s[-1]) if max_tokens is None or x <= max_tokens)
    if not keep:
        raise InputError(f"no size to measure: the trace's sizes start at {int(s[0])}, above --max-tokens {max_tokens}")
    return sorted(keep)


def _pool_subset(sizes: list[int]) -> list[int]:
    """At most MAX_POOL_SIZES sizes spread evenly on a log scale, the largest included."""
    if len(sizes) <= MAX_POOL_SIZES:
        return list(sizes)
    idx = np.unique(np.round(np.geomspace(1, len(sizes), MAX_POOL_SIZES)).astype(int) - 1)
    return sorted({sizes[i] for i in idx} | {sizes[-1]})


def run_calibrate(
    sizes=DEFAULT_CALIBRATION_SIZES,
    model="qwen3-8b",
    device="auto",
    dtype="auto",
    sdpa_backend="auto",
    seed=0,
    warmup=3,
    repeats=10,
    memory=True,
    hf_fix_attention=True,
    random_weights=False,
    progress=None,
    runner="breakable",
    mix=None,
    chunked_prefill_size=None,
    graph_impl="auto",
):
    """Measure what the time objective prices, on one runner, and graph memory.

    breakable: segments(b) at every size of `sizes` (the bucket grid), and eager(n, r) and
    breaks(n, r) at every batch of `mix` (core.mix.BatchMix; default: each size as one
    request). breaks(n, r) = replay of the batch in the smallest grid bucket >= n minus that
    bucket's segments. full: eager and whole-forward replay at every size (one request).
    Returns a core.calibration.Calibration."""
    from bcgtune.engines.preflight import check_run

    check_runner(runner)
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise InputError("calibration sizes must be positive integers", "--sizes")
    if mix is not None and runner == "breakable" and int(mix.tokens.max()) > sizes[-1]:
        sizes.append(int(mix.tokens.max()))  # breaks of the largest batches need a bucket that holds them
    shape = check_run(model, device, sizes, chunked_prefill_size, what="calibration size")
    engine, desc, env = _setup(
        model, device, dtype, sdpa_backend, seed, max(sizes), shape, runner, hf_fix_attention, random_weights, None, graph_impl
    )
    say = progress or (lambda msg: None)
    if runner == "breakable":
        return _calibrate_breakable(engine, env, desc, sizes, mix, sdpa_backend, seed, warmup, repeats, memory, say)
    return _calibrate_full(engine, env, desc, sizes, sdpa_backend, seed, warmup, repeats, memory, say)


def _pool_by_largest(engine, sizes, make_solo, say):
    """Pool size when each of (a subset of) the sizes is the largest graph, alone in a
    fresh pool: (tokens, GiB) arrays, or None when a capture failed."""
    pool_by = {}
    for n in reversed(_pool_subset(sizes)):
        solo = make_solo(n)
        r = solo.capture([n], record_attention=False)[0]
        pool_by[n] = r.pool_growth_gib if r.ok else None
        solo.release()
        del solo
        say(f"pool   n={n:6d}  {pool_by[n] if pool_by[n] is not None else float('nan'):.4f} GiB (alone)")
    if not all(v is not None for v in pool_by.values()):
        return None
    return np.asarray(sorted(pool_by)), np.asarray([pool_by[k] for k in sorted(pool_by)])


def _memory_model(recs, sizes):
    """(pool of the largest graph, mean growth of each further graph, growth per bucket).
    The mean, not the median: most further graphs fit in segments the pool already holds
    (growth 0) and a few add a segment; only the mean keeps the total."""
    growth = {r.bucket: r.pool_growth_gib for r in recs}
    rest = [growth[b] for b in sizes if b != max(sizes)]
    return growth[max(sizes)], (statistics.fmean(rest) if rest else 0.0), growth


def _capture_all(engine, sizes, **kw):
    """Capture every size; a failed capture ends the calibration (ExternalError)."""
    recs = engine.capture(sizes, **kw)
    failed = [r for r in recs if not r.ok]
    if failed:
        raise ExternalError(f"capture failed at {failed[0].bucket} tokens: {failed[0].error}")
    return recs


def _graph_memory(engine, recs, sizes, meta: dict) -> tuple[float | None, float | None]:
    """(pool of the largest graph, mean growth per further graph) from a capture largest
    first, the growth per bucket recorded in `meta`; (None, None) without graphs."""
    if not engine.graphs_enabled:
        return None, None
    pool_gib, per_graph, growth = _memory_model(recs, sizes)
    meta["pool_growth_gib_largest_first"] = {str(b): growth[b] for b in sizes}
    return pool_gib, per_graph


def _environment_meta(engine, env, desc, warmup, repeats, inputs: str, replay_includes: str) -> dict:
    return {
        "gpu": {k: env.get(k) for k in ("gpu_name", "gpu_memory_gib", "compute_capability", "multiprocessors", "driver")},
        "software": {k: env.get(k) for k in ("backend", "torch", "cuda", "hip", "cudnn", "python")},
        "engine": {
            "runner": engine.runner,
            "runner_matches": env.get("runner_matches"),
            "graph_mode": engine.mode,
            "graph_impl": engine.graph_impl,
            "attention": env.get("attention"),
            "sdpa_backend": env["sdpa_backend"],
            "warmup": warmup,
            "repeats": repeats,
            "timer": ("cuda events, median" if engine.device.type == "cuda" else "perf_counter, median")
            + " of interleaved rounds (every size once per round, in shuffled order)",
            "inputs": inputs,
            "replay_includes": replay_includes,
        },
        "model": desc,
    }


def _calibrate_breakable(engine, env, desc, sizes, mix, sdpa_backend, seed, warmup, repeats, memory, say):
    from bcgtune.core.calibration import BatchTimes, Calibration
    from bcgtune.core.mix import BatchMix
    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.torch_graphs import summarize_ms, text_inputs, time_interleaved

    if mix is None:
        mix = BatchMix.single_request(sizes, np.ones(len(sizes), dtype=np.int64))
    pbt = None
    if memory and engine.graphs_enabled:
        impl = engine.impl.name

        def make_solo(n):
            return BreakablePrefillEngine(
                engine.model, engine.device, n, sdpa_backend=sdpa_backend, warmup=engine.warmup, graph_impl=impl
            )

        pbt = _pool_by_largest(engine, sizes, make_solo, say)
    recs = _capture_all(engine, sizes, record_attention=False)
    # Every call in the same interleaved rounds (time_interleaved): the segments of every
    # bucket alone, and for every batch its eager forward and its replay next to its bucket's
    # segments. One phase, so the segment curve and the break times see the same mix of GPU
    # clock and power states (a GPU at its power limit runs some seconds at 1.6 GHz, others at
    # 2.0: measured in separate phases, segments and breaks disagreed by 5% on the H200). A
    # batch's break time is the median over rounds of its replay minus the segments run just
    # before it.
    grid = np.asarray(sizes, dtype=np.int64)
    pairs = list(zip(mix.tokens.tolist(), mix.requests.tolist()))
    buckets = [int(grid[np.searchsorted(grid, n)]) for n, _ in pairs]
    inputs = [text_inputs(engine.model, n, engine.device, seed=seed + n, requests=r) for n, r in pairs]
    groups = [[functools.partial(engine.replay_segments, b)] for b in sizes]
    for x, b in zip(inputs, buckets):
        groups.append([engine.eager_call(x)])
        groups.append([functools.partial(engine.replay_segments, b), functools.partial(engine.replay, x, b)])
    say(
        f"timing {len(sizes)} buckets' segments and {len(pairs)} batches (eager, and replay next to its bucket's "
        f"segments) in {repeats} interleaved rounds after {warmup} warm-up round{'s' if warmup != 1 else ''}"
    )
    times = time_interleaved(
        groups,
        engine.device,
        warmup,
        repeats,
        seed=seed,
        on_round=lambda done, total: say(f"round {done}/{total} done" + (" (warm-up)" if done <= warmup else "")),
    )
    seg = {b: summarize_ms(t[0]) for b, t in zip(sizes, times)}
    for b in sizes:
        say(f"segments b={b:6d}  {seg[b]['median_ms']:9.3f} ms  ({engine.segment_count(b)} segments)")
    times = times[len(sizes) :]
    eager_ms, breaks_ms, spread, clipped = [], [], {}, 0
    for i, ((n, r), b) in enumerate(zip(pairs, buckets)):
        e = summarize_ms(times[2 * i][0])
        seg_alone, full = times[2 * i + 1]
        t = summarize_ms(full)
        brk = statistics.median(f - s_ for f, s_ in zip(full, seg_alone))
        if brk < 0:
            clipped += 1
            brk = 0.0
        eager_ms.append(e["median_ms"])
        breaks_ms.append(brk)
        spread[f"{n}x{r}"] = {
            "eager_p10_p90": [e["p10_ms"], e["p90_ms"]],
            "replay_ms": t["median_ms"],
            "bucket": b,
            "replay_p10_p90": [t["p10_ms"], t["p90_ms"]],
        }
        say(
            f"batch  n={n:6d} r={r:3d}  eager {e['median_ms']:9.3f} ms  replay in {b} {t['median_ms']:9.3f} ms  "
            f"breaks {brk:8.3f} ms"
        )
    meta = _environment_meta(
        engine,
        env,
        desc,
        warmup,
        repeats,
        "n random tokens split evenly into r requests, seeded",
        "input copy + pad fill + batch metadata + segments and breaks + logits tail",
    )
    meta.update(
        {
            "segments_spread": {str(b): [seg[b]["p10_ms"], seg[b]["p90_ms"]] for b in sizes},
            "segments_per_graph": {str(b): engine.segment_count(b) for b in sizes},
            "batches_spread": spread,
            "breaks_clipped_at_zero": clipped,
            "mix": {"pairs": int(mix.tokens.size), "batches": mix.n_batches, "requests_known": mix.requests_known},
            "capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs},
        }
    )
    pool_gib, per_graph = _graph_memory(engine, recs, sizes, meta)
    cal = Calibration(
        tokens=grid,
        eager_ms=None,
        graph_ms=np.asarray([seg[b]["median_ms"] for b in sizes]),
        pool_gib=pool_gib,
        per_graph_gib=per_graph,
        pool_by_tokens=pbt,
        meta=meta,
        runner="breakable",
        batches=BatchTimes(mix.tokens, mix.requests, eager_ms, breaks_ms),
    )
    engine.release()
    return cal


def _calibrate_full(engine, env, desc, sizes, sdpa_backend, seed, warmup, repeats, memory, say):
    from bcgtune.core.calibration import Calibration
    from bcgtune.engines.torch_graphs import PrefillGraphEngine, summarize_ms, text_inputs, time_interleaved

    inputs = {n: text_inputs(engine.model, n, engine.device, seed=seed + n) for n in sizes}
    # each kind measured in interleaved rounds over the sizes (time_interleaved), not a
    # block per size: every size sees the same mix of GPU clock and power states
    e_times = time_interleaved([[engine.eager_call(inputs[n])] for n in sizes], engine.device, warmup, repeats, seed=seed)
    eager = {n: summarize_ms(t[0]) for n, t in zip(sizes, e_times)}
    for n in sizes:
        say(f"eager  n={n:6d}  {eager[n]['median_ms']:9.3f} ms")
    pbt = None
    if memory and engine.graphs_enabled:

        def make_solo(n):
            return PrefillGraphEngine(engine.model, engine.device, n, sdpa_backend=sdpa_backend)

        pbt = _pool_by_largest(engine, sizes, make_solo, say)
    recs = _capture_all(engine, sizes)
    g_times = time_interleaved(
        [[functools.partial(engine.replay, inputs[n], n)] for n in sizes], engine.device, warmup, repeats, seed=seed + 1
    )
    graph = {n: summarize_ms(t[0]) for n, t in zip(sizes, g_times)}
    for n in sizes:
        say(f"replay b={n:6d}  {graph[n]['median_ms']:9.3f} ms")
    meta = _environment_meta(
        engine, env, desc, warmup, repeats, "one sequence of n random tokens, seeded", "input copy + pad fill + replay"
    )
    meta.update(
        {
            "attention_mismatches": [r.bucket for r in recs if not r.attention_match],
            "spread": {
                str(n): {
                    "eager_p10_p90": [eager[n]["p10_ms"], eager[n]["p90_ms"]],
                    "graph_p10_p90": [graph[n]["p10_ms"], graph[n]["p90_ms"]],
                }
                for n in sizes
            },
            "capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs},
        }
    )
    pool_gib, per_graph = _graph_memory(engine, recs, sizes, meta)
    cal = Calibration(
        tokens=np.asarray(sizes),
        eager_ms=np.asarray([eager[n]["median_ms"] for n in sizes]),
        graph_ms=np.asarray([graph[n]["median_ms"] for n in sizes]),
        pool_gib=pool_gib,
        per_graph_gib=per_graph,
        pool_by_tokens=pbt,
        meta=meta,
        runner="full",
    )
    engine.release()
    return cal
