"""The runtime as an operator starts it (`python -m ops.cli run --role all`, a real
process on the real broker and database): OTLP/HTTP export configured by
`OTEL_EXPORTER_OTLP_ENDPOINT` alone, received by a real HTTP server on loopback that
decodes the protobuf bodies; and librdkafka's lines as logging records, never raw on
stderr."""

from __future__ import annotations

import contextlib
import gzip
import re
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ledger import Ledger, PostgresLedger
from schemas import TopicNames
from tests.integration.consumer.harness import Tool, write_policy
from tests.support import roles
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration

_ROOT: Final = Path(__file__).resolve().parents[3]
# librdkafka's own stderr format: %<syslog level>|<seconds.millis>|<facility>|<client>|
_RAW_LIBRDKAFKA: Final = re.compile(rb"^%\d\|\d+\.\d+\|[A-Z_]+\|", re.MULTILINE)


@dataclass
class Received:
    """What the receiver decoded, per path: (service.name, names) per request."""

    traces: list[tuple[str, set[str]]] = field(default_factory=list)
    metrics: list[tuple[str, set[str]]] = field(default_factory=list)
    other_paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def services(self, signal: str) -> dict[str, set[str]]:
        """service.name -> span or metric names received for `signal`."""
        out: dict[str, set[str]] = {}
        with self.lock:
            for service, names in getattr(self, signal):
                out.setdefault(service, set()).update(names)
        return out


def _service(resource: Resource) -> str:
    for attribute in resource.attributes:
        if attribute.key == "service.name":
            return str(attribute.value.string_value)
    return ""


def _handler(received: Received) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            with received.lock:
                if self.path == "/v1/traces":
                    traces = ExportTraceServiceRequest.FromString(body)
                    for spans in traces.resource_spans:
                        names = {s.name for scope in spans.scope_spans for s in scope.spans}
                        received.traces.append((_service(spans.resource), names))
                elif self.path == "/v1/metrics":
                    points = ExportMetricsServiceRequest.FromString(body)
                    for batch in points.resource_metrics:
                        names = {m.name for scope in batch.scope_metrics for m in scope.metrics}
                        received.metrics.append((_service(batch.resource), names))
                else:
                    received.other_paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the test reports what matters

    return Handler


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    received = Received()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(received))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


@dataclass(frozen=True)
class Deployment:
    bootstrap: str
    database_url: str
    topics: TopicNames
    env: dict[str, str]


