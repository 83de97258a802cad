"""Rendering of the torch engine's results: capture, validate and calibrate. Pure functions
of the typed results (bcgtune/services/capture.py, validate.py, calibrate.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bcgtune.core.plan.calibration import Calibration
    from bcgtune.services.capture import CaptureReport
    from bcgtune.services.validate import BucketValidation, ValidationReport


def format_environment(environment: dict[str, Any], model: dict[str, Any]) -> str:
    """One line: GPU, CUDA or HIP, driver, torch, runner, mode, SDPA backend, model."""
    e = environment
    ver = (
        f"CUDA {e.get('cuda')}" if e.get("backend") == "cuda" else (f"HIP {e.get('hip')}" if e.get("backend") == "hip" else "CPU")
    )
    if e.get("backend") == "sim":  # the simulated device: what it replays instead of a toolkit
        ver = f"replays {(e.get('simulated') or {}).get('calibration')}"
    gpu = e.get("gpu_name") or "no GPU"
    runner = e.get("runner", "full")
    impl = f" ({e.get('graph_impl')}, attention {e.get('attention')})" if runner == "breakable" else ""
    return (
        f"{gpu} | {ver} | driver {e.get('driver')} | torch {e.get('torch')} | runner {runner}{impl} | "
        f"mode {e.get('graph_mode')} | sdpa {e.get('sdpa_backend')} | model {model.get('name')}"
    )


def format_capture(rep: CaptureReport) -> list[str]:
    lines = [format_environment(rep.environment, rep.model), f"{'bucket':>8} {'capture s':>10} {'pool GiB':>9}  result"]
    dry = rep.environment.get("graph_mode") == "padded-eager"  # no graph on this device: nothing was captured
    for r in rep.per_bucket:
        pool = "-" if r.pool_growth_gib is None else f"{r.pool_growth_gib:.4f}"
        res = ("ran eager, no graph" if dry else "ok") if r.ok else f"FAILED: {r.error}"
        if r.ok and r.segments:
            res += f" ({r.segments} segments)"
        if r.ok and not r.attention_match:
            res += "  (attention differs from eager: " + "; ".join(r.attention_capture) + ")"
        lines.append(f"{r.bucket:>8} {r.capture_s:>10.3f} {pool:>9}  {res}")
    pool = "-" if rep.pool_gib_total is None else f"{rep.pool_gib_total:.3f} GiB"
    if dry:
        lines.append(
            f"no graphs captured: {rep.graphs} buckets ran as padded eager forwards on "
            f"{rep.environment.get('backend', 'this device')} in {rep.capture_s_total:.2f} s "
            "(a dry run: graph capture not checked; run on a GPU for that)"
        )
    else:
        lines.append(f"{rep.graphs} graphs in {rep.capture_s_total:.2f} s, pool {pool}")
    return lines


def format_validation(rep: ValidationReport) -> list[str]:
    lines = [format_environment(rep.environment, rep.model)]
    if rep.injected_fault != "none":
        lines.append(f"NEGATIVE CONTROL: replay with the fault {rep.injected_fault!r} injected; this run must FAIL")
    lines += [
        (
            f"gap threshold {rep.gap_threshold}, max logprob delta {rep.max_logprob_delta}; "
            f"requests per batch {','.join(map(str, rep.requests))}; "
            f"{rep.bitwise_batches} of {rep.batches_checked} batches bit for bit"
        ),
        f"{'bucket':>7} {'sizes':>20} {'top1':>7} {'max|dlogit|':>11} {'max|dlogp|':>10} {'wide':>6} {'flips w/n':>9} "
        f"{'pad-inv':>7} {'attn':>5}  verdict",
    ]
    for e in rep.per_bucket:
        lines += _bucket_lines(e)
    sw = rep.image_sweep
    if sw:
        done = sw.done
        lines.append(
            f"image sweep {sw.image_px} px: {len(done)} prefills, new captures {sw.new_captures}, "
            f"dynamo recompiles {sw.dynamo_recompiles} (torch.compile not used), "
            f"min top1 {min((r.comparison.top1_agree for r in done), default=1.0):.4f}, "
            f"{sum(r.comparison.bitwise for r in done)} bit for bit: {'ok' if all(r.ok for r in sw.checks) else 'FAIL'}"
        )
        after = sw.text_after_image
        lines.append(
            f"text batch after an image batch, same bucket and length: {len(after)} buckets, "
            f"{sum(t.comparison.bitwise for t in after)} bit for bit: {'ok' if all(t.ok for t in after) else 'FAIL'}"
        )
        lines += _batch_problems([*done, *after])
    lines += _side_input_lines(rep)
    lines.append("PASS" if rep.ok else "FAIL")
    if not rep.ok:
        lines += [f"  {p}" for p in rep.problems()]
    return lines


def _side_input_lines(rep: ValidationReport) -> list[str]:
    """Per side input: in how many batches replay read it, of those that carry it, and how
    many batches without it left it unread (each probed by zeroing it)."""
    from bcgtune.engines.base import SIDE_INPUT_LABELS

    checks = list(rep.checks)
    if rep.image_sweep is not None:
        checks += [*rep.image_sweep.done, *rep.image_sweep.text_after_image]
    lines = ["side inputs, read by replay (probed by zeroing each):"]
    for name in rep.side_inputs:
        uses = [s for c in checks for s in c.side_inputs if s.name == name]
        given = [s for s in uses if s.given and s.replay_used is not None]
        absent = [s for s in uses if not s.given]
        line = (
            f"  {SIDE_INPUT_LABELS[name]}: read in {sum(bool(s.replay_used) for s in given)} of {len(given)} batches carrying it"
        )
        if absent:
            line += f"; unread in {sum(s.replay_used is False for s in absent)} of {len(absent)} batches without it"
        lines.append(line + ("" if all(s.ok for s in uses) else "  FAIL"))
    return lines


def _batch_problems(checks: list) -> list[str]:
    return [f"         {c.kind} n={c.n} in {c.bucket}: {'; '.join(c.problems)}" for c in checks if c.problems]


def _bucket_lines(e: BucketValidation) -> list[str]:
    if not e.captured:
        return [f"{e.bucket:>7}  capture FAILED: {e.error}"]
    cs = [c.comparison for c in e.checks]
    if not cs:
        return [f"{e.bucket:>7}  no size replays in it (all of (b/2, b] go to a smaller bucket)   ok"]
    top1 = min(c.top1_agree for c in cs)
    mad = max(c.max_abs_diff for c in cs)
    mlp = max(c.max_logprob_delta for c in cs)
    wide = sum(c.wide_gap_tokens for c in cs)
    fw = sum(c.wide_gap_flips for c in cs)
    fn = sum(c.narrow_gap_flips for c in cs)
    pi = e.pad_invariance
    pis = "-" if pi is None else ("exact" if pi.ok else f"{pi.max_abs_diff:.2g}")
    sizes = ",".join(str(s) for s in e.sizes or [])
    lines = [
        f"{e.bucket:>7} {sizes[-20:]:>20} {top1:>7.4f} {mad:>11.4g} {mlp:>10.4g} {wide:>6} {fw:>4}/{fn:<4} {pis:>7} "
        f"{'same' if e.attention_match else 'DIFF':>5}  {'ok' if e.ok else 'FAIL'}"
    ]
    for check in e.checks:
        c = check.comparison
        if c.failing_requests or (c.requests > 1 and c.differing_requests):
            lines.append(
                f"         n={check.n} r={c.requests}: requests differing {c.differing_requests}, failing {c.failing_requests}"
            )
    lines += _batch_problems(e.checks)
    if not e.attention_match:
        lines.append(f"         eager:   {'; '.join(e.attention_eager)}")
        lines.append(f"         capture: {'; '.join(e.attention_capture)}")
    return lines


def format_calibration(cal: Calibration) -> list[str]:
    g = cal.meta.get("gpu", {})
    s = cal.meta.get("software", {})
    eng = cal.meta.get("engine", {})
    lines = [
        f"{g.get('gpu_name') or 'CPU'} | driver {g.get('driver')} | torch {s.get('torch')} | "
        f"{'HIP ' + str(s.get('hip')) if s.get('hip') else 'CUDA ' + str(s.get('cuda'))} | "
        f"model {cal.meta.get('model', {}).get('name')} | runner {cal.runner} | {eng.get('graph_mode')}"
    ]
    lines += _shape_lines(cal)
    if cal.runner == "breakable" and cal.batches is not None:
        lines.append(f"{'bucket':>7} {'segments ms':>12}")
        for t, gm in zip(cal.tokens, cal.graph_ms):
            lines.append(f"{int(t):>7} {gm:>12.3f}")
        bt = cal.batches
        lines.append(f"{'tokens':>7} {'requests':>8} {'eager ms':>10} {'breaks ms':>10}")
        for t, r, e, b in zip(bt.tokens, bt.requests, bt.eager_ms, bt.breaks_ms):
            lines.append(f"{int(t):>7} {int(r):>8} {e:>10.3f} {b:>10.3f}")
    elif cal.eager_ms is not None:
        lines.append(f"{'tokens':>7} {'eager ms':>10} {'graph ms':>10} {'speed-up':>8}")
        for t, e, gm in zip(cal.tokens, cal.eager_ms, cal.graph_ms):
            lines.append(f"{int(t):>7} {e:>10.3f} {gm:>10.3f} {e / gm if gm else float('nan'):>7.2f}x")
    if cal.pool_gib is not None:
        lines.append(f"pool of the largest graph {cal.pool_gib:.3f} GiB, per further graph {cal.per_graph_gib or 0:.4f} GiB")
    lines.append(model_check_line(cal))
    return lines


def _shape_lines(cal: Calibration) -> list[str]:
    """The rank the calibration measured and how (TP, all-reduces, MoE routing), as recorded."""
    eng, model = cal.meta.get("engine", {}), cal.meta.get("model", {})
    out = []
    if isinstance(eng, dict) and eng.get("tensor_parallel"):
        out.append(f"tensor parallel: {eng['tensor_parallel']}")
    spread = model.get("routing_spread") if isinstance(model, dict) else None
    if isinstance(eng, dict) and eng.get("expert_gemm") and isinstance(spread, dict):
        out.append(
            f"MoE: routing {eng.get('routing')} (busiest expert {spread.get('busiest_over_mean')}x the mean load, "
            f"{100 * float(spread.get('idle_share') or 0):.0f}% idle, {spread.get('tokens')} random rows), "
            f"expert GEMMs {eng['expert_gemm']}, padded rows {eng.get('pad_rows')}; not reproduced: expert-parallel "
            "all-to-all, quantised kernels"
        )
    return out


def model_check_line(cal: Calibration) -> str:
    """What a calibration's intervals rest on: its model check, or why there is none."""
    from bcgtune.core.plan.model_check import not_checked_reason

    mc = cal.model_check
    if mc is None:
        return f"model error not checked ({not_checked_reason(cal)}): intervals cover the calibration's noise only"
    return f"{mc.summary()}; intervals widen by {mc.margins_text()}"


def text(lines: list[str]) -> str:
    """Lines as the command prints them: one per line, a newline after the last."""
    return "\n".join(lines) + "\n"
