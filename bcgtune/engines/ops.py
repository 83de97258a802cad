"""The library calls behind `bcgtune capture`, `validate` and `calibrate`: each builds an
engine, runs, and returns a plain dict (rendering is the CLI's job)."""

from __future__ import annotations

import datetime as _dt
import statistics
import time

import numpy as np

from bcgtune.errors import InputError

DEFAULT_CALIBRATION_SIZES = (16, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192)
DEFAULT_IMAGE_PX = (128, 256, 512)


def _setup(model_spec, device_spec, dtype_name, sdpa_backend, seed, max_tokens, hf_fix_attention=True,
           random_weights=False, warmup=1):
    import torch

    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.torch_graphs import PrefillGraphEngine, resolved_sdpa_backend

    device = resolve_device(device_spec)
    dtype = parse_dtype(dtype_name, device)
    torch.manual_seed(seed)
    model, desc = load_model(model_spec, device, dtype, sdpa_backend, seed, hf_fix_attention, random_weights)
    engine = PrefillGraphEngine(model, device, max_tokens, sdpa_backend=sdpa_backend, warmup=warmup)
    env = environment(device)
    env["graph_mode"] = engine.mode
    env["sdpa_backend"] = resolved_sdpa_backend(sdpa_backend, device)
    return engine, desc, env


def _header(kind: str, env: dict, desc: dict) -> dict:
    from bcgtune import __version__

    return {
        "format_version": 1,
        "kind": kind,
        "tool": "bcgtune",
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "model": desc,
    }


