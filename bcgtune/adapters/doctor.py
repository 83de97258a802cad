"""`bcgtune doctor`: what the installed stack will do with prefill CUDA graphs, before a
10-minute server start-up.

SGLang is asked itself, in a child process (bcgtune.adapters.sglang_resolve): its argument
resolution says which prefill graphs a profile's launch captures, `serve`'s flag check says
whether it would launch at all, and the prefill runner's own `can_replay_locally`
(srt/model_executor/runner/prefill_cuda_graph_runner.py, built on the CPU with stand-ins
for the GPU) says whether a Qwen4-Exp (Qwen3.8-Flash-Next) image batch and a text batch
replay, with speculative decoding off and on. The gate is classified by those answers:

  patched          images replay without speculative decoding, stay eager with it
                   (the multimodal breakable-prefill patch)
  unpatched        every image batch runs eager
  refusal-removed  images replay even under speculative decoding, which the patch
                   exists to prevent (the draft runner still refuses them)
  inverted         images replay only under speculative decoding
  unknown          the runner could not be built or asked

When the runner module cannot be imported (SGLang absent, or a copy that does not import
here), its source is read with `ast` instead, and the report says it is a reading:
patched / unpatched / absent / unknown by the shape of the code.
"""

from __future__ import annotations

import ast
import bisect
import json
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bcgtune.adapters.sglang_resolve import (
    FlagCheck,
    ResolvedPrefill,
    RunnerAnswers,
    SglangAnswers,
    ask_sglang,
    locate_model_config,
    resolve_with_model,
)
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, smallest_replaying_size
from bcgtune.errors import InputError

RUNNER_RELPATH = Path("srt/model_executor/runner/prefill_cuda_graph_runner.py")
QWEN4_EXP_ARCHS = ("Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLMMTP")
_QWEN4_NAME_RE = re.compile(r"qwen3\.8-flash-next|qwen4[-_]?exp", re.IGNORECASE)

BLOCKING, WARNING, INFO = "blocking", "warning", "info"


@dataclass
class Finding:
    severity: str  # blocking | warning | info
    code: str
    message: str


@dataclass
class GateReport:
    state: str  # patched | unpatched | refusal-removed | inverted | absent | unknown
    detail: str
    path: str | None
    method: str = "source reading"  # "behaviour" (the runner was run) | "source reading" (ast)
    answers: dict[str, bool] | None = None  # image/text x speculative off/on, when run


@dataclass
class DoctorReport:
    python: dict
    torch: dict
    sglang: dict
    default_prefill_backend: str | None
    prefill_runner_gate: GateReport
    profile: str | None = None
    findings: list[Finding] = field(default_factory=list)
    resolved_prefill: ResolvedPrefill | None = None

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKING]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = not self.blocking
        return d


# --------------------------------------------------------------------------- environment
def python_info() -> dict:
    return {"version": platform.python_version(), "executable": sys.executable}


def torch_info() -> dict:
    """torch's version, CUDA or HIP runtime and GPUs. torch absent is fine."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    info: dict = {
        "installed": True,
        "version": getattr(torch, "__version__", "unknown"),
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "gpus": [],
    }
    try:
        available = bool(torch.cuda.is_available())
        info["gpu_available"] = available
        if available:
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                info["gpus"].append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    except Exception as exc:
        info["gpu_available"] = False
        info["gpu_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return info


def sglang_info() -> dict:
    """sglang's version and package folder without importing it (find_spec on a top-level
    package locates it without running its __init__)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False}
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None  # a source checkout on sys.path
    return {"installed": True, "version": version, "path": str(Path(list(spec.submodule_search_locations)[0]))}


def default_prefill_backend(torch_: dict) -> str | None:
    """model_executor/cuda_graph_config.py, default_prefill_backend: breakable when
    is_cuda() (a CUDA build of torch with a visible GPU), else disabled (ROCm: opt-in)."""
    if not torch_.get("installed"):
        return None
    if torch_.get("cuda") and torch_.get("gpu_available"):
        return "breakable"
    return "disabled"


