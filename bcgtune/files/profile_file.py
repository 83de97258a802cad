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
                trace_xxh128, trace_path, objective, max_buckets, padding_factor,
                alignment, tool_version, date, note
    [tuned]     written by `bcgtune tune` with the list: what its proof run measured (list,
                trace_gain_pct and its 95% half-width over the whole trace, measured_gain_pct
                on the batches replayed, against SGLang's ladder, the
                predicted gain, passes, batches, graphs, capture_s, graph_mem_gib,
                calibration_sha256, device, torch, date); doctor and drift report it. A list
                written without it (suggest-buckets, drift) drops an older [tuned].

The bucket list lives only in [buckets].list; `serve` passes it as
`--cuda-graph-bs-prefill`. [server] may not set `cuda-graph-bs-prefill` (two places for
one list would drift: it is an error that points to [buckets].list), and a
`cuda-graph-config` JSON with a prefill `bs` next to [buckets].list is refused too
(SGLang lets the JSON win silently). A profile without [buckets] launches with SGLang's
default ladder.

Built-in profiles have one source, the top-level profiles/ folder of the source tree, so
`--profile profiles/mi355x.toml` works in a checkout; the build copies that folder into
the package as bcgtune/data/profiles/ (setup.py), so `--profile mi355x` works after
`pip install` too. An editable install has no copy and reads the source folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from bcgtune.core.schema import StrictDocument, Tokens, validate
from bcgtune.core.sglang.replay import check_bucket_list
from bcgtune.errors import InputError, quote
from bcgtune.fileio import atomic_write_text

# Flags that a profile may not carry in [server], and where they belong instead.
_SERVER_FORBIDDEN = {
    "cuda_graph_bs_prefill": "the bucket list lives in [buckets].list",
    "model_path": "the model is [profile].model (or serve --model-path)",
    "model": "the model is [profile].model (or serve --model-path)",
}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
    tuned: dict[str, Any] | None = None  # [tuned]: what bcgtune tune measured for the list (TunedTable)

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
        if self.tuned is not None:
            out["tuned"] = dict(self.tuned)
        return out

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())


# --------------------------------------------------------------------------- loading
def builtin_profiles_dir() -> Path:
    """The installed copy of the built-in profiles, else (an editable install or a plain
    checkout) their source folder, profiles/ beside the package."""
    installed = Path(str(resources.files("bcgtune"))) / "data" / "profiles"
    if installed.is_dir():
        return installed
    return Path(str(resources.files("bcgtune"))).parent / "profiles"


def builtin_profile_names() -> list[str]:
    root = builtin_profiles_dir()
    try:
        return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def builtin_profile_path(name: str) -> Path:
    return builtin_profiles_dir() / f"{name}.toml"


def resolve_profile_path(name_or_path: str | os.PathLike) -> Path:
    """A path (anything with a folder separator or a .toml suffix, or an existing file)
    is used as is; otherwise a built-in name."""
    from bcgtune.fileio import path_kind

    s = str(name_or_path)
    p = Path(s)
    kind = path_kind(s)
    if os.sep in s or "/" in s or s.endswith(".toml") or kind is not None:
        if kind is None:
            raise InputError("no such profile file", s if len(s) <= 200 else s[:197] + "...")
        if kind == "folder":
            raise InputError("is a folder, not a profile file", s)
        if kind == "other":  # a pipe or a device: a profile may be read twice (checked, then edited)
            raise InputError("is not a regular file (a pipe or a device): a profile is read from a file", s)
        return p
    bp = builtin_profile_path(s)
    if path_kind(bp) != "file":
        names = ", ".join(builtin_profile_names()) or "none"
        raise InputError(f"no built-in profile {quote(s)} (built-in: {names}; or give a path to a .toml file)", "--profile")
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
    from bcgtune.fileio import read_input

    path = resolve_profile_path(name_or_path)
    data = read_input(str(path), "profile (TOML)", limit=PROFILE_MAX_BYTES)
    return parse_profile(data, str(path), path=path)


def parse_profile(text: str | bytes, where: str, path: Path | None = None) -> Profile:
    from bcgtune.fileio import parse_toml

    return profile_from_dict(parse_toml(text, where), where, path=path)


# ---- the document, one pydantic model per table (docs/formats.md is generated from these) ----
PROFILE_MAX_BYTES = 1 << 20
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"
ListItem = Union[StrictInt, StrictFloat, StrictStr]
ServerValue = Union[StrictBool, StrictInt, StrictFloat, StrictStr, Annotated[list[ListItem], Field(min_length=1)]]


