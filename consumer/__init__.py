"""The controller runtime (SPEC §8): a Kafka consumer group around the pure decision
core. Records become plain values at intake, batches are planned without I/O, and each
batch commits in one ledger transaction with its offsets; bad input is dead-lettered,
never fatal. Only this package and `producers` import confluent_kafka."""

from __future__ import annotations

from consumer.batch import FORGED_REFUSALS, Planned, Rules, open_view, plan_batch_of
from consumer.controller import Controller, consumer_config
from consumer.deadletter import dead_letter, dead_letter_id
from consumer.errors import ControllerError, SettingsError, TelemetryError
from consumer.health_server import ENV_METRICS_ADDRESS, HealthServer, Probe
from consumer.intake import Accepted, Intake, RawRecord, Refusal, RefusalCode, Rejected
from consumer.metrics import ControllerMetrics
from consumer.service import load_rules, run_controller
from consumer.settings import ControllerSettings
from consumer.telemetry import Telemetry, build_telemetry
from consumer.tracing import BatchTracer, extract_context, trace_headers

__all__ = [
    "ENV_METRICS_ADDRESS",
    "FORGED_REFUSALS",
    "Accepted",
    "BatchTracer",
    "Controller",
    "ControllerError",
    "ControllerMetrics",
    "ControllerSettings",
    "HealthServer",
    "Intake",
    "Planned",
    "Probe",
    "RawRecord",
    "Refusal",
    "RefusalCode",
    "Rejected",
    "Rules",
    "SettingsError",
    "Telemetry",
    "TelemetryError",
    "build_telemetry",
    "consumer_config",
    "dead_letter",
    "dead_letter_id",
    "extract_context",
    "load_rules",
    "open_view",
    "plan_batch_of",
    "run_controller",
    "trace_headers",
]
