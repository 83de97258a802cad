"""Rendering of `serve --dry-run` (bcgtune.services.serve.DryRun): the command, the
environment it adds, and what SGLang will capture as shell comments under it."""

from __future__ import annotations

from bcgtune.cli.render.launch import render_resolved_prefill
from bcgtune.services.serve import DryRun


def render_dry_run(result: DryRun) -> str:
    cmd, name = result.plan.cmd, result.plan.profile_name
    lines = []
    if cmd.env:
        lines.append(f"# environment added by profile {name}:")
        lines.extend(f"export {line}" for line in cmd.env_lines())
    else:
        lines.append(f"# environment added by profile {name}: none")
    lines.append(cmd.shell_line())
    lines.extend(f"# {line}" for line in render_resolved_prefill(result.capture))
    return "\n".join(lines) + "\n"
