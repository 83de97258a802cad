"""The bounds of every value bcgtune reads, and the one mechanism that checks them.

Documents (trace and calibration JSON, profile and workload TOML) and option values are
validated with pydantic: a model or an annotated type below, passed to `validate()`. A
failure becomes one InputError line naming the source and the field, in the document's own
notation (`t.json: histogram.sizes[3]`, `p.toml: [server].tp-size`), with the offending value
quoted at most ~80 characters. Bounds are those of a serving engine: token counts fit
SGLang's int32 tensors, times and sizes are finite, seeds fit numpy's legacy generator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Iterable

import pydantic
from pydantic import Field, TypeAdapter

from bcgtune.errors import InputError, quote

# SGLang keeps token counts in int32 tensors (forward_batch_info.py: seq_lens, extend lens).
TOKENS_MAX = 2**31 - 1
# Batches of one size in a histogram: far above any real trace, and sums of
# count x tokens stay exact in int64.
BATCHES_MAX = 2**31 - 1
# A time in milliseconds or a memory in GiB: a day / a petabyte is already absurd.
MS_MAX = 86_400_000.0
GIB_MAX = 1e6
# numpy.random.RandomState (bench_serving's legacy generator) takes seeds in [0, 2**32).
SEED_MAX = 2**32 - 1
# Attention-DP ranks of one server: far above any cluster SGLang runs on.
DP_RANKS_MAX = 4096
# Requests one simulation may play: 3 million take minutes; beyond this, refuse.
REQUESTS_MAX = 10_000_000

Tokens = Annotated[int, Field(strict=True, ge=1, le=TOKENS_MAX)]
BatchCount = Annotated[int, Field(strict=True, ge=1, le=BATCHES_MAX)]
Milliseconds = Annotated[float, Field(strict=True, ge=0, le=MS_MAX, allow_inf_nan=False)]
GiB = Annotated[float, Field(strict=True, ge=0, le=GIB_MAX, allow_inf_nan=False)]
Seed = Annotated[int, Field(strict=True, ge=0, le=SEED_MAX)]
PositiveInt = Annotated[int, Field(strict=True, ge=1, le=TOKENS_MAX)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0, le=TOKENS_MAX)]
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


@lru_cache(maxsize=256)
def _adapter(schema: Any) -> TypeAdapter:
    return TypeAdapter(schema)


def format_loc(loc: Iterable[Any], style: str = "json", data: Any = None) -> str:
    """('histogram', 'sizes', 3) -> `histogram.sizes[3]` (json) or, for TOML documents,
    ('server', 'tp-size') -> `[server].tp-size` (a first key that holds a table is written
    as TOML writes a table header)."""
    out = ""
    parts = list(loc)
    for i, p in enumerate(parts):
        if isinstance(p, int):
            out += f"[{p}]"
        elif style == "toml" and i == 0 and (len(parts) > 1 or (isinstance(data, dict) and isinstance(data.get(p), dict))):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def _message(err: Any, schema: Any) -> str:
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be ") :]
    elif re.match(r"(Value|List|Tuple|Set|Dictionary|String) should ", msg):
        msg = "must " + msg.split(" should ", 1)[1]  # pydantic-core names the type in some versions
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(schema, err.get("loc", ()))
        return "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "missing required key"
    if "input" in err and kind not in ("model_type", "dict_type"):
        msg += f", got {quote(err['input'])}"
    elif kind in ("model_type", "dict_type"):
        msg = "must be a table/object" + (f", got {quote(err['input'])}" if "input" in err else "")
    return msg


def _allowed_keys(schema: Any, loc: tuple) -> list[str]:
    """Field names of the model that refused an extra key (best effort, for the hint)."""
    model = schema
    for part in list(loc)[:-1]:
        fields = getattr(model, "model_fields", None)
        if not fields or not isinstance(part, str):
            return []
        field = next((f for n, f in fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        model = field.annotation
    fields = getattr(model, "model_fields", None) or {}
    return [f.alias or n for n, f in fields.items()]


def validate(
    schema: Any,
    data: Any,
    where: str | None = None,
    *,
    style: str = "json",
    prefix: tuple = (),
    field: str | None = None,
    as_fields: bool = False,
    loc_in_where: bool = False,
) -> Any:
    """`data` validated against `schema` (a pydantic model or an annotated type). On failure,
    an InputError naming `where` (a file, a flag) and the failing location inside it.
    `as_fields`: the model's fields are the user's inputs (a request built from options):
    the error names the field, which the CLI turns into its flag. `loc_in_where`: the
    location joins the source (`p.toml: [server].tp-size`) instead of the message."""
    try:
        return _adapter(schema).validate_python(data)
    except pydantic.ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = tuple(err.get("loc", ()))
        msg = _message(err, schema)
        if as_fields and loc:
            raise InputError(msg, where, field=str(loc[0])) from None
        loc_text = format_loc(prefix + loc, style, data if not prefix else None)
        if loc_in_where and loc_text:
            raise InputError(msg, f"{where}: {loc_text}" if where else loc_text, field=field) from None
        what = f"{loc_text}: {msg}" if loc_text else msg
        raise InputError(what, where, field=field) from None
    except RecursionError:
        raise InputError("nested too deeply", where, field=field) from None


class Document(pydantic.BaseModel):
    """Base of the documents bcgtune reads: unknown keys are kept out of the model but
    allowed (files from a newer bcgtune stay readable); subclasses that must be strict
    (profiles, workloads) forbid them."""

    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())


class StrictDocument(pydantic.BaseModel):
    """A hand-written document: an unknown key is an error that names it."""

    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())


@dataclass(frozen=True)
class CliOption:
    """Metadata that makes a schema field a command-line option as well, declared once with
    the field (`Annotated[int | None, CliOption("...")]`): the command line generates its
    option from the field's name and type. `help` is the option's help line (the field's
    description documents the file key); `aliases` are further spellings of the flag."""

    help: str
    aliases: tuple[str, ...] = ()


def parse_int_list(
    value: Any,
    where: str | None = None,
    *,
    item: Any = PositiveInt,
    sort_unique: bool = False,
    field: str | None = None,
    max_items: int = 100_000,
    empty_items: bool = False,
) -> list[int]:
    """'256 512 1024', '256,512,1024', 256 or [256, 512] -> a list of ints, each checked
    against `item`. `sort_unique`: ascending without duplicates (a bucket list: SGLang sorts
    and deduplicates what it captures); otherwise the order is kept (a sweep).
    A comma list with an empty item ('4,,8', '4,') is refused unless `empty_items`."""
    if isinstance(value, str):
        if not empty_items and "," in value and any(not t.strip() for t in value.split(",")):
            raise InputError(f"empty item in the list {quote(value)}", where, field=field)
        toks = value.replace(",", " ").split()
        if len(toks) > max_items:
            raise InputError(f"more than {max_items:,} values", where, field=field)
        vals: list[Any] = []
        for t in toks:
            try:
                vals.append(int(t))
            except ValueError:
                raise InputError(f"{quote(t)} is not an integer", where, field=field) from None
    elif isinstance(value, int) and not isinstance(value, bool):
        vals = [value]
    elif isinstance(value, (list, tuple)):
        if len(value) > max_items:
            raise InputError(f"more than {max_items:,} values", where, field=field)
        vals = list(value)
    else:
        raise InputError(f"must be an integer or a list of integers, got {quote(value)}", where, field=field)
    if not vals:
        raise InputError("empty list", where, field=field)
    out = [validate(item, v, where, field=field) for v in vals]
    return sorted(set(out)) if sort_unique else out
