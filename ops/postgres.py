"""A real PostgreSQL server on this machine, from Debian's `postgresql-<major>` binaries.

PostgreSQL refuses to run as root, and our scripts and CI run as root; so when the
effective user is root, `initdb`, `pg_ctl` and the server run as an unprivileged OS user
(`postgres`, or a dedicated system user created on first use) through `runuser`. As
anyone else they run as that user. The server listens on 127.0.0.1 only and keeps fsync
on.

No connection is trusted, not even a local one: every role, the superuser included,
authenticates with a password (`scram-sha-256`, in a `pg_hba.conf` this module writes
on every start, with no `trust` line). The superuser's password is generated when the
cluster is made (an older cluster made with `trust` gets one the first time it starts
here, in single-user mode before the server listens) and kept in `<root>/pgpass`, a
libpq password file readable by the stack's owner alone (0600), beside the login roles'
passwords (`remember`). The URLs this module gives name that file (`passfile=`) and
never hold a password, so another local user can neither read a password nor connect.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

import ledger
from ledger import LedgerError, LedgerUnavailable, ping_database
from ops.errors import StackError
from ops.paths import TRAVERSABLE, private_dir
from ops.ports import LOOPBACK, free_ports, is_port_free, retry_bind_clash
from ops.process import log_tail, pid_alive
from ops.settings import DATABASE_USER

__all__ = [
    "PostgresServer",
    "PostgresServiceError",
    "ensure_database",
    "find_bin_dir",
    "postmaster_pid",
    "service_os_user",
    "start_postgres",
    "wait_for_postgres",
]

_PG_ROOT = Path("/usr/lib/postgresql")
_PASSFILE = "pgpass"
_HBA = """\
# Written by ops/postgres.py on every start: every connection authenticates with a
# password (scram-sha-256); nothing is trusted, not even the local socket.
local   all  all                 scram-sha-256
host    all  all  127.0.0.1/32   scram-sha-256
host    all  all  ::1/128        scram-sha-256
"""
# The settings of every local server, single or of a failover pair.
SERVER_SETTINGS: Final[Mapping[str, str]] = {
    # Sized for a 2-core developer box running Kafka beside it.
    "shared_buffers": "256MB",
    "max_connections": "200",
    # Durability stays as in production: tests must see what production would.
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "log_line_prefix": "%m [%p] %q%u@%d ",
    # Loaded for `recoveryctl bench --profile`, which turns tracking on for its own
    # scratch database only (`ALTER DATABASE ... SET pg_stat_statements.track`); off
    # everywhere else, so that no other session pays for it.
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "none",
}
_SERVICE_USER_CREATED = "agent-recovery"
_SETTINGS_FILE = "agent-recovery.conf"
_ADMIN_DATABASE = "postgres"
# Unix socket paths are limited to 107 bytes; a deep checkout falls back to TCP only.
_MAX_SOCKET_DIR = 90


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid of the postmaster of data folder `data_dir` (from its `postmaster.pid`),
    or None when it is not running."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return pid if pid_alive(pid) else None


class PostgresServiceError(StackError):
    """The local PostgreSQL server could not be prepared, started or stopped."""


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """A running local server: where clients connect and how to stop it.

    `root` holds `data/` (the cluster, owned by `os_user`, mode 0700), the server log and
    the port of the last start. `os_user` is None when the server runs as the caller.
    """

    root: Path
    port: int
    bin_dir: Path
    os_user: str | None
    host: str = LOOPBACK
    user: str = DATABASE_USER

    @property
    def data_dir(self) -> Path:
        """The cluster's data folder (PGDATA)."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        """The server log, whose tail error messages show."""
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        """Connection URL of the administrative database (`postgres`)."""
        return self.url_for(_ADMIN_DATABASE)

    @property
    def passfile(self) -> Path:
        """The libpq password file of this server's roles (0600, the stack owner's)."""
        return self.root / _PASSFILE

    def url_for(self, database: str) -> str:
        """Connection URL of `database` on this server: no password in it, the password
        file named instead (`passfile`, which libpq reads)."""
        passfile = quote(str(self.passfile), safe="/")
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}?passfile={passfile}"

    def remember(self, passwords: Mapping[str, str]) -> None:
        """Add (or replace) the passwords of these roles in the password file, so that
        this server's URLs authenticate as them too."""
        _write_passfile(self.passfile, {**_read_passfile(self.passfile), **passwords})

    @property
    def pid(self) -> int | None:
        """The postmaster's pid from `postmaster.pid`, or None when it is not running."""
        return postmaster_pid(self.data_dir)

    def is_running(self) -> bool:
        """Whether the postmaster of this data folder is alive."""
        return self.pid is not None

    def stop(self) -> None:
        """Stop with `pg_ctl stop -m fast`: sessions are ended, the server checkpoints and
        exits cleanly. Stopping a stopped server does nothing."""
        if not self.is_running():
            return
        command = [str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data_dir)]
        result = _run(self, [*command, "-m", "fast", "-w", "-t", "60"])
        if result.returncode != 0 and self.is_running():
            raise PostgresServiceError(
                f"`pg_ctl stop -m fast` failed for {self.data_dir} (exit "
                f"{result.returncode}): {result.stdout}{result.stderr}\n"
                f"Log tail:\n{log_tail(self.log_path)}"
            )


