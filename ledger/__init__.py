"""The Action Ledger: PostgreSQL (and an in-memory twin) holding operation state, events,
evidence, decisions, approvals, hash-chained audit records, the transactional outbox,
stored consumer offsets and partition epochs. Only this package imports psycopg."""

from __future__ import annotations

from ledger.admin import (
    create_database,
    drop_database,
    ensure_database,
    ping_database,
    with_database,
    with_user,
)
from ledger.audit import AuditRecord, ChainBreak, ChainHead, verify_chain
from ledger.codec import view_from_json, view_to_json
from ledger.deadletters import DeadLetter, intake_chain_id
from ledger.errors import (
    EventIdReused,
    FencedError,
    LedgerError,
    LedgerUnavailable,
    MigrationError,
    NonceReused,
    RetryableConflict,
    UnknownOperation,
    VersionConflict,
)
from ledger.inspection import (
    DeadLetterEntry,
    Incident,
    LedgerInspector,
    MachineStateCount,
    OperationRecord,
    OperationSummary,
    OutboxEntry,
    OverdueTimer,
    StoredEvent,
)
from ledger.interface import (
    AuditOutboxRow,
    CommitResult,
    HeldOutboxRow,
    Ledger,
    OperationInfo,
    OutboxLease,
    OutboxRecord,
    PartitionAttempt,
    PartitionClaim,
)
from ledger.memory import MemoryLedger
from ledger.migrations import MigrationReport, available_migrations, migrate, migrate_database
from ledger.outbox_watch import OutboxWatch
from ledger.postgres import PostgresLedger
from ledger.records import Batch, Entry, Position, Source, batch_rows
from ledger.roles import (
    LOGIN_ROLES,
    DatabaseRole,
    RolesReport,
    current_role,
    ensure_roles,
    migrate_as_owner,
)
from ledger.rowsign import RowSigner
from ledger.schema import describe_schema, expected_schema
from ledger.schema_check import pending_migrations, require_current_schema
from ledger.timers import FiredTimer, FiredTimers, TimerSummary, WaitingState
from ledger.waiting import DatabaseWait
from ledger.worker_store import (
    WORKER_ROLE,
    WORKER_SCHEMA,
    ExecutionRow,
    WorkerExecutions,
    ensure_worker_store,
)

__all__ = [
    "LOGIN_ROLES",
    "WORKER_ROLE",
    "WORKER_SCHEMA",
    "AuditOutboxRow",
    "AuditRecord",
    "Batch",
    "ChainBreak",
    "ChainHead",
    "CommitResult",
    "DatabaseRole",
    "DatabaseWait",
    "DeadLetter",
    "DeadLetterEntry",
    "Entry",
    "EventIdReused",
    "ExecutionRow",
    "FencedError",
    "FiredTimer",
    "FiredTimers",
    "HeldOutboxRow",
    "Incident",
    "Ledger",
    "LedgerError",
    "LedgerInspector",
    "LedgerUnavailable",
    "MachineStateCount",
    "MemoryLedger",
    "MigrationError",
    "MigrationReport",
    "NonceReused",
    "OperationInfo",
    "OperationRecord",
    "OperationSummary",
    "OutboxEntry",
    "OutboxLease",
    "OutboxRecord",
    "OutboxWatch",
    "OverdueTimer",
    "PartitionAttempt",
    "PartitionClaim",
    "Position",
    "PostgresLedger",
    "RetryableConflict",
    "RolesReport",
    "RowSigner",
    "Source",
    "StoredEvent",
    "TimerSummary",
    "UnknownOperation",
    "VersionConflict",
    "WaitingState",
    "WorkerExecutions",
    "available_migrations",
    "batch_rows",
    "create_database",
    "current_role",
    "describe_schema",
    "drop_database",
    "ensure_database",
    "ensure_roles",
    "ensure_worker_store",
    "expected_schema",
    "intake_chain_id",
    "migrate",
    "migrate_as_owner",
    "migrate_database",
    "pending_migrations",
    "ping_database",
    "require_current_schema",
    "verify_chain",
    "view_from_json",
    "view_to_json",
    "with_database",
    "with_user",
]
