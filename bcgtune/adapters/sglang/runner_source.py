"""The prefill runner's multimodal gate read from its source with `ast` (nothing runs): the
fallback when SGLang cannot run the runner itself. The reading evaluates the runner's own
conditions (in `__init__` and `can_replay_locally`) for the four questions the running
runner is asked, and classifies the answers the same way (bcgtune.core.sglang.runner_gate). A
reading never says what the runner does: running could still contradict it (a module that
does not import, a check moved into a helper or a property, a name SGLang imports that is
gone), so a reading is never a verdict: the gate is "not checked", with what the source reads
as beside it, and it never blocks.

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

from bcgtune.core.sglang.runner_gate import GateState, classify_gate

RUNNER_RELPATH = Path("srt/model_executor/runner/prefill_cuda_graph_runner.py")

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
    reads_as: GateState | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "detail": self.detail,
            "path": self.path,
            "method": self.method,
            "answers": None if self.answers is None else dict(self.answers),
            "reads_as": self.reads_as,
        }


def find_runner_source(sglang_path: str | None = None) -> Path | None:
    """The installed runner's file, from sglang's package folder (found, not imported)."""
    if sglang_path is None:
        from bcgtune.adapters.machine.environment import sglang_info

        sglang_path = sglang_info().path
    if not sglang_path:
        return None
    return Path(sglang_path) / RUNNER_RELPATH


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


def _assignments(fn: ast.AST) -> tuple[dict[str, ast.expr], dict[str, ast.expr]]:
    """(`self.X = expr` by X, `name = expr` by name) in a method (the last assignment wins)."""
    attrs: dict[str, ast.expr] = {}
    names: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                attrs[t.attr] = node.value
            elif isinstance(t, ast.Name):
                names[t.id] = node.value
    return attrs, names


Truth = bool | None  # None: the reading cannot tell


class _Reader:
    """Evaluates the runner's own conditions for one scenario: a Qwen4-Exp model on the
    target (not draft) runner under breakable graphs, an image or a text batch, speculative
    decoding off or on. What it cannot evaluate is unknown (None)."""

    def __init__(self, init: ast.AST, can: ast.AST, *, image: bool, spec: bool):
        self.attrs, self.init_names = _assignments(init)
        _, self.can_names = _assignments(can)
        self.image, self.spec = image, spec
        self.depth = 0

    def truth(self, node: ast.AST, names: dict[str, ast.expr] | None = None) -> Truth:
        if self.depth > 40:
            return None
        self.depth += 1
        try:
            return self._truth(node, self.can_names if names is None else names)
        finally:
            self.depth -= 1

    def _truth(self, node: ast.AST, names: dict[str, ast.expr]) -> Truth:  # noqa: C901 (one case per node kind)
        if isinstance(node, ast.Constant):
            return bool(node.value) if isinstance(node.value, (bool, int, type(None))) else None
        if isinstance(node, ast.Name):
            if node.id == "contains_mm_inputs":
                return self.image
            if node.id in names:
                return self.truth(names[node.id], names)
            return None
        if isinstance(node, ast.Attribute):
            if node.attr == "is_draft_worker":
                return False  # the target runner
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.attrs:
                return self.truth(self.attrs[node.attr], self.init_names)
            return None
        if isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if fname == "is_speculative":
                return self.spec
            if fname == "is_qwen4_exp":
                return True
            if fname == "bool" and len(node.args) == 1:
                return self.truth(node.args[0], names)
            return None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            v = self.truth(node.operand, names)
            return None if v is None else not v
        if isinstance(node, ast.BoolOp):
            vals = [self.truth(v, names) for v in node.values]
            if isinstance(node.op, ast.And):
                return False if False in vals else (None if None in vals else True)
            return True if True in vals else (None if None in vals else False)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            text = ast.unparse(node)
            equal = "BREAKABLE" in text or "'breakable'" in text or '"breakable"' in text
            if not equal and ("FULL" in text or "'full'" in text or '"full"' in text):
                equal = False
            elif not equal:
                return None
            return equal if isinstance(node.ops[0], ast.Eq) else not equal
        if isinstance(node, ast.IfExp):
            t = self.truth(node.test, names)
            return None if t is None else self.truth(node.body if t else node.orelse, names)
        return None


_GATE_WORDS = ("is_qwen4_exp", "qwen", "is_speculative", "spec_algorithm")


def _mentions_gate(node: ast.AST, reader: _Reader, seen: frozenset[str] = frozenset()) -> bool:
    """The condition depends on the Qwen4-Exp / speculative-decoding gate: it reads
    something (directly, or through a local or `self.` attribute) set from those."""
    text = ast.unparse(node)
    if any(w in text for w in _GATE_WORDS):
        return True
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            key = "self." + n.attr
            if key not in seen and n.attr in reader.attrs and _mentions_gate(reader.attrs[n.attr], reader, seen | {key}):
                return True
        if isinstance(n, ast.Name) and n.id not in seen and n.id in reader.can_names:
            if _mentions_gate(reader.can_names[n.id], reader, seen | {n.id}):
                return True
        if isinstance(n, ast.Name) and n.id not in seen and n.id in reader.init_names:
            if _mentions_gate(reader.init_names[n.id], reader, seen | {n.id}):
                return True
    return False


def _refusals(body: list[ast.stmt], conds: tuple[ast.expr, ...] = ()) -> list[tuple[ast.expr, ...]]:
    """The conditions under which can_replay_locally's statements `return False` (each a
    conjunction along its nested ifs)."""
    out: list[tuple[ast.expr, ...]] = []
    for st in body:
        if isinstance(st, ast.Return) and isinstance(st.value, ast.Constant) and st.value.value is False:
            out.append(conds)
        elif isinstance(st, ast.If):
            out += _refusals(st.body, (*conds, st.test))
            out += _refusals(st.orelse, (*conds, ast.UnaryOp(op=ast.Not(), operand=st.test)))
    return out


def read_gate_answers(init: ast.AST, can: ast.AST) -> dict[str, bool] | str:
    """What can_replay_locally would answer, read from its source, for the four questions
    asked of the running runner; or why the reading cannot tell."""
    answers: dict[str, bool] = {}
    gate_refusals = [c for c in _refusals(getattr(can, "body", [])) if c]
    for image in (True, False):
        for spec in (False, True):
            reader = _Reader(init, can, image=image, spec=spec)
            refused = False
            for conds in gate_refusals:
                if not any(_mentions_gate(c, reader) for c in conds):
                    continue  # another feature's refusal (LoRA, logprobs, ...): not what is asked
                vals = [reader.truth(c) for c in conds]
                if False in vals:
                    continue
                if None in vals:
                    return "a condition of the multimodal gate could not be read: " + " and ".join(
                        ast.unparse(c)[:80] for c in conds
                    )
                refused = True
            answers[f"{'image' if image else 'text'}_spec_{'on' if spec else 'off'}"] = not refused
    return answers


def runner_gate_state(path: str | Path | None) -> GateReport:
    """Read the prefill runner's multimodal gate from its source (`ast`, nothing runs):
    the fallback when the runner module cannot be imported."""
    if path is None:
        return GateReport("not checked", "sglang is not installed (no runner source to read)", None)
    p = Path(path)
    where = str(p)
    if not p.is_file():
        return GateReport("not checked", f"runner source not found ({RUNNER_RELPATH})", where)
    methods = _runner_methods(p)
    if isinstance(methods, str):
        return GateReport("not checked", f"its source cannot be read either: {methods}", where)
    init, can = methods
    if not any(w in ast.unparse(init) + ast.unparse(can) for w in ("qwen", "is_speculative")):
        return GateReport(
            "not checked", "reads as absent (no Qwen4-Exp multimodal refusal in can_replay_locally)", where, reads_as="absent"
        )
    answers = read_gate_answers(init, can)
    if isinstance(answers, str):
        return GateReport("not checked", f"its source cannot be read either: {answers}", where)
    state, detail = classify_gate(answers)
    # running could contradict any reading (an import that fails, a check moved into a
    # helper or a property, a name SGLang imports that is gone): a reading is never a
    # verdict, whatever it reads as, and never blocks
    return GateReport("not checked", f"reads as {state} ({detail})", where, answers=answers, reads_as=state)


def reads_deepstack_slot(path: str | Path | None) -> bool | str:
    """Whether the runner's source registers a capture slot for DeepStack visual inputs:
    its __init__, where the capture slots are registered, names them. A reading (nothing
    runs); a string says why it cannot tell."""
    if path is None or not Path(path).is_file():
        return "no runner source to read"
    methods = _runner_methods(Path(path))
    if isinstance(methods, str):
        return methods
    init, _ = methods
    return "deepstack" in ast.unparse(init).lower()
