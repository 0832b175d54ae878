"""The named queries of `sql/queries.sql`, loaded once.

SQL lives in `.sql` files (procrastinate's layout), not in f-strings: each block starts
with `-- name: <name>`; the comment lines after it describe it. `QUERIES[name]` is the
statement text; an unknown name is a `KeyError` at import time of the caller's first use.
"""

from __future__ import annotations

from importlib import resources
from types import MappingProxyType
from typing import Final

__all__ = ["QUERIES", "parse_queries"]

_MARKER = "-- name:"


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into `{name: statement}`. Raises `ValueError` on a repeated
    name or an empty block, which would otherwise surface only when the query runs."""
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), f"{_MARKER} <end>"]:
        if line.startswith(_MARKER):
            if name is not None:
                _add(queries, name, lines)
            name, lines = line[len(_MARKER) :].strip(), []
        elif name is not None and not (line.startswith("--") and not lines):
            lines.append(line)
    return queries


def _add(queries: dict[str, str], name: str, lines: list[str]) -> None:
    statement = "\n".join(lines).strip().rstrip(";").strip()
    if not statement:
        raise ValueError(f"queries.sql: query {name} is empty")
    if name in queries:
        raise ValueError(f"queries.sql: query {name} is defined twice")
    queries[name] = statement


def _load() -> MappingProxyType[str, str]:
    text = resources.files("ledger").joinpath("sql/queries.sql").read_text(encoding="utf-8")
    return MappingProxyType(parse_queries(text))


QUERIES: Final = _load()