class ProfileTable(StrictDocument):
    """[profile]: what the profile is for."""

    name: Annotated[
        str,
        Field(
            pattern=_NAME,
            max_length=100,
            description="Profile name: letters, digits, '.', '_' or '-'; default log files are named after it.",
        ),
    ]
    platform: Annotated[
        Literal["rocm", "cuda"],
        Field(
            description="Where the server runs: decides SGLang's default prefill backend (breakable on CUDA, disabled on ROCm)."
        ),
    ]
    description: Annotated[str, Field(max_length=2000, description="Free text.")] = ""
    hardware: Annotated[
        str,
        Field(max_length=100, description="The GPU, e.g. h200 or mi355x: its memory sets SGLang's default chunked-prefill size."),
    ] = ""
    model: Annotated[
        Optional[str],
        Field(
            min_length=1,
            max_length=4096,
            description="The model SGLang serves (--model-path): a path or a hub id. `serve --model-path` overrides it.",
        ),
    ] = None


class BucketsTable(StrictDocument):
    """[buckets]: the prefill bucket list (`serve` passes it as --cuda-graph-bs-prefill) and
    where it came from."""

    list_: Annotated[
        list[Tokens],
        Field(alias="list", min_length=1, max_length=4096, description="The buckets: token counts, unique and ascending."),
    ]
    source: Annotated[Optional[str], Field(max_length=2000, description="Where the list comes from.")] = None
    trace_sha256: Annotated[Optional[str], Field(max_length=128, description="sha256 of the trace it was tuned on.")] = None
    trace_xxh128: Annotated[
        Optional[str],
        Field(pattern=r"^[0-9a-f]{32}$", description="XXH3-128 of the log it was tuned on (its first), as xxh128sum prints it."),
    ] = None
    trace_path: Annotated[Optional[str], Field(max_length=4096, description="The trace it was tuned on.")] = None
    objective: Annotated[Optional[str], Field(max_length=40, description="padding or time.")] = None
    max_buckets: Annotated[Optional[StrictInt], Field(ge=1, le=4096, description="The K it was tuned with.")] = None
    padding_factor: Annotated[
        Optional[Union[StrictInt, StrictFloat]], Field(ge=1, le=1e6, description="The replay rule's factor it was tuned with.")
    ] = None
    alignment: Annotated[
        Optional[StrictInt], Field(ge=1, le=2**31 - 1, description="The multiple its buckets were aligned to.")
    ] = None
    tool_version: Annotated[Optional[str], Field(max_length=40, description="bcgtune's version that wrote it.")] = None
    date: Annotated[Optional[str], Field(max_length=40, description="When it was written.")] = None
    note: Annotated[Optional[str], Field(max_length=2000, description="Free text.")] = None
    launch_check: Annotated[
        Optional[str],
        Field(
            max_length=2000,
            description="Whether SGLang itself resolved the launch the list was priced for: 'checked', or "
            "'not checked: WHY' (bcgtune's model of its rules priced it).",
        ),
    ] = None


Pct = Annotated[float, Field(strict=False, ge=-1e6, le=1e6, allow_inf_nan=False)]
HalfPct = Annotated[float, Field(strict=False, ge=0, le=1e6, allow_inf_nan=False)]


