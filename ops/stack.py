"""The local stack: Kafka (one broker, or a three-node cluster) and one PostgreSQL server,
started and stopped as one.

The one way to bring up services for developers (`recoveryctl stack up`, `ops/dev up`)
and for the demo. When `RECOVERY_KAFKA_BOOTSTRAP` or `RECOVERY_DATABASE_URL` name
existing services, those are checked and used instead of starting local ones (Kafka as
the client settings of the environment, `schemas.KafkaSecurity`). What was started is
written to `<stack dir>/state.json` so that `stack down` and `stack status` in another
process find it. The local broker is secured (TLS, SASL/SCRAM-SHA-512, ACLs) unless
`plaintext` is asked for (`--plaintext`, `RECOVERY_STACK_KAFKA_PLAINTEXT=1`); the state
names each component's client properties file (`ops.kafka_security`). `brokers=3`
(`--brokers 3`) starts the three-node KRaft cluster of `ops.kafka_cluster` instead of
the single broker, in its own folder (`<stack dir>/kafka-cluster`).

`stack up` on a recorded stack restarts only what died: a service that still answers
keeps its process (and pid), one whose process is gone or does not answer is stopped
if anything of it is left and started again on its own data and port; of a cluster,
only the nodes whose processes are gone are started again, beside the others. No command
trusts a state file whose processes are gone: `live_state` (what the commands that
resolve the stack's URLs read) ignores it, and a stack stopped by the process that
started it (`LocalStack.stop`, as `recoveryctl bench` and the demo do) forgets it.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ledger import LOGIN_ROLES, LedgerError, ensure_roles
from ops.db_passwords import resolve_passwords, store_passwords
from ops.errors import StackError
from ops.kafka import KafkaBroker, ensure_jars, start_kafka, wait_for_kafka
from ops.kafka_cluster import KafkaCluster, start_kafka_cluster
from ops.keys import stack_roster
from ops.paths import TRAVERSABLE, private_dir, stack_dir
from ops.postgres import (
    PostgresServer,
    ensure_database,
    find_bin_dir,
    start_postgres,
    wait_for_postgres,
)
from ops.postgres_ha import MONITOR, HaPostgres, start_postgres_ha
from ops.process import file_lock
from ops.settings import DATABASE_NAME, StackSettings
from schemas import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP, KafkaSecurity, ServiceSettings

__all__ = [
    "KafkaState",
    "LocalStack",
    "PostgresState",
    "ServiceStatus",
    "StackState",
    "live_state",
    "plaintext_requested",
    "read_state",
    "stack_down",
    "stack_status",
    "stack_up",
]

_STATE_FILE = "state.json"
_CLUSTER_DIR = "kafka-cluster"
_PAIR_DIR = "postgres-ha"  # the failover pair's three servers (`stack up --ha`)
T = TypeVar("T")


class KafkaState(BaseModel):
    """The broker as recorded in the state file; `external` when named by the env var."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str
    external: bool
    pid: int | None = None
    data_dir: str | None = None
    log: str | None = None
    # How clients connect: SASL_SSL for the secured local broker, PLAINTEXT for one
    # started with --plaintext; an external broker's is the environment's.
    security_protocol: str = "PLAINTEXT"
    # Component -> its librdkafka client properties file (RECOVERY_KAFKA_CONFIG_FILE),
    # for a secured local broker.
    client_files: dict[str, str] = {}
    # How many local brokers: 1, or a cluster's nodes, whose pids (node id i at i - 1)
    # and client addresses (`bootstrap`, comma-separated, in node order) are recorded;
    # `pid` is then None and `data_dir` the cluster's folder.
    brokers: int = 1
    node_pids: list[int] = []

    def client(self, component: str) -> KafkaSecurity:
        """The client settings `component` (a key of `schemas.KAFKA_PRINCIPALS`)
        connects with: its properties file on a secured local broker, else the
        environment's."""
        path = self.client_files.get(component)
        if path is None:
            return KafkaSecurity.from_env()
        return KafkaSecurity.from_file(Path(path))


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
    # A failover pair (`stack up --ha`, `ops.postgres_ha`): `port` is the monitor's,
    # `node_ports` the two data nodes', and every URL lists both nodes.
    ha: bool = False
    node_ports: tuple[int, int] | None = None


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
    kafka: KafkaBroker | KafkaCluster | None
    postgres: PostgresServer | HaPostgres | None
    reused: bool = False
    # The services of a recorded stack that `stack up` found dead and started again
    # ("kafka", "postgres"); the others kept their processes.
    restarted: tuple[str, ...] = ()

    @property
    def bootstrap(self) -> str:
        """Kafka bootstrap servers, as clients take them."""
        return self.state.kafka.bootstrap

    @property
    def database_url(self) -> str:
        """URL of the application database."""
        return self.state.postgres.url

    def kafka_client(self, component: str) -> KafkaSecurity:
        """The Kafka client settings of `component` (see `KafkaState.client`)."""
        return self.state.kafka.client(component)

    def stop(self) -> None:
        """Stop the services this stack started (never external ones) and remove the
        state file when it still records this stack, so no later command trusts it."""
        errors: list[str] = []
        for handle in (self.kafka, self.postgres):
            if handle is None:
                continue
            try:
                handle.stop()
            except StackError as exc:
                errors.append(str(exc))
        home = Path(self.state.stack_dir)
        if home.is_dir():
            with file_lock(home / ".lock"):
                _forget(home, self.state)
        if errors:
            raise StackError("\n".join(errors))

    def alive(self) -> bool:
        """Whether every local service's process still runs (external ones count as
        alive: their state is checked by connecting, `stack_status`)."""
        return all(h.is_running() for h in (self.kafka, self.postgres) if h is not None)

    @classmethod
    def from_state(cls, state: StackState, *, reused: bool = False) -> LocalStack:
        """Handles rebuilt from a state file written by another process."""
        kafka: KafkaBroker | KafkaCluster | None = None
        k = state.kafka
        if not k.external and k.node_pids and k.data_dir:
            nodes = list(zip(k.bootstrap.split(","), k.node_pids, strict=True))
            kafka = KafkaCluster.rebuilt(Path(k.data_dir), nodes)
        elif not k.external and k.pid and k.data_dir:
            kafka = KafkaBroker(k.bootstrap, k.pid, Path(k.data_dir))
        postgres: PostgresServer | HaPostgres | None = None
        pg = state.postgres
        if not pg.external and pg.root and pg.port and pg.bin_dir:
            if pg.ha and pg.node_ports is not None:
                postgres = HaPostgres(
                    Path(pg.root), pg.port, pg.node_ports, Path(pg.bin_dir), pg.os_user
                )
            else:
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