# --------------------------------------------------------------------------- the gate
def find_runner_source(sglang_path: str | None = None) -> Path | None:
    if sglang_path is None:
        sglang_path = sglang_info().get("path")
    if not sglang_path:
        return None
    return Path(sglang_path) / RUNNER_RELPATH


def _self_attrs(node: ast.AST) -> set[str]:
    return {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _returns_false(body: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Return) and isinstance(s.value, ast.Constant) and s.value.value is False for s in body)


def _runner_methods(p: Path) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.FunctionDef | ast.AsyncFunctionDef] | str:
    """PrefillCudaGraphRunner's __init__ and can_replay_locally from the runner's source,
    or why they cannot be read."""
    try:
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
    except (OSError, SyntaxError, ValueError) as exc:
        return f"cannot parse runner source: {type(exc).__name__}"
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PrefillCudaGraphRunner"), None)
    if cls is None:
        return "class PrefillCudaGraphRunner not found"
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    init, can = methods.get("__init__"), methods.get("can_replay_locally")
    if init is None or can is None:
        missing = [m for m in ("__init__", "can_replay_locally") if m not in methods]
        return f"PrefillCudaGraphRunner.{'/'.join(missing)} not found"
    return init, can


def _qwen_bcg_assignments(init: ast.AST) -> dict[str, ast.expr]:
    """`self._qwen_bcg_* = <expr>` in __init__: each attribute and its expression."""
    assigned: dict[str, ast.expr] = {}
    for node in ast.walk(init):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr.startswith("_qwen_bcg")
            ):
                assigned[t.attr] = node.value
    return assigned


def _multimodal_gate_attrs(can: ast.AST) -> set[str]:
    """The `self._qwen_bcg_*` attributes read by `if contains_mm_inputs and ...: return
    False` in can_replay_locally."""
    gate_attrs: set[str] = set()
    for node in ast.walk(can):
        if isinstance(node, ast.If) and "contains_mm_inputs" in _names(node.test) and _returns_false(node.body):
            gate_attrs |= {a for a in _self_attrs(node.test) if a.startswith("_qwen_bcg")}
    return gate_attrs


def _classify_reading(assigned: dict[str, ast.expr], gate_attrs: set[str], where: str) -> GateReport:
    """The gate's state from the attributes __init__ sets and the ones the multimodal
    refusal reads."""
    if not gate_attrs:
        if not assigned:
            return GateReport("absent", "no Qwen4-Exp multimodal refusal in can_replay_locally", where)
        return GateReport(
            "unknown",
            f"__init__ sets {', '.join(sorted(assigned))} but no multimodal gate reads them",
            where,
        )
    if gate_attrs == {"_qwen_bcg_multimodal_eager"}:
        expr = assigned.get("_qwen_bcg_multimodal_eager")
        if expr is not None and "is_speculative" in ast.unparse(expr):
            return GateReport(
                "patched", "image batches replay unless speculative decoding is on (_qwen_bcg_multimodal_eager)", where
            )
        return GateReport("unknown", "gate reads _qwen_bcg_multimodal_eager, not derived from is_speculative()", where)
    if "_qwen_bcg_hc_sidechannel" in gate_attrs:
        return GateReport(
            "unpatched",
            "every Qwen4-Exp image batch runs eager under breakable graphs (gate on " + " / ".join(sorted(gate_attrs)) + ")",
            where,
        )
    return GateReport("unknown", f"unrecognized gate on {', '.join(sorted(gate_attrs))}", where)


def runner_gate_state(path: str | Path | None) -> GateReport:
    """Read the prefill runner's multimodal gate from its source (`ast`, nothing runs):
    the fallback when the runner module cannot be imported."""
    if path is None:
        return GateReport("unknown", "sglang is not installed (no runner source to read)", None)
    p = Path(path)
    where = str(p)
    if not p.is_file():
        return GateReport("unknown", f"runner source not found ({RUNNER_RELPATH})", where)
    methods = _runner_methods(p)
    if isinstance(methods, str):
        return GateReport("unknown", methods, where)
    init, can = methods
    return _classify_reading(_qwen_bcg_assignments(init), _multimodal_gate_attrs(can), where)


