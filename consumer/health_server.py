"""The runtime's HTTP endpoint: `/metrics` (Prometheus text exposition), `/healthz`
(liveness) and `/readyz` (readiness) for every role a process runs.

One server per process, whatever roles it runs (`recoveryctl run --role all` serves the
controller and the relay from one port). Each role registers its probes under its name
(`add`); a probe returns its checks as `{name: None}` when a check passes and `{name:
"why it fails"}` when it does not. `/healthz` and `/readyz` answer 200 when every check of
every role passes and 503 otherwise, with a JSON body naming each check and what failed,
so an operator (or Kubernetes) sees *which* dependency is down. Until a role registers,
`/readyz` fails with the check `started`.

`/metrics` is OpenTelemetry's Prometheus exporter over the roles' own meter providers:
each role's provider gets a reader from `metric_reader()`, all bound to this server's
registry, so the series on `/metrics` are exactly the OpenTelemetry instruments the
controller and relay already record (one set of counters, exported two ways). The
series are listed in docs/operations.md.

The server is the standard library's `ThreadingHTTPServer` in a daemon thread: a slow
probe (each has a timeout of about two seconds) holds only its own request, never a
role's loop. It binds `RECOVERY_METRICS_ADDRESS` (`host:port`; port 0 picks a free one);
it is off when that is unset.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from consumer.errors import SettingsError
from consumer.settings import ENV_METRICS_ADDRESS

__all__ = ["ENV_METRICS_ADDRESS", "HealthServer", "Probe", "parse_address"]

Probe = Callable[[], Mapping[str, str | None]]
"""A role's checks: check name -> None when it passes, else why it fails."""

log = logging.getLogger("consumer.health")


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) as a bind address; raises `SettingsError` naming
    the variable when it is not one."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(
            f"{ENV_METRICS_ADDRESS}={address!r} is not host:port (for example "
            "127.0.0.1:9464); set it so, or leave it unset to serve no endpoint"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


class HealthServer:
    """The endpoint of one process (module docstring); `start` binds it, `close` stops it."""

    def __init__(self, address: str) -> None:
        self._bind = parse_address(address)
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._live: dict[str, Probe] = {}
        self._ready: dict[str, Probe] = {}
        self._readers = 0
        self._server: ThreadingHTTPServer | None = None

    def metric_reader(self) -> PrometheusMetricReader:
        """A reader to give one role's meter provider; its series appear on `/metrics`.
        Only the first reader reports `target_info` (one family name per exposition)."""
        with self._lock:
            first = self._readers == 0
            self._readers += 1
        return PrometheusMetricReader(disable_target_info=not first, registry=self.registry)

    def add(self, role: str, *, live: Probe, ready: Probe) -> None:
        """Register (or replace) the probes of `role`."""
        with self._lock:
            self._live[role] = live
            self._ready[role] = ready

    def remove(self, role: str) -> None:
        """Forget `role`'s probes (it stopped)."""
        with self._lock:
            self._live.pop(role, None)
            self._ready.pop(role, None)

    def check(self, kind: str) -> tuple[bool, dict[str, Any]]:
        """Run the `healthz` or `readyz` probes; returns whether all pass and the body."""
        with self._lock:
            probes = dict(self._live if kind == "healthz" else self._ready)
        checks: dict[str, dict[str, Any]] = {}
        if kind == "readyz" and not probes:
            checks["started"] = {"ok": False, "detail": "no role has started yet"}
        for role, probe in sorted(probes.items()):
            try:
                results = probe()
            except Exception as exc:  # a probe that breaks is a failing check, not a 500
                results = {"probe": f"the probe itself failed: {exc!r}"}
            for name, failure in results.items():
                entry: dict[str, Any] = {"ok": failure is None}
                if failure is not None:
                    entry["detail"] = failure
                checks[f"{role}.{name}"] = entry
        failed = sorted(name for name, entry in checks.items() if not entry["ok"])
        body = {"status": "fail" if failed else "ok", "failed": failed, "checks": checks}
        return not failed, body

    @property
    def port(self) -> int:
        """The bound port (after `start`)."""
        if self._server is None:
            raise RuntimeError("the health server is not started")
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Bind and serve in a daemon thread; raises `SettingsError` when the address
        cannot be bound (in use, or not an address of this host)."""
        handler = _handler(self)
        try:
            self._server = ThreadingHTTPServer(self._bind, handler)
        except OSError as exc:
            raise SettingsError(
                f"cannot serve metrics and health on {self._bind[0]}:{self._bind[1]} "
                f"({ENV_METRICS_ADDRESS}): {exc}; pick a free host:port"
            ) from exc
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True).start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self._bind[0], self.port)
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(server: HealthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
            elif path in ("/healthz", "/readyz"):
                ok, body = server.check(path[1:])
                payload = json.dumps(body, sort_keys=True).encode()
                self._send(200 if ok else 503, "application/json", payload)
            else:
                self._send(404, "text/plain", b"not found: try /metrics, /healthz, /readyz\n")

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
