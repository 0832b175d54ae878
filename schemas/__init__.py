"""Wire contracts: JSON Schemas of RECOVERY.yaml and the administrator registry, the Avro
schemas of every topic's records and their codecs, the JSON Schema of JSON event input,
the envelope and command values, Kafka header names, and the OCSF audit mapping.

Paths are exported so that loaders read the schema files shipped with the package rather
than a copy.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
RECOVERY_MACHINE_SCHEMA = SCHEMA_DIR / "recovery-machine.schema.json"
REGISTRY_SCHEMA = SCHEMA_DIR / "registry.schema.json"
EVENT_SCHEMA = SCHEMA_DIR / "event.schema.json"

# After the path constants: `machines` imports them from here while it loads, and the
# modules below import `machines`, so the paths must exist before the cycle closes.
from schemas.catalog import (  # noqa: E402
    AVRO_DIR,
    CAPABILITY_COMMAND,
    DEAD_LETTER,
    EVENT_ENVELOPE,
    EVIDENCE_EVENT,
    SchemaCatalog,
    SchemaVersion,
    default_catalog,
    rabin_fingerprint,
)
from schemas.codec import (  # noqa: E402
    DEFAULT_MAX_BYTES,
    AvroSingleObjectCodec,
    Codec,
    JsonCodec,
    WireDecoder,
)
from schemas.command import CapabilityCommand  # noqa: E402
from schemas.envelope import event_to_json, event_to_record, record_to_event  # noqa: E402
from schemas.errors import WireCode, WireError  # noqa: E402
from schemas.headers import (  # noqa: E402
    CONTENT_TYPE,
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    HEADER_COMMAND_ID,
    HEADER_RECORD_ID,
    HEADER_SCHEMA,
    TRACEPARENT,
    TRACESTATE,
    header_value,
    record_id,
)
from schemas.ocsf import OCSF_VERSION, audit_to_ocsf, audit_to_ocsf_json  # noqa: E402

__all__ = [
    "AVRO_DIR",
    "CAPABILITY_COMMAND",
    "CONTENT_TYPE",
    "CONTENT_TYPE_AVRO",
    "CONTENT_TYPE_JSON",
    "DEAD_LETTER",
    "DEFAULT_MAX_BYTES",
    "EVENT_ENVELOPE",
    "EVENT_SCHEMA",
    "EVIDENCE_EVENT",
    "HEADER_COMMAND_ID",
    "HEADER_RECORD_ID",
    "HEADER_SCHEMA",
    "OCSF_VERSION",
    "RECOVERY_MACHINE_SCHEMA",
    "REGISTRY_SCHEMA",
    "SCHEMA_DIR",
    "TRACEPARENT",
    "TRACESTATE",
    "AvroSingleObjectCodec",
    "CapabilityCommand",
    "Codec",
    "JsonCodec",
    "SchemaCatalog",
    "SchemaVersion",
    "WireCode",
    "WireDecoder",
    "WireError",
    "audit_to_ocsf",
    "audit_to_ocsf_json",
    "default_catalog",
    "event_to_json",
    "event_to_record",
    "header_value",
    "rabin_fingerprint",
    "record_id",
    "record_to_event",
]