# --------------------------------------------------------------------------- the gate, by behaviour
GATE_QUESTIONS = ("image_spec_off", "image_spec_on", "text_spec_off", "text_spec_on")


def classify_gate(answers: dict[str, bool]) -> tuple[str, str]:
    """(state, detail) from the runner's own answers for a Qwen4-Exp image batch and a
    text batch, with speculative decoding off and on."""
    if any(q not in answers for q in GATE_QUESTIONS):
        return "unknown", "the runner did not answer every question"
    if not (answers["text_spec_off"] and answers["text_spec_on"]):
        return "unknown", "a text batch did not replay either, so the answers say nothing about images"
    img_off, img_on = answers["image_spec_off"], answers["image_spec_on"]
    if img_off and not img_on:
        return "patched", "image batches replay unless speculative decoding is on"
    if not img_off and not img_on:
        return "unpatched", "every Qwen4-Exp image batch runs eager under breakable graphs"
    if img_off and img_on:
        return (
            "refusal-removed",
            "image batches replay even under speculative decoding, where the draft runner refuses them "
            "(ranks can split between replay and eager)",
        )
    return "inverted", "image batches replay only under speculative decoding"


def gate_report(runner: RunnerAnswers | None, path: str | Path | None) -> GateReport:
    """The gate by behaviour when the runner ran; a source reading when its module could
    not be imported; unknown when it imported but could not be run."""
    where = str(path) if path is not None else None
    if runner is not None and runner.ok:
        state, detail = classify_gate(runner.answers)
        return GateReport(state, detail, where, method="behaviour", answers=dict(runner.answers))
    if runner is not None and runner.imported:
        return GateReport(
            "unknown",
            f"the runner imports but could not be run: {runner.error}",
            where,
            method="behaviour",
            answers=dict(runner.answers) or None,
        )
    reading = runner_gate_state(path)
    why = runner.error if runner is not None and runner.error else "the runner was not run"
    reading.detail = f"{reading.detail} (read from the source, not run: {why})"
    return reading


# --------------------------------------------------------------------------- profile checks
def model_is_qwen4_exp(model: str | None) -> bool | None:
    """True/False when it can tell (the model's config.json in a local folder or the local
    Hugging Face cache, or the checkpoint's name), None when it cannot."""
    if not model:
        return None
    folder, _ = locate_model_config(model)
    if folder is not None:
        try:
            data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        archs = data.get("architectures") or []
        if isinstance(archs, list) and archs:
            return archs[0] in QWEN4_EXP_ARCHS
        if data.get("model_type"):
            return data["model_type"] == "qwen4_exp"
    if _QWEN4_NAME_RE.search(model):
        return True
    return None


def effective_prefill_backend(server: dict, platform_name: str) -> tuple[str, bool]:
    """(backend, explicit) for a [server] table, by bcgtune's model of SGLang's resolution
    (bcgtune.core.ladder.resolve_prefill_capture; no SGLang needed): "disabled" whenever
    nothing would be captured. `explicit`: the launch chose the backend or switched graphs
    off. For what SGLang itself resolves, use sglang_resolve.resolve_prefill."""
    from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags
    from bcgtune.core.ladder import resolve_prefill_capture

    launch = prefill_launch_from_server_flags(server, platform=platform_name)
    cap = resolve_prefill_capture(launch)
    return (cap.backend if cap.captured else "disabled"), (launch.backend is not None or launch.backend_forced_off)


def _moved(requested: list[int], captured: tuple[int, ...]) -> list[str]:
    cap = sorted(captured)
    out = []
    for b in sorted(set(requested)):
        i = bisect.bisect_left(cap, b)
        if i < len(cap) and cap[i] != b:
            out.append(f"{b}->{cap[i]}")
    return out


def _flag_findings(flags: FlagCheck | None) -> list[Finding]:
    """serve's flag check: a refusal blocks; a check that could not run is said."""
    if flags is not None and flags.ok is False:
        where = f" ({flags.where})" if flags.where else ""
        return [Finding(BLOCKING, "flag-refused", f"serve refuses this launch: {flags.message}{where}")]
    if flags is not None and flags.ok is None:
        return [Finding(INFO, "flags-unchecked", f"flags not checked against SGLang's parser: {flags.message}")]
    return []


