"""Workload files and shipped presets, profiles' server settings and option values, each
turned into a validated `Workload` (bcgtune/core/sim/workload.py holds the value and its schema).

Sources, later ones winning: built-in defaults <- a workload TOML or shipped preset
(`--workload`) <- a profile's `[server]` (`--profile`) <- explicit options. Keys may be
kebab-case or snake_case, and SGLang's short names (`tp`, `dp`) stand for their flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pydantic

from bcgtune.core import schema
from bcgtune.core.sim.workload import (
    _LIST_FIELDS,
    LEVELS_MAX,
    SECTIONS,
    ServerSettings,
    Workload,
    WorkloadFile,
    WorkloadSettings,
    with_settings,
)
from bcgtune.errors import InputError
from bcgtune.files.profile_file import snake

PRESET_DIR = "workloads"
DEFAULT_PRESET = "mi355x-multimodal-pr"

# GPU memory per device by profile `hardware`, for SGLang's chunked_prefill_size default
# (arg_groups/memory_hook.py thresholds: <160 GiB -> 8192, larger -> 16384).
HARDWARE_GPU_MEMORY_GIB = {
    "a100": 80.0,
    "h100": 80.0,
    "h200": 141.0,
    "b200": 180.0,
    "gb200": 186.0,
    "mi300x": 192.0,
    "mi325x": 256.0,
    "mi350x": 288.0,
    "mi355x": 288.0,
}


# SGLang/profile flags the simulator reads under other names.
_SERVER_ALIASES = {"tp": "tp_size", "dp": "dp_size", "tensor_parallel_size": "tp_size", "data_parallel_size": "dp_size"}


def _setting_name(key: str) -> str:
    """A key as written (kebab or snake case, an SGLang alias such as `tp`) -> its field name."""
    name = snake(key)
    return _SERVER_ALIASES.get(name, name)


def _normalize_table(table: Any, known: Mapping[str, Any], where: str, label: str) -> Any:
    """Keys of one table renamed to their field names; unknown keys stay as written so the
    schema's refusal names them. Two spellings of one setting are refused."""
    if not isinstance(table, Mapping):
        return table  # the schema says it must be a table
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in table.items():
        name = _setting_name(key)
        name = name if name in known else key
        if name in out:
            raise InputError(f"{label}{key}: same setting as {label}{written[name]}", where)
        out[name] = value
        written[name] = key
    return out


def _set_values(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(exclude_none=True)


def preset_names() -> list[str]:
    from importlib import resources

    base = resources.files("bcgtune") / "data" / PRESET_DIR
    try:
        return sorted(e.name[:-5] for e in base.iterdir() if e.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _preset_bytes(name: str) -> bytes | None:
    from importlib import resources

    if name not in preset_names():
        return None
    return (resources.files("bcgtune") / "data" / PRESET_DIR / f"{name}.toml").read_bytes()


def _is_path(path_or_name: str) -> bool:
    return Path(path_or_name).is_file() or path_or_name.endswith(".toml") or "/" in path_or_name


def read_workload_document(path_or_name: str) -> tuple[WorkloadFile, str, str]:
    """A workload TOML (path) or shipped preset (name), validated: (document, where, the
    name it goes by when it gives none)."""
    from bcgtune import fileio

    if _is_path(path_or_name):
        where = fileio.display_path(path_or_name)
        data = fileio.read_toml(path_or_name, "workload file")
        default_name = Path(path_or_name).stem
    else:
        raw = _preset_bytes(path_or_name)
        if raw is None:
            names = ", ".join(preset_names()) or "none"
            raise InputError(f"no workload file or preset named {path_or_name!r} (presets: {names})")
        where = f"preset {path_or_name}"
        data = fileio.parse_toml(raw, where)
        default_name = path_or_name
    data = {
        key: _normalize_table(value, SECTIONS[key].model_fields, where, f"[{key}].") if key in SECTIONS else value
        for key, value in data.items()
    }
    doc = schema.validate(WorkloadFile, data, where, style="toml")
    return doc, where, default_name


def load_workload_file(path_or_name: str, base: Workload | None = None) -> Workload:
    """A workload TOML (path) or a shipped preset (name) applied over `base`. Layout:

        name = "..."              # optional
        description = "..."       # optional
        profile = "mi355x"        # optional: server settings from a profile, then [server] on top
        [client]  dataset_name, num_prompts, random_input_len, ... (bench_serving's names)
        [server]  chunked_prefill_size, max_running_requests, ... (SGLang's names)
        [step_time]  prefill_floor_ms, decode_base_ms, ...

    Strict: an unknown key, a wrong type or a value out of bounds is an error naming the
    file and `[table].key` (WorkloadFile is the schema)."""
    doc, where, default_name = read_workload_document(path_or_name)
    w = base if base is not None else Workload()
    if doc.profile is not None:
        w = apply_profile(w, doc.profile)
    for section in SECTIONS:
        w = with_settings(w, _set_values(getattr(doc, section)))
    name = doc.name if doc.name is not None else default_name
    return replace(w, name=name).validate(where)


def profile_server_settings(path_or_name: str) -> dict[str, Any]:
    """The `[server]` table of a profile (snake_case SGLang flags) plus `gpu_memory_gib` when
    the profile names known hardware."""
    from bcgtune.files.profile_file import load_profile

    prof = load_profile(path_or_name)
    out = dict(prof.server)
    hardware = str(prof.hardware or "").lower()
    if hardware in HARDWARE_GPU_MEMORY_GIB and "gpu_memory_gib" not in out:
        out["gpu_memory_gib"] = HARDWARE_GPU_MEMORY_GIB[hardware]
    return out


def apply_profile(w: Workload, path_or_name: str) -> Workload:
    """Server settings the simulator models, from a profile; other flags are not its business."""
    where = str(path_or_name)
    server = profile_server_settings(path_or_name)
    modelled = {k: v for k, v in server.items() if _setting_name(k) in ServerSettings.model_fields}
    table = _normalize_table(modelled, ServerSettings.model_fields, where, "[server].")
    return with_settings(w, _set_values(schema.validate(ServerSettings, table, where, style="toml", prefix=("server",))))


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Option values as the CLI parsed them (comma lists as strings; ints, floats, bools
    otherwise) -> validated settings by field name. Errors name the field."""
    given: dict[str, Any] = {}
    for key, value in options.items():
        name = _setting_name(key)
        if name in _LIST_FIELDS and isinstance(value, str):
            value = schema.parse_int_list(
                value, None, item=_LIST_FIELDS[name], field=name, max_items=LEVELS_MAX, empty_items=False
            )
        given[name] = value
    return _set_values(schema.validate(WorkloadSettings, given, None, as_fields=True))


def workload_from_options(
    workload: str | None = None,
    profile: str | None = None,
    **options: Any,
) -> Workload:
    """The CLI's mapping: defaults <- `workload` (file or preset) <- `profile` <- each option
    given (None = not given). Option values arrive as the CLI parsed them (strings for the
    comma lists, floats/ints/bools otherwise); errors name the option's field."""
    w = Workload()
    if workload is not None:
        w = load_workload_file(workload, w)
    if profile is not None:
        w = apply_profile(w, profile)
    given = {k: v for k, v in options.items() if v is not None}
    if given:
        w = with_settings(w, check_options(given))
    return w.validate()


def default_workload() -> Workload:
    """The image benchmark of the Qwen multimodal breakable-prefill pull request (SGLang,
    MI355X) on the mi355x profile's server settings: the shipped preset of that name."""
    return load_workload_file(DEFAULT_PRESET)
