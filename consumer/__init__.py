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
from consumer.controller import Controller, consumer_config
from consumer.deadletter import dead_letter, dead_letter_id
from consumer.errors import ControllerError, PolicyRefused, SettingsError, TelemetryError
from consumer.health_server import ENV_METRICS_ADDRESS, HealthServer, Probe
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
from consumer.service import controller_policy, load_rules, redact_url, run_controller
from consumer.settings import ENV_DEMO_MODE, ControllerSettings
from consumer.telemetry import CONTROLLER_SERVICE, RELAY_SERVICE, Telemetry, build_telemetry
from consumer.tracing import BatchTracer, extract_context, trace_headers

__all__ = [
    "CONTROLLER_SERVICE",
    "ENV_DEMO_MODE",
    "ENV_METRICS_ADDRESS",
    "FORGED_REFUSALS",
    "RELAY_SERVICE",
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
    "RawRecord",
    "Refusal",
    "RefusalCode",
    "Rejected",
    "SettingsError",
    "Telemetry",
    "TelemetryError",
    "build_telemetry",
    "claim_keys",
    "consumer_config",
    "controller_policy",
    "dead_letter",
    "dead_letter_id",
    "decide_batch",
    "extract_context",
    "load_rules",
    "openings",
    "operation_ids",
    "positions_for",
    "redact_url",
    "run_controller",
    "trace_headers",
]
