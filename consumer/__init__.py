"""The controller runtime (SPEC §8): a Kafka consumer group around the pure decision
core. Records become plain values at intake, batches are decided without I/O, and each
batch commits in one ledger transaction with its offsets; bad input is dead-lettered,
never fatal. Only this package and `producers` import confluent_kafka."""

from __future__ import annotations

from consumer.batch import (
    FORGED_REFUSALS,
    DecidedBatch,
    claim_keys,
    decide_batch,
    openings,
    operation_ids,
    positions_for,
)
from consumer.controller import ADVISORY_COMMIT_INTERVAL_MS, Controller, consumer_config
from consumer.deadletter import dead_letter, dead_letter_id
from consumer.errors import ControllerError, PolicyRefused, SettingsError, TelemetryError
from consumer.health_server import HealthServer, Probe
from consumer.intake import (
    Accepted,
    Intake,
    IntakeResult,
    RawRecord,
    Refusal,
    RefusalCode,
    Rejected,
)
from consumer.metrics import ControllerMetrics
from consumer.reload import (
    RULES_CHANGE_REFUSED,
    RULES_CHANGED,
    RulesWatch,
    reload_requests,
    rules_chain_id,
    rules_digests,
)
from consumer.service import (
    checked_rules,
    controller_policy,
    load_machines,
    load_rules,
    operator_policy,
    redact_url,
    run_controller,
)
from consumer.settings import (
    ENV_DEMO_MODE,
    ENV_METRICS_ADDRESS,
    ControllerSettings,
    ProcessSettings,
    RulesSettings,
    TelemetrySettings,
)
from consumer.telemetry import (
    CONTROLLER_SERVICE,
    METRIC_VIEWS,
    RELAY_SERVICE,
    SECONDS_BUCKETS,
    Telemetry,
    build_telemetry,
)
from consumer.tracing import BatchTracer, extract_context, trace_headers

__all__ = [
    "ADVISORY_COMMIT_INTERVAL_MS",
    "CONTROLLER_SERVICE",
    "ENV_DEMO_MODE",
    "ENV_METRICS_ADDRESS",
    "FORGED_REFUSALS",
    "METRIC_VIEWS",
    "RELAY_SERVICE",
    "RULES_CHANGED",
    "RULES_CHANGE_REFUSED",
    "SECONDS_BUCKETS",
    "Accepted",
    "BatchTracer",
    "Controller",
    "ControllerError",
    "ControllerMetrics",
    "ControllerSettings",
    "DecidedBatch",
    "HealthServer",
    "Intake",
    "IntakeResult",
    "PolicyRefused",
    "Probe",
    "ProcessSettings",
    "RawRecord",
    "Refusal",
    "RefusalCode",
    "Rejected",
    "RulesSettings",
    "RulesWatch",
    "SettingsError",
    "Telemetry",
    "TelemetryError",
    "TelemetrySettings",
    "build_telemetry",
    "checked_rules",
    "claim_keys",
    "consumer_config",
    "controller_policy",
    "dead_letter",
    "dead_letter_id",
    "decide_batch",
    "extract_context",
    "load_machines",
    "load_rules",
    "openings",
    "operation_ids",
    "operator_policy",
    "positions_for",
    "redact_url",
    "reload_requests",
    "rules_chain_id",
    "rules_digests",
    "run_controller",
    "trace_headers",
]
