"""`event.schema.json` is as strict as the Avro envelope: same fields, same required set,
no unknown fields, at every level."""

from __future__ import annotations

import json
from typing import Any

from schemas import EVENT_ENVELOPE, EVENT_SCHEMA, default_catalog

JSON_SCHEMA: dict[str, Any] = json.loads(EVENT_SCHEMA.read_text())


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """Follow a `$ref`, or the non-null branch of a `oneOf` with null."""
    if "$ref" in node:
        return _resolve(JSON_SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if "oneOf" in node:
        [branch] = [b for b in node["oneOf"] if b != {"type": "null"}]
        return _resolve(branch)
    return node


def _record_of(avro_type: Any) -> dict[str, Any] | None:
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    records = [b for b in branches if isinstance(b, dict) and b.get("type") == "record"]
    return records[0] if records else None


def _compare(avro_record: dict[str, Any], json_object: dict[str, Any], path: str) -> list[str]:
    problems: list[str] = []
    if json_object.get("additionalProperties") is not False:
        problems.append(f"{path}: JSON allows unknown fields")
    avro_fields = {f["name"]: f for f in avro_record["fields"]}
    if set(avro_fields) != set(json_object["properties"]):
        problems.append(
            f"{path}: fields differ {set(avro_fields) ^ set(json_object['properties'])}"
        )
    avro_required = {n for n, f in avro_fields.items() if "default" not in f}
    if avro_required != set(json_object.get("required", [])):
        problems.append(f"{path}: required differ {avro_required} vs {json_object['required']}")
    for name, field in avro_fields.items():
        nested = _record_of(field["type"])
        if nested is not None and name in json_object["properties"]:
            inner = _resolve(json_object["properties"][name])
            problems += _compare(nested, inner, f"{path}.{name}")
    return problems


def test_the_json_schema_has_exactly_the_avro_fields_and_required_set_at_every_level() -> None:
    avro = default_catalog().current(EVENT_ENVELOPE).parsed
    assert _compare(avro, JSON_SCHEMA, "envelope") == []


def test_the_parity_check_notices_a_missing_field() -> None:
    avro = default_catalog().current(EVENT_ENVELOPE).parsed
    trimmed = {**JSON_SCHEMA, "properties": dict(JSON_SCHEMA["properties"])}
    trimmed["properties"].pop("causation")
    assert _compare(avro, trimmed, "envelope") != []
