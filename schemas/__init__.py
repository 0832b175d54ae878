"""Wire contracts: the Avro schemas of every topic's records and their codecs, the JSON
Schema of JSON event input, the envelope and command values, Kafka header names, topic
names and the variables naming the services, the OCSF audit mapping, and the bridge that
turns librdkafka's log lines into logging records. (The JSON Schemas of RECOVERY.yaml
and of the registry belong to the machine format: `machines`.)

`EVENT_SCHEMA` is exported so that loaders read the schema file shipped with the package
rather than a copy.
"""

from __future__ import annotations

from schemas.catalog import (
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
from schemas.codec import (
    DEFAULT_MAX_BYTES,
    EVENT_SCHEMA,
    AvroSingleObjectCodec,
    Codec,
    JsonCodec,
    WireDecoder,
)
from schemas.command import CapabilityCommand
from schemas.deployment import (
    DEFAULT_CONTROLLER_ID,
    DEFAULT_TOPICS,
    ENV_CONTROLLER_ID,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_PRODUCER_ID,
    ENV_PRODUCER_KEY_FILE,
    ENV_ROSTER_FILE,
    ENV_TOPIC_PREFIX,
    TopicNames,
)
from schemas.envelope import event_to_json, event_to_record, record_to_event
from schemas.errors import WireCode, WireError
from schemas.headers import (
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
from schemas.kafka_log import LOGGER_PREFIX, KafkaLog, librdkafka_logger
from schemas.ocsf import OCSF_VERSION, audit_to_ocsf, audit_to_ocsf_json
from schemas.outbox_wire import (
    ANCHOR_KINDS,
    OUTBOX_STREAMS,
    PUBLISHED_TIME,
    SIGNATURE_ROW_HEADERS,
    OutboxSigner,
    WireValue,
    encode_outbox_value,
    needs_published_time,
    outbox_stream,
)
from schemas.signing import (
    HEADER_KEY_ID,
    HEADER_PRODUCER,
    HEADER_SIGNATURE,
    RECORD_SIGNATURE_DOMAIN,
    SIGNED_HEADERS,
    RecordSigner,
    SignerSettingMissing,
    record_signing_message,
    signer_from_env,
    verify_record,
)

__all__ = [
    "ANCHOR_KINDS",
    "AVRO_DIR",
    "CAPABILITY_COMMAND",
    "CONTENT_TYPE",
    "CONTENT_TYPE_AVRO",
    "CONTENT_TYPE_JSON",
    "DEAD_LETTER",
    "DEFAULT_CONTROLLER_ID",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TOPICS",
    "ENV_CONTROLLER_ID",
    "ENV_CONTROLLER_SIGNING_KEY_FILE",
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_PRODUCER_ID",
    "ENV_PRODUCER_KEY_FILE",
    "ENV_ROSTER_FILE",
    "ENV_TOPIC_PREFIX",
    "EVENT_ENVELOPE",
    "EVENT_SCHEMA",
    "EVIDENCE_EVENT",
    "HEADER_COMMAND_ID",
    "HEADER_KEY_ID",
    "HEADER_PRODUCER",
    "HEADER_RECORD_ID",
    "HEADER_SCHEMA",
    "HEADER_SIGNATURE",
    "LOGGER_PREFIX",
    "OCSF_VERSION",
    "OUTBOX_STREAMS",
    "PUBLISHED_TIME",
    "RECORD_SIGNATURE_DOMAIN",
    "SIGNATURE_ROW_HEADERS",
    "SIGNED_HEADERS",
    "TRACEPARENT",
    "TRACESTATE",
    "AvroSingleObjectCodec",
    "CapabilityCommand",
    "Codec",
    "JsonCodec",
    "KafkaLog",
    "OutboxSigner",
    "RecordSigner",
    "SchemaCatalog",
    "SchemaVersion",
    "SignerSettingMissing",
    "TopicNames",
    "WireCode",
    "WireDecoder",
    "WireError",
    "WireValue",
    "audit_to_ocsf",
    "audit_to_ocsf_json",
    "default_catalog",
    "encode_outbox_value",
    "event_to_json",
    "event_to_record",
    "header_value",
    "librdkafka_logger",
    "needs_published_time",
    "outbox_stream",
    "rabin_fingerprint",
    "record_id",
    "record_signing_message",
    "record_to_event",
    "signer_from_env",
    "verify_record",
]