class TunedTable(StrictDocument):
    """[tuned]: what `bcgtune tune` measured for the list it wrote into [buckets].list: the
    gain over SGLang's default ladder on the whole trace, estimated from the proof run (the
    trace, or a stratified sample of it, replayed in interleaved rounds) with its 95% interval,
    the gain measured on the batches replayed, what the list costs and where it was measured."""

    list_: Annotated[list[Tokens], Field(alias="list", min_length=0, max_length=4096, description="The list the tune measured.")]
    trace_gain_pct: Annotated[
        Optional[Pct], Field(description="Time saved against SGLang's ladder over the whole trace, % of the ladder's.")
    ] = None
    trace_gain_half_pct: Annotated[
        Optional[HalfPct],
        Field(
            description="Half-width of its 95% interval (%): the sampling error, the run's noise and the stated allowance "
            "for capture offsets included."
        ),
    ] = None
    trace_batches: Annotated[Optional[StrictInt], Field(ge=1, le=10**12, description="Batches in the trace.")] = None
    measured_gain_pct: Annotated[
        Pct,
        Field(description="Measured time saved against SGLang's ladder on the batches the proof replayed, % of the ladder's."),
    ]
    measured_gain_half_pct: Annotated[Optional[HalfPct], Field(description="Half-width of its 95% interval (%).")] = None
    predicted_gain_pct: Annotated[Optional[Pct], Field(description="The gain the calibration predicted (%).")] = None
    predicted_gain_half_pct: Annotated[Optional[HalfPct], Field(description="Half-width of its 95% interval (%).")] = None
    passes: Annotated[StrictInt, Field(ge=1, le=100, description="Independent passes of the proof run.")]
    batches: Annotated[StrictInt, Field(ge=1, le=10**12, description="Trace batches each pass replayed.")]
    graphs: Annotated[StrictInt, Field(ge=0, le=4096, description="Graphs in the list.")]
    capture_s: Annotated[
        Optional[float], Field(ge=0, le=86_400, allow_inf_nan=False, description="Capture time of the list (s).")
    ] = None
    graph_mem_gib: Annotated[
        Optional[float], Field(ge=0, le=1e6, allow_inf_nan=False, description="Memory its graphs reserve (GiB).")
    ] = None
    calibration_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the calibration file.")]
    device: Annotated[str, Field(min_length=1, max_length=200, description="The GPU (or cpu) it was measured on.")]
    torch: Annotated[str, Field(min_length=1, max_length=80, description="torch's version.")]
    date: Annotated[str, Field(min_length=1, max_length=40, description="When it was measured (UTC, ISO 8601).")]
    tool_version: Annotated[Optional[str], Field(max_length=40, description="bcgtune's version.")] = None
    model: Annotated[
        Optional[str], Field(max_length=200, description="The model shape the calibration measured (bcgtune's name).")
    ] = None
    stands_for: Annotated[
        Optional[str], Field(max_length=200, description="The Hugging Face model that shape is, when known.")
    ] = None
    tp_size: Annotated[Optional[StrictInt], Field(ge=1, le=1 << 20, description="The TP size of the rank it measured.")] = None
    ep_size: Annotated[Optional[StrictInt], Field(ge=1, le=1 << 20, description="The expert-parallel size it measured.")] = None


class ProfileFile(StrictDocument):
    """A launch profile: one TOML file per hardware and model."""

    profile: Annotated[ProfileTable, Field(description="What the profile is for.")]
    server: Annotated[
        dict[str, ServerValue],
        Field(
            description="SGLang launch flags, one key per flag: full names in kebab or snake case, or SGLang's short "
            "forms (tp, dp, ep). A value is a bool (true emits the bare flag, false nothing), an int, a float, "
            "a string or a non-empty list of those."
        ),
    ] = {}
    env: Annotated[
        dict[Annotated[str, Field(pattern=_ENV)], StrictStr],
        Field(description="Environment variables added at launch (string values)."),
    ] = {}
    buckets: Annotated[
        Optional[BucketsTable], Field(description="The prefill bucket list; without it SGLang captures its default ladder.")
    ] = None
    tuned: Annotated[
        Optional[TunedTable], Field(description="What bcgtune tune measured for [buckets].list (written by it).")
    ] = None


def _non_ascii_number(text: str) -> bool:
    """A string that Python's int() or float() (and SGLang's argparse) reads as a number
    although its digits are not 0-9 ('１', '٣'): it would launch what it does not show."""
    t = text.strip().lstrip("+-")
    return bool(t) and not t.isascii() and t.replace(".", "", 1).isdecimal()


def _snake_keys(table: Any) -> Any:
    return {snake(k): v for k, v in table.items()} if isinstance(table, dict) else table


def profile_from_dict(data: Mapping[str, Any], where: str, path: Path | None = None) -> Profile:
    """Types and bounds through the schema (one-line errors naming `file: [table].key`), then
    the rules between keys: one flag written twice, flags that belong elsewhere, a JSON
    config that would override [buckets].list."""
    raw = dict(data)
    for sec in ("profile", "buckets", "tuned"):  # kebab or snake keys
        if sec in raw:
            raw[sec] = _snake_keys(raw[sec])
    doc = validate(ProfileFile, raw, where, style="toml", loc_in_where=True)
    server: dict[str, Any] = {}
    seen_as: dict[str, str] = {}
    for k, v in doc.server.items():
        key = snake(k)
        label = f"{where}: [server].{k}"
        if not key or not re.match(r"^[a-z0-9][a-z0-9_]*$", key):
            raise InputError("not a flag name (full SGLang flag names, e.g. tp-size)", label)
        if key in seen_as:
            raise InputError(f"same flag as [server].{seen_as[key]}", label)
        seen_as[key] = k
        if key in _SERVER_FORBIDDEN:
            raise InputError(f"not allowed in [server]: {_SERVER_FORBIDDEN[key]}", label)
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, str) and _non_ascii_number(item):
                raise InputError(f"{quote(item)} is a number in non-ASCII digits: write it with 0-9", label)
        server[key] = list(v) if isinstance(v, list) else v
    buckets = None
    provenance: dict[str, Any] = {}
    if doc.buckets is not None:
        buckets = check_bucket_list(doc.buckets.list_, f"{where}: [buckets].list")
        provenance = doc.buckets.model_dump(exclude={"list_"}, exclude_none=True)
        if "bs" in (prefill_graph_config(server) or {}):
            raise InputError(
                "sets prefill bs, which SGLang would use instead of [buckets].list; remove one",
                f"{where}: [server].{seen_as['cuda_graph_config']}",
            )
    tuned = None
    if doc.tuned is not None:
        if doc.buckets is None:
            raise InputError("[tuned] describes a list, and the profile has no [buckets].list", f"{where}: [tuned]")
        tuned = doc.tuned.model_dump(by_alias=True, exclude_none=True)
    return Profile(
        name=doc.profile.name,
        platform=doc.profile.platform,
        path=path,
        description=doc.profile.description,
        hardware=doc.profile.hardware,
        model=doc.profile.model,
        server=server,
        env=dict(doc.env),
        buckets=buckets,
        provenance=provenance,
        tuned=tuned,
    )


