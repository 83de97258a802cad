"""What a profile's launch says about the engine that stands for one of its ranks: the
model it serves, its TP and EP sizes and its chunked prefill size (engines/config.Launch),
which resolving a run takes wherever the command line gave none."""

from __future__ import annotations

from typing import Any

from bcgtune.engines.config import Launch


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def launch_of(profile: Any) -> Launch | None:
    """The Launch of a loaded profile (files.profile_file.Profile), None for none."""
    if profile is None:
        return None
    server = profile.server or {}
    return Launch(
        where=profile.where,
        model=profile.model or None,
        tp=_positive(server.get("tp_size")),
        ep=_positive(server.get("ep_size")),
        chunked_prefill_size=_positive(server.get("chunked_prefill_size")),
    )


def launch_of_profile(path: str | None) -> Launch | None:
    """The Launch of the profile at `path` (a built-in name or a TOML file), None for none."""
    if path is None:
        return None
    from bcgtune.files.profile_file import load_profile

    return launch_of(load_profile(path))
