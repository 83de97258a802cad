"""Help text: plain, the same on a terminal and in a pipe, at any width.

Help is laid out by click's own formatter (which wraps text and never cuts an option name),
not by rich: no markup to escape (`[buckets]` prints as written), no box to cut columns, and
`bcgtune --help` imports neither rich nor any command module. Options are listed under their
panel (the `rich_help_panel` of their declaration), in the order they are declared; a
command's examples, attached with `@examples(...)`, follow verbatim.
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any, Callable, Iterable, Sequence

EXAMPLES_ATTR = "help_examples"
_DEFAULT_PANELS = ("Arguments", "Options")
# click's names for the value types, by Python type or by click's type name
_TYPE_NAMES = {
    "int": "INTEGER",
    "integer": "INTEGER",
    "integer range": "INTEGER",
    "float": "FLOAT",
    "float range": "FLOAT",
    "str": "TEXT",
    "text": "TEXT",
}


def examples(*lines: str) -> Callable[[Callable], Callable]:
    """Attach usage examples to a command function; its help ends with them, each line
    printed as written (a command line stays copyable at any width)."""

    def deco(func: Callable) -> Callable:
        setattr(func, EXAMPLES_ATTR, tuple(lines))
        return func

    return deco


def command_examples(func: Callable) -> tuple[str, ...]:
    return tuple(getattr(func, EXAMPLES_ATTR, ()))


def _type_facts(param: Any) -> tuple[Any, tuple | None, Any, Any]:
    """(base type or click type name, choices, min, max) of a parameter, whichever typer
    built it: typer 0.29 describes types itself (`type_descriptor`), older ones through
    click's ParamType (`type`)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        choices = tuple(getattr(c, "value", c) for c in desc.choices) if desc.is_choice and desc.choices else None
        base = desc.annotation
        args = getattr(base, "__args__", None)
        if desc.is_list and args:
            base = args[0]
        return base, choices, getattr(param, "min", None), getattr(param, "max", None)
    t = param.type
    return getattr(t, "name", None), getattr(t, "choices", None), getattr(t, "min", None), getattr(t, "max", None)


def _range(param: Any) -> str | None:
    """'1<=x<=1048576' for a bounded number (click's own wording)."""
    _, _, lo, hi = _type_facts(param)
    if lo is None and hi is None:
        return None
    if lo is None:
        return f"x<={hi}"
    if hi is None:
        return f"x>={lo}"
    return f"{lo}<=x<={hi}"


def _metavar(param: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    base, choices, _, _ = _type_facts(param)
    if choices:
        return "[" + "|".join(str(c) for c in choices) + "]"
    if isinstance(base, type):
        return _TYPE_NAMES.get(base.__name__, base.__name__.upper())
    return _TYPE_NAMES.get(str(base), str(base or "value").upper())


def _default(param: Any) -> str | None:
    """The default worth showing: a set value (not None, not an empty list, not a flag's
    False), unless the declaration hides it."""
    if getattr(param, "show_default", True) is False:
        return None
    value = getattr(param.default, "value", param.default)  # an Enum default shows its value
    if callable(value) or value is None or value == [] or value == ():
        return None
    if getattr(param, "is_flag", False):
        if not getattr(param, "secondary_opts", None):
            return None
        return param.opts[0] if value else param.secondary_opts[0]
    return str(value)


def option_record(param: Any) -> tuple[str, str]:
    """(names and metavar, help with its [default; range; required] note)."""
    if param.param_type_name == "argument":
        first = _metavar(param)
    else:
        first = ", ".join(param.opts)
        if param.secondary_opts:
            first += " / " + ", ".join(param.secondary_opts)
        if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            first += " " + _metavar(param)
    extra = []
    default = _default(param)
    if default is not None:
        extra.append(f"default: {default}")
    rng = _range(param)
    if rng:
        extra.append(rng)
    if param.required and param.param_type_name == "option":
        extra.append("required")
    text = param.help or ""
    if extra:
        text = f"{text}  [{'; '.join(extra)}]" if text else f"[{'; '.join(extra)}]"
    return first, text


def _panels(params: Iterable[Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Options grouped by panel: Arguments, Options, then the declared panels in order."""
    groups: dict[str, list[tuple[str, str]]] = {name: [] for name in _DEFAULT_PANELS}
    for p in params:
        if getattr(p, "hidden", False):
            continue
        default_panel = "Arguments" if p.param_type_name == "argument" else "Options"
        groups.setdefault(getattr(p, "rich_help_panel", None) or default_panel, []).append(option_record(p))
    return [(name, rows) for name, rows in groups.items() if rows]


def _wrap(text: str, width: int) -> list[str]:
    """Paragraphs (blank-line separated) re-flowed to `width`, never breaking a word at a
    hyphen (option names stay whole) nor cutting a long word."""
    out: list[str] = []
    for para in text.split("\n\n"):
        words = " ".join(para.split())
        if not words:
            continue
        if out:
            out.append("")
        out += textwrap.wrap(words, max(width, 20), break_on_hyphens=False, break_long_words=False) or [""]
    return out


def _write_text(formatter: Any, text: str) -> None:
    pad = " " * formatter.current_indent
    for line in _wrap(text, formatter.width - formatter.current_indent):
        formatter.write(f"{pad}{line}\n" if line else "\n")


def _write_dl(formatter: Any, rows: Sequence[tuple[str, str]], col_max: int = 30, spacing: int = 2) -> None:
    """A definition list as click writes it (names, then help aligned in a second column;
    help under the name when the name is wider than `col_max`), wrapped with `_wrap`."""
    first = min(max(len(name) for name, _ in rows), col_max) + spacing
    pad = " " * formatter.current_indent
    width = formatter.width - formatter.current_indent - first
    for name, text in rows:
        lines = _wrap(text, width)
        if not lines:
            formatter.write(f"{pad}{name}\n")
            continue
        if len(name) <= first - spacing:
            formatter.write(f"{pad}{name:<{first}}{lines[0]}\n")
            rest = lines[1:]
        else:
            formatter.write(f"{pad}{name}\n")
            rest = lines
        for line in rest:
            formatter.write(f"{pad}{' ' * first}{line}\n" if line else "\n")


def format_command_help(cmd: Any, ctx: Any, formatter: Any, examples: Sequence[str] = ()) -> None:
    """Usage, the docstring (paragraphs wrapped to the width), options by panel, examples."""
    cmd.format_usage(ctx, formatter)
    if cmd.help:
        formatter.write_paragraph()
        with formatter.indentation():
            _write_text(formatter, inspect.cleandoc(cmd.help).partition("\f")[0])
    for name, rows in _panels(cmd.get_params(ctx)):
        with formatter.section(name):
            _write_dl(formatter, rows)
    if examples:
        with formatter.section("Examples"):
            for line in examples:
                formatter.write(" " * formatter.current_indent + line + "\n")


def format_group_help(group: Any, ctx: Any, formatter: Any, commands: Sequence[tuple[str, str]]) -> None:
    """The root help: usage, text, options, then every command with its one-line summary
    (from the command table: no command module is imported)."""
    format_command_help(group, ctx, formatter)
    with formatter.section("Commands"):
        _write_dl(formatter, commands)
