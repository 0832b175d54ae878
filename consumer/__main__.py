"""`python -m consumer`: one controller group member, configured from the environment
(`consumer.settings`), stopped cleanly by SIGTERM or SIGINT: the batch in hand is
committed or abandoned (and replayed by the next owner), then the member leaves the
group and closes the ledger. Exit status 0 on a clean stop, 2 on bad settings (a
missing policy, RECOVERY_CONTROLLER_POLICY_PATH, or one refused outside demo mode,
RECOVERY_DEMO_MODE=1, included), 1 when the controller could not start or failed.
With `RECOVERY_METRICS_ADDRESS` set (host:port) it serves /metrics, /healthz and
/readyz there (`consumer.health_server`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

from consumer.errors import ControllerError, PolicyRefused, SettingsError
from consumer.health_server import HealthServer
from consumer.reload import reload_requests
from consumer.service import run_controller
from consumer.settings import ControllerSettings, ProcessSettings
from schemas import ConfigurationError


def main() -> int:
    """Run until signalled; return the exit status."""
    try:
        process = ProcessSettings.load()
        logging.basicConfig(
            level=process.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        settings = ControllerSettings.from_env()
        address = process.metrics_address
        health = HealthServer(address).start() if address else None
    except (SettingsError, ConfigurationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("consumer").info("signal %d: stopping after this batch", signum)
        stop.set()

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        reload_requests.request(f"SIGHUP to pid {os.getpid()}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    try:
        run_controller(settings, stop, health=health)
    except PolicyRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ControllerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if health is not None:
            health.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