def plaintext_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `RECOVERY_STACK_KAFKA_PLAINTEXT` asks for the plaintext listener."""
    return StackSettings.load(environ).kafka_plaintext


def live_state(directory: Path | None = None) -> StackState | None:
    """The recorded stack when its local services' processes still run, else None:
    what commands read to find the stack's URLs, so a stack stopped or killed behind
    the state file's back is not trusted ("cannot reach the server")."""
    state = read_state(directory)
    if state is None or not LocalStack.from_state(state).alive():
        return None
    return state


def _forget(home: Path, state: StackState) -> None:
    """Remove the state file if it still records `state` (the caller holds the lock)."""
    try:
        current = read_state(home)
    except StackError:
        return
    if current is not None and current.started_at == state.started_at:
        (home / _STATE_FILE).unlink(missing_ok=True)


def stack_up(
    directory: Path | None = None,
    progress: TextIO | None = None,
    *,
    external_timeout: float = 15.0,
    plaintext: bool | None = None,
    brokers: int | None = None,
    ha: bool | None = None,
) -> LocalStack:
    """Start (or reuse, or attach to external) Kafka and PostgreSQL and record them.

    Idempotent: when the recorded stack still runs, it is returned as is (and when its
    broker's mode or broker count is not the one asked for, `StackError` says to stop
    it first). Local services start in parallel; if one fails, the other is stopped
    before the error is raised. External services get `external_timeout` seconds to
    answer. The local broker is secured unless `plaintext` (default:
    `plaintext_requested()`); `brokers` (default: as recorded, else 1) local brokers
    run, more than one as a cluster (`ops.kafka_cluster`). With `ha` (default: as
    recorded, else not) the ledger runs on a local failover pair (`ops.postgres_ha`:
    pg_auto_failover's monitor, a primary and its synchronous standby); a recorded pair
    whose node died gets it started again (it rejoins as the standby).
    """
    # Traversable (PostgreSQL's own user reaches its data below), not listable.
    home = private_dir(directory or stack_dir(), TRAVERSABLE)
    wanted_plaintext = plaintext_requested() if plaintext is None else plaintext
    if brokers is not None and brokers not in (1, 3):
        raise StackError(f"--brokers takes 1 (one broker) or 3 (a cluster), not {brokers}")
    with file_lock(home / ".lock"):
        out = progress or sys.stderr
        return _stack_up(home, out, external_timeout, wanted_plaintext, brokers, ha)


