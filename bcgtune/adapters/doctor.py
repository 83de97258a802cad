"""`bcgtune doctor`: what the installed stack will do with prefill CUDA graphs, before a
10-minute server start-up. Reads SGLang's source with `ast` (never imports sglang, needs
no GPU); imports torch only inside torch_info().

The multimodal gate (sglang 0.5.23, srt/model_executor/runner/prefill_cuda_graph_runner.py):
  unpatched: PrefillCudaGraphRunner.__init__ sets _qwen_bcg_hc_sidechannel /
             _qwen_bcg_mtp_draft and can_replay_locally returns False for
             `contains_mm_inputs and (self._qwen_bcg_hc_sidechannel or ...)`: every
             Qwen4-Exp (Qwen3.8-Flash-Next) image batch runs eager under breakable graphs.
  patched:   (shared/seeds/000) __init__ sets `_qwen_bcg_multimodal_eager = qwen_bcg and
             model_runner.spec_algorithm.is_speculative()` and the gate reads only it:
             image batches replay unless speculative decoding is on.
  absent:    the runner has no Qwen multimodal gate at all (an SGLang without Qwen4-Exp
             breakable support, or one where the refusal was removed).
  unknown:   the file or the methods are missing, do not parse, or the gate has a shape
             this check does not recognize.
"""

from __future__ import annotations

import ast
import json
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    state: str  # patched | unpatched | absent | unknown
    detail: str
    path: str | None


@dataclass
class DoctorReport:
    python: dict
    torch: dict
    sglang: dict
    default_prefill_backend: str | None
    prefill_runner_gate: GateReport
    profile: str | None = None
    findings: list[Finding] = field(default_factory=list)

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
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _returns_false(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(s, ast.Return) and isinstance(s.value, ast.Constant) and s.value.value is False for s in body
    )


def runner_gate_state(path: str | Path | None) -> GateReport:
    """Classify the installed prefill runner's multimodal gate from its source."""
    if path is None:
        return GateReport("unknown", "sglang is not installed (no runner source to read)", None)
    p = Path(path)
    where = str(p)
    if not p.is_file():
        return GateReport("unknown", f"runner source not found ({RUNNER_RELPATH})", where)
    try:
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=where)
    except (OSError, SyntaxError, ValueError) as exc:
        return GateReport("unknown", f"cannot parse runner source: {type(exc).__name__}", where)
    cls = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PrefillCudaGraphRunner"), None
    )
    if cls is None:
        return GateReport("unknown", "class PrefillCudaGraphRunner not found", where)
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    init, can = methods.get("__init__"), methods.get("can_replay_locally")
    if init is None or can is None:
        missing = [m for m in ("__init__", "can_replay_locally") if m not in methods]
        return GateReport("unknown", f"PrefillCudaGraphRunner.{'/'.join(missing)} not found", where)

    # self._qwen_bcg_* = <expr> in __init__
    assigned: dict[str, ast.expr] = {}
    for node in ast.walk(init):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and t.attr.startswith("_qwen_bcg")
                    and node.value is not None
                ):
                    assigned[t.attr] = node.value
    # `if contains_mm_inputs and <self._qwen_bcg_* ...>: return False` in can_replay_locally
    gate_attrs: set[str] = set()
    for node in ast.walk(can):
        if isinstance(node, ast.If) and "contains_mm_inputs" in _names(node.test) and _returns_false(node.body):
            attrs = {a for a in _self_attrs(node.test) if a.startswith("_qwen_bcg")}
            gate_attrs |= attrs

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
            "every Qwen4-Exp image batch runs eager under breakable graphs (gate on "
            + " / ".join(sorted(gate_attrs))
            + ")",
            where,
        )
    return GateReport("unknown", f"unrecognized gate on {', '.join(sorted(gate_attrs))}", where)


# --------------------------------------------------------------------------- profile checks
def model_is_qwen4_exp(model: str | None) -> bool | None:
    """True/False when it can tell (a local config.json, or the checkpoint's name), None
    when it cannot."""
    if not model:
        return None
    cfg = Path(model) / "config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        archs = data.get("architectures") or []
        if archs:
            return archs[0] in QWEN4_EXP_ARCHS
        if data.get("model_type"):
            return data["model_type"] == "qwen4_exp"
    if _QWEN4_NAME_RE.search(model):
        return True
    return None


