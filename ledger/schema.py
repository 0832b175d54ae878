"""A stable text description of the ledger's schema, read from the catalogue.

The schema test applies every migration to an empty database and compares
`describe_schema` with the snapshot in `sql/schema.snapshot`, so a migration that does
not produce the schema the code expects (or a hand edit of a live database) is caught.
After adding a migration on purpose, regenerate the snapshot:

    .venv/bin/python -m ledger.schema postgresql://.../db > ledger/sql/schema.snapshot
"""

from __future__ import annotations

import sys
from importlib import resources

import psycopg
from psycopg.rows import TupleRow

__all__ = ["describe_schema", "expected_schema"]

_COLUMNS = """
SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')
FROM information_schema.columns
WHERE table_schema = 'public'
ORDER BY table_name, ordinal_position
"""

_CONSTRAINTS = """
SELECT rel.relname, con.conname, pg_get_constraintdef(con.oid)
FROM pg_constraint AS con
JOIN pg_class AS rel ON rel.oid = con.conrelid
JOIN pg_namespace AS nsp ON nsp.oid = rel.relnamespace
WHERE nsp.nspname = 'public'
ORDER BY rel.relname, con.conname
"""

_INDEXES = """
SELECT tablename, indexname, indexdef
FROM pg_indexes
WHERE schemaname = 'public'
ORDER BY tablename, indexname
"""

_TRIGGERS = """
SELECT event_object_table, trigger_name, action_timing, event_manipulation,
       action_orientation, action_statement
FROM information_schema.triggers
WHERE trigger_schema = 'public'
ORDER BY event_object_table, trigger_name, event_manipulation
"""

_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid)
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = 'public'
ORDER BY p.proname
"""


def describe_schema(conn: psycopg.Connection[TupleRow]) -> str:
    """Tables with their columns, constraints, indexes, triggers and functions of the
    public schema, one per line, in a stable order (the migrations table included)."""
    lines: list[str] = []
    for title, query in (
        ("column", _COLUMNS),
        ("constraint", _CONSTRAINTS),
        ("index", _INDEXES),
        ("trigger", _TRIGGERS),
        ("function", _FUNCTIONS),
    ):
        for row in conn.execute(query).fetchall():
            lines.append(title + " " + " | ".join(str(v) for v in row))
    return "\n".join(lines) + "\n"


def expected_schema() -> str:
    """The snapshot the migrations must produce."""
    return resources.files("ledger").joinpath("sql/schema.snapshot").read_text("utf-8")


def main() -> None:
    """Print the schema of the database named on the command line."""
    with psycopg.connect(sys.argv[1]) as conn:
        sys.stdout.write(describe_schema(conn))


if __name__ == "__main__":
    main()