def _graphs_off_findings(profile, resolved: ResolvedPrefill) -> list[Finding]:
    """Prefill graphs off: ROCm's default when the backend was not chosen, or a bucket
    list that is never captured."""
    if resolved.graphs_on:
        return []
    server = profile.server
    explicit = any(
        k in server for k in ("cuda_graph_backend_prefill", "disable_prefill_cuda_graph", "disable_cuda_graph")
    ) or "backend" in (_prefill_json(server))
    has_list = profile.buckets is not None
    if profile.platform == "rocm" and not explicit:
        return [
            Finding(
                BLOCKING if has_list else WARNING,
                "rocm-prefill-backend-unset",
                "ROCm: the prefill CUDA-graph backend defaults to disabled (breakable is opt-in); "
                'set cuda-graph-backend-prefill = "breakable" in [server]'
                + (", or the bucket list is never captured" if has_list else ""),
            )
        ]
    if has_list:
        return [
            Finding(BLOCKING, "buckets-dead", f"[buckets].list is never captured: prefill graphs are off ({resolved.reason})")
        ]
    return []


def _qwen_gate_findings(gate: GateReport, qwen: bool | None, spec) -> list[Finding]:
    """With prefill graphs on: whether a Qwen4-Exp model's image prefills replay on this
    runner (`qwen` None: the model could not be identified; `spec`: the speculative
    algorithm in [server])."""
    if qwen is None:
        if gate.state != "unpatched":
            return []
        return [
            Finding(
                INFO,
                "model-unknown",
                "cannot tell whether the model is Qwen4-Exp (its image prefills would run eager on this runner)",
            )
        ]
    if not qwen:
        return []
    out = []
    if gate.state == "unpatched":
        out.append(
            Finding(
                BLOCKING,
                "qwen-mm-unpatched-runner",
                "Qwen4-Exp (Qwen3.8-Flash-Next) multimodal model on an unpatched prefill runner: "
                "every image prefill runs eager (apply the multimodal breakable-prefill patch)",
            )
        )
    elif gate.state in ("refusal-removed", "inverted"):
        out.append(
            Finding(BLOCKING, f"qwen-mm-gate-{gate.state}", f"the prefill runner's multimodal gate is wrong: {gate.detail}")
        )
    elif gate.state == "unknown":
        out.append(Finding(WARNING, "qwen-mm-gate-unknown", f"cannot tell whether image prefills replay: {gate.detail}"))
    if bool(spec) and str(spec).upper() not in ("NONE", "FALSE"):
        out.append(
            Finding(
                WARNING,
                "speculative-mm-eager",
                f"speculative decoding ({spec}) is on: Qwen4-Exp image batches stay eager even on a patched runner",
            )
        )
    return out


def _gap_finding(buckets: list[int]) -> list[Finding]:
    """Neighbouring buckets so far apart that the sizes between them replay in neither
    (SGLang's replay rule: bcgtune.core.replay)."""
    gaps = [(x, y, smallest_replaying_size(y)) for x, y in zip(buckets, buckets[1:])]
    spans = ", ".join(f"{x}->{y} (sizes {x + 1}..{lo - 1} run eager)" for x, y, lo in gaps if lo > x + 1)
    if not spans:
        return []
    return [Finding(WARNING, "bucket-gap", f"neighbouring buckets more than {DEFAULT_PADDING_FACTOR:g}x apart: {spans}")]


def _above_chunk_finding(buckets: list[int], resolved: ResolvedPrefill, server: dict) -> list[Finding]:
    """Buckets above the chunk per attention-DP rank: a prefill batch holds at most that
    (schedule_policy.py), plus one token per running request with --enable-mixed-chunk."""
    chunk = resolved.chunked_prefill_size
    if chunk is None or chunk <= 0 or buckets[-1] <= chunk or server.get("enable_mixed_chunk"):
        return []
    over = [x for x in buckets if x > chunk]
    return [
        Finding(
            WARNING,
            "bucket-above-chunk",
            f"buckets {over} exceed the chunked prefill size per rank ({chunk}): "
            "no prefill batch is that large, so they cost capture time and memory for nothing",
        )
    ]


