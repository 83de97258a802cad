"""Write bcgtune/core/sglang/tables.py from the installed SGLang's source: the architecture
lists that bcgtune's model of SGLang's launch resolution and of its refusals needs (read
with `ast`; nothing of SGLang is imported).

    python scripts/extract_sglang_tables.py            # rewrite the module
    python scripts/extract_sglang_tables.py --check    # exit 1 when its tables differ (a test runs this)
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "bcgtune" / "core" / "sglang" / "tables.py"
ARCH_RE = re.compile(r"^[A-Z][A-Za-z0-9_]*(ForCausalLM|ForConditionalGeneration|LMHeadModel|Model)[A-Za-z0-9_]*$")


def sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglang is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _strings(node: ast.AST, consts: dict[str, list[str]]) -> list[str]:
    """The strings of a list/tuple literal, `*NAME` expanded from module-level tuples."""
    out: list[str] = []
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for e in node.elts:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Name):
                out += consts[e.value.id]
            else:
                raise ValueError(f"unexpected element {ast.dump(e)[:80]}")
    return out


def model_config_lists(root: Path) -> dict[str, list[str]]:
    src = (root / "srt" / "configs" / "model_config.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    consts: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, (ast.Tuple, ast.List)):
                try:
                    consts[node.targets[0].id] = _strings(node.value, consts)
                except (ValueError, KeyError):
                    pass
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("multimodal_model_archs", "multimodal_breakable_cuda_graph_supported_model_archs", "mm_disabled_models"):
                found[name] = _strings(node.value, consts)
    found["MIMO_V2_MULTIMODAL_ARCHS"] = consts["MIMO_V2_MULTIMODAL_ARCHS"]
    return found


# Settings a prefill capture depends on: a resolution function that names an architecture
# and mentions one of these can change what that model captures.
CAPTURE_FIELDS = (
    "cuda_graph",
    "chunked_prefill_size",
    "max_running_requests",
    "attention_backend",
    "moe_a2a_backend",
    "attn_dp_size",
    "attn_cp_size",
    "dp_size",
    "tp_size",
    "two_batch_overlap",
    "moe_dense_tp_size",
    "dp_lm_head",
    "attn_tp_gather",
    "context_length",
    "max_total_tokens",
    "pp_size",
    "Backend.",
)


def arch_specific(root: Path) -> dict[str, list[str]]:
    """Every architecture named by a function of SGLang's launch resolution (srt/arg_groups)
    that touches a setting the prefill capture depends on, with those functions
    (`file:function`)."""
    out: dict[str, set[str]] = {}
    base = root / "srt" / "arg_groups"
    for path in sorted(base.rglob("*.py")):
        rel = str(path.relative_to(root))
        src = path.read_text(encoding="utf-8")
        for fn in ast.parse(src).body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            segment = ast.get_source_segment(src, fn) or ""
            if not any(f in segment for f in CAPTURE_FIELDS):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and ARCH_RE.match(node.value):
                    out.setdefault(node.value, set()).add(f"{rel}:{fn.name}")
    return {k: sorted(v) for k, v in sorted(out.items())}


def function_tuple(root: Path, rel: str, function: str, var: str) -> list[str]:
    """The strings of a tuple literal assigned to `var` inside `function` of `rel`."""
    tree = ast.parse((root / rel).read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == var
                ):
                    return _strings(node.value, {})
    raise SystemExit(f"{rel}: {function} has no {var}")


def dict_keys(root: Path, rel: str, var: str) -> list[str]:
    """The string keys of a dict literal assigned to module-level `var` of `rel`."""
    tree = ast.parse((root / rel).read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == var and isinstance(node.value, ast.Dict):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    raise SystemExit(f"{rel} has no dict {var}")


def refusal_lists(root: Path) -> dict[str, list[str]]:
    """Lists SGLang's launch checks refuse a launch by."""
    return {
        "FLASHINFER_MEGAMOE_ARCHS": function_tuple(
            root, "srt/arg_groups/moe_hook.py", "validate_flashinfer_megamoe_model", "validated_architectures"
        ),
        "DEEPEP_V2_ARCHS": dict_keys(root, "srt/configs/moe_model_registry.py", "_DEEPEP_V2_MODELS"),
    }


