"""The ledger on a PostgreSQL pair with automatic failover: pg_auto_failover's monitor and
two keepers (`pg_autoctl`, Debian's `pg-auto-failover-cli` and
`postgresql-15-auto-failover`), all on this machine, as the single server of
`ops.postgres` runs.

Three PostgreSQL servers under `root`: the monitor (`monitor/`, the state machine that
decides which node is primary) and two data nodes (`node_a/`, `node_b/`), each run by
its own `pg_autoctl run`, which starts, stops, promotes and demotes its server as the
monitor assigns. The first node is made a primary; the second is cloned from it with
`pg_basebackup` and streams from it as a synchronous standby: pg_auto_failover sets
`synchronous_standby_names = 'ANY 1 (...)'` while the standby is healthy, so a commit
the primary acknowledges is on both nodes. When the primary is lost the monitor
promotes the standby (docs/ledger.md, "Failover"). Clients connect with a libpq
multi-host URL (`url_for`) and `target_session_attrs=read-write`, which finds whichever
node is primary now.

Nothing is trusted, as on the single server: every server is made here with
`initdb --auth=scram-sha-256` (pg_autoctl's own initdb would write `trust` lines, so it
never makes a cluster), every `pg_hba.conf` is written here (`--skip-pg-hba`) with only
`scram-sha-256` lines, replication included, and every role has a password: the
superuser, the keepers' `autoctl_node` on the monitor, the standby's
`pgautofailover_replicator`. The monitor's health checks need no password (they only
see whether a server answers). The service user's processes read their passwords from
`service.pgpass` (its own, 0600); clients read theirs from `pgpass` (the stack owner's,
0600), which the URLs name.

The monitor's health-check settings are shortened from pg_auto_failover's defaults
(`MONITOR_TUNING`) so that a lost primary is replaced in seconds rather than about half
a minute; the measurements are in docs/faults.md, "Losing the ledger's primary".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final
from urllib.parse import quote

from ops.paths import TRAVERSABLE, private_dir
from ops.ports import LOOPBACK, free_ports
from ops.postgres import (
    _HBA,
    _MAX_SOCKET_DIR,
    SERVER_SETTINGS,
    PostgresServer,
    PostgresServiceError,
    _clear_stale_lock,
    _give,
    _read_passfile,
    _write_passfile,
    find_bin_dir,
    initdb,
    postmaster_pid,
    service_os_user,
    write_server_files,
)
from ops.process import child_pids, log_tail, pid_alive
from ops.settings import DATABASE_NAME, DATABASE_USER

__all__ = [
    "MONITOR",
    "MONITOR_TUNING",
    "NODES",
    "FailoverEvent",
    "HaPostgres",
    "NodeState",
    "start_postgres_ha",
]

MONITOR: Final = "monitor"
NODES: Final = ("node_a", "node_b")
_REPLICATOR: Final = "pgautofailover_replicator"
_KEEPER_ROLE: Final = "autoctl_node"
_MONITOR_DATABASE: Final = "pg_auto_failover"
_PORTS_FILE: Final = "ports.json"
_SERVICE_PASSFILE: Final = "service.pgpass"
_CLIENT_PASSFILE: Final = "pgpass"
_NODE_HBA: Final = _HBA + (
    "# The standby's streaming replication and pg_rewind, with a password too.\n"
    f"host    replication  {_REPLICATOR}  127.0.0.1/32   scram-sha-256\n"
)
# The monitor's failure detection (milliseconds; pg_auto_failover's defaults in
# brackets). A dead server refuses connections at once, so one retry half a second
# later settles it; a node whose keeper has not reported for 3 s is unhealthy [20 s];
# an unreachable primary is given 3 s to demote itself [30 s] before the standby is
# promoted (its own keeper demotes it anyway once it loses both the monitor and the
# standby for `network_partition_timeout`, 20 s).
MONITOR_TUNING: Final[Mapping[str, int]] = {
    "pgautofailover.health_check_period": 1000,  # [5000]
    "pgautofailover.health_check_timeout": 1000,  # [5000]
    "pgautofailover.health_check_max_retries": 1,  # [2]
    "pgautofailover.health_check_retry_delay": 500,  # [2000]
    "pgautofailover.node_considered_unhealthy_timeout": 3000,  # [20000]
    "pgautofailover.primary_demote_timeout": 3000,  # [30000]
}
# The keepers this process started, by pid: kept so that they are reaped when they end
# (and never collected while they run).
_SUPERVISORS: Final[dict[int, subprocess.Popen[bytes]]] = {}
# The monitor's server: no pg_stat_statements (pg_autoctl preloads its own extension).
_MONITOR_SETTINGS: Final = {
    k: v for k, v in SERVER_SETTINGS.items() if not k.startswith(("shared_preload", "pg_stat"))
}


@dataclass(frozen=True, slots=True)
class NodeState:
    """One data node as the monitor sees it (`pg_autoctl show state`)."""

    name: str
    port: int
    healthy: bool
    reported: str
    assigned: str

    @property
    def primary(self) -> bool:
        """Whether this node serves writes now (a primary, or one alone)."""
        return self.reported in ("primary", "wait_primary", "single") and self.reported == (
            self.assigned
        )


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """One event of the monitor: a node's reported state or a goal it was given."""

    at: datetime
    node: str
    reported: str
    goal: str
    description: str


