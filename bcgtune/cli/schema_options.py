"""Option sets generated from the declarations they feed, so that each option is declared
once: a pydantic schema whose fields carry `schema.CliOption` metadata (the workload's
client and server settings), or a table of SGLang launch flags (the parallel layout).

Generating from a pydantic schema imports pydantic (a quarter of a second), which `bcgtune
COMMAND --help` must not pay: the workload's option table is generated ahead, into
bcgtune/cli/simulate_options_table.py (scripts/gen_option_tables.py writes it; a test checks
it equals what the schema generates now).

Each generator returns a dataclass of `Annotated[type, typer.Option(...)]` fields, the
shape `bcgtune.cli.options.options()` adds to a command. A field keeps the schema's name, so
an error the library raises about a field (`InputError(field=...)`, from the location of a
pydantic validation error) names the option that carried it (bcgtune/cli/app.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

import typer

if typing.TYPE_CHECKING:
    import pydantic


@dataclass(frozen=True)
class OptionSpec:
    """One generated option: the dataclass field `name` with its type and default, and the
    typer.Option arguments."""

    name: str
    kind: type
    default: Any
    flags: tuple[str, ...]
    help: str
    panel: str | None = None
    show_default: bool = True
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None  # a closed set of strings, checked at parse time

    def annotation(self) -> Any:
        kw: dict[str, Any] = {"help": self.help, "show_default": self.show_default}
        if self.choices:
            kw["metavar"] = "[" + "|".join(self.choices) + "]"
            kw["callback"] = one_of(self.choices)
        if self.panel is not None:
            kw["rich_help_panel"] = self.panel
        if self.minimum is not None:
            kw["min"] = self.minimum
        if self.maximum is not None:
            kw["max"] = self.maximum
        kind = self.kind if self.default is not None else Optional[self.kind]  # noqa: UP045 (typer reads it)
        return Annotated[kind, typer.Option(*self.flags, **kw)]


def one_of(values: tuple[str, ...]) -> Callable[[Optional[str]], Optional[str]]:
    """A parse-time check that a text option holds one of `values` (the command still
    receives the string)."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and value not in values:
            raise typer.BadParameter(f"must be one of {', '.join(values)}, got {value[:60]!r}")
        return value

    return check


def flag_of(name: str) -> str:
    """A field name as a command-line flag: `num_prompts` -> `--num-prompts`."""
    return "--" + name.replace("_", "-")


def _strip(annotation: Any) -> Any:
    """The value type under Optional[...] and Annotated[...]."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                raise TypeError(f"no option type for {annotation!r}")
            annotation = rest[0]
        else:
            return annotation


def _option_type(annotation: Any) -> type:
    """The type the command line parses for a schema type: lists arrive as one text (a
    comma list the schema's parser splits), a closed set of strings as a string."""
    base = _strip(annotation)
    origin = typing.get_origin(base)
    if origin in (list, tuple):
        return str
    if origin is Literal:
        return str
    if base in (bool, int, float, str):
        return base
    raise TypeError(f"no option type for {annotation!r}")


def specs_from_model(model: type[pydantic.BaseModel], panel: str | None = None) -> list[OptionSpec]:
    """An option (default None: not given) for each field of `model` that carries CliOption
    metadata, in the model's field order. Imports pydantic through the schema: the command
    line reads the table generated from this (bcgtune/cli/simulate_options_table.py)."""
    from bcgtune.core.schema import CliOption

    out = []
    for name, info in model.model_fields.items():
        meta = next((m for m in info.metadata if isinstance(m, CliOption)), None)
        if meta is None:
            continue
        base = _strip(info.annotation)
        out.append(
            OptionSpec(
                name=name,
                kind=_option_type(info.annotation),
                default=None,
                flags=(flag_of(name), *meta.aliases),
                help=meta.help,
                panel=panel,
                show_default=False,
                choices=tuple(typing.get_args(base)) if typing.get_origin(base) is Literal else None,
            )
        )
    return out


def spec_source(spec: OptionSpec) -> str:
    """The Python source of one spec, for a generated table."""
    args = ", ".join(
        [repr(spec.name), spec.kind.__name__, repr(spec.default), repr(spec.flags), repr(spec.help)]
        + [f"{k}={getattr(spec, k)!r}" for k in ("panel", "show_default", "minimum", "maximum", "choices")]
    )
    return f"    OptionSpec({args}),"


def option_set(class_name: str, specs: Iterable[OptionSpec], namespace: Mapping[str, Callable[..., Any]] | None = None) -> type:
    """A dataclass with one option field per spec (and the methods in `namespace`)."""
    fields = [(s.name, s.annotation(), dataclasses.field(default=s.default)) for s in specs]
    return dataclasses.make_dataclass(class_name, fields, namespace=dict(namespace or {}))
