"""`bcgtune capture`, `validate` and `calibrate`: prefill graphs on a GPU through torch.
torch and the engine are imported inside the commands, so `bcgtune --help` stays light."""

from __future__ import annotations

import json
from typing import Optional

import typer

from bcgtune.cli.app import app

_MODEL_HELP = (
    "Built-in random-weight model (qwen3-8b, qwen3-0.6b, qwen3-vl-8b, tiny, qwen3-vl-tiny) "
    "or a local Hugging Face checkpoint folder (hf:PATH or PATH)."
)
_SDPA_HELP = "SDPA backend pinned for eager and capture alike: auto (flash on GPU, math on CPU), flash, efficient, cudnn, math, none."
_RUNNER_HELP = ("Prefill graph runner: breakable (SGLang's default on CUDA: captured segments, attention eager "
                "between them on the real rows) or full (SGLang's `full` prefill backend with one request slot: "
                "one whole-forward graph per bucket).")
_CPS_HELP = ("The server's chunked prefill size: buckets above it are refused "
             "(default: 16384, SGLang's largest default).")
_IMPL_HELP = "Breakable capture machinery: auto (SGLang's own classes when they import, else bcgtune's), sglang, bcgtune."


def _buckets(buckets: Optional[str], profile: Optional[str], where: str) -> list[int]:
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.errors import InputError

    if buckets and profile:
        raise InputError("give --buckets or --profile, not both", where)
    if buckets:
        return parse_bucket_list(buckets, "--buckets")
    if profile:
        from bcgtune.adapters.profiles import load_profile

        prof = load_profile(profile)
        if not prof.buckets:
            raise InputError("profile has no [buckets].list", profile)
        return sorted(set(int(b) for b in prof.buckets))
    raise InputError("give --buckets LIST or --profile P", where)


def _emit_json(obj, out: Optional[str]) -> None:
    from bcgtune.fileio import atomic_write_json

    if out:
        atomic_write_json(out, obj)
        typer.echo(f"wrote {out}", err=True)


def _env_line(rep: dict) -> str:
    e = rep["environment"]
    ver = f"CUDA {e.get('cuda')}" if e.get("backend") == "cuda" else (f"HIP {e.get('hip')}" if e.get("backend") == "hip" else "CPU")
    gpu = e.get("gpu_name") or "no GPU"
    runner = e.get("runner", "full")
    impl = f" ({e.get('graph_impl')}, attention {e.get('attention')})" if runner == "breakable" else ""
    return (f"{gpu} | {ver} | driver {e.get('driver')} | torch {e.get('torch')} | runner {runner}{impl} | "
            f"mode {e.get('graph_mode')} | sdpa {e.get('sdpa_backend')} | model {rep['model'].get('name')}")