def _stack_up(
    home: Path,
    out: TextIO,
    external_timeout: float,
    plaintext: bool,
    brokers: int | None,
    ha: bool | None,
) -> LocalStack:
    started = time.monotonic()
    services = ServiceSettings.load()
    bootstrap, database_url = services.kafka_bootstrap, services.database_url
    if database_url is not None and ha:
        raise StackError(
            f"{ENV_DATABASE_URL} names an existing database; --ha starts a local failover "
            "pair: unset it to run one"
        )
    if bootstrap is not None and brokers not in (None, 1):
        raise StackError(
            f"{ENV_KAFKA_BOOTSTRAP} names an existing broker; --brokers {brokers} starts "
            "local ones: unset it to run a local cluster"
        )
    current = read_state(home)
    pair = ha if ha is not None else (current is not None and current.postgres.ha)
    survivors = _surviving_nodes(current, bootstrap)
    kept_kafka, kept_postgres = _kept(current, bootstrap, database_url, survivors, pair)
    if current is not None and (kept_kafka is not None or survivors):
        _check_mode(current.kafka, plaintext, brokers)
    if current is not None and kept_kafka is not None and kept_postgres is not None:
        return LocalStack.from_state(current, reused=True)
    count = brokers or (current.kafka.brokers if current is not None else 1)
    if bootstrap is None and kept_kafka is None:
        ensure_jars(progress=out)  # in this thread, so download progress stays readable
    if database_url is None and kept_postgres is None:
        find_bin_dir()  # fail before starting Kafka when PostgreSQL is not installed
    if bootstrap is None and kept_kafka is None and count > 1:
        dead = sorted(set(range(1, count + 1)) - set(survivors))
        what = f"nodes {dead} of " if survivors else ""
        print(f"stack up: starting {what}the {count}-node Kafka cluster", file=out)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="stack-up") as pool:
        kafka_future: Future[tuple[KafkaBroker | KafkaCluster | None, KafkaState]] = (
            _done(kept_kafka)
            if kept_kafka is not None
            else pool.submit(_kafka, home, bootstrap, external_timeout, plaintext, count, survivors)
        )
        postgres_future: Future[tuple[PostgresServer | HaPostgres | None, PostgresState]] = (
            _done(kept_postgres)
            if kept_postgres is not None
            else pool.submit(_postgres, home, database_url, external_timeout, pair)
        )
        pending: list[Future[Any]] = [kafka_future, postgres_future]
        wait(pending)
    _raise_if_any_failed(
        kafka_future, postgres_future, keep=(kept_kafka is not None, kept_postgres is not None)
    )
    kafka, kafka_state = kafka_future.result()
    postgres, postgres_state = postgres_future.result()
    for name, kept in (("kafka", kept_kafka), ("postgres", kept_postgres)):
        if current is not None:
            print(f"stack up: {name} {'still running' if kept else 'restarted'}", file=out)
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
    # Restarting one service of a stack someone else started leaves it theirs to stop.
    reused = kept_kafka is not None or kept_postgres is not None
    restarted = tuple(
        name
        for name, kept in (("kafka", kept_kafka), ("postgres", kept_postgres))
        if current is not None and kept is None
    )
    return LocalStack(state, kafka, postgres, reused, restarted)