def effective_prefill_backend(server: dict, platform_name: str) -> tuple[str, bool]:
    """(backend, explicit): cuda-graph-config JSON wins over --cuda-graph-backend-prefill,
    --disable-prefill-cuda-graph means disabled, else the platform default."""
    from bcgtune.adapters.profiles import prefill_graph_config

    prefill = prefill_graph_config(server) or {}
    if "backend" in prefill:
        return str(prefill["backend"]), True
    if server.get("disable_prefill_cuda_graph") is True or server.get("disable_cuda_graph") is True:
        return "disabled", True
    if server.get("cuda_graph_backend_prefill"):
        return str(server["cuda_graph_backend_prefill"]), True
    return ("breakable" if platform_name == "cuda" else "disabled"), False


def profile_findings(profile, gate: GateReport, model: str | None = None) -> list[Finding]:
    from bcgtune.core.ladder import align_buckets, layout_alignment, layout_from_server_flags
    from bcgtune.errors import InputError

    out: list[Finding] = []
    server = profile.server
    backend, explicit = effective_prefill_backend(server, profile.platform)
    model = model or profile.model
    qwen = model_is_qwen4_exp(model)
    spec = server.get("speculative_algorithm")
    spec_on = bool(spec) and str(spec).upper() not in ("NONE", "FALSE")

    if profile.platform == "rocm" and not explicit:
        sev = BLOCKING if profile.buckets is not None else WARNING
        out.append(
            Finding(
                sev,
                "rocm-prefill-backend-unset",
                "ROCm: the prefill CUDA-graph backend defaults to disabled (breakable is opt-in); "
                "set cuda-graph-backend-prefill = \"breakable\" in [server]"
                + (", or the bucket list is never captured" if profile.buckets is not None else ""),
            )
        )
    elif backend == "disabled" and profile.buckets is not None:
        out.append(Finding(WARNING, "buckets-unused", "prefill CUDA graphs are disabled, so [buckets].list is unused"))

    if backend == "breakable" and qwen:
        if gate.state == "unpatched":
            out.append(
                Finding(
                    BLOCKING,
                    "qwen-mm-unpatched-runner",
                    "Qwen4-Exp (Qwen3.8-Flash-Next) multimodal model on an unpatched prefill runner: "
                    "every image prefill runs eager (apply the multimodal breakable-prefill patch, seeds/000)",
                )
            )
        elif gate.state == "unknown":
            out.append(
                Finding(WARNING, "qwen-mm-gate-unknown", f"cannot tell whether image prefills replay: {gate.detail}")
            )
        if spec_on:
            out.append(
                Finding(
                    WARNING,
                    "speculative-mm-eager",
                    f"speculative decoding ({spec}) is on: Qwen4-Exp image batches stay eager even on a patched runner",
                )
            )
    elif qwen is None and backend == "breakable" and gate.state == "unpatched":
        out.append(
            Finding(
                INFO,
                "model-unknown",
                "cannot tell whether the model is Qwen4-Exp (its image prefills would run eager on this runner)",
            )
        )

    if profile.buckets:
        b = profile.buckets
        gaps = [(x, y) for x, y in zip(b, b[1:]) if y > 2 * x]
        if gaps:
            spans = ", ".join(f"{x}->{y} (sizes {x + 1}..{-(-y // 2) - 1} run eager)" for x, y in gaps)
            out.append(Finding(WARNING, "bucket-gap", f"neighbouring buckets more than 2x apart: {spans}"))
        try:
            layout = layout_from_server_flags(server, is_hip=profile.platform == "rocm")
            align = layout_alignment(layout)
        except InputError as exc:
            out.append(Finding(WARNING, "layout", f"cannot derive the parallel layout: {exc}"))
            align = 1
        if align > 1:
            off = [x for x in b if x % align]
            if off:
                captured = align_buckets(b, align)
                out.append(
                    Finding(
                        WARNING,
                        "bucket-alignment",
                        f"buckets {off} are not multiples of {align} (this layout's capture alignment); "
                        f"SGLang captures {captured}",
                    )
                )
    return out


def run_doctor(profile=None, *, runner_path: str | Path | None = None, model: str | None = None) -> DoctorReport:
    sg = sglang_info()
    if runner_path is None and sg.get("installed"):
        runner_path = find_runner_source(sg["path"])
    gate = runner_gate_state(runner_path)
    tor = torch_info()
    report = DoctorReport(
        python=python_info(),
        torch=tor,
        sglang=sg,
        default_prefill_backend=default_prefill_backend(tor),
        prefill_runner_gate=gate,
        profile=profile.name if profile is not None else None,
    )
    if profile is not None:
        report.findings = profile_findings(profile, gate, model=model)
        if tor.get("installed"):
            hip = bool(tor.get("hip"))
            if hip != (profile.platform == "rocm") and tor.get("gpu_available"):
                out_platform = "ROCm" if hip else "CUDA"
                report.findings.append(
                    Finding(INFO, "platform-mismatch", f"profile is for {profile.platform}, this machine runs {out_platform} torch")
                )
    return report
