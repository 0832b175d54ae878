"""The Avro schemas shipped in `schemas/avro/`, indexed by name and by fingerprint.

Files are named `<record>.v<N>.avsc`. Every version of a record shares the Avro full
name (`recovery.EventEnvelope`); the highest version is the current reader schema and
every version is a writer schema the codec can still read, found by the CRC-64-AVRO
(Rabin) fingerprint of its parsing canonical form, as Avro single-object encoding and
schema resolution require. Old versions are never deleted or edited: a record written
years ago must still be read (docs/wire-formats.md, "Evolution rules").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro.schema import parse_schema, to_parsing_canonical_form

from schemas.errors import WireCode, WireError

__all__ = [
    "AVRO_DIR",
    "CAPABILITY_COMMAND",
    "DEAD_LETTER",
    "EVENT_ENVELOPE",
    "EVIDENCE_EVENT",
    "SchemaCatalog",
    "SchemaVersion",
    "default_catalog",
    "rabin_fingerprint",
]

AVRO_DIR = Path(__file__).resolve().parent / "avro"

EVENT_ENVELOPE = "recovery.EventEnvelope"
CAPABILITY_COMMAND = "recovery.CapabilityCommand"
EVIDENCE_EVENT = "recovery.EvidenceEvent"
DEAD_LETTER = "recovery.DeadLetter"

_FILE_NAME = re.compile(r"^(?P<stem>[a-z0-9_]+)\.v(?P<version>[1-9][0-9]*)\.avsc$")

# CRC-64-AVRO as the Avro specification defines it ("Schema Fingerprints"): a Rabin
# fingerprint with this empty value; the table is built once at import.
_EMPTY = 0xC15D213AA4D7A795


def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_TABLE = _table()


def rabin_fingerprint(canonical_form: str) -> bytes:
    """The CRC-64-AVRO fingerprint of a parsing canonical form, as the 8 little-endian
    bytes that follow the `C3 01` marker of a single-object encoded record."""
    fp = _EMPTY
    for byte in canonical_form.encode("utf-8"):
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One `.avsc` file: its record name, version, parsed schema and fingerprint."""

    name: str
    version: int
    path: Path
    parsed: Any
    canonical_form: str
    fingerprint: bytes

    @property
    def fingerprint_hex(self) -> str:
        """The fingerprint as 16 hex digits (little-endian byte order, as on the wire)."""
        return self.fingerprint.hex()


class SchemaCatalog:
    """Every schema version in a folder; lookups by fingerprint (writers) and by name
    (the current reader schema, which is the highest version)."""

    def __init__(self, versions: list[SchemaVersion]) -> None:
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        self._current: dict[str, SchemaVersion] = {}
        for version in versions:
            clash = self._by_fingerprint.get(version.fingerprint)
            if clash is not None:
                raise WireError(
                    WireCode.UNKNOWN_SCHEMA,
                    f"{version.path.name} and {clash.path.name} have the same canonical form; "
                    "delete the copy or change the new version",
                )
            self._by_fingerprint[version.fingerprint] = version
            current = self._current.get(version.name)
            if current is None or version.version > current.version:
                self._current[version.name] = version

    @classmethod
    def load(cls, directory: Path = AVRO_DIR) -> SchemaCatalog:
        """Parse every `<record>.v<N>.avsc` in `directory`. A file whose name or content is
        malformed raises `WireError` naming it: a broken catalogue must stop start-up."""
        versions = [_load_file(path) for path in sorted(directory.glob("*.avsc"))]
        if not versions:
            raise WireError(WireCode.UNKNOWN_SCHEMA, f"no .avsc files in {directory}")
        return cls(versions)

    def names(self) -> tuple[str, ...]:
        """The record full names the catalogue knows, sorted."""
        return tuple(sorted(self._current))

    def current(self, name: str) -> SchemaVersion:
        """The reader (highest) version of record `name`."""
        try:
            return self._current[name]
        except KeyError:
            known = ", ".join(self.names())
            raise WireError(
                WireCode.UNKNOWN_SCHEMA, f"no schema named {name!r}; known: {known}"
            ) from None

    def by_fingerprint(self, fingerprint: bytes) -> SchemaVersion | None:
        """The writer schema with this fingerprint, or None."""
        return self._by_fingerprint.get(fingerprint)

    def versions(self) -> Mapping[bytes, SchemaVersion]:
        """Every version by fingerprint (read-only view)."""
        return dict(self._by_fingerprint)


def _load_file(path: Path) -> SchemaVersion:
    match = _FILE_NAME.match(path.name)
    if match is None:
        raise WireError(
            WireCode.UNKNOWN_SCHEMA,
            f"{path}: schema files are named <record>.v<N>.avsc (lowercase, N >= 1)",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        # Each call gets its own named-type table, so two versions of one record (which
        # share type names) do not collide.
        parsed = parse_schema(raw, named_schemas={})
        canonical = to_parsing_canonical_form(parsed)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise WireError(WireCode.UNKNOWN_SCHEMA, f"{path}: not a valid Avro schema: {exc}") from exc
    name = parsed["name"] if isinstance(parsed, dict) else ""
    return SchemaVersion(
        name=name,
        version=int(match["version"]),
        path=path,
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=rabin_fingerprint(canonical),
    )


_DEFAULT: SchemaCatalog | None = None


def default_catalog() -> SchemaCatalog:
    """The catalogue of the schemas shipped in `schemas/avro/`, loaded once."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SchemaCatalog.load()
    return _DEFAULT