def check_provenance(prov: Mapping[str, Any], where: str) -> dict[str, Any]:
    """[buckets] provenance keys (everything but the list), checked as the file would be."""
    table = validate(
        BucketsTable, {**_snake_keys(dict(prov)), "list": [1]}, where, style="toml", prefix=("buckets",), loc_in_where=True
    )
    return table.model_dump(exclude={"list_"}, exclude_none=True)


def trace_digest_provenance(sources: list) -> dict[str, str]:
    """[buckets] provenance naming the log a list was tuned on by the digest its trace
    records for its first source that has one: trace_xxh128, or trace_sha256 from a trace
    written before logs were identified by XXH3-128; nothing when no source records one."""
    from bcgtune.core.trace.prefill_trace import source_digest

    digest = next((d for d in map(source_digest, sources) if d), None)
    if digest is None:
        return {}
    return {f"trace_{digest[0]}": digest[1]}


def tuned_text(tuned: dict[str, Any]) -> str:
    """A profile's [tuned] record in one line: where and when, the gain over the whole trace
    (and what it was measured on), or, for a record written before that estimate existed,
    the gain measured on the proof's batches, said to be theirs."""
    extra = []
    if tuned.get("capture_s") is not None:
        extra.append(f"capture {tuned['capture_s']:.2f} s")
    if tuned.get("graph_mem_gib") is not None:
        extra.append(f"{tuned['graph_mem_gib']:.3f} GiB")
    passes = f"{tuned.get('passes')} proof pass{'es' if tuned.get('passes') != 1 else ''}"
    batches, of = tuned.get("batches"), tuned.get("trace_batches")
    if tuned.get("trace_gain_pct") is not None:
        half = tuned.get("trace_gain_half_pct")
        gain = f"{tuned['trace_gain_pct']:+.2f}%" + (f" ± {half:.2f}%" if half is not None else "")
        measured = "the whole trace" if batches == of else f"{batches:,} of its {of:,} batches" if of else f"{batches} batches"
        what = f"gain {gain} against SGLang's ladder over the whole trace (95%; measured on {measured}, {passes})"
    else:
        half = tuned.get("measured_gain_half_pct")
        gain = f"{tuned['measured_gain_pct']:+.2f}%" + (f" ± {half:.2f}%" if half is not None else "")
        what = (
            f"measured gain {gain} against SGLang's ladder on the {batches} batches its proof replayed "
            f"({passes}; not the trace's)"
        )
    return (
        f"tuned on {tuned.get('device')} at {tuned.get('date')} (torch {tuned.get('torch')}), {what}; "
        f"{tuned.get('graphs')} graphs" + (", " + ", ".join(extra) if extra else "")
    )