def _done(value: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(value)
    return future


def _surviving_nodes(current: StackState | None, bootstrap: str | None) -> dict[int, KafkaBroker]:
    """The nodes of a recorded local cluster that still run while others died (node id
    -> handle): kept as they are while the dead ones start again. Empty when it is not
    a cluster, or when all or none of its nodes run."""
    if current is None or bootstrap is not None:
        return {}
    cluster = LocalStack.from_state(current).kafka
    if not isinstance(cluster, KafkaCluster):
        return {}
    alive = {i: n for i, n in enumerate(cluster.nodes, start=1) if n.is_running()}
    return alive if 0 < len(alive) < len(cluster.nodes) else {}


def _kept(
    current: StackState | None,
    bootstrap: str | None,
    database_url: str | None,
    survivors: dict[int, KafkaBroker],
    ha: bool,
) -> tuple[
    tuple[KafkaBroker | KafkaCluster | None, KafkaState] | None,
    tuple[PostgresServer | HaPostgres | None, PostgresState] | None,
]:
    """The recorded services that may be kept as they are: the ones asked for now (local,
    or the same external address, a single server or a pair as `ha` says) that still
    answer. What is left of a local one that does not (a process that no longer
    answers) is stopped, to be started again; the `survivors` of a cluster whose other
    nodes died keep running, and so do the live servers of a pair one of whose servers
    died (`start_postgres_ha` starts only the dead one)."""
    if current is None:
        return None, None
    handles = LocalStack.from_state(current)
    kafka: tuple[KafkaBroker | KafkaCluster | None, KafkaState] | None = None
    postgres: tuple[PostgresServer | HaPostgres | None, PostgresState] | None = None
    k, pg = current.kafka, current.postgres
    same_kafka = (bootstrap == k.bootstrap) if k.external else bootstrap is None
    if same_kafka and (k.external or (handles.kafka and handles.kafka.is_running())):
        if _kafka_status(k).running:
            kafka = (handles.kafka, k)
    same_pg = (database_url == pg.url) if pg.external else (database_url is None and pg.ha == ha)
    whole = not isinstance(handles.postgres, HaPostgres) or handles.postgres.complete()
    if same_pg and (pg.external or (handles.postgres and handles.postgres.is_running())):
        if whole and _postgres_status(pg).running:
            postgres = (handles.postgres, pg)
    if kafka is None and handles.kafka is not None and not survivors:
        handles.kafka.stop()  # nothing, when its process is gone
    if postgres is None and handles.postgres is not None and not (same_pg and pg.ha):
        handles.postgres.stop()
    return kafka, postgres


def stack_down(directory: Path | None = None, *, purge: bool = False) -> StackState | None:
    """Stop the recorded stack's local services and forget it; with `purge`, also delete
    their data. Returns the state that was stopped, or None when nothing was recorded."""
    home = directory or stack_dir()
    if not home.is_dir():
        return None
    with file_lock(home / ".lock"):
        state = read_state(home)
        if state is not None:
            stack = LocalStack.from_state(state)
            for handle in (stack.kafka, stack.postgres):
                if handle is not None:
                    handle.stop()
            (home / _STATE_FILE).unlink(missing_ok=True)
        if purge:
            for name in ("kafka", _CLUSTER_DIR, "postgres", _PAIR_DIR):
                shutil.rmtree(home / name, ignore_errors=True)
        return state


def stack_status(directory: Path | None = None) -> list[ServiceStatus]:
    """Whether each recorded service answers now (empty when no stack is recorded)."""
    state = read_state(directory or stack_dir())
    if state is None:
        return []
    return [_kafka_status(state.kafka), _postgres_status(state.postgres)]


def _check_mode(kafka: KafkaState, plaintext: bool, brokers: int | None) -> None:
    """Refuse to reuse or repair a recorded local Kafka of another mode or size."""
    if kafka.external:
        return
    if brokers is not None and brokers != kafka.brokers:
        raise StackError(
            f"the recorded stack's Kafka ({kafka.bootstrap}) runs {kafka.brokers} "
            f"broker(s), but --brokers {brokers} was asked for; stop it with `recoveryctl "
            "stack down` and start again"
        )
    if (kafka.security_protocol == "PLAINTEXT") == plaintext:
        return
    running = "plaintext" if kafka.security_protocol == "PLAINTEXT" else "secured"
    asked = "plaintext" if plaintext else "secured"
    raise StackError(
        f"the running stack's Kafka broker ({kafka.bootstrap}) is {running}, but a "
        f"{asked} one was asked for; stop it with `recoveryctl stack down` and start again"
    )


def _kafka(
    home: Path,
    bootstrap: str | None,
    timeout: float,
    plaintext: bool,
    brokers: int,
    survivors: dict[int, KafkaBroker],
) -> tuple[KafkaBroker | KafkaCluster | None, KafkaState]:
    if bootstrap is not None:
        security = KafkaSecurity.from_env()
        wait_for_kafka(bootstrap, timeout=timeout, security=security)
        return None, KafkaState(
            bootstrap=bootstrap, external=True, security_protocol=security.effective_protocol
        )
    if brokers > 1:
        return _cluster(home, plaintext, brokers, survivors)
    broker = start_kafka(home / "kafka", secured=not plaintext)
    state = KafkaState(
        bootstrap=broker.bootstrap,
        external=False,
        pid=broker.pid,
        data_dir=str(broker.data_dir),
        log=str(broker.log_path),
        security_protocol=broker.admin.effective_protocol,
        client_files={} if broker.security is None else broker.security.client_files(),
    )
    return broker, state


def _cluster(
    home: Path, plaintext: bool, brokers: int, survivors: dict[int, KafkaBroker]
) -> tuple[KafkaCluster, KafkaState]:
    cluster = start_kafka_cluster(
        home / _CLUSTER_DIR, nodes=brokers, secured=not plaintext, keep=survivors
    )
    state = KafkaState(
        bootstrap=cluster.bootstrap,
        external=False,
        data_dir=str(cluster.data_dir),
        log=" ".join(str(node.log_path) for node in cluster.nodes),
        security_protocol=cluster.admin.effective_protocol,
        client_files={} if cluster.security is None else cluster.security.client_files(),
        brokers=brokers,
        node_pids=[node.pid for node in cluster.nodes],
    )
    return cluster, state


def _postgres(
    home: Path, url: str | None, timeout: float, ha: bool
) -> tuple[PostgresServer | HaPostgres | None, PostgresState]:
    if url is not None:
        wait_for_postgres(url, timeout=timeout)
        return None, PostgresState(url=url, external=True)
    server: PostgresServer | HaPostgres = (
        start_postgres_ha(home / _PAIR_DIR) if ha else start_postgres(home / "postgres")
    )
    ensure_database(server.url, DATABASE_NAME)
    # Every login role authenticates with its password, kept (0600) where `recoveryctl
    # db roles` keeps them and in the server's password file the URLs name.
    password_file = home / "db-roles.json"
    passwords = resolve_passwords(LOGIN_ROLES, password_file)
    try:
        ensure_roles(server.url_for(DATABASE_NAME), passwords)
        store_passwords(password_file, passwords)
        server.remember(passwords)
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
        port=server.monitor_port if isinstance(server, HaPostgres) else server.port,
        root=str(server.root),
        bin_dir=str(server.bin_dir),
        os_user=server.os_user,
        log=str(server.log_path(MONITOR) if isinstance(server, HaPostgres) else server.log_path),
        ha=isinstance(server, HaPostgres),
        node_ports=server.node_ports if isinstance(server, HaPostgres) else None,
    )
    return server, state