@app.command("capture")
def capture_command(
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Token buckets, e.g. '256,512,1024'."),
    profile: Optional[str] = typer.Option(None, "--profile", help="A profile (name or path): its \\[buckets].list."),
    model: str = typer.Option("qwen3-8b", "--model", help=_MODEL_HELP),
    device: str = typer.Option("auto", "--device", help="auto, cuda, cuda:N or cpu."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32."),
    sdpa_backend: str = typer.Option("auto", "--sdpa-backend", help=_SDPA_HELP),
    hf_attention: str = typer.Option("causal", "--hf-attention", help="HF models: causal (bcgtune's fixed causal SDPA) or sdpa (transformers' own)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="HF folder: random weights from config.json."),
    warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Eager warm-up runs before each capture (default: 2 breakable, as SGLang; 1 full)."),
    runner: str = typer.Option("breakable", "--runner", help=_RUNNER_HELP),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size", min=1, help=_CPS_HELP),
    graph_impl: str = typer.Option("auto", "--graph-impl", help=_IMPL_HELP),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="Write the report JSON (atomic)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Capture one prefill graph per bucket (largest first, one pool): seconds, pool growth, errors."""
    from bcgtune.engines.ops import run_capture
    from bcgtune.errors import CheckFailed

    bl = _buckets(buckets, profile, "bcgtune capture")
    progress = None if as_json else (lambda r: typer.echo(f"  captured {r.bucket}: {'ok' if r.ok else r.error}", err=True))
    rep = run_capture(bl, model=model, device=device, dtype=dtype, sdpa_backend=sdpa_backend, seed=seed, warmup=warmup,
                      hf_fix_attention=_hf_fix(hf_attention), random_weights=random_weights, progress=progress,
                      runner=runner, chunked_prefill_size=chunked_prefill_size, graph_impl=graph_impl)
    _emit_json(rep, out)
    if as_json:
        typer.echo(json.dumps(rep))
    else:
        typer.echo(render_capture(rep), nl=False)
    if rep["failed"]:
        raise CheckFailed(f"{rep['failed']} of {len(rep['buckets'])} captures failed")


def _hf_fix(value: str) -> bool:
    from bcgtune.errors import InputError

    if value not in ("causal", "sdpa"):
        raise InputError(f"--hf-attention must be causal or sdpa, got {value!r}")
    return value == "causal"


def render_capture(rep: dict) -> str:
    lines = [_env_line(rep), f"{'bucket':>8} {'capture s':>10} {'pool GiB':>9}  result"]
    for r in rep["per_bucket"]:
        pool = "-" if r["pool_growth_gib"] is None else f"{r['pool_growth_gib']:.4f}"
        res = "ok" if r["ok"] else f"FAILED: {r['error']}"
        if r["ok"] and r.get("segments"):
            res += f" ({r['segments']} segments)"
        if r["ok"] and not r["attention_match"]:
            res += "  (attention differs from eager: " + "; ".join(r["attention_capture"]) + ")"
        lines.append(f"{r['bucket']:>8} {r['capture_s']:>10.3f} {pool:>9}  {res}")
    pool = "-" if rep["pool_gib_total"] is None else f"{rep['pool_gib_total']:.3f} GiB"
    lines.append(f"{rep['graphs']} graphs in {rep['capture_s_total']:.2f} s, pool {pool}")
    return "\n".join(lines) + "\n"


@app.command("validate")
def validate_command(
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Token buckets to check, e.g. '256,512,1024'."),
    profile: Optional[str] = typer.Option(None, "--profile", help="A profile (name or path): its \\[buckets].list."),
    model: str = typer.Option("qwen3-8b", "--model", help=_MODEL_HELP),
    server: bool = typer.Option(False, "--server", help="Validate a live SGLang server launched from --profile instead."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="With --server: prompts file."),
    min_replay_share: Optional[float] = typer.Option(None, "--min-replay-share", help="With --server: least share of prefill batches that must replay."),
    device: str = typer.Option("auto", "--device", help="auto, cuda, cuda:N or cpu."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32."),
    sdpa_backend: str = typer.Option("auto", "--sdpa-backend", help=_SDPA_HELP),
    hf_attention: str = typer.Option("causal", "--hf-attention", help="HF models: causal (fixed) or sdpa (transformers' own)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="HF folder: random weights from config.json."),
    sizes_per_bucket: int = typer.Option(3, "--sizes-per-bucket", min=1, help="Sizes checked per bucket in (b/2, b] (ends included)."),
    requests: str = typer.Option("1,4", "--requests", help="Request counts each size is checked with (a batch of n tokens from r requests; the full runner checks 1)."),
    runner: str = typer.Option("breakable", "--runner", help=_RUNNER_HELP),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size", min=1, help=_CPS_HELP),
    graph_impl: str = typer.Option("auto", "--graph-impl", help=_IMPL_HELP),
    gap_threshold: float = typer.Option(0.7, "--gap-threshold", min=0.0, help="Top-1/top-2 logit gap above which a flip or logprob change fails (vLLM #55944)."),
    max_logprob_delta: float = typer.Option(0.5, "--max-logprob-delta", min=0.0, help="Largest |logprob change| of eager's top-1 allowed where the gap is wide."),
    images: Optional[bool] = typer.Option(None, "--images/--no-images", help="Sweep image-style inputs (default: on for VL models)."),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="Write the report JSON (atomic)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Padded replay vs eager on identical inputs, per bucket; non-zero exit on failure."""
    from bcgtune.errors import CheckFailed, InputError

    if server:
        if not profile:
            raise InputError("--server needs --profile P (the launch to validate)", "bcgtune validate")
        from bcgtune.adapters.live_validate import run_server_validation

        code = run_server_validation(profile=profile, prompts=prompts, min_replay_share=min_replay_share, json_out=as_json,
                                     gap_threshold=gap_threshold, delta_tol=max_logprob_delta)
        raise typer.Exit(int(code))
    if prompts is not None or min_replay_share is not None:
        raise InputError("--prompts and --min-replay-share apply with --server only", "bcgtune validate")
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.engines.ops import run_validate

    bl = _buckets(buckets, profile, "bcgtune validate")
    progress = None if as_json else (lambda e: typer.echo(f"  bucket {e['bucket']}: {'ok' if e['ok'] else 'FAIL'}", err=True))
    rep = run_validate(bl, model=model, device=device, dtype=dtype, sdpa_backend=sdpa_backend, seed=seed,
                       sizes_per_bucket=sizes_per_bucket, gap_threshold=gap_threshold,
                       max_logprob_delta=max_logprob_delta, images=images, hf_fix_attention=_hf_fix(hf_attention),
                       random_weights=random_weights, progress=progress, runner=runner,
                       requests=parse_bucket_list(requests, "--requests"), chunked_prefill_size=chunked_prefill_size,
                       graph_impl=graph_impl)
    _emit_json(rep, out)
    if as_json:
        typer.echo(json.dumps(rep))
    else:
        typer.echo(render_validate(rep), nl=False)
    if not rep["ok"]:
        bad = [str(e["bucket"]) for e in rep["per_bucket"] if not e["ok"]]
        what = f"buckets {', '.join(bad)} failed" if bad else "image sweep failed"
        raise CheckFailed(f"validation failed: {what}")


def render_validate(rep: dict) -> str:
    lines = [_env_line(rep),
             (f"gap threshold {rep['gap_threshold']}, max logprob delta {rep['max_logprob_delta']}; "
              f"requests per batch {','.join(map(str, rep.get('requests', [1])))}; "
              f"{rep.get('bitwise_batches', 0)} of {rep.get('batches_checked', 0)} batches bit for bit"),
             f"{'bucket':>7} {'sizes':>20} {'top1':>7} {'max|dlogit|':>11} {'max|dlogp|':>10} {'wide':>6} {'flips w/n':>9} {'pad-inv':>7} {'attn':>5}  verdict"]
    for e in rep["per_bucket"]:
        if not e["captured"]:
            lines.append(f"{e['bucket']:>7}  capture FAILED: {e['error']}")
            continue
        cs = e["checks"]
        if not cs:
            lines.append(f"{e['bucket']:>7}  no size replays in it (all of (b/2, b] go to a smaller bucket)   ok")
            continue
        top1 = min(c["top1_agree"] for c in cs)
        mad = max(c["max_abs_diff"] for c in cs)
        mlp = max(c["max_logprob_delta"] for c in cs)
        wide = sum(c["wide_gap_tokens"] for c in cs)
        fw = sum(c["wide_gap_flips"] for c in cs)
        fn = sum(c["narrow_gap_flips"] for c in cs)
        pi = e.get("pad_invariance")
        pis = "-" if pi is None else ("exact" if pi["ok"] else f"{pi['max_abs_diff']:.2g}")
        sizes = ",".join(str(s) for s in e["sizes"])
        lines.append(f"{e['bucket']:>7} {sizes[-20:]:>20} {top1:>7.4f} {mad:>11.4g} {mlp:>10.4g} {wide:>6} {fw:>4}/{fn:<4} {pis:>7} "
                     f"{'same' if e['attention_match'] else 'DIFF':>5}  {'ok' if e['ok'] else 'FAIL'}")
        for c in cs:
            if c.get("failing_requests") or (c.get("requests", 1) > 1 and c.get("differing_requests")):
                lines.append(f"         n={c['n']} r={c['requests']}: requests differing {c['differing_requests']}, "
                             f"failing {c['failing_requests']}")
        if not e["attention_match"]:
            lines.append(f"         eager:   {'; '.join(e['attention_eager'])}")
            lines.append(f"         capture: {'; '.join(e['attention_capture'])}")
    sw = rep.get("image_sweep")
    if sw:
        done = [r for r in sw["checks"] if "skipped" not in r]
        lines.append(
            f"image sweep {sw['image_px']} px: {len(done)} prefills, new captures {sw['new_captures']}, "
            f"dynamo recompiles {sw['dynamo_recompiles']} (torch.compile not used), "
            f"min top1 {min((r['top1_agree'] for r in done), default=1.0):.4f}: {'ok' if sw['ok'] else 'FAIL'}"
        )
    lines.append("PASS" if rep["ok"] else "FAIL")
    return "\n".join(lines) + "\n"


@app.command("calibrate")
def calibrate_command(
    out: str = typer.Option(..., "-o", "--out", help="Calibration file to write: JSON (versioned) or .csv."),
    model: str = typer.Option("qwen3-8b", "--model", help=_MODEL_HELP),
    sizes: Optional[str] = typer.Option(None, "--sizes", help="Token sizes to measure (default 16 ... 8192, 15 sizes)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Drop sizes above this."),
    grid: Optional[int] = typer.Option(None, "--grid", min=1, help="Measure every multiple of this (a bucket grid; suggest-buckets then picks buckets among the measured sizes). Up to --max-tokens (default 8192) or the trace's range."),
    sizes_from: Optional[str] = typer.Option(None, "--sizes-from", help="Trace file: measure the grid (default --grid 64) over the sizes this trace's batches can replay in, plus its smallest and largest size."),
    device: str = typer.Option("auto", "--device", help="auto, cuda, cuda:N or cpu."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32."),
    sdpa_backend: str = typer.Option("auto", "--sdpa-backend", help=_SDPA_HELP),
    hf_attention: str = typer.Option("causal", "--hf-attention", help="HF models: causal (fixed) or sdpa (transformers' own)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="HF folder: random weights from config.json."),
    factor: float = typer.Option(2.0, "--padding-factor", help="With --sizes-from: replay iff bucket <= factor * tokens (SGLang: 2)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed runs before each measurement."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed runs per size (median reported)."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Also measure pool size per largest bucket."),
    runner: str = typer.Option("breakable", "--runner", help=_RUNNER_HELP),
    mix_every: int = typer.Option(1, "--mix-every", min=1, help="Breakable, with --sizes-from: measure every Nth distinct (tokens, requests) batch of the trace (others interpolated), to save device time on large models."),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size", min=1, help=_CPS_HELP),
    graph_impl: str = typer.Option("auto", "--graph-impl", help=_IMPL_HELP),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration JSON on stdout too."),
) -> None:
    """Measure what the time objective prices on one runner (breakable: segments per bucket, and eager and break time per batch of the trace's (tokens, requests) mix; full: eager and replay per size) and graph memory; write a calibration."""
    from bcgtune.core.calibration import save_calibration
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.engines.ops import DEFAULT_CALIBRATION_SIZES, run_calibrate
    from bcgtune.errors import InputError

    if not out:
        raise InputError("give -o FILE", "bcgtune calibrate")
    if sizes and (grid or sizes_from):
        raise InputError("give --sizes, or --grid/--sizes-from, not both", "bcgtune calibrate")
    meta_extra = {}
    mix = None
    if sizes_from or grid:
        from bcgtune.engines.ops import grid_sizes

        trace_sizes = None
        if sizes_from:
            from bcgtune.core.mix import batch_mix
            from bcgtune.core.trace import load_trace

            trace = load_trace(sizes_from).validate()
            trace_sizes = trace.sizes
            mix = batch_mix(trace).sample(mix_every)
        step = grid or 64
        wanted = grid_sizes(step, max_tokens=max_tokens, trace_sizes=trace_sizes, factor=factor)
        meta_extra = {"bucket_grid": step, "sizes_from": sizes_from}
        if mix is not None:
            meta_extra["mix_every"] = mix_every
    else:
        wanted = parse_bucket_list(sizes, "--sizes") if sizes else list(DEFAULT_CALIBRATION_SIZES)
        if max_tokens is not None:
            wanted = [s for s in wanted if s <= max_tokens] or [max_tokens]
    say = None if as_json else (lambda m: typer.echo("  " + m, err=True))
    if say:
        say(f"{len(wanted)} sizes: {wanted[0]} ... {wanted[-1]}")
    cal = run_calibrate(wanted, model=model, device=device, dtype=dtype, sdpa_backend=sdpa_backend, seed=seed,
                        warmup=warmup, repeats=repeats, memory=memory, hf_fix_attention=_hf_fix(hf_attention),
                        random_weights=random_weights, progress=say, runner=runner, mix=mix,
                        chunked_prefill_size=chunked_prefill_size, graph_impl=graph_impl)
    cal.meta.update(meta_extra)
    save_calibration(cal, out)
    typer.echo(f"wrote {out}", err=True)
    if as_json:
        typer.echo(json.dumps(cal.to_json_obj()))
    else:
        typer.echo(render_calibration(cal), nl=False)


def render_calibration(cal) -> str:
    g = cal.meta.get("gpu", {})
    s = cal.meta.get("software", {})
    eng = cal.meta.get("engine", {})
    lines = [f"{g.get('gpu_name') or 'CPU'} | driver {g.get('driver')} | torch {s.get('torch')} | "
             f"{'HIP ' + str(s.get('hip')) if s.get('hip') else 'CUDA ' + str(s.get('cuda'))} | "
             f"model {cal.meta.get('model', {}).get('name')} | runner {cal.runner} | {eng.get('graph_mode')}"]
    if cal.runner == "breakable":
        lines.append(f"{'bucket':>7} {'segments ms':>12}")
        for t, gm in zip(cal.tokens, cal.graph_ms):
            lines.append(f"{int(t):>7} {gm:>12.3f}")
        bt = cal.batches
        lines.append(f"{'tokens':>7} {'requests':>8} {'eager ms':>10} {'breaks ms':>10}")
        for t, r, e, b in zip(bt.tokens, bt.requests, bt.eager_ms, bt.breaks_ms):
            lines.append(f"{int(t):>7} {int(r):>8} {e:>10.3f} {b:>10.3f}")
    else:
        lines.append(f"{'tokens':>7} {'eager ms':>10} {'graph ms':>10} {'speed-up':>8}")
        for t, e, gm in zip(cal.tokens, cal.eager_ms, cal.graph_ms):
            lines.append(f"{int(t):>7} {e:>10.3f} {gm:>10.3f} {e / gm if gm else float('nan'):>7.2f}x")
    if cal.pool_gib is not None:
        lines.append(f"pool of the largest graph {cal.pool_gib:.3f} GiB, per further graph {cal.per_graph_gib or 0:.4f} GiB")
    return "\n".join(lines) + "\n"