# --------------------------------------------------------------------------- writing
def write_profile_buckets(
    path: str | os.PathLike,
    buckets,
    provenance: Mapping[str, Any] | None = None,
    base_profile: str | os.PathLike | None = None,
    server: Mapping[str, Any] | None = None,
    tuned: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> Profile:
    """Set `path`'s [buckets] (list + provenance) atomically (temp file + rename), and the
        [server] flags in `server` (the launch the list was priced for, e.g. its chunk) and
        [profile].model to `model` when given (the model of the traffic it was priced on).

        The document is edited with tomlkit, which keeps every other table, comment, blank line
        and key order as written: only [buckets] changes (its old keys go: provenance describes
        the new list). A file with CRLF line endings stays CRLF, and one that opens with a
    UTF-8 byte-order mark keeps it. When `path` does not exist, it is
        created from `base_profile` (a built-in name or a path; required then) with
        [profile].name set from the new file's stem. The result is re-read with the strict
        loader before it replaces anything."""
    path = Path(path)
    where = str(path)
    blist = check_bucket_list(list(buckets), "bucket list to write")
    prov = check_provenance(dict(provenance or {}), where)
    new_name = None
    bom = False
    if path.exists():
        if path.is_dir():
            raise InputError("is a folder, not a profile file", where)
        source, old = where, _read_text(where)
        bom = _starts_with_bom(where)  # kept: the editor that wrote it may want it back
        parse_profile(old, where, path=path)  # refuse to edit a file that is already wrong
    else:
        if base_profile is None:
            raise InputError("profile does not exist; give a base profile to create it from", where)
        base_path = resolve_profile_path(base_profile)
        source, old = str(base_path), _read_text(str(base_path))
        base = parse_profile(old, source, path=base_path)
        stem = path.stem if path.suffix == ".toml" else path.name
        if stem != base.name and _NAME_RE.match(stem):
            new_name = stem
    if tuned is not None:
        validate(TunedTable, _snake_keys(dict(tuned)), where, style="toml", prefix=("tuned",), loc_in_where=True)
    new = _with_buckets(old, source, blist, prov, new_name, dict(server or {}), None if tuned is None else dict(tuned), model)
    result = parse_profile(new, where, path=path)
    atomic_write_text(path, ("\ufeff" if bom else "") + new)
    return result


def _starts_with_bom(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(3) == b"\xef\xbb\xbf"
    except OSError:
        return False


def _with_buckets(
    text: str,
    where: str,
    buckets: list[int],
    provenance: Mapping[str, Any],
    name: str | None,
    server: Mapping[str, Any] | None = None,
    tuned: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> str:
    """`text` with its [buckets] table replaced (or added at the end), [profile].name set
    to `name` when given and the `server` flags set in [server]; everything else as written."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    crlf = "\r\n" in text and "\n" not in text.replace("\r\n", "")
    try:
        doc = tomlkit.parse(text.replace("\r\n", "\n") if crlf else text)
    except TOMLKitError as exc:  # the strict loader read it: tomlkit should too
        raise InputError(f"cannot edit this TOML document: {str(exc)[:160]}", where) from None
    table = tomlkit.table()
    table.add("list", tomlkit.array(buckets))  # type: ignore[arg-type]
    for key, value in provenance.items():
        table.add(key, value)
    if "buckets" in doc:
        # comments and blank lines after the old table's last key introduce the next table
        body = getattr(getattr(doc["buckets"], "value", None), "body", [])
        tail: list[Any] = []
        for key, item in reversed(body):
            if key is not None:
                break
            tail.insert(0, item)
        for item in tail:
            table.add(item)
        doc["buckets"] = table
        if tail and len(table.value.body) > len(tail) + len(provenance) + 1:
            table.value.body.pop()  # the blank line tomlkit adds after a table ending in a comment
    else:
        if doc.body and not doc.as_string().endswith("\n\n"):
            doc.add(tomlkit.nl())
        doc.add("buckets", table)
    if name is not None:
        doc["profile"]["name"] = name
    if model is not None:
        doc["profile"]["model"] = model
    if server:
        if "server" not in doc:
            doc.add("server", tomlkit.table())
        table = doc["server"]
        for key, value in server.items():
            # the profile's own spelling of the flag (tp_size or tp-size), else the key given
            same = next((k for k in table if snake(str(k)) == snake(key)), key)
            table[same] = value
    _set_tuned(doc, tuned)
    out = tomlkit.dumps(doc)
    return out.replace("\n", "\r\n") if crlf else out


def _set_tuned(doc, tuned: Mapping[str, Any] | None) -> None:
    """[tuned] describes the list written with it; a list written without one (suggest-buckets,
    drift) is no longer the list an earlier tune measured, so its record goes."""
    import tomlkit

    if "tuned" in doc:
        del doc["tuned"]
    if tuned:
        rec = tomlkit.table()
        for key, value in tuned.items():
            rec.add(key, tomlkit.array(value) if isinstance(value, list) else value)  # type: ignore[arg-type]
        doc.add("tuned", rec)


def _read_text(path: str) -> str:
    from bcgtune.fileio import decode_text, read_input

    return decode_text(read_input(path, "profile (TOML)", limit=PROFILE_MAX_BYTES), path, "profile (TOML)")