@dataclass(frozen=True, slots=True)
class HaPostgres:
    """A running failover pair and its monitor (module docstring). `root` holds one
    folder per server (`monitor/`, `node_a/`, `node_b/`, each with `data/` and the
    keeper's log), the keepers' configuration, the ports and both password files."""

    root: Path
    monitor_port: int
    node_ports: tuple[int, int]
    bin_dir: Path
    os_user: str | None
    host: str = LOOPBACK
    user: str = DATABASE_USER

    # -- where clients connect ----------------------------------------------------------

    @property
    def passfile(self) -> Path:
        """The clients' libpq password file (0600, the stack owner's)."""
        return self.root / _CLIENT_PASSFILE

    @property
    def url(self) -> str:
        """Multi-host URL of the administrative database (`postgres`) on the primary."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """Multi-host URL of `database` on whichever node is primary: both nodes listed,
        `target_session_attrs=read-write` (libpq skips the standby), the password file
        named, no password in it."""
        hosts = ",".join(f"{self.host}:{port}" for port in self.node_ports)
        passfile = quote(str(self.passfile), safe="/")
        return (
            f"postgresql://{self.user}@{hosts}/{database}"
            f"?target_session_attrs=read-write&passfile={passfile}"
        )

    def node_url(self, name: str, database: str = "postgres") -> str:
        """URL of `database` on node `name` alone, whatever its role."""
        passfile = quote(str(self.passfile), safe="/")
        port = self.node_ports[NODES.index(name)]
        return f"postgresql://{self.user}@{self.host}:{port}/{database}?passfile={passfile}"

    def with_user(self, user: str) -> HaPostgres:
        """The same pair, URLs connecting as `user` (a login role `remember` knows)."""
        return HaPostgres(
            self.root, self.monitor_port, self.node_ports, self.bin_dir, self.os_user,
            self.host, user,
        )  # fmt: skip

    def remember(self, passwords: Mapping[str, str]) -> None:
        """Add (or replace) these roles' passwords in the clients' password file."""
        _write_passfile(self.passfile, {**_read_passfile(self.passfile), **passwords})

    # -- processes ----------------------------------------------------------------------

    def folder(self, name: str) -> Path:
        """The folder of server `name` (`MONITOR` or one of `NODES`)."""
        return self.root / name

    def log_path(self, name: str) -> Path:
        """The log of server `name`'s keeper and PostgreSQL."""
        return self.folder(name) / "pg_autoctl.log"

    def supervisor_pid(self, name: str) -> int | None:
        """The pid of `pg_autoctl run` of server `name` (its process group), or None
        when it does not run."""
        try:
            pid = int((self.folder(name) / "run.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def running(self, name: str) -> bool:
        """Whether the keeper of server `name` runs."""
        return self.supervisor_pid(name) is not None

    def complete(self) -> bool:
        """Whether the monitor and both nodes' keepers run."""
        return all(self.running(name) for name in (MONITOR, *NODES))

    def is_running(self) -> bool:
        """Whether the monitor and at least one node run: the ledger can be reached,
        perhaps after a failover (`stack up` starts what died)."""
        return self.running(MONITOR) and any(self.running(n) for n in NODES)

    @property
    def pid(self) -> int | None:
        """The monitor keeper's pid (what the stack records as the service's pid)."""
        return self.supervisor_pid(MONITOR)

    def kill(self, name: str) -> None:
        """SIGKILL server `name`'s keeper, its PostgreSQL and every backend: the whole
        server is lost at once, as when its machine dies. PostgreSQL's children (the
        backends, the WAL sender) each lead a session of their own, outside the keeper's
        process group, and a backend outliving its postmaster can still acknowledge a
        commit its standby confirms. So the group is stopped first (no child is forked
        after), then the postmaster's children, and only then is any of them killed:
        none runs a step once the kill began. Returns when all are gone."""
        pid = self.supervisor_pid(name)
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        postmaster = postmaster_pid(self.folder(name) / "data")
        children = child_pids(postmaster) if postmaster is not None else []
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signum)
        os.killpg(pid, signal.SIGKILL)
        for gone in (pid, *children):
            _wait_gone(gone, 10.0)
        (self.folder(name) / "run.pid").unlink(missing_ok=True)

    def start(self, name: str) -> None:
        """Start the keeper of server `name` again on its folder and port (a node rejoins
        as a standby: its keeper rewinds it when it was the primary); nothing when it
        runs."""
        if not self.running(name):
            _clear_stale_lock(self.folder(name) / "data")
            _supervise(self, name)

    def stop(self) -> None:
        """Stop the standby, the primary, then the monitor (`pg_autoctl stop`, a fast
        shutdown; what does not stop within a minute is killed). In that order the
        monitor sees the standby go first and never fails over to it."""
        try:
            primary = self.primary() if self.running(MONITOR) else None
        except PostgresServiceError:
            primary = None
        for name in (*sorted(NODES, key=lambda n: n == primary), MONITOR):
            pid = self.supervisor_pid(name)
            if pid is None:
                continue
            _autoctl(self, ["stop", "--pgdata", str(self.folder(name) / "data")], check=False)
            if not _wait_gone(pid, 60.0):
                self.kill(name)
            (self.folder(name) / "run.pid").unlink(missing_ok=True)

    # -- what the monitor says ----------------------------------------------------------

    def nodes(self) -> tuple[NodeState, ...]:
        """Each data node as the monitor sees it now; raises `PostgresServiceError` when
        the monitor does not answer."""
        result = _autoctl(self, ["show", "state", "--json", "--pgdata", self._monitor_data])
        try:
            rows = json.loads(result.stdout)
        except ValueError as exc:
            raise PostgresServiceError(f"pg_autoctl show state: {result.stdout!r}") from exc
        return tuple(
            NodeState(
                name=str(row["nodename"]),
                port=int(row["nodeport"]),
                healthy=int(row["health"]) == 1,
                reported=str(row["current_group_state"]),
                assigned=str(row["assigned_group_state"]),
            )
            for row in rows
        )

    def events(self, count: int = 50) -> tuple[FailoverEvent, ...]:
        """The monitor's last `count` events, oldest first (`pg_autoctl show events`):
        where the time of a failover goes."""
        args = ["show", "events", "--json", "--count", str(count)]
        result = _autoctl(self, [*args, "--pgdata", self._monitor_data])
        try:
            rows = json.loads(result.stdout or "[]")
        except ValueError as exc:
            raise PostgresServiceError(f"pg_autoctl show events: {result.stdout!r}") from exc
        return tuple(
            FailoverEvent(
                at=datetime.fromisoformat(str(row["eventtime"])),
                node=str(row["nodename"]),
                reported=str(row["reportedstate"]),
                goal=str(row["goalstate"]),
                description=" ".join(str(row["description"]).split()),
            )
            for row in rows
        )

    def primary(self) -> str | None:
        """The node that serves writes now, by the monitor, or None."""
        found = [n.name for n in self.nodes() if n.primary]
        return found[0] if len(found) == 1 else None

    def wait_synchronous(self, timeout: float) -> str:
        """Wait until one node is primary and the other its synchronous standby
        (`primary` and `secondary`, as assigned); return the primary's name. Raises
        `PostgresServiceError` with the monitor's view and the logs' tails."""
        deadline = time.monotonic() + timeout
        states: tuple[NodeState, ...] = ()
        while time.monotonic() < deadline:
            try:
                states = self.nodes()
            except PostgresServiceError:
                states = ()
            reached = {(n.reported, n.assigned) for n in states}
            if reached == {("primary", "primary"), ("secondary", "secondary")}:
                return next(n.name for n in states if n.reported == "primary")
            time.sleep(0.5)
        raise self._failed(f"no synchronous pair after {timeout:.0f}s: {states}")

    @property
    def _monitor_data(self) -> str:
        return str(self.folder(MONITOR) / "data")

    def _failed(self, why: str) -> PostgresServiceError:
        tails = "".join(
            f"\n--- {self.log_path(name)} (tail) ---\n{log_tail(self.log_path(name), 15)}"
            for name in (MONITOR, *NODES)
        )
        return PostgresServiceError(f"PostgreSQL failover pair in {self.root}: {why}{tails}")


def start_postgres_ha(
    root: Path, *, ports: Sequence[int] | None = None, ready_timeout: float = 120.0
) -> HaPostgres:
    """Start (making them on first use) the monitor and both nodes under `root`, or only
    those whose keeper is not running, and return once a primary and its synchronous
    standby stream. `ports` (monitor, node_a, node_b) default to those of the last start,
    else free ones. Raises `PostgresServiceError` with the logs' tails on failure."""
    root = private_dir(root.resolve(), TRAVERSABLE)
    bin_dir = find_bin_dir()
    if shutil.which("pg_autoctl", path=f"{bin_dir}:/usr/bin:/bin") is None:
        raise PostgresServiceError(
            "pg_autoctl is not installed: install the Debian packages pg-auto-failover-cli "
            "and postgresql-15-auto-failover (.ci/run does)"
        )
    monitor, a, b = _ports(root, ports)
    cluster = HaPostgres(root, monitor, (a, b), bin_dir, service_os_user())
    for name in (MONITOR, *NODES):
        folder = cluster.folder(name)
        folder.mkdir(exist_ok=True, mode=0o700)
        _give_service(cluster, folder)
    for name in ("xdg", "run", "sock"):
        (root / name).mkdir(exist_ok=True, mode=0o700)
        _give_service(cluster, root / name)
    if not (cluster.folder(NODES[1]) / "data" / "PG_VERSION").is_file():
        _create(cluster)
    else:
        for name in (MONITOR, *NODES):
            _write_files(cluster, name)
            cluster.start(name)
    cluster.wait_synchronous(ready_timeout)
    return cluster


def _ports(root: Path, ports: Sequence[int] | None) -> tuple[int, int, int]:
    if ports is not None:
        monitor, a, b = ports
        chosen = (monitor, a, b)
    else:
        try:
            saved = json.loads((root / _PORTS_FILE).read_text())
            chosen = (int(saved[MONITOR]), int(saved[NODES[0]]), int(saved[NODES[1]]))
        except (FileNotFoundError, KeyError, ValueError, TypeError):
            monitor, a, b = free_ports(3)
            chosen = (monitor, a, b)
    names = (MONITOR, *NODES)
    (root / _PORTS_FILE).write_text(json.dumps(dict(zip(names, chosen, strict=True))))
    return chosen


def _create(cluster: HaPostgres) -> None:
    """Make the three servers: passwords first, then the monitor, the primary, and the
    standby cloned from it (module docstring)."""
    passwords = {
        DATABASE_USER: secrets.token_urlsafe(24),
        _KEEPER_ROLE: secrets.token_urlsafe(24),
        _REPLICATOR: secrets.token_urlsafe(24),
    }
    service = cluster.root / _SERVICE_PASSFILE
    _write_passfile(service, passwords)
    _give_service(cluster, service)
    cluster.remember({DATABASE_USER: passwords[DATABASE_USER]})
    for name in (MONITOR, NODES[0]):
        server = _server(cluster, name)
        initdb(server, passwords[DATABASE_USER])
        _write_files(cluster, name)
    monitor_port = str(cluster.monitor_port)
    _autoctl(
        cluster,
        ["create", "monitor", "--pgdata", cluster._monitor_data, "--pgport", monitor_port,
         "--hostname", cluster.host, "--skip-pg-hba", "--no-ssl"],
    )  # fmt: skip
    cluster.start(MONITOR)
    settings = "".join(f"ALTER SYSTEM SET {k} = {v};\n" for k, v in MONITOR_TUNING.items())
    _psql(
        cluster,
        cluster.monitor_port,
        _MONITOR_DATABASE,
        f"ALTER ROLE {_KEEPER_ROLE} PASSWORD '{passwords[_KEEPER_ROLE]}';\n{settings}"
        "SELECT pg_reload_conf();\n",
    )
    for index, name in enumerate(NODES):
        _create_node(cluster, name)
        cluster.start(name)
        if index == 0:
            _wait_state(cluster, name, "single")
            _psql(
                cluster,
                cluster.node_ports[0],
                "postgres",
                f"ALTER ROLE {_REPLICATOR} PASSWORD '{passwords[_REPLICATOR]}';\n",
            )


def _create_node(cluster: HaPostgres, name: str) -> None:
    monitor = (
        f"postgresql://{_KEEPER_ROLE}@{cluster.host}:{cluster.monitor_port}/{_MONITOR_DATABASE}"
        f"?passfile={quote(str(cluster.root / _SERVICE_PASSFILE), safe='/')}"
    )
    port = cluster.node_ports[NODES.index(name)]
    _autoctl(
        cluster,
        ["create", "postgres", "--pgdata", str(cluster.folder(name) / "data"),
         "--pgport", str(port), "--pghost", cluster.host, "--hostname", cluster.host,
         "--listen", cluster.host, "--skip-pg-hba", "--no-ssl", "--monitor", monitor,
         "--dbname", DATABASE_NAME, "--username", cluster.user, "--name", name],
    )  # fmt: skip


def _wait_state(cluster: HaPostgres, name: str, state: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(n.name == name and n.reported == state for n in cluster.nodes()):
                return
        except PostgresServiceError:
            pass
        time.sleep(0.3)
    raise cluster._failed(f"{name} did not reach state {state} within {timeout:.0f}s")


def _server(cluster: HaPostgres, name: str) -> PostgresServer:
    """Server `name` as `ops.postgres` handles one (its folder, the service user)."""
    port = cluster.monitor_port if name == MONITOR else cluster.node_ports[NODES.index(name)]
    return PostgresServer(cluster.folder(name), port, cluster.bin_dir, cluster.os_user)


def _write_files(cluster: HaPostgres, name: str) -> None:
    """The settings and `pg_hba.conf` of server `name`, as on every start. Each keeper
    reaches its server over loopback TCP (`--pghost`); pg_autoctl passes the port and
    address on the server's command line. The Unix sockets of all three servers are in
    one folder (`sock/`; a socket file is named by its port), because a standby's data
    folder is a copy of the primary's, settings included, and because pg_autoctl
    starts a killed primary once with no TCP address (`-h ''`) to finish its crash
    recovery before `pg_rewind`: a server with neither TCP nor a socket does not start,
    and the old primary could never rejoin."""
    server = _server(cluster, name)
    if not (server.data_dir / "PG_VERSION").is_file():
        return
    sockets = cluster.root / "sock"
    base = _MONITOR_SETTINGS if name == MONITOR else SERVER_SETTINGS
    socket_dir = str(sockets) if len(str(sockets)) <= _MAX_SOCKET_DIR else ""
    write_server_files(
        server,
        {**base, "unix_socket_directories": socket_dir},
        _HBA if name == MONITOR else _NODE_HBA,
    )


def _environment(cluster: HaPostgres) -> dict[str, str]:
    """What every pg_autoctl process runs with: its configuration under `root/xdg`, the
    service user's password file, loopback TCP."""
    root = cluster.root
    return {
        "PATH": f"{cluster.bin_dir}:/usr/bin:/bin",
        "HOME": str(root / "run"),
        "LC_ALL": "C",
        "PGHOST": cluster.host,
        "PGUSER": cluster.user,
        "PGPASSFILE": str(root / _SERVICE_PASSFILE),
        "XDG_CONFIG_HOME": str(root / "xdg" / "config"),
        "XDG_DATA_HOME": str(root / "xdg" / "data"),
        "XDG_RUNTIME_DIR": str(root / "run"),
    }


def _command(cluster: HaPostgres, argv: Sequence[str]) -> list[str]:
    env = [f"{k}={v}" for k, v in _environment(cluster).items()]
    command = ["env", "-i", *env, *argv]
    if cluster.os_user is not None:
        command = ["runuser", "-u", cluster.os_user, "--", *command]
    return command


def _autoctl(
    cluster: HaPostgres, args: Sequence[str], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        _command(cluster, ["pg_autoctl", *args]),
        cwd=cluster.root,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    if check and result.returncode != 0:
        raise cluster._failed(
            f"`pg_autoctl {' '.join(args[:2])}` exited {result.returncode}:\n"
            f"{result.stdout}{result.stderr[-3000:]}"
        )
    return result


def _wait_accepting(cluster: HaPostgres, port: int, timeout: float = 60.0) -> None:
    """Wait until the server on `port` accepts connections (`pg_isready`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = subprocess.run(
            [str(cluster.bin_dir / "pg_isready"), "-q", "-h", cluster.host, "-p", str(port)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        if ready.returncode == 0:
            return
        time.sleep(0.2)
    raise cluster._failed(f"the server on port {port} did not accept connections in time")


def _psql(cluster: HaPostgres, port: int, database: str, statements: str) -> None:
    """Run `statements` as the superuser on one server, the SQL on stdin (a password in
    it never shows in a process list)."""
    _wait_accepting(cluster, port)
    psql = [str(cluster.bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", cluster.host, "-p", str(port), "-U", cluster.user, "-d", database]  # fmt: skip
    result = subprocess.run(
        _command(cluster, psql),
        cwd=cluster.root,
        capture_output=True,
        text=True,
        input=statements,
        timeout=120,
    )
    if result.returncode != 0:
        raise cluster._failed(f"psql on port {port} exited {result.returncode}: {result.stderr}")


def _supervise(cluster: HaPostgres, name: str) -> None:
    """Start `pg_autoctl run` for server `name` in a process group of its own (so that
    `kill` takes the keeper, its PostgreSQL and every backend at once)."""
    folder = cluster.folder(name)
    log = cluster.log_path(name)
    with log.open("a", encoding="utf-8") as handle:
        process = subprocess.Popen(
            _command(cluster, ["pg_autoctl", "run", "--pgdata", str(folder / "data")]),
            cwd=cluster.root,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _SUPERVISORS[process.pid] = process
    (folder / "run.pid").write_text(str(process.pid))


def _give_service(cluster: HaPostgres, path: Path) -> None:
    _give(_server(cluster, MONITOR), path)


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        own = _SUPERVISORS.get(pid)
        if own is not None and own.poll() is not None:  # reaped: no zombie left
            del _SUPERVISORS[pid]
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)
