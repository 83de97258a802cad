"""The click classes behind bcgtune's commands (typer builds them with `cls=`):

- `Command`: plain help (bcgtune/cli/help.py), and one rule for every option that takes a
  value: an empty or blank value is an error naming the option, never "unset".
- `LazyGroup`: the root command. It lists the commands from the command table and imports a
  command's module only when that command is run or asked for its help.

They work on every typer that pyproject.toml allows (typer 0.19 on click 8, typer 0.29 on the
click it bundles): only click's public Command/Group methods are overridden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from difflib import get_close_matches
from typing import Any

from typer.core import TyperCommand, TyperGroup

from bcgtune.cli import guard
from bcgtune.cli.help import format_command_help, format_group_help
from bcgtune.errors import InputError


def flag_of_param(param: Any) -> str:
    """The name an error shows for a parameter: its long option, or an argument's metavar."""
    return _flag(param)


def _flag(param: Any) -> str:
    if param.param_type_name == "argument":
        return str(param.metavar or param.name.upper()).strip("[]")
    longs = [o for o in param.opts if o.startswith("--")]
    return (longs or param.opts)[0]


def command_line_values(params: list[Any], values: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(the parameter's names, a string value) for every value given or defaulted."""
    out = []
    for p in params:
        value = values.get(p.name)
        names = tuple(getattr(p, "opts", ())) + tuple(getattr(p, "secondary_opts", ())) or (_flag(p),)
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, str):
                out.append((names, v))
    return out


def refuse_empty_values(params: list[Any], values: dict[str, Any]) -> None:
    """An option (or single argument) given '' or blanks: refused, naming it. Arguments that
    pass the rest of the line to another program (nargs=-1) are left as given."""
    for p in params:
        if getattr(p, "is_flag", False) or getattr(p, "count", False) or p.nargs == -1 or p.name not in values:
            continue
        value = values[p.name]
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(v, str) and not v.strip() for v in items):
            raise InputError("empty value: give a value or leave the option out", _flag(p))


def _plain_help_option(opt: Any) -> Any:
    """The --help flag defaults to False, not None: typer 0.29 would otherwise validate the
    missing flag's None through pydantic on every command line (0.1-0.2 s of imports)."""
    if opt is not None and opt.default is None:
        opt.default = False
    return opt


class Command(TyperCommand):
    examples: tuple[str, ...] = ()

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        params = self.get_params(ctx)
        refuse_empty_values(params, ctx.params)
        guard.record_command_line(command_line_values(params, ctx.params))
        return rest

    def format_help(self, ctx: Any, formatter: Any) -> None:
        format_command_help(self, ctx, formatter, self.examples)


class LazyCommands(MutableMapping):
    """name -> click command, built (its module imported) on first access, in table order."""

    def __init__(self, names: list[str], build: Callable[[str], Any]):
        self._names = list(names)
        self._build = build
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = cmd

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class LazyGroup(TyperGroup):
    """Subclassed by the app with `table` ((name, one-line summary), in help order) and
    `build` (name -> click command)."""

    table: tuple[tuple[str, str], ...] = ()
    build: Callable[[str], Any]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands([name for name, _ in self.table], type(self).build)

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        format_group_help(self, ctx, formatter, self.table)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except Exception as error:  # click's UsageError, whichever click typer runs on
            exc: Any = error
            message = getattr(exc, "message", None)
            shown = str(exc.format_message()) if hasattr(exc, "format_message") else ""
            if isinstance(message, str) and args and "Did you mean" not in message + shown:
                close = get_close_matches(args[0], list(self.commands), n=2)
                if close:
                    hint = ". Did you mean " + ", ".join(repr(c) for c in close) + "?"
                    exc.message = message.rstrip(".") + hint
            raise