def find_bin_dir() -> Path:
    """The `bin` folder of the newest PostgreSQL major installed under
    /usr/lib/postgresql (Debian keeps the server binaries off PATH)."""
    majors = sorted(
        (int(p.name), p / "bin")
        for p in _PG_ROOT.glob("*")
        if p.name.isdigit() and (p / "bin" / "pg_ctl").is_file()
    )
    if not majors:
        raise PostgresServiceError(
            f"no PostgreSQL server binaries under {_PG_ROOT}; install them with "
            "`apt-get install postgresql-15` (or run `.ci/run`, which does)."
        )
    return majors[-1][1]


def service_os_user() -> str | None:
    """The OS user the server runs as: None (the caller) unless the caller is root; then
    `postgres` when it exists, else a dedicated system user created now."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", _SERVICE_USER_CREATED):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
         _SERVICE_USER_CREATED],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return _SERVICE_USER_CREATED


def start_postgres(
    root: Path, *, port: int | None = None, ready_timeout: float = 60.0
) -> PostgresServer:
    """Start a server on `root/data`, initialising the cluster on first use, and return
    once a client connects. The port defaults to the one used last time when still free,
    else a free one. Raises `PostgresServiceError` with the server log's tail on failure.
    """
    # Traversable by the service user, not listable: the password file sits here.
    root = private_dir(root.resolve(), TRAVERSABLE)

    def launch() -> PostgresServer:
        server = PostgresServer(
            root=root,
            port=_choose_port(root, port),
            bin_dir=find_bin_dir(),
            os_user=service_os_user(),
        )
        return _launch(server, ready_timeout)

    return retry_bind_clash(
        launch, PostgresServiceError, pinned=port is not None, remembered=root / "port.json"
    )


def _clear_stale_lock(data_dir: Path) -> None:
    """Remove the lock files (`postmaster.pid`, `.s.PGSQL.<port>.lock` beside the socket,
    which lives in the data folder) of a server that was killed (kill -9, OOM): their
    pid is gone or a zombie nobody reaped (a container's init may not reap). The server
    checks the pid with kill(pid, 0), which a zombie passes, and would refuse to start."""
    for lock in (data_dir / "postmaster.pid", *data_dir.glob(".s.PGSQL.*.lock")):
        try:
            pid = int(lock.read_text(encoding="utf-8").splitlines()[0])
        except (OSError, IndexError, ValueError):
            continue
        if not pid_alive(pid):
            lock.unlink(missing_ok=True)


def _launch(server: PostgresServer, ready_timeout: float) -> PostgresServer:
    if server.is_running():
        raise PostgresServiceError(
            f"a PostgreSQL server (pid {server.pid}) already runs on {server.data_dir}; "
            "stop it first (`recoveryctl stack down`) or use another folder."
        )
    if not (server.data_dir / "PG_VERSION").is_file():
        _initdb(server)
    _clear_stale_lock(server.data_dir)
    _ensure_superuser_password(server)
    _write_settings(server)
    _give(server, server.log_path, touch=True)
    server.log_path.chmod(0o600)
    result = _run(
        server,
        [
            str(server.bin_dir / "pg_ctl"),
            "start",
            "-D",
            str(server.data_dir),
            "-l",
            str(server.log_path),
            "-w",
            "-t",
            str(int(ready_timeout)),
        ],
    )
    if result.returncode != 0:
        raise _failed(server, f"`pg_ctl start` exited {result.returncode}: {result.stderr}")
    try:
        wait_for_postgres(server.url, ready_timeout, server=server)
    except BaseException:
        server.stop()
        raise
    return server


def wait_for_postgres(
    url: str, timeout: float = 30.0, *, server: PostgresServer | None = None
) -> None:
    """Return once a client connects to `url` and runs `SELECT 1`; when `server` is given,
    give up early if it stops running, and quote its log."""
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if server is not None and not server.is_running():
            raise _failed(server, "the server process exited")
        try:
            ping_database(url, connect_timeout=2)
            return
        except LedgerUnavailable as exc:
            last_error = str(exc.__cause__ or exc).strip()
            time.sleep(0.1)
    if server is not None:
        raise _failed(server, f"no connection after {timeout:.0f} s: {last_error}")
    raise PostgresServiceError(
        f"PostgreSQL at {url} did not accept a connection within {timeout:.0f} s "
        f"({last_error}); check that it runs and the URL is right."
    )


def ensure_database(url: str, name: str) -> None:
    """Create database `name` on the server of `url` (an admin connection) if missing."""
    try:
        ledger.ensure_database(url, name)
    except LedgerError as exc:
        raise PostgresServiceError(f"cannot provision the local stack's database: {exc}") from exc


def _choose_port(root: Path, port: int | None) -> int:
    if port is not None:
        return port
    try:
        previous = int(json.loads((root / "port.json").read_text())["port"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        previous = 0
    if previous and is_port_free(previous):
        return previous
    return free_ports(1)[0]


def _initdb(server: PostgresServer) -> None:
    password = secrets.token_urlsafe(24)
    initdb(server, password)
    server.remember({server.user: password})


def initdb(server: PostgresServer, password: str) -> None:
    """Make the cluster `server.data_dir` (owned by the service user), its superuser
    authenticating with `password` (scram-sha-256, never `trust`), its `postgresql.conf`
    including the settings file `write_server_files` writes. Raises
    `PostgresServiceError` with initdb's output when it fails."""
    data = server.data_dir
    shutil.rmtree(data, ignore_errors=True)  # a half-made cluster from a failed initdb
    data.mkdir(mode=0o700)
    _give(server, data)
    _check_reachable(server)
    # initdb (the service user) reads the superuser's password from a file of its own.
    pwfile = server.root / f".initdb-{secrets.token_hex(4)}"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(password + "\n")
    _give(server, pwfile)
    try:
        result = _run(
            server,
            [
                str(server.bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                server.user,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=UTF8",
                "--locale=C",
            ],
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        raise PostgresServiceError(
            f"initdb failed for {data} (exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\n# Written by ops/postgres.py on every start.\ninclude '{_SETTINGS_FILE}'\n")


def _ensure_superuser_password(server: PostgresServer) -> None:
    """Give the superuser a password when the password file has none for it: a cluster
    made by an older version (`--auth=trust`). Set in single-user mode, before the
    server listens, so there is no moment a connection is trusted."""
    if server.user in _read_passfile(server.passfile):
        return
    password = secrets.token_urlsafe(24)
    statement = f"ALTER ROLE \"{server.user}\" PASSWORD '{password}';\n"
    command = [str(server.bin_dir / "postgres"), "--single", "-D", str(server.data_dir), "postgres"]
    result = _run(server, command, stdin=statement)
    if result.returncode != 0:
        raise _failed(server, f"setting the superuser's password failed: {result.stderr}")
    server.remember({server.user: password})


def _read_passfile(path: Path) -> dict[str, str]:
    """Role -> password of a password file this module wrote (`*:*:*:role:password`)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        fields = line.split(":")
        if len(fields) == 5 and not line.startswith("#"):
            found[fields[3]] = fields[4]
    return found


def _write_passfile(path: Path, passwords: Mapping[str, str]) -> None:
    """A libpq password file (0600, never readable by others in between) giving each
    role its password on this server, whatever port it listens on."""
    text = "# Written by ops/postgres.py: the local server's roles (libpq passfile).\n"
    text += "".join(f"*:*:*:{role}:{password}\n" for role, password in sorted(passwords.items()))
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _write_settings(server: PostgresServer) -> None:
    socket_dir = str(server.data_dir) if len(str(server.data_dir)) <= _MAX_SOCKET_DIR else ""
    settings = {
        "listen_addresses": server.host,
        "port": str(server.port),
        "unix_socket_directories": socket_dir,
        **SERVER_SETTINGS,
    }
    write_server_files(server, settings, _HBA)
    (server.root / "port.json").write_text(json.dumps({"port": server.port}))


def write_server_files(server: PostgresServer, settings: Mapping[str, str], hba: str) -> None:
    """Write the settings file the cluster's `postgresql.conf` includes and its
    `pg_hba.conf` (owned by the service user), as on every start."""
    lines = [f"{key} = '{value}'\n" for key, value in settings.items()]
    path = server.data_dir / _SETTINGS_FILE
    header = "# Local stack settings (ops/postgres.py); rewritten on every start.\n"
    path.write_text(header + "".join(lines))
    _give(server, path)
    hba_path = server.data_dir / "pg_hba.conf"
    hba_path.write_text(hba)
    _give(server, hba_path)


def _give(server: PostgresServer, path: Path, *, touch: bool = False) -> None:
    if touch:
        path.touch()
    if server.os_user is not None:
        shutil.chown(path, user=server.os_user, group=pwd.getpwnam(server.os_user).pw_gid)


def _check_reachable(server: PostgresServer) -> None:
    if server.os_user is None:
        return
    probe = _run(server, ["test", "-w", str(server.data_dir)])
    if probe.returncode != 0:
        raise PostgresServiceError(
            f"OS user {server.os_user} cannot reach {server.data_dir}: a folder above it is "
            "not traversable (e.g. /root is 0700). Set RECOVERY_STACK_DIR to a folder "
            "others can traverse, such as /var/tmp/agent-recovery."
        )


def _run(
    server: PostgresServer, command: list[str], *, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    # The C locale, so that the server tools' messages read the same everywhere.
    command = ["env", "LC_ALL=C", *command]
    if server.os_user is not None:
        command = ["runuser", "-u", server.os_user, "--", *command]
    # cwd: the service user may not be allowed into the caller's working directory.
    return subprocess.run(
        command,
        cwd=server.root,
        capture_output=True,
        text=True,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        timeout=300,
    )


def _failed(server: PostgresServer, why: str) -> PostgresServiceError:
    return PostgresServiceError(
        f"PostgreSQL on {server.host}:{server.port} ({server.data_dir}) failed to start: "
        f"{why}\n--- {server.log_path} (tail) ---\n{log_tail(server.log_path)}"
    )