@pytest.fixture
def deployment(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> Deployment:
    topics = TopicNames(
        events=topic_factory(2),
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    env = {
        "RECOVERY_DATABASE_URL": database_url,
        # `recoveryctl run` runs both roles on this one administrative URL of the test
        # server; the controller refuses a superuser unless told to.
        "RECOVERY_CONTROLLER_ALLOW_SUPERUSER": "1",
        "RECOVERY_CONTROLLER_GROUP_ID": f"otel-{uuid.uuid4().hex[:8]}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(
            write_policy(tmp_path, Ed25519PrivateKey.generate())
        ),
        # The tests' roster speaks for any agent: a demo deployment.
        "RECOVERY_DEMO_MODE": "1",
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": "6000",
        **{
            f"RECOVERY_TOPIC_{s.upper()}": getattr(topics, s)
            for s in ("events", "commands", "evidence", "audit", "dlq")
        },
    }
    return Deployment(kafka_bootstrap, database_url, topics, env)


class LateBroker:
    """A TCP forwarder to the broker on loopback that refuses every connection (its port
    is bound, nothing listens) until `open`: each Kafka client's first connection fails,
    which librdkafka logs, and the clients work once it is open."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []

    def open(self) -> None:
        """Start accepting and forwarding."""
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._target)
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Stop accepting and close every forwarded connection."""
        self._listener.close()
        for end in self._open:
            end.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _unpublished(ledger: Ledger) -> int:
    with ledger.lease_outbox(100_000) as lease:
        return len(lease.records)


def _run_until_drained(
    deployment: Deployment,
    env: Mapping[str, str],
    log: Path,
    operations: int,
    started: Callable[[], None] | None = None,
) -> bytes:
    """Start `run --role all` (then call `started`), publish `operations` events, wait
    until each is decided and the outbox is drained, stop it with SIGTERM; returns its
    stderr."""
    # Only what the test names: no OTEL_* of the developer's shell leaks in.
    child_env = {
        k: v
        for k, v in roles.role_env({**deployment.env, **env}).items()
        if not k.startswith("OTEL_") or k in env
    }
    with log.open("wb") as err:
        process = subprocess.Popen(
            [*roles.role_argv("relay")[:-1], "all", "--log-level", "INFO"],
            cwd=_ROOT,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    ledger = PostgresLedger(deployment.database_url, max_size=2)
    try:
        if started is not None:
            started()
        tool = Tool(deployment.bootstrap, deployment.topics.events)
        ops = [f"op-{i}" for i in range(operations)]
        for op in ops:
            tool.event("email-send", op, "TOOL_TIMEOUT")
        tool.publisher.close(30)
        roles.poll_until(
            lambda: all(ledger.decisions(op) for op in ops) or process.poll() is not None,
            60,
            "every event to be decided",
            detail=lambda: roles.log_tail(log, 30),
        )
        assert process.poll() is None, f"runtime exited:\n{roles.log_tail(log, 30)}"
        roles.poll_until(
            lambda: _unpublished(ledger) == 0,
            60,
            "the relay to drain the outbox",
            detail=lambda: roles.log_tail(log, 30),
        )
    finally:
        process.terminate()
        try:
            code = process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
            ledger.close()
    assert code == 0, f"runtime exit {code}:\n{roles.log_tail(log, 30)}"
    return log.read_bytes()


def test_otlp_endpoint_alone_exports_spans_and_metrics_per_signal_path_per_service(
    deployment: Deployment, receiver: tuple[str, Received], tmp_path: Path
) -> None:
    url, received = receiver
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": deployment.bootstrap,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
    }
    stderr = _run_until_drained(deployment, env, tmp_path / "runtime.log", operations=3)

    # Shutdown flushes both signals, so everything has arrived once the process exited.
    assert received.other_paths == [], stderr.decode(errors="replace")[-3000:]
    spans = received.services("traces")
    points = received.services("metrics")
    assert set(spans) == set(points) == {"recovery-controller", "recovery-relay"}, (
        spans,
        points,
    )
    topics = deployment.topics
    assert f"process {topics.events}" in spans["recovery-controller"]
    assert f"send {topics.commands}" in spans["recovery-relay"]
    assert "recovery.controller.events.processed" in points["recovery-controller"]
    assert "recovery.relay.published" in points["recovery-relay"]


def test_librdkafka_lines_are_log_records_of_each_component_never_raw_on_stderr(
    deployment: Deployment, tmp_path: Path
) -> None:
    # The broker refuses the runtime's first connections: every client of the runtime
    # has something to log (connection refused), then works once the broker is there.
    broker = LateBroker(deployment.bootstrap)
    log = tmp_path / "runtime.log"

    def open_when_refused() -> None:
        roles.poll_until(
            lambda: b"Connection refused" in log.read_bytes(),
            30,
            "the controller to log a refused connection",
            detail=lambda: roles.log_tail(log, 30),
        )
        broker.open()

    env = {"RECOVERY_KAFKA_BOOTSTRAP": broker.address}
    try:
        stderr = _run_until_drained(deployment, env, log, operations=1, started=open_when_refused)
    finally:
        broker.close()

    raw = _RAW_LIBRDKAFKA.findall(stderr)
    assert raw == [], stderr.decode(errors="replace")[-3000:]
    text = stderr.decode(errors="replace")
    for component in ("controller", "relay"):
        assert re.search(rf" librdkafka\.{component}: [A-Z_]+ \[", text), (
            f"no record of logger librdkafka.{component}:\n{text[-3000:]}"
        )
