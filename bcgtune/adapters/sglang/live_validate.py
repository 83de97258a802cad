"""What `bcgtune validate --server` does against a live server (the pipeline is
bcgtune/services/server_validation.py, the verdict bcgtune/core/bench/server_validation.py): the
probes, asking the server for them, and reading its log.

The same probes go to both launches, one at a time (so each prefill batch is one probe and
both servers see the same batch shapes): text prompts of several lengths and image prompts
(PNG made locally with PIL at several resolutions, so image batches with different
visual-token lengths reach several buckets), greedy, with logprobs through SGLang's native
/generate (return_logprob, top_logprobs_num).

From the graphs-on server's log: the captured buckets (capture lines) and the replays of
text and of image batches (`cuda graph: True/False`). The text phase and the image phase
are told apart by the log's line numbers at the phase boundary.

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
from typing import Any, Callable

from bcgtune.adapters.sglang.live import Launch, build_launch, ensure_alive, running_server
from bcgtune.core.bench.server_validation import GateCheck, Generation, LogReplay, PhaseReplay, ProbeKind, ProbeLaunch
from bcgtune.errors import ExternalError, InputError

MAX_NEW_TOKENS = 16
# A prompts file: each probe is a request to each of two servers, one at a time.
PROBES_MAX = 10_000
PROMPTS_FILE_MAX_BYTES = 64 << 20
IMAGE_MAX_BYTES = 64 << 20
MAX_NEW_TOKENS_MAX = 1 << 20
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
    kind: ProbeKind = "text"
    max_new_tokens: int = MAX_NEW_TOKENS


def make_image(w: int, h: int, seed: int) -> str:
    """A deterministic PNG (gradients and bands, no randomness) as a data URL."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (w, h))
    px = im.load()
    assert px is not None
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


def _image_url(img: str, base: Path, where: str) -> str:
    """A probe's image as a data URL: one as given, or a file (relative to the prompts file)."""
    if img.startswith("data:"):
        return img
    ip = Path(img) if Path(img).is_absolute() else base / img
    if not ip.is_file():
        raise InputError(f"no such image {img[:80]!r}", where)
    try:
        if ip.stat().st_size > IMAGE_MAX_BYTES:
            raise InputError(f"image {img[:80]!r} is larger than {IMAGE_MAX_BYTES >> 20} MiB", where)
        data = ip.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read image {img[:80]!r}: {exc.strerror or exc}", where) from None
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _json_probe(line: str, lineno: int, base: Path, where: str) -> Probe:
    from bcgtune import fileio

    obj = fileio.parse_json(line, where)
    if not isinstance(obj, dict):
        raise InputError('a JSON line must be an object {"text": ...}', where)
    if not isinstance(obj.get("text"), str):
        raise InputError("each JSON line needs a string 'text'", where)
    img = obj.get("image")
    if img is not None and not isinstance(img, str):
        raise InputError("'image' must be a file path or a data: URL (a string)", where)
    mnt = obj.get("max_new_tokens", MAX_NEW_TOKENS)
    if not isinstance(mnt, int) or isinstance(mnt, bool) or not 1 <= mnt <= MAX_NEW_TOKENS_MAX:
        raise InputError(f"max_new_tokens must be an integer in 1..{MAX_NEW_TOKENS_MAX:,}", where)
    url = _image_url(img, base, where) if img else None
    return Probe(f"line-{lineno}", obj["text"], url, "image" if url else "text", mnt)


def load_probes(path: str) -> list[Probe]:
    """A prompts file: JSON lines {"text": ..., "image": PATH-or-data-URL?, "max_new_tokens"?}
    or plain text, one prompt per line (UTF-8). Image paths are relative to the file."""
    from bcgtune import fileio

    text = fileio.decode_text(fileio.read_input(path, "prompts file", limit=PROMPTS_FILE_MAX_BYTES), path, "prompts file")
    base = Path(path).parent
    probes: list[Probe] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if len(probes) >= PROBES_MAX:
            raise InputError(f"more than {PROBES_MAX:,} prompts", path)
        where = f"{path}:{lineno}"
        probes.append(_json_probe(s, lineno, base, where) if s.startswith("{") else Probe(f"line-{lineno}", s))
    if not probes:
        raise InputError("prompts file holds no prompt", path)
    return probes


# --------------------------------------------------------------------------- talking to it
def generate(base_url: str, probe: Probe, timeout: float = 600.0) -> Generation:
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
    except (urllib.error.URLError, OSError, ValueError, RecursionError) as exc:
        raise ExternalError(f"/generate failed for probe {probe.name}: {exc}", base_url) from None
    try:
        return _generation(obj)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        raise ExternalError(f"/generate answered an unexpected form for probe {probe.name}", base_url) from None


def _generation(obj: Any) -> Generation:
    """SGLang's /generate answer (with return_logprob and top_logprobs_num)."""
    if isinstance(obj, list):
        obj = obj[0]
    meta = obj.get("meta_info") or {}
    lps = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []
    return Generation(
        text=str(obj.get("text", "")),
        ids=[int(x[1]) for x in lps],
        logprobs=[float(x[0]) for x in lps],
        top=[[(float(t[0]), int(t[1])) for t in (row or [])] for row in tops],
    )


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


def run_probes(
    profile: Any, probes: list[Probe], log_path: Path, label: str, say: Callable[[str], None] | None = None
) -> tuple[list[Generation], ProbeLaunch]:
    """Launch `profile`, send every probe (text ones first, then image ones), stop it.
    Returns the answers in the probes' order of sending and the launch with its log's
    line ranges of each phase."""
    launch: Launch = build_launch(profile, log_path)
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
    return outs, ProbeLaunch(launch_command=launch.argv, log=str(log_path), phases=marks)


# --------------------------------------------------------------------------- the server's log
def log_replay(log_path: str, phases: dict[str, list[int]]) -> LogReplay:
    """Captured buckets and per-phase replays from the graphs-on server's log."""
    from bcgtune.adapters.sglang.log import parse_logs
    from bcgtune.core.sglang.replay import assign_buckets

    try:
        trace = parse_logs([log_path])
    except InputError:
        return LogReplay(captured=[])
    captured = sorted(
        {b for c in trace.captures if c.get("phase") == "target" and c.get("kind") == "prefill" for b in (c.get("buckets") or [])}
    )
    assert trace.batches is not None
    lines = trace.batches["line"]
    graph = trace.batches["graph"]
    fwd = trace.batches["forward_tokens"]
    out = LogReplay(captured=captured)
    for kind in ("text", "image"):
        if kind not in phases:
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
        phase = PhaseReplay(
            batches=n,
            replayed=replayed,
            share=replayed / n if n else None,
            eligible=eligible,
            replayed_eligible=rep_eligible,
            share_of_eligible=rep_eligible / eligible if eligible else None,
            sizes=fwd[sel].tolist(),
            graph=g.tolist(),
        )
        if kind == "text":
            out.text = phase
        else:
            out.image = phase
    return out


def gate_crosscheck() -> GateCheck:
    """What doctor reads from this machine's SGLang source about the multimodal gate."""
    try:
        from bcgtune.adapters.sglang.runner_source import find_runner_source, runner_gate_state
    except ImportError:
        return GateCheck(state="unknown", detail="doctor not available")
    g = runner_gate_state(find_runner_source())
    return GateCheck(state=g.state, detail=g.detail, path=g.path)