def _choices_value(node: ast.AST, names: dict[str, list[str]]) -> list[str] | None:
    """A `choices=` value as a list of strings: a literal, a list named in choices.py, or a
    sum of those; None for anything else (an attribute, numbers)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        return vals if len(vals) == len(node.elts) and all(isinstance(v, str) for v in vals) else None
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _choices_value(node.left, names), _choices_value(node.right, names)
        return None if left is None or right is None else left + right
    return None


def flag_choices(root: Path) -> dict[str, list[str]]:
    """Every launch flag whose values SGLang's parser restricts to a list of strings
    (`Arg(choices=...)` of a field in srt/arg_groups/fields/, the lists of
    srt/arg_groups/choices.py resolved), by field name."""
    names: dict[str, list[str]] = {}
    for node in ast.parse((root / "srt/arg_groups/choices.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            vals = _choices_value(node.value, names)
            if vals is not None:
                names[node.targets[0].id] = vals
    out: dict[str, list[str]] = {}
    for path in sorted((root / "srt/arg_groups/fields").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            for call in ast.walk(node.annotation):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Arg":
                    for kw in call.keywords:
                        if kw.arg == "choices":
                            vals = _choices_value(kw.value, names)
                            if vals is not None:
                                out[node.target.id] = vals
    return dict(sorted(out.items()))


def render(version: str, lists: dict[str, list[str]], archs: dict[str, list[str]], choices: dict[str, list[str]]) -> str:
    def q(v: str) -> str:
        return json.dumps(v)

    def tup(values) -> str:
        return "(\n" + "".join(f"    {q(v)},\n" for v in values) + ")"

    lines = [
        f'"""Architecture tables of SGLang {version}\'s launch resolution, read from its source by',
        "scripts/extract_sglang_tables.py (do not edit: rerun the script; a test checks that this",
        'module matches the installed SGLang)."""',
        "",
        f"SGLANG_VERSION = {q(version)}",
        "",
        "# srt/configs/model_config.py, multimodal_model_archs: models SGLang serves as multimodal",
        f"MULTIMODAL_ARCHS = {tup(lists['multimodal_model_archs'])}",
        "",
        "# srt/configs/model_config.py, multimodal_breakable_cuda_graph_supported_model_archs:",
        "# multimodal models that may keep breakable prefill graphs",
        f"MULTIMODAL_BREAKABLE_ARCHS = {tup(lists['multimodal_breakable_cuda_graph_supported_model_archs'])}",
        "",
        "# srt/configs/model_config.py, ModelConfig.__init__ (mm_disabled_models): multimodal off",
        "# unless --enable-multimodal",
        f"MULTIMODAL_OFF_BY_DEFAULT_ARCHS = {tup(lists['mm_disabled_models'])}",
        "",
        "# srt/configs/model_config.py, MIMO_V2_MULTIMODAL_ARCHS: multimodal only when the config",
        "# has both vision_config and audio_config",
        f"MIMO_V2_MULTIMODAL_ARCHS = {tup(lists['MIMO_V2_MULTIMODAL_ARCHS'])}",
        "",
        "# srt/arg_groups/moe_hook.py, validate_flashinfer_megamoe_model (validated_architectures):",
        "# --moe-a2a-backend flashinfer_megamoe refuses any other model",
        f"FLASHINFER_MEGAMOE_ARCHS = {tup(lists['FLASHINFER_MEGAMOE_ARCHS'])}",
        "",
        "# srt/configs/moe_model_registry.py, _DEEPEP_V2_MODELS: the architectures SGLang registers",
        "# for DeepEP v2 (srt/arg_groups/moe_hook.py, validate_deepep_v2_model_architecture refuses",
        "# any other model with --moe-a2a-backend deepep_v2)",
        f"DEEPEP_V2_ARCHS = {tup(lists['DEEPEP_V2_ARCHS'])}",
        "",
        "# srt/arg_groups/fields/*.py, Arg(choices=...): the values SGLang's argument parser accepts",
        "# for each flag it restricts to a list of strings (lists of srt/arg_groups/choices.py",
        "# resolved), by field name; any other value is refused before anything resolves",
        "FLAG_CHOICES: dict[str, tuple[str, ...]] = {",
        *[f"    {q(k)}: ({', '.join(q(v) for v in vals)}{',' if len(vals) == 1 else ''})," for k, vals in choices.items()],
        "}",
        "",
        "# Every architecture named by a function of SGLang's launch resolution (srt/arg_groups)",
        "# that touches a setting the prefill capture depends on, with those functions",
        "# (file:function): settings SGLang may change for that model alone.",
        "ARCH_SPECIFIC_RULES: dict[str, tuple[str, ...]] = {",
    ]
    for k, v in archs.items():
        lines.append(f"    {q(k)}: (")
        lines += [f"        {q(x)}," for x in v]
        lines.append("    ),")
    lines += ["}", ""]
    return "\n".join(lines)


def _values(text: str) -> dict:
    """The tables a module's text defines (its layout, e.g. after ruff format, aside)."""
    ns: dict = {}
    exec(compile(text, str(OUT), "exec"), ns)  # noqa: S102 (our own generated module)
    return {k: v for k, v in ns.items() if k.isupper()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the module differs from the installed SGLang")
    args = ap.parse_args()
    root = sglang_root()
    lists = {**model_config_lists(root), **refusal_lists(root)}
    text = render(importlib.metadata.version("sglang"), lists, arch_specific(root), flag_choices(root))
    if args.check:
        if _values(OUT.read_text(encoding="utf-8") if OUT.exists() else "") != _values(text):
            print(f"{OUT} differs from the installed SGLang: rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
