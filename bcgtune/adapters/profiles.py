"""Launch profiles: one TOML file per hardware + model, strict.

    [profile]   name, description, hardware, platform ("rocm" | "cuda"), model
    [server]    SGLang launch flags, one key per flag, full flag names (kebab or snake
                case; normalized to snake in memory) or SGLang's documented short
                forms (`tp`, `dp`, `ep`), stored under the full name. Values: bool, int, float, str, or a
                list of those. `true` emits the bare flag; `false` emits nothing (the same
                as leaving the key out: to negate a flag that SGLang can negate, write
                `no-<flag> = true`).
    [env]       environment variables added at launch (string values, names as written)
    [buckets]   list = [...] the prefill buckets, plus provenance: source, trace_sha256,
                trace_path, objective, max_buckets, padding_factor, alignment,
                tool_version, date, note

The bucket list lives only in [buckets].list; `serve` passes it as
`--cuda-graph-bs-prefill`. [server] may not set `cuda-graph-bs-prefill` (two places for
one list would drift: it is an error that points to [buckets].list), and a
`cuda-graph-config` JSON with a prefill `bs` next to [buckets].list is refused too
(SGLang lets the JSON win silently). A profile without [buckets] launches with SGLang's
default ladder.

Built-in profiles ship as package data (bcgtune/data/profiles/, copies of the top-level
profiles/ folder, which is the one source; tests/test_profiles.py asserts the copies are
identical) so `--profile mi355x` works after `pip install`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from bcgtune.core.replay import check_bucket_list
from bcgtune.errors import InputError
from bcgtune.fileio import atomic_write_text

SECTIONS = ("profile", "server", "env", "buckets")
PLATFORMS = ("rocm", "cuda")
PROFILE_KEYS: dict[str, type | tuple] = {
    "name": str,
    "description": str,
    "hardware": str,
    "platform": str,
    "model": str,
}
PROVENANCE_KEYS: dict[str, type | tuple] = {
    "source": str,
    "trace_sha256": str,
    "trace_path": str,
    "objective": str,
    "max_buckets": int,
    "padding_factor": (int, float),
    "alignment": int,
    "tool_version": str,
    "date": str,
    "note": str,
}
# Flags that a profile may not carry in [server], and where they belong instead.
_SERVER_FORBIDDEN = {
    "cuda_graph_bs_prefill": "the bucket list lives in [buckets].list",
    "model_path": "the model is [profile].model (or serve --model)",
    "model": "the model is [profile].model (or serve --model)",
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Other names SGLang's launch parser gives a flag, mapped to the flag's own name (its
# `dest`): the short flags SGLang's documentation writes (`--tp 2`, `--dp 2` in "Common
# launch commands" of docs/advanced_features/server_arguments), which its parser takes as
# unique prefixes of --tp-size / --dp-size, and the aliases it registers itself
# (srt/arg_groups/fields/parallel.py: --ep, --tensor-parallel-size, ...). A profile may use
# any of them; bcgtune stores and emits the full name. tests/test_profiles.py checks each
# entry against the installed parser.
FLAG_ALIASES = {
    "tp": "tp_size",
    "dp": "dp_size",
    "ep": "ep_size",
    "tensor_parallel_size": "tp_size",
    "data_parallel_size": "dp_size",
    "pipeline_parallel_size": "pp_size",
    "expert_parallel_size": "ep_size",
    "attention_data_parallel_size": "attn_dp_size",
    "attention_context_parallel_size": "attn_cp_size",
    "decode_context_parallel_size": "dcp_size",
    "moe_data_parallel_size": "moe_dp_size",
}


def snake(key: str) -> str:
    """The one normalizer for SGLang flag names: `--tp-size`, `tp-size` and `tp_size` are
    `tp_size`, and SGLang's short flags and aliases (`tp`, `tensor-parallel-size`) are the
    flag they stand for. Other names (abbreviations included) pass through unchanged, for
    the parser check to refuse."""
    key = key.strip().lstrip("-").replace("-", "_")
    return FLAG_ALIASES.get(key, key)


def flag_name(key: str) -> str:
    """[server] key (snake or kebab) -> the command-line flag, `--kebab-case`."""
    return "--" + snake(key).replace("_", "-")


@dataclass
class Profile:
    name: str
    platform: str
    path: Path | None = None
    description: str = ""
    hardware: str = ""
    model: str | None = None
    server: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    buckets: list[int] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else f"profile {self.name}"

    def to_dict(self) -> dict:
        prof = {"name": self.name}
        for k in ("description", "hardware"):
            if getattr(self, k):
                prof[k] = getattr(self, k)
        prof["platform"] = self.platform
        if self.model is not None:
            prof["model"] = self.model
        out: dict[str, Any] = {"profile": prof}
        if self.server:
            out["server"] = {k.replace("_", "-"): v for k, v in self.server.items()}
        if self.env:
            out["env"] = dict(self.env)
        if self.buckets is not None:
            out["buckets"] = {"list": list(self.buckets), **self.provenance}
        return out

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


# --------------------------------------------------------------------------- loading
def builtin_profile_names() -> list[str]:
    root = resources.files("bcgtune") / "data" / "profiles"
    try:
        return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def builtin_profile_path(name: str) -> Path:
    p = resources.files("bcgtune") / "data" / "profiles" / f"{name}.toml"
    return Path(str(p))


def resolve_profile_path(name_or_path: str | os.PathLike) -> Path:
    """A path (anything with a folder separator or a .toml suffix, or an existing file)
    is used as is; otherwise a built-in name."""
    s = str(name_or_path)
    p = Path(s)
    if os.sep in s or "/" in s or s.endswith(".toml") or p.exists():
        if not p.exists():
            raise InputError("no such profile file", s)
        if p.is_dir():
            raise InputError("is a folder, not a profile file", s)
        return p
    bp = builtin_profile_path(s)
    if not bp.is_file():
        names = ", ".join(builtin_profile_names()) or "none"
        raise InputError(f"no built-in profile {s!r} (built-in: {names}; or give a path to a .toml file)", s)
    return bp


def prefill_graph_config(server: dict) -> dict | None:
    """The `prefill` object of a `cuda-graph-config` JSON flag (which SGLang lets win over
    the per-phase flags), or None when absent or not valid JSON."""
    cfg = server.get("cuda_graph_config")
    if not isinstance(cfg, str):
        return None
    try:
        parsed = json.loads(cfg)
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("prefill"), dict):
        return parsed["prefill"]
    return None


def load_profile(name_or_path: str | os.PathLike) -> Profile:
    path = resolve_profile_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", str(path)) from None
    return parse_profile(text, str(path), path=path)


def parse_profile(text: str, where: str, path: Path | None = None) -> Profile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", where) from None
    return profile_from_dict(data, where, path=path)


def _where(where: str, key: str) -> str:
    return f"{where}: {key}"


def _check_type(value: Any, types, where: str, key: str) -> None:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        want = " or ".join(t.__name__ for t in types)
        raise InputError(f"must be {want}, got {type(value).__name__} {value!r}", _where(where, key))


def _check_server_value(value: Any, where: str, key: str) -> Any:
    scalar = (bool, int, float, str)
    if isinstance(value, list):
        if not value:
            raise InputError("an empty list emits no values; leave the key out", _where(where, key))
        for v in value:
            if isinstance(v, (list, dict)) or not isinstance(v, scalar):
                raise InputError(f"list items must be int, float or str, got {v!r}", _where(where, key))
            if isinstance(v, bool):
                raise InputError("list items must be int, float or str, not bool", _where(where, key))
        return list(value)
    if isinstance(value, dict):
        raise InputError("a table is not a flag value (write JSON flags as a string)", _where(where, key))
    if not isinstance(value, scalar):
        raise InputError(f"must be bool, int, float, str or a list, got {type(value).__name__}", _where(where, key))
    return value


def check_provenance(prov: Mapping[str, Any], where: str, section: str = "buckets") -> dict[str, Any]:
    out = {}
    for k, v in prov.items():
        key = snake(k)
        if key not in PROVENANCE_KEYS:
            allowed = ", ".join(["list", *PROVENANCE_KEYS])
            raise InputError(f"unknown key (allowed: {allowed})", _where(where, f"[{section}].{k}"))
        _check_type(v, PROVENANCE_KEYS[key], where, f"[{section}].{k}")
        out[key] = v
    return out


def profile_from_dict(data: Mapping[str, Any], where: str, path: Path | None = None) -> Profile:
    for sec in data:
        if sec not in SECTIONS:
            raise InputError(f"unknown section (allowed: {', '.join(SECTIONS)})", _where(where, f"[{sec}]"))
        if not isinstance(data[sec], dict):
            raise InputError("must be a table", _where(where, f"[{sec}]"))

    prof_raw = data.get("profile")
    if prof_raw is None:
        raise InputError("missing [profile] section", where)
    prof: dict[str, Any] = {}
    for k, v in prof_raw.items():
        key = snake(k)
        if key not in PROFILE_KEYS:
            raise InputError(f"unknown key (allowed: {', '.join(PROFILE_KEYS)})", _where(where, f"[profile].{k}"))
        _check_type(v, PROFILE_KEYS[key], where, f"[profile].{k}")
        prof[key] = v
    for req in ("name", "platform"):
        if req not in prof:
            raise InputError("missing required key", _where(where, f"[profile].{req}"))
    if not _NAME_RE.match(prof["name"]):
        raise InputError("name must be letters, digits, '.', '_' or '-'", _where(where, "[profile].name"))
    if prof["platform"] not in PLATFORMS:
        raise InputError(f"must be one of {', '.join(PLATFORMS)}, got {prof['platform']!r}", _where(where, "[profile].platform"))
    if "model" in prof and not prof["model"].strip():
        raise InputError("must not be empty", _where(where, "[profile].model"))

    server: dict[str, Any] = {}
    seen_as: dict[str, str] = {}
    for k, v in data.get("server", {}).items():
        key = snake(k)
        label = f"[server].{k}"
        if not key or not re.match(r"^[a-z0-9][a-z0-9_]*$", key):
            raise InputError("not a flag name (full SGLang flag names, e.g. tp-size)", _where(where, label))
        if key in seen_as:
            raise InputError(f"same flag as [server].{seen_as[key]}", _where(where, label))
        seen_as[key] = k
        if key in _SERVER_FORBIDDEN:
            raise InputError(f"not allowed in [server]: {_SERVER_FORBIDDEN[key]}", _where(where, label))
        server[key] = _check_server_value(v, where, label)

    env: dict[str, str] = {}
    for k, v in data.get("env", {}).items():
        if not _ENV_RE.match(k):
            raise InputError("not an environment variable name", _where(where, f"[env].{k}"))
        if not isinstance(v, str):
            raise InputError(f"must be str (quote it: \"{v}\"), got {type(v).__name__}", _where(where, f"[env].{k}"))
        env[k] = v

    buckets = None
    provenance: dict[str, Any] = {}
    if "buckets" in data:
        raw = dict(data["buckets"])
        lst = raw.pop("list", None)
        if lst is None:
            raise InputError("missing required key (the bucket list)", _where(where, "[buckets].list"))
        if not isinstance(lst, list):
            raise InputError(f"must be a list of integers, got {type(lst).__name__}", _where(where, "[buckets].list"))
        buckets = check_bucket_list(lst, _where(where, "[buckets].list"))
        provenance = check_provenance(raw, where)
        if "bs" in (prefill_graph_config(server) or {}):
            raise InputError(
                "sets prefill bs, which SGLang would use instead of [buckets].list; remove one",
                _where(where, f"[server].{seen_as['cuda_graph_config']}"),
            )

    return Profile(
        name=prof["name"],
        platform=prof["platform"],
        path=path,
        description=prof.get("description", ""),
        hardware=prof.get("hardware", ""),
        model=prof.get("model"),
        server=server,
        env=env,
        buckets=buckets,
        provenance=provenance,
    )


# --------------------------------------------------------------------------- writing
_SECTION_RE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]\s*(#.*)?$")


def _buckets_table_text(buckets: list[int], provenance: Mapping[str, Any]) -> str:
    import tomli_w

    body = tomli_w.dumps({"buckets": {"list": list(buckets), **dict(provenance)}})
    return body


def _replace_buckets_section(text: str, new_section: str) -> str | None:
    """Swap the [buckets] table's text, keeping every other byte (comments included).
    None when the file's layout is not one header + keys (then the caller rewrites)."""
    lines = text.splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        m = _SECTION_RE.match(line.rstrip("\r\n"))
        if m is None:
            continue
        name = m.group(1).strip()
        if start is None and name == "buckets":
            start = i
        elif start is not None:
            if name.startswith("buckets."):
                return None
            end = i
            break
    if start is None:
        sep = "" if not text or text.endswith("\n") else "\n"
        return text + sep + ("\n" if text.strip() else "") + new_section
    if end is None:
        end = len(lines)
    # keep comment/blank lines that sit just above the next section with that section
    while end - 1 > start and (lines[end - 1].strip() == "" or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + new_section + ("\n" if tail else "") + tail


def write_profile_buckets(
    path: str | os.PathLike,
    buckets,
    provenance: Mapping[str, Any] | None = None,
    base_profile: str | os.PathLike | None = None,
) -> Profile:
    """Set `path`'s [buckets] (list + provenance) atomically (temp file + rename).

    When `path` exists, only its [buckets] table changes; the other sections, and
    comments, stay as they were. When it does not, it is created from `base_profile` (a
    built-in name or a path; required then) with [profile].name set from the new file's
    stem. The result is re-read with the strict loader before it replaces anything."""
    path = Path(path)
    where = str(path)
    blist = check_bucket_list(list(buckets), "bucket list to write")
    prov = check_provenance(dict(provenance or {}), where)
    if path.exists():
        if path.is_dir():
            raise InputError("is a folder, not a profile file", where)
        old = path.read_text(encoding="utf-8")
        parse_profile(old, where, path=path)  # refuse to edit a file that is already wrong
    else:
        if base_profile is None:
            raise InputError("profile does not exist; give a base profile to create it from", where)
        base_path = resolve_profile_path(base_profile)
        old = base_path.read_text(encoding="utf-8")
        base = parse_profile(old, str(base_path), path=base_path)
        stem = path.stem if path.suffix == ".toml" else path.name
        if stem != base.name and _NAME_RE.match(stem):
            old = _set_profile_name(old, base.name, stem)
    section = _buckets_table_text(blist, prov)
    new = _replace_buckets_section(old, section)
    if new is None:
        data = tomllib.loads(old)
        data["buckets"] = {"list": blist, **prov}
        import tomli_w

        new = tomli_w.dumps(data)
    result = parse_profile(new, where, path=path)
    atomic_write_text(path, new)
    return result


def _set_profile_name(text: str, old_name: str, new_name: str) -> str:
    """Rename [profile].name in place (first `name = "..."` line of [profile])."""
    lines = text.splitlines(keepends=True)
    in_profile = False
    for i, line in enumerate(lines):
        m = _SECTION_RE.match(line.rstrip("\r\n"))
        if m:
            in_profile = m.group(1).strip() == "profile"
            continue
        if in_profile and re.match(r"^\s*name\s*=", line):
            lines[i] = f'name = "{new_name}"\n'
            break
    return "".join(lines)