# ---------------------------------------------------------------------------------------
def run_capture(buckets, model="qwen3-8b", device="auto", dtype="auto", sdpa_backend="auto", seed=0,
                warmup=1, hf_fix_attention=True, random_weights=False, progress=None) -> dict:
    buckets = sorted(set(int(b) for b in buckets))
    engine, desc, env = _setup(model, device, dtype, sdpa_backend, seed, max(buckets), hf_fix_attention,
                               random_weights, warmup)
    before = engine._reserved()
    t0 = time.perf_counter()
    recs = engine.capture(buckets, on_record=progress)
    total = time.perf_counter() - t0
    after = engine._reserved()
    out = _header("bcgtune.capture-report", env, desc)
    out.update(
        buckets=buckets,
        graphs=sum(r.ok for r in recs),
        failed=sum(not r.ok for r in recs),
        capture_s_total=round(total, 3),
        pool_gib_total=round(after - before, 4) if engine.graphs_enabled else None,
        attention_mismatches=sum(1 for r in recs if r.ok and not r.attention_match),
        per_bucket=[r.to_dict() for r in sorted(recs, key=lambda r: r.bucket)],
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


def run_validate(buckets, model="qwen3-8b", device="auto", dtype="auto", sdpa_backend="auto", seed=0,
                 sizes_per_bucket=3, gap_threshold=0.7, max_logprob_delta=0.5, image_px=DEFAULT_IMAGE_PX,
                 images=None, hf_fix_attention=True, random_weights=False, progress=None) -> dict:
    import torch

    from bcgtune.engines.torch_graphs import (
        check_pad_invariance,
        compare_logits,
        dynamo_counters,
        image_inputs,
        text_inputs,
    )

    buckets = sorted(set(int(b) for b in buckets))
    engine, desc, env = _setup(model, device, dtype, sdpa_backend, seed, max(buckets), hf_fix_attention,
                               random_weights)
    recs = {r.bucket: r for r in engine.capture(buckets)}
    is_vl = getattr(engine.model, "input_kind", "ids") == "embeds" and getattr(getattr(engine.model, "cfg", None), "vision", None) is not None
    do_images = is_vl if images is None else bool(images)
    if do_images and not is_vl:
        raise InputError("--images needs a VL model (e.g. --model qwen3-vl-8b)")
    rng = np.random.default_rng(seed)
    per_bucket = []
    prev = 0
    for b in buckets:
        rec = recs[b]
        entry = {"bucket": b, "captured": rec.ok, "error": rec.error, "attention_match": rec.attention_match,
                 "attention_eager": rec.attention_eager, "attention_capture": rec.attention_capture, "checks": []}
        if rec.ok:
            sizes = _sizes_in_bucket(b, prev, sizes_per_bucket, rng)
            for n in sizes:
                x = text_inputs(engine.model, n, engine.device, seed=seed * 7919 + n)
                he, le = engine.eager(x)
                hr, lr, used = engine.replay(x)
                c = compare_logits(engine.model, he, hr, le, lr, gap_threshold, max_logprob_delta)
                c.update(n=n, bucket=used, kind="text")
                entry["checks"].append(c)
                del he, le
            if sizes:
                x = text_inputs(engine.model, sizes[0], engine.device, seed=seed + 17)
                entry["pad_invariance"] = check_pad_invariance(engine, x, b, seed=seed)
            else:
                entry["pad_invariance"] = None
            entry["sizes"] = sizes
        ok = rec.ok and rec.attention_match and all(c["ok"] for c in entry["checks"]) and (
            entry.get("pad_invariance") is None or entry["pad_invariance"]["ok"])
        entry["ok"] = bool(ok)
        per_bucket.append(entry)
        prev = b
        if progress is not None:
            progress(entry)
    image_sweep = None
    if do_images:
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
                from bcgtune.engines.models import image_token_count

                vis = image_token_count(engine.model, px, px)
                n_min = max(lo, vis + 3)
                if n_min > b:
                    rows.append({"bucket": b, "image_px": px, "visual_tokens": vis, "skipped": "bucket too small for the image"})
                    continue
                n = int(rng.integers(n_min, b + 1))
                x = image_inputs(engine.model, n, px, engine.device, seed=seed + px + b)
                he, le = engine.eager(x)
                hr, lr, used = engine.replay(x)
                c = compare_logits(engine.model, he, hr, le, lr, gap_threshold, max_logprob_delta)
                c.update(n=n, bucket=used, kind=x.kind, visual_tokens=vis, image_px=px)
                rows.append(c)
            prev = b
        dyn_after = dynamo_counters()
        image_sweep = {
            "image_px": list(image_px),
            "new_captures": engine.capture_count - captures_before,
            "dynamo_recompiles": dyn_after["recompiles"] - dyn_before["recompiles"],
            "dynamo_new_graphs": dyn_after["unique_graphs"] - dyn_before["unique_graphs"],
            "torch_compile_used": False,
            "checks": rows,
        }
        image_sweep["ok"] = (
            image_sweep["new_captures"] == 0
            and image_sweep["dynamo_recompiles"] == 0
            and all(r.get("ok", True) for r in rows)
        )
    out = _header("bcgtune.validation-report", env, desc)
    out.update(
        buckets=buckets,
        gap_threshold=gap_threshold,
        max_logprob_delta=max_logprob_delta,
        per_bucket=per_bucket,
        image_sweep=image_sweep,
        ok=all(e["ok"] for e in per_bucket) and (image_sweep is None or image_sweep["ok"]),
    )
    return out


# ---------------------------------------------------------------------------------------
MAX_POOL_SIZES = 16  # graph memory alone is measured at most at this many sizes (smooth in n)


def grid_sizes(step: int, max_tokens: int | None = None, trace_sizes=None, factor: float = 2.0) -> list[int]:
    """Sizes for a bucket-grid calibration: every multiple of `step` up to `max_tokens`
    (default 8192). With a trace, only the multiples some traced size n can replay in
    (n <= c <= factor * n), none above the first multiple at or past the largest traced size
    (a larger bucket only pads more) nor above `max_tokens`, plus the trace's smallest and largest size so
    eager time is measured, not extrapolated, at the ends. Pure: runs without torch."""
    if step < 1:
        raise InputError(f"--grid must be >= 1, got {step}")
    if trace_sizes is None:
        top = max_tokens or 8192
        out = list(range(step, top + 1, step))
        if not out:
            raise InputError(f"--grid {step} is above --max-tokens {top}")
        return out
    s = np.unique(np.asarray(trace_sizes, dtype=np.int64))
    top = int(-(-int(s[-1]) // step) * step)
    if max_tokens is not None:
        top = min(top, max_tokens)
    c = np.arange(step, top + 1, step, dtype=np.int64)
    # some n with c / factor <= n <= c
    hi = np.searchsorted(s, c, side="right")
    lo = np.searchsorted(s * factor, c.astype(np.float64), side="left")
    keep = set(c[lo < hi].tolist())
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


def run_calibrate(sizes=DEFAULT_CALIBRATION_SIZES, model="qwen3-8b", device="auto", dtype="auto",
                  sdpa_backend="auto", seed=0, warmup=3, repeats=10, memory=True, hf_fix_attention=True,
                  random_weights=False, progress=None):
    """Measure t_eager(n) and t_graph(b) at each size, plus graph memory. Returns
    (Calibration, raw report dict)."""
    import torch

    from bcgtune.core.calibration import Calibration
    from bcgtune.engines.torch_graphs import PrefillGraphEngine, text_inputs

    sizes = sorted(set(int(s) for s in sizes))
    if not sizes or sizes[0] < 1:
        raise InputError("calibration sizes must be positive integers", "--sizes")
    engine, desc, env = _setup(model, device, dtype, sdpa_backend, seed, max(sizes), hf_fix_attention, random_weights)
    say = progress or (lambda msg: None)
    inputs = {n: text_inputs(engine.model, n, engine.device, seed=seed + n) for n in sizes}
    eager = {}
    for n in sizes:
        eager[n] = engine.time_eager(inputs[n], warmup=warmup, repeats=repeats)
        say(f"eager  n={n:6d}  {eager[n]['median_ms']:9.3f} ms")
    pool_by = None
    if memory and engine.graphs_enabled:
        # Pool size when each size is the largest (alone in a fresh pool).
        pool_by = {}
        for n in reversed(_pool_subset(sizes)):
            solo = PrefillGraphEngine(engine.model, engine.device, n, sdpa_backend=sdpa_backend)
            r = solo.capture([n], record_attention=False)[0]
            pool_by[n] = r.pool_growth_gib if r.ok else None
            solo.release()
            del solo
            say(f"pool   n={n:6d}  {pool_by[n] if pool_by[n] is not None else float('nan'):.4f} GiB (alone)")
    recs = engine.capture(sizes)
    failed = [r for r in recs if not r.ok]
    if failed:
        from bcgtune.errors import ExternalError

        raise ExternalError(f"capture failed at {failed[0].bucket} tokens: {failed[0].error}")
    graph = {}
    for n in sizes:
        graph[n] = engine.time_replay(inputs[n], n, warmup=warmup, repeats=repeats)
        say(f"replay b={n:6d}  {graph[n]['median_ms']:9.3f} ms")
    growth = {r.bucket: r.pool_growth_gib for r in recs}
    pool_gib = per_graph = None
    if engine.graphs_enabled:
        pool_gib = growth[max(sizes)]
        rest = [growth[b] for b in sizes if b != max(sizes)]
        # mean, not median: most further graphs fit in segments the pool already holds
        # (growth 0) and a few add a segment; only the mean keeps the total (on the H200 grid
        # run the median was 0 while 122 further graphs added 1.26 GiB)
        per_graph = statistics.fmean(rest) if rest else 0.0
    meta = {
        "gpu": {k: env.get(k) for k in ("gpu_name", "gpu_memory_gib", "compute_capability", "multiprocessors", "driver")},
        "software": {k: env.get(k) for k in ("backend", "torch", "cuda", "hip", "cudnn", "python")},
        "engine": {"graph_mode": engine.mode, "sdpa_backend": env["sdpa_backend"], "warmup": warmup, "repeats": repeats,
                   "timer": "cuda events, median" if engine.device.type == "cuda" else "perf_counter, median",
                   "inputs": "one sequence of n random tokens, seeded", "replay_includes": "input copy + pad fill + replay"},
        "model": desc,
        "attention_mismatches": [r.bucket for r in recs if not r.attention_match],
        "spread": {str(n): {"eager_p10_p90": [eager[n]["p10_ms"], eager[n]["p90_ms"]],
                            "graph_p10_p90": [graph[n]["p10_ms"], graph[n]["p90_ms"]]} for n in sizes},
        "capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs},
        "pool_growth_gib_largest_first": {str(b): growth[b] for b in sizes},
    }
    pbt = None
    if pool_by and all(v is not None for v in pool_by.values()):
        pbt = (np.asarray(sorted(pool_by)), np.asarray([pool_by[k] for k in sorted(pool_by)]))
    cal = Calibration(
        tokens=np.asarray(sizes),
        eager_ms=np.asarray([eager[n]["median_ms"] for n in sizes]),
        graph_ms=np.asarray([graph[n]["median_ms"] for n in sizes]),
        pool_gib=pool_gib,
        per_graph_gib=per_graph,
        pool_by_tokens=pbt,
        meta=meta,
    )
    engine.release()
    del torch
    return cal
