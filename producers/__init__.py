"""Everything that writes to Kafka: topic provisioning, the client library
tools, capability workers and approvers use, and an example capability worker. (The
outbox relay joins this package.)"""

from __future__ import annotations

from producers.acls import (
    DEFAULT_GROUP_PREFIXES,
    AclEntry,
    AclReport,
    acl_bindings,
    list_acls,
    provision_acls,
)
from producers.client import RESULT_EVENTS, EventPublisher, RecoveryClient, event_record_id
from producers.encoding import EncodedRecord, RecordEncoder, UnpublishableRow
from producers.errors import (
    DeliveryFailed,
    KafkaReadError,
    ProducersError,
    ProvisionError,
    RecordRefused,
)
from producers.execution_store import (
    ENV_WORKER_STORE,
    ENV_WORKER_STORE_URL,
    Execution,
    ExecutionRecords,
    ExecutionState,
    ExecutionStore,
    PostgresExecutionStore,
    StoredAnswer,
    open_execution_store,
)
from producers.partitions import PartitionExtent, StoredRecord, partition_extents, read_range
from producers.readback import TopicRecord, read_commands, read_topic
from producers.relay import LineageCache, OutboxRelay, lineage_from_ledger
from producers.relay_health import relay_probes
from producers.settings import RelaySettings, WorkerSettings
from producers.topics import (
    BrokerProbe,
    TopicLimitError,
    TopicResult,
    check_message_limits,
    provision,
)
from producers.verdicts import VERDICT_GROUP_PREFIX, EventVerdict, VerdictReader, VerdictTimeout
from producers.worker import (
    ENV_WORKER_START,
    ActionResult,
    CapabilityWorker,
    Handler,
    StartPosition,
    WorkerStats,
    demo_handlers,
    drill_answer,
    roster_from_env,
    verify_outcome,
)

__all__ = [
    "DEFAULT_GROUP_PREFIXES",
    "ENV_WORKER_START",
    "ENV_WORKER_STORE",
    "ENV_WORKER_STORE_URL",
    "RESULT_EVENTS",
    "VERDICT_GROUP_PREFIX",
    "AclEntry",
    "AclReport",
    "ActionResult",
    "BrokerProbe",
    "CapabilityWorker",
    "DeliveryFailed",
    "EncodedRecord",
    "EventPublisher",
    "EventVerdict",
    "Execution",
    "ExecutionRecords",
    "ExecutionState",
    "ExecutionStore",
    "Handler",
    "KafkaReadError",
    "LineageCache",
    "OutboxRelay",
    "PartitionExtent",
    "PostgresExecutionStore",
    "ProducersError",
    "ProvisionError",
    "RecordEncoder",
    "RecordRefused",
    "RecoveryClient",
    "RelaySettings",
    "StartPosition",
    "StoredAnswer",
    "StoredRecord",
    "TopicLimitError",
    "TopicRecord",
    "TopicResult",
    "UnpublishableRow",
    "VerdictReader",
    "VerdictTimeout",
    "WorkerSettings",
    "WorkerStats",
    "acl_bindings",
    "check_message_limits",
    "demo_handlers",
    "drill_answer",
    "event_record_id",
    "lineage_from_ledger",
    "list_acls",
    "open_execution_store",
    "partition_extents",
    "provision",
    "provision_acls",
    "read_commands",
    "read_range",
    "read_topic",
    "relay_probes",
    "roster_from_env",
    "verify_outcome",
]
