"""Everything that writes to Kafka: topic provisioning, the client library
tools, capability workers and approvers use, and an example capability worker. (The
outbox relay joins this package.)"""

from __future__ import annotations

from producers.client import RESULT_EVENTS, EventPublisher, RecoveryClient, event_record_id
from producers.encoding import EncodedRecord, RecordEncoder
from producers.errors import DeliveryFailed, ProducersError, ProvisionError
from producers.readback import TopicRecord, read_commands, read_topic
from producers.relay import LineageCache, OutboxRelay, RelaySettings, lineage_from_ledger
from producers.relay_health import relay_probes
from producers.topics import BrokerProbe, TopicResult, provision
from producers.worker import (
    ActionResult,
    CapabilityWorker,
    Handler,
    WorkerStats,
    demo_handlers,
    roster_from_env,
    verify_outcome,
)

__all__ = [
    "RESULT_EVENTS",
    "ActionResult",
    "BrokerProbe",
    "CapabilityWorker",
    "DeliveryFailed",
    "EncodedRecord",
    "EventPublisher",
    "Handler",
    "LineageCache",
    "OutboxRelay",
    "ProducersError",
    "ProvisionError",
    "RecordEncoder",
    "RecoveryClient",
    "RelaySettings",
    "TopicRecord",
    "TopicResult",
    "WorkerStats",
    "demo_handlers",
    "event_record_id",
    "lineage_from_ledger",
    "provision",
    "read_commands",
    "read_topic",
    "relay_probes",
    "roster_from_env",
    "verify_outcome",
]
