"""The local stack: one Kafka broker and one PostgreSQL server, started and stopped as one.

The one way to bring up services for developers (`recoveryctl stack up`, `ops/dev up`)
and for the demo. When `RECOVERY_KAFKA_BOOTSTRAP` or `RECOVERY_DATABASE_URL` name
existing services, those are checked and used instead of starting local ones. What was
started is written to `<stack dir>/state.json` so that `stack down` and `stack status`
in another process find it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, ValidationError

from ledger import LOGIN_ROLES, LedgerError, ensure_roles
from ops.errors import StackError
from ops.kafka import KafkaBroker, ensure_jars, start_kafka, wait_for_kafka
from ops.keys import stack_roster
from ops.paths import ensure_dir, stack_dir
from ops.postgres import (
    PostgresServer,
    ensure_database,
    find_bin_dir,
    start_postgres,
    wait_for_postgres,
)
from ops.process import file_lock
from ops.settings import DATABASE_NAME
from schemas import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP

__all__ = [
    "KafkaState",
    "LocalStack",
    "PostgresState",
    "ServiceStatus",
    "StackState",
    "read_state",
    "stack_down",
    "stack_status",
    "stack_up",
]

_STATE_FILE = "state.json"


class KafkaState(BaseModel):
    """The broker as recorded in the state file; `external` when named by the env var."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str
    external: bool
    pid: int | None = None
    data_dir: str | None = None
    log: str | None = None


class PostgresState(BaseModel):
    """The server as recorded in the state file; `url` is the application database."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    external: bool
    admin_url: str | None = None
    # Component ("controller", "relay", "owner", "reader", "auditor") -> URL of the
    # application database as its login role (ledger.LOGIN_ROLES); empty for an
    # external server, whose roles `recoveryctl db roles` manages.
    role_urls: dict[str, str] = {}
    pid: int | None = None
    port: int | None = None
    root: str | None = None
    bin_dir: str | None = None
    os_user: str | None = None
    log: str | None = None


class StackState(BaseModel):
    """What `stack up` started, where it listens, and how long it took."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka: KafkaState
    postgres: PostgresState
    stack_dir: str
    started_at: datetime
    startup_seconds: float