def _rounded_finding(requested: list[int] | None, buckets: list[int], resolved: ResolvedPrefill) -> list[Finding]:
    """A bucket list that SGLang changes before capture (alignment, DeepEP rounding)."""
    if requested is None or sorted(set(requested)) == buckets:
        return []
    why = []
    if resolved.alignment > 1:
        why.append(f"this layout rounds buckets up to multiples of {resolved.alignment}")
    why += [n for n in resolved.notes if "multiple of 8" in n or "divisible by 8" in n]
    moved = _moved(requested, resolved.buckets)
    return [
        Finding(
            WARNING,
            "bucket-rounded",
            f"buckets {', '.join(moved) or 'changed'}: SGLang captures {buckets}" + (f" ({'; '.join(why)})" if why else ""),
        )
    ]


def profile_findings(
    profile,
    gate: GateReport,
    model: str | None = None,
    resolved: ResolvedPrefill | None = None,
    flags: FlagCheck | None = None,
) -> list[Finding]:
    """What in a profile would disappoint at launch. `resolved`: what the server will do
    (sglang_resolve; bcgtune's model of SGLang's rules when None); `flags`: serve's flag
    check on the launch (None: not run)."""
    out = _flag_findings(flags)
    model = model or profile.model
    if resolved is None:
        try:
            resolved = resolve_with_model(profile, model, fallback_reason="not asked")
        except InputError as exc:
            out.append(Finding(BLOCKING, "launch-invalid", f"the launch cannot be resolved: {exc}"))
            return out
    qwen = model_is_qwen4_exp(model)
    out += _graphs_off_findings(profile, resolved)
    if resolved.graphs_on:
        buckets = list(resolved.buckets)
        out += _qwen_gate_findings(gate, qwen, profile.server.get("speculative_algorithm"))
        out += _gap_finding(buckets)
        out += _above_chunk_finding(buckets, resolved, profile.server)
        out += _rounded_finding(profile.buckets, buckets, resolved)
    return out


def _prefill_json(server: dict) -> dict:
    from bcgtune.adapters.sglang_flags import prefill_graph_json

    return prefill_graph_json(server)


def run_doctor(
    profile=None,
    *,
    runner_path: str | Path | None = None,
    model: str | None = None,
    ask=ask_sglang,
) -> DoctorReport:
    """Everything doctor reports. `ask`: how SGLang is asked (sglang_resolve.ask_sglang;
    one child process answers the resolution, the flag check and the runner gate)."""
    sg = sglang_info()
    installed_runner = None
    if sg.get("installed"):
        installed_runner = find_runner_source(sg["path"])
    path = runner_path if runner_path is not None else installed_runner
    answers: SglangAnswers = ask(
        profile,
        model,
        runner_sources=[None if runner_path is None else str(runner_path)],
        check_flags=profile is not None,
        resolve=profile is not None,
    )
    runner = answers.runners[0] if answers.runners else None
    if runner_path is None and not sg.get("installed"):
        runner = None
    gate = gate_report(runner, path)
    tor = torch_info()
    report = DoctorReport(
        python=python_info(),
        torch=tor,
        sglang=sg,
        default_prefill_backend=default_prefill_backend(tor),
        prefill_runner_gate=gate,
        profile=profile.name if profile is not None else None,
        resolved_prefill=answers.resolved,
    )
    if profile is not None:
        report.findings = profile_findings(profile, gate, model=model, resolved=answers.resolved, flags=answers.flags)
        if tor.get("installed"):
            hip = bool(tor.get("hip"))
            if hip != (profile.platform == "rocm") and tor.get("gpu_available"):
                out_platform = "ROCm" if hip else "CUDA"
                report.findings.append(
                    Finding(
                        INFO, "platform-mismatch", f"profile is for {profile.platform}, this machine runs {out_platform} torch"
                    )
                )
    return report
