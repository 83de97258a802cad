"""The one way bcgtune prints a table and a count: left-aligned text columns, right-aligned
numbers, a dashed rule under the header; counts with their noun in the singular or plural."""

from __future__ import annotations

from typing import Sequence


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: set[int] | None = None,
    indent: str = "",
    wrap_last: int | None = None,
) -> list[str]:
    """Lines of a table. `right`: indices of right-aligned columns (default: all but the first).
    `wrap_last`: the last column (left-aligned text) wrapped at this many characters, its
    further lines under its first."""
    if right is None:
        right = set(range(1, len(headers)))
    if wrap_last is not None and rows:
        import textwrap

        last = len(headers) - 1
        wrapped: list[Sequence[str]] = []
        for r in rows:
            parts = textwrap.wrap(r[last], wrap_last, break_on_hyphens=False) or [""]
            wrapped.append([*r[:last], parts[0]])
            wrapped += [[""] * last + [p] for p in parts[1:]]
        rows = wrapped
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return (
            indent + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        )

    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def num(n) -> str:
    return "-" if n is None else f"{int(n):,}"


def count(n, noun: str, plural: str | None = None) -> str:
    """'1 graph', '12 graphs', '1,251 batches'."""
    n = int(n)
    word = noun if n == 1 else (plural or (noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")))
    return f"{n:,} {word}"
