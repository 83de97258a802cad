"""The prefill runner's multimodal gate read from its source with `ast` (nothing runs): the
fallback when SGLang cannot run the runner itself.

SGLang 0.5.23's runner (srt/model_executor/runner/prefill_cuda_graph_runner.py) refuses
every Qwen4-Exp image batch under breakable graphs:

    qwen_bcg = backend == BREAKABLE and is_qwen4_exp(hf_config)
    self._qwen_bcg_hc_sidechannel = qwen_bcg and not model_runner.is_draft_worker
    self._qwen_bcg_mtp_draft = qwen_bcg and model_runner.is_draft_worker
    ...
    if contains_mm_inputs and (self._qwen_bcg_hc_sidechannel or self._qwen_bcg_mtp_draft):
        return False

The multimodal breakable-prefill patch keys that refusal on speculative decoding instead
(`_qwen_bcg_multimodal_eager = qwen_bcg and model_runner.spec_algorithm.is_speculative()`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

RUNNER_RELPATH = Path("srt/model_executor/runner/prefill_cuda_graph_runner.py")

GateState = Literal["patched", "unpatched", "refusal-removed", "inverted", "absent", "unknown"]
GateMethod = Literal["behaviour", "source reading"]


@dataclass
class GateReport:
    """The runner's multimodal gate: `state` and why (`detail`), the file it came from, how
    it was found (`method`: the runner was run, or its source was read), and, when run, its
    answers for an image and a text batch with speculative decoding off and on."""

    state: GateState
    detail: str
    path: str | None
    method: GateMethod = "source reading"
    answers: dict[str, bool] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "detail": self.detail,
            "path": self.path,
            "method": self.method,
            "answers": None if self.answers is None else dict(self.answers),
        }


def find_runner_source(sglang_path: str | None = None) -> Path | None:
    """The installed runner's file, from sglang's package folder (found, not imported)."""
    if sglang_path is None:
        from bcgtune.adapters.environment import sglang_info

        sglang_path = sglang_info().path
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


Method = ast.FunctionDef | ast.AsyncFunctionDef


def _runner_methods(p: Path) -> tuple[Method, Method] | str:
    """PrefillCudaGraphRunner's __init__ and can_replay_locally from the runner's source,
    or why they cannot be read."""
    try:
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
    except (OSError, SyntaxError, ValueError, RecursionError) as exc:
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