def _raise_if_any_failed(
    kafka: Future[tuple[KafkaBroker | KafkaCluster | None, KafkaState]],
    postgres: Future[tuple[PostgresServer | HaPostgres | None, PostgresState]],
    *,
    keep: tuple[bool, bool] = (False, False),
) -> None:
    """When either service failed, stop the one that started (not one `keep` says was
    already running) and raise every reason."""
    errors = [exc for exc in (kafka.exception(), postgres.exception()) if exc is not None]
    if not errors:
        return
    if not keep[0] and kafka.exception() is None and (broker := kafka.result()[0]) is not None:
        broker.stop()
    if (
        not keep[1]
        and postgres.exception() is None
        and (server := postgres.result()[0]) is not None
    ):
        server.stop()
    if len(errors) == 1:
        raise errors[0]
    raise StackError("\n\n".join(str(exc) for exc in errors))


def _kafka_status(kafka: KafkaState) -> ServiceStatus:
    try:
        wait_for_kafka(
            kafka.bootstrap, timeout=3.0, security=kafka.client("admin"), brokers=kafka.brokers
        )
        running, detail = True, "answers metadata requests"
    except StackError as exc:
        running, detail = False, str(exc).splitlines()[0]
    if kafka.node_pids:
        pids = ", ".join(str(pid) for pid in kafka.node_pids)
        detail = f"{kafka.brokers} nodes, pids {pids}, data {kafka.data_dir}; {detail}"
    elif not kafka.external:
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
