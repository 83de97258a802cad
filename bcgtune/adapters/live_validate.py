"""`bcgtune validate --server`: the patched-runner check on a live server.

Two launches of one profile: graphs on (as the profile says) and graphs off
(`--cuda-graph-backend-prefill disabled`). The same probes go to both, one at a time (so
each prefill batch is one probe and both servers see the same batch shapes): text prompts
of several lengths and image prompts (PNG made locally with PIL at several resolutions, so
image batches with different visual-token lengths reach several buckets), greedy, with
logprobs through SGLang's native /generate (return_logprob, top_logprobs_num).

Compared per request and position, up to the first top-1 flip (after a flip the contexts
differ and later positions say nothing about graphs): top-1 agreement, |logprob delta| of
the chosen token, and the eager top-1/top-2 gap at a flip. A flip fails only where that gap
exceeds --gap-threshold (below it, a flip is bf16 noise: vLLM #55944); a logprob delta
fails where it exceeds the delta tolerance. Identical-text rate is reported.

From the graphs-on server's log: the captured buckets (capture lines) and the replay share
of text and of image batches (`cuda graph: True/False`). The text phase and the image phase
are told apart by the log's line numbers at the phase boundary. The share that is checked
against --min-replay-share counts only batches whose size the replay rule serves with the
captured buckets (a size with no bucket within 2x runs eager by design). On a Qwen4-Exp
model without speculative decoding, image batches replaying proves the patched runner; if
text batches replay but every image batch runs eager, the runner is unpatched.

Environment: BCGTUNE_SERVER_CMD as in live.py. BCGTUNE_IMAGE_PROMPT overrides the text that
goes with an image (default: Qwen-VL chat form with one image placeholder).
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcgtune.adapters.live import build_launch, ensure_alive, graphs_off, running_server, terminate_as_interrupt
from bcgtune.core.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.document import document_header
from bcgtune.errors import ExternalError, InputError

DEFAULT_MIN_REPLAY_SHARE = 0.9  # of the batches a captured bucket serves under the 2x rule
MAX_NEW_TOKENS = 16
TOP_LOGPROBS = 5
IMAGE_SIZES = [(256, 256), (384, 512), (512, 512), (768, 768), (1024, 768)]
QWEN_VL_IMAGE_PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image in detail.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
_TEXT_SEEDS = [
    "Explain how a CUDA graph differs from eager kernel launches.",
    "Write a short story about a lighthouse keeper who collects clocks.",
    "List the planets of the solar system with one fact about each.",
    "Summarize the causes of the French Revolution.",
    "Describe the water cycle to a ten year old.",
    "Give three tips for writing clear technical documentation.",
]
_TEXT_REPEATS = [1, 3, 8, 20, 50, 120]  # lengths from ~15 to ~1500 tokens: several buckets


@dataclass
class Probe:
    name: str
    text: str
    image: str | None = None  # data URL
    kind: str = "text"  # text | image
    max_new_tokens: int = MAX_NEW_TOKENS


def make_image(w: int, h: int, seed: int) -> str:
    """A deterministic PNG (gradients and bands, no randomness) as a data URL."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (w, h))
    px = im.load()
    for y in range(h):
        for x in range(0, w):
            px[x, y] = ((x * 255) // max(1, w - 1), (y * 255) // max(1, h - 1), (seed * 53 + (x ^ y)) % 256)
    d = ImageDraw.Draw(im)
    for k in range(4):
        d.rectangle([k * w // 8, k * h // 8, w - k * w // 8 - 1, k * h // 16 + h // 4], outline=(255 - 40 * k, 40 * k, 128))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def default_probes() -> list[Probe]:
    probes = [Probe(f"text-{i}", " ".join([_TEXT_SEEDS[i % len(_TEXT_SEEDS)]] * rep)) for i, rep in enumerate(_TEXT_REPEATS)]
    prompt = os.environ.get("BCGTUNE_IMAGE_PROMPT") or QWEN_VL_IMAGE_PROMPT
    for i, (w, h) in enumerate(IMAGE_SIZES):
        probes.append(Probe(f"image-{w}x{h}", prompt, make_image(w, h, i), "image"))
    return probes


def load_probes(path: str) -> list[Probe]:
    """A prompts file: JSON lines {"text": ..., "image": PATH-or-data-URL?, "max_new_tokens"?}
    or plain text, one prompt per line. Image paths are relative to the file."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such prompts file", path)
    probes = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as exc:
                raise InputError(f"invalid JSON: {exc.msg}", f"{path}:{lineno}") from None
            if not isinstance(obj.get("text"), str):
                raise InputError("each JSON line needs a string 'text'", f"{path}:{lineno}")
            img = obj.get("image")
            if img is not None and not str(img).startswith("data:"):
                ip = (p.parent / img) if not Path(img).is_absolute() else Path(img)
                if not ip.is_file():
                    raise InputError(f"no such image {img!r}", f"{path}:{lineno}")
                img = "data:image/png;base64," + base64.b64encode(ip.read_bytes()).decode()
            mnt = obj.get("max_new_tokens", MAX_NEW_TOKENS)
            if not isinstance(mnt, int) or mnt < 1:
                raise InputError("max_new_tokens must be a positive integer", f"{path}:{lineno}")
            probes.append(Probe(f"line-{lineno}", obj["text"], img, "image" if img else "text", mnt))
        else:
            probes.append(Probe(f"line-{lineno}", s))
    if not probes:
        raise InputError("prompts file holds no prompt", path)
    return probes


# --------------------------------------------------------------------------- talking to it
def generate(base_url: str, probe: Probe, timeout: float = 600.0) -> dict:
    body: dict[str, Any] = {
        "text": probe.text,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": probe.max_new_tokens},
        "return_logprob": True,
        "top_logprobs_num": TOP_LOGPROBS,
        "stream": False,
    }
    if probe.image:
        body["image_data"] = [probe.image]
    req = urllib.request.Request(
        base_url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (127.0.0.1)
            obj = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode(errors="replace")
        raise ExternalError(f"/generate answered {exc.code} for probe {probe.name}: {detail}", base_url) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ExternalError(f"/generate failed for probe {probe.name}: {exc}", base_url) from None
    if isinstance(obj, list):
        obj = obj[0]
    meta = obj.get("meta_info") or {}
    lps = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []
    return {
        "text": obj.get("text", ""),
        "ids": [int(x[1]) for x in lps],
        "logprobs": [float(x[0]) for x in lps],
        "top": [[(float(t[0]), int(t[1])) for t in (row or [])] for row in tops],
    }


def _log_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def _settled_lines(path: Path, quiet_s: float = 0.3, limit_s: float = 5.0) -> int:
    """Line count of the server's log once it stopped growing (its output pump lags)."""
    n = _log_lines(path)
    t_end = time.monotonic() + limit_s
    stable_since = time.monotonic()
    while time.monotonic() < t_end:
        time.sleep(0.05)
        m = _log_lines(path)
        if m != n:
            n, stable_since = m, time.monotonic()
        elif time.monotonic() - stable_since >= quiet_s:
            break
    return n


def run_probes(profile, probes: list[Probe], log_path: Path, label: str, say=None) -> tuple[list[dict], dict]:
    launch = build_launch(profile, log_path)
    outs = []
    marks: dict[str, list[int]] = {}
    with running_server(launch, label=label, say=say) as server:
        start = _settled_lines(log_path)
        for kind in ("text", "image"):
            group = [p for p in probes if p.kind == kind]
            if not group:
                continue
            begin = _settled_lines(log_path)
            for p in group:
                ensure_alive(server, launch, f"probe {p.name}")
                outs.append(generate(launch.base_url, p))
            marks[kind] = [begin, _settled_lines(log_path)]
        marks["start"] = [0, start]
    return outs, {"launch_command": launch.argv, "log": str(log_path), "phases": marks}


# --------------------------------------------------------------------------- comparing
@dataclass
class RequestCompare:
    name: str
    kind: str
    positions: int  # positions compared (up to and including the first flip)
    agree: int
    first_flip: int | None
    flip_gap: float | None  # eager top1 - top2 logprob at the flip
    flip_fails: bool
    max_logprob_delta: float
    delta_fails: bool
    identical_text: bool


def compare_outputs(probes, on, off, gap_threshold: float, delta_tol: float) -> list[RequestCompare]:
    out = []
    for p, a, b in zip(probes, on, off):
        n = min(len(a["ids"]), len(b["ids"]))
        agree = 0
        flip = None
        deltas = []
        for i in range(n):
            if a["ids"][i] != b["ids"][i]:
                flip = i
                break
            agree += 1
            deltas.append(abs(a["logprobs"][i] - b["logprobs"][i]))
        gap = None
        if flip is not None:
            top = b["top"][flip] if flip < len(b["top"]) else []
            if len(top) >= 2:
                gap = top[0][0] - top[1][0]
        flip_fails = flip is not None and (gap is None or gap > gap_threshold)
        mx = max(deltas) if deltas else 0.0
        out.append(
            RequestCompare(
                p.name,
                p.kind,
                agree + (1 if flip is not None else 0),
                agree,
                flip,
                gap,
                flip_fails,
                mx,
                mx > delta_tol,
                a["text"] == b["text"],
            )
        )
    return out


def replay_shares(log_path: str, phases: dict) -> dict:
    """Captured buckets and per-phase replay shares from the graphs-on server's log."""
    from bcgtune.adapters.sglang_log import parse_logs
    from bcgtune.core.replay import assign_buckets

    try:
        trace = parse_logs([log_path])
    except InputError:
        return {"captured": [], "text": None, "image": None}
    captured = sorted(
        {b for c in trace.captures if c.get("phase") == "target" and c.get("kind") == "prefill" for b in (c.get("buckets") or [])}
    )
    lines = trace.batches["line"]
    graph = trace.batches["graph"]
    fwd = trace.batches["forward_tokens"]
    out: dict[str, Any] = {"captured": captured}
    for kind in ("text", "image"):
        if kind not in phases:
            out[kind] = None
            continue
        lo, hi = phases[kind]
        sel = (lines > lo) & (lines <= hi)
        g = graph[sel]
        n = int(sel.sum())
        replayed = int((g == 1).sum())
        if captured:
            _, ok = assign_buckets(fwd[sel], captured)
            eligible = int(ok.sum())
            rep_eligible = int(((g == 1) & ok).sum())
        else:
            eligible = rep_eligible = 0
        out[kind] = {
            "batches": n,
            "replayed": replayed,
            "share": replayed / n if n else None,
            "eligible": eligible,
            "replayed_eligible": rep_eligible,
            "share_of_eligible": rep_eligible / eligible if eligible else None,
            "sizes": fwd[sel].tolist(),
            "graph": g.tolist(),
        }
    return out


def gate_crosscheck() -> dict:
    try:
        from bcgtune.adapters.runner_source import find_runner_source, runner_gate_state
    except ImportError:
        return {"state": "unknown", "detail": "doctor not available"}
    g = runner_gate_state(find_runner_source())
    return {"state": g.state, "detail": g.detail, "path": g.path}


def runner_verdict(shares: dict, qwen4: bool | None, speculative: bool, backend: str) -> tuple[str, str]:
    img, txt = shares.get("image"), shares.get("text")
    if not img or not img["batches"]:
        return "unknown", "no image batch was probed"
    if backend != "breakable":
        return "not-applicable", f"prefill backend is {backend}: the multimodal gate applies to breakable graphs only"
    if speculative:
        return "not-applicable", "speculative decoding is on: image batches run eager with either runner"
    if img["replayed"] > 0:
        what = "patched" if qwen4 is not False else "replays"
        return what, "image batches replay" + (
            " (Qwen4-Exp without speculative decoding: the patched runner is in place)" if qwen4 else ""
        )
    if txt and txt["replayed"] > 0 and img["eligible"] > 0:
        if qwen4 is False:
            return "eager-images", "image batches run eager while text batches replay (model is not Qwen4-Exp)"
        return "unpatched", "every image batch ran eager while text batches replayed: the prefill runner is unpatched"
    return "unknown", "no batch replayed, or no image batch had a bucket within 2x"


def server_validation(
    profile_ref: str,
    prompts: str | None = None,
    min_replay_share: float | None = None,
    gap_threshold: float = GAP_THRESHOLD,
    delta_tol: float = MAX_LOGPROB_DELTA,
    workdir: str | os.PathLike | None = None,
    say=None,
) -> dict:
    """Run both launches and return the report (ok + reasons; also written to
    <workdir>/validation.json). `min_replay_share` None: DEFAULT_MIN_REPLAY_SHARE. `say`:
    progress callback (one line each)."""
    from bcgtune.adapters.model_config import model_is_qwen4_exp
    from bcgtune.adapters.profiles import load_profile
    from bcgtune.adapters.sglang_flags import effective_prefill_backend

    if min_replay_share is None:
        min_replay_share = DEFAULT_MIN_REPLAY_SHARE
    if not 0.0 <= min_replay_share <= 1.0:
        raise InputError(f"min replay share must be within 0..1, got {min_replay_share}", "--min-replay-share")
    profile = load_profile(profile_ref)
    backend, _ = effective_prefill_backend(profile.server, profile.platform)
    if backend == "disabled":
        raise InputError("the profile runs prefill graphs disabled: nothing to validate against eager", profile.where)
    probes = load_probes(prompts) if prompts else default_probes()
    folder = Path(workdir) if workdir else Path.cwd() / f"bcgtune-validate-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    with terminate_as_interrupt():
        on, on_info = run_probes(profile, probes, folder / "graphs-on.server.log", "graphs-on server", say)
        off, off_info = run_probes(graphs_off(profile), probes, folder / "graphs-off.server.log", "graphs-off server", say)
    cmp = compare_outputs(probes, on, off, gap_threshold, delta_tol)
    shares = replay_shares(on_info["log"], on_info["phases"])
    qwen4 = model_is_qwen4_exp(profile.model)
    spec = bool(profile.server.get("speculative_algorithm"))
    state, why = runner_verdict(shares, qwen4, spec, backend)
    reasons = []
    for c in cmp:
        if c.flip_fails:
            gap = "unknown" if c.flip_gap is None else f"{c.flip_gap:.2f}"
            reasons.append(f"{c.name}: top-1 flip at position {c.first_flip} with eager gap {gap} > {gap_threshold}")
        if c.delta_fails:
            reasons.append(f"{c.name}: logprob delta {c.max_logprob_delta:.3f} > {delta_tol}")
    if not shares["captured"]:
        reasons.append("the graphs-on server logged no prefill capture")
    for kind in ("text", "image"):
        s = shares.get(kind)
        if s and s["eligible"]:
            if s["share_of_eligible"] < min_replay_share:
                reasons.append(
                    f"{kind} batches replayed {s['replayed_eligible']}/{s['eligible']} of those a bucket serves "
                    f"({100 * s['share_of_eligible']:.0f}% < {100 * min_replay_share:.0f}%)"
                )
    n_pos = sum(c.positions for c in cmp)
    report = {
        **document_header("bcgtune.server-validation"),
        "profile": profile.name,
        "model": profile.model,
        "backend": backend,
        "probes": len(probes),
        "gap_threshold": gap_threshold,
        "logprob_delta_tolerance": delta_tol,
        "min_replay_share": min_replay_share,
        "top1_agreement": (sum(c.agree for c in cmp) / n_pos) if n_pos else None,
        "identical_text_rate": sum(c.identical_text for c in cmp) / len(cmp) if cmp else None,
        "max_logprob_delta": max((c.max_logprob_delta for c in cmp), default=0.0),
        "requests": [c.__dict__ for c in cmp],
        "captured_buckets": shares["captured"],
        "replay": {k: shares.get(k) for k in ("text", "image")},
        "runner": {"verdict": state, "why": why, "qwen4_exp": qwen4, "speculative": spec, "doctor": gate_crosscheck()},
        "launches": {"graphs_on": on_info, "graphs_off": off_info},
        "workdir": str(folder),
        "ok": not reasons,
        "failures": reasons,
    }
    from bcgtune.fileio import atomic_write_json

    atomic_write_json(folder / "validation.json", report)
    return report