class ServiceStatus(BaseModel):
    """Whether one service of a recorded stack answers now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    address: str
    external: bool
    running: bool
    detail: str


@dataclass(frozen=True, slots=True)
class LocalStack:
    """Handles on the services of a stack; a None handle means an external service."""

    state: StackState
    kafka: KafkaBroker | None
    postgres: PostgresServer | None
    reused: bool = False

    @property
    def bootstrap(self) -> str:
        """Kafka bootstrap servers, as clients take them."""
        return self.state.kafka.bootstrap

    @property
    def database_url(self) -> str:
        """URL of the application database."""
        return self.state.postgres.url

    def stop(self) -> None:
        """Stop the services this stack started (never external ones)."""
        errors: list[str] = []
        for handle in (self.kafka, self.postgres):
            if handle is None:
                continue
            try:
                handle.stop()
            except StackError as exc:
                errors.append(str(exc))
        if errors:
            raise StackError("\n".join(errors))

    @classmethod
    def from_state(cls, state: StackState, *, reused: bool = False) -> LocalStack:
        """Handles rebuilt from a state file written by another process."""
        kafka = None
        if not state.kafka.external and state.kafka.pid and state.kafka.data_dir:
            kafka = KafkaBroker(state.kafka.bootstrap, state.kafka.pid, Path(state.kafka.data_dir))
        postgres = None
        pg = state.postgres
        if not pg.external and pg.root and pg.port and pg.bin_dir:
            postgres = PostgresServer(Path(pg.root), pg.port, Path(pg.bin_dir), pg.os_user)
        return cls(state, kafka, postgres, reused)


def read_state(directory: Path | None = None) -> StackState | None:
    """The state file of the stack in `directory` (default: `stack_dir()`), or None."""
    path = (directory or stack_dir()) / _STATE_FILE
    try:
        return StackState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except ValidationError as exc:
        raise StackError(
            f"the stack state file {path} is unreadable ({exc.error_count()} errors); "
            "stop any leftover processes and delete it."
        ) from exc


def stack_up(
    directory: Path | None = None,
    progress: TextIO | None = None,
    *,
    external_timeout: float = 15.0,
) -> LocalStack:
    """Start (or reuse, or attach to external) Kafka and PostgreSQL and record them.

    Idempotent: when the recorded stack still runs, it is returned as is. Local services
    start in parallel; if one fails, the other is stopped before the error is raised.
    External services get `external_timeout` seconds to answer.
    """
    home = ensure_dir(directory or stack_dir())
    with file_lock(home / ".lock"):
        return _stack_up(home, progress or sys.stderr, external_timeout)


def _stack_up(home: Path, out: TextIO, external_timeout: float) -> LocalStack:
    current = read_state(home)
    if current is not None:
        if all(status.running for status in stack_status(home)):
            return LocalStack.from_state(current, reused=True)
        LocalStack.from_state(current).stop()  # half-dead: clear what is left
    started = time.monotonic()
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP)
    database_url = os.environ.get(ENV_DATABASE_URL)
    if bootstrap is None:
        ensure_jars(progress=out)  # in this thread, so download progress stays readable
    if database_url is None:
        find_bin_dir()  # fail before starting Kafka when PostgreSQL is not installed
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="stack-up") as pool:
        kafka_future = pool.submit(_kafka, home, bootstrap, external_timeout)
        postgres_future = pool.submit(_postgres, home, database_url, external_timeout)
        pending: list[Future[Any]] = [kafka_future, postgres_future]
        wait(pending)
    _raise_if_any_failed(kafka_future, postgres_future)
    kafka, kafka_state = kafka_future.result()
    postgres, postgres_state = postgres_future.result()
    state = StackState(
        kafka=kafka_state,
        postgres=postgres_state,
        stack_dir=str(home),
        started_at=datetime.now(UTC),
        startup_seconds=round(time.monotonic() - started, 2),
    )
    (home / _STATE_FILE).write_text(state.model_dump_json(indent=2) + "\n")
    # The controller's key (0600) and a roster naming it, for local controllers and
    # workers (docs/operations.md, "Keys").
    stack_roster(home)
    return LocalStack(state, kafka, postgres)


def stack_down(directory: Path | None = None, *, purge: bool = False) -> StackState | None:
    """Stop the recorded stack's local services and forget it; with `purge`, also delete
    their data. Returns the state that was stopped, or None when nothing was recorded."""
    home = directory or stack_dir()
    if not home.is_dir():
        return None
    with file_lock(home / ".lock"):
        state = read_state(home)
        if state is not None:
            LocalStack.from_state(state).stop()
            (home / _STATE_FILE).unlink(missing_ok=True)
        if purge:
            for name in ("kafka", "postgres"):
                shutil.rmtree(home / name, ignore_errors=True)
        return state


def stack_status(directory: Path | None = None) -> list[ServiceStatus]:
    """Whether each recorded service answers now (empty when no stack is recorded)."""
    state = read_state(directory or stack_dir())
    if state is None:
        return []
    return [_kafka_status(state.kafka), _postgres_status(state.postgres)]


def _kafka(
    home: Path, bootstrap: str | None, timeout: float
) -> tuple[KafkaBroker | None, KafkaState]:
    if bootstrap is not None:
        wait_for_kafka(bootstrap, timeout=timeout)
        return None, KafkaState(bootstrap=bootstrap, external=True)
    broker = start_kafka(home / "kafka")
    state = KafkaState(
        bootstrap=broker.bootstrap,
        external=False,
        pid=broker.pid,
        data_dir=str(broker.data_dir),
        log=str(broker.log_path),
    )
    return broker, state


def _postgres(
    home: Path, url: str | None, timeout: float
) -> tuple[PostgresServer | None, PostgresState]:
    if url is not None:
        wait_for_postgres(url, timeout=timeout)
        return None, PostgresState(url=url, external=True)
    server = start_postgres(home / "postgres")
    ensure_database(server.url, DATABASE_NAME)
    try:
        ensure_roles(server.url_for(DATABASE_NAME))  # loopback trust: no passwords
    except LedgerError as exc:
        raise StackError(f"local PostgreSQL: cannot set up the ledger roles: {exc}") from exc
    roles = {
        component: replace(server, user=role).url_for(DATABASE_NAME)
        for component, role in LOGIN_ROLES.items()
    }
    state = PostgresState(
        url=server.url_for(DATABASE_NAME),
        external=False,
        admin_url=server.url,
        role_urls=roles,
        pid=server.pid,
        port=server.port,
        root=str(server.root),
        bin_dir=str(server.bin_dir),
        os_user=server.os_user,
        log=str(server.log_path),
    )
    return server, state


def _raise_if_any_failed(
    kafka: Future[tuple[KafkaBroker | None, KafkaState]],
    postgres: Future[tuple[PostgresServer | None, PostgresState]],
) -> None:
    """When either service failed, stop the one that started and raise every reason."""
    errors = [exc for exc in (kafka.exception(), postgres.exception()) if exc is not None]
    if not errors:
        return
    if kafka.exception() is None and (broker := kafka.result()[0]) is not None:
        broker.stop()
    if postgres.exception() is None and (server := postgres.result()[0]) is not None:
        server.stop()
    if len(errors) == 1:
        raise errors[0]
    raise StackError("\n\n".join(str(exc) for exc in errors))


def _kafka_status(kafka: KafkaState) -> ServiceStatus:
    try:
        wait_for_kafka(kafka.bootstrap, timeout=3.0)
        running, detail = True, "answers metadata requests"
    except StackError as exc:
        running, detail = False, str(exc).splitlines()[0]
    if not kafka.external:
        detail = f"pid {kafka.pid}, data {kafka.data_dir}; {detail}"
    return ServiceStatus(
        name="kafka",
        address=kafka.bootstrap,
        external=kafka.external,
        running=running,
        detail=detail,
    )


def _postgres_status(postgres: PostgresState) -> ServiceStatus:
    try:
        wait_for_postgres(postgres.url, timeout=3.0)
        running, detail = True, "accepts connections"
    except StackError as exc:
        running, detail = False, str(exc).splitlines()[0]
    if not postgres.external:
        detail = f"pid {postgres.pid}, data {postgres.root}; {detail}"
    return ServiceStatus(
        name="postgres",
        address=postgres.url,
        external=postgres.external,
        running=running,
        detail=detail,
    )
