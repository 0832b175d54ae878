"""A real Apache Kafka broker on this machine, assembled from Maven Central, without Docker.

`ensure_jars` copies the broker's runtime jars once into the cache (outside the
repository); `start_kafka` formats a data folder on first use and runs `kafka.Kafka` in
KRaft combined mode on 127.0.0.1, returning a `KafkaBroker` handle once a client's
metadata request succeeds. By default the broker is secured: TLS and SASL/SCRAM-SHA-512
for clients, mTLS on the controller listener, `StandardAuthorizer` with nothing allowed
that an ACL does not grant (`ops/kafka/secured.properties`; the material and the
principals' passwords: `ops.kafka_security`); `secured=False` runs the plaintext
listener of `ops/kafka/plaintext.properties` instead. Stopping sends SIGTERM;
restarting on the same folder keeps every record, because an already formatted folder
is never formatted again. The same pieces (`write_config`, `format_storage`,
`spawn_node`) start each node of the three-node cluster of `ops.kafka_cluster`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import TextIO

from ops.errors import StackError
from ops.kafka_security import SCRAM_MECHANISM, BrokerSecurity, ensure_broker_security
from ops.paths import cache_dir, ensure_dir, private_dir
from ops.ports import LOOPBACK, free_ports, is_port_free, retry_bind_clash
from ops.process import file_lock, log_tail, pid_alive, pid_cmdline, terminate
from ops.settings import KAFKA_VERSION, LOG4J_VERSION, StackSettings
from producers import BrokerProbe
from schemas import KAFKA_PRINCIPALS, KafkaSecurity

__all__ = [
    "ClusterSeat",
    "KafkaBroker",
    "KafkaServiceError",
    "check_formatted_users",
    "ensure_jars",
    "ensure_tools",
    "find_java",
    "format_storage",
    "jars_cached",
    "new_cluster_id",
    "not_ready",
    "render_server_properties",
    "spawn_node",
    "start_kafka",
    "wait_for_kafka",
    "write_config",
]

_RESOURCES = Path(__file__).resolve().parent / "kafka"
_MARKER = "COMPLETE"
_MAIN_CLASS = "kafka.Kafka"
# Enough for a broker holding test topics; the JVM default would take a quarter of RAM.
_JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_STOP_GRACE_SECONDS = 30.0
# Written after a successful format: the SCRAM users the storage was formatted with.
_SCRAM_MARKER = "scram-users.json"


class KafkaServiceError(StackError):
    """The local Kafka broker could not be prepared, started or stopped."""


@dataclass(frozen=True, slots=True)
class ClusterSeat:
    """A node's place in a multi-node cluster: its node id, the static voter set
    (`id@host:port,...`, every node a voter) and how many copies each partition has
    (`min.insync.replicas` is one fewer, at least 1)."""

    node_id: int
    voters: str
    replication: int

    @property
    def min_insync(self) -> int:
        """In-sync replicas a write needs: all but one, so one node may be down."""
        return max(1, self.replication - 1)


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """A running local broker: where clients connect and how to stop it.

    `process` is set when this Python process started the broker; a handle rebuilt from
    the stack's state file has only the pid, and is stopped by signalling that pid after
    checking that it still names this broker.
    """

    bootstrap: str
    pid: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)
    # The secured broker's material and principals; None for a plaintext broker.
    security: BrokerSecurity | None = field(default=None, compare=False, repr=False)

    @property
    def admin(self) -> KafkaSecurity:
        """Client settings with which to administer this broker (its admin principal;
        plaintext for a plaintext broker)."""
        return KafkaSecurity() if self.security is None else self.security.client("admin")

    @property
    def log_path(self) -> Path:
        """The broker's own log (log4j2), whose tail error messages show."""
        return self.data_dir / "server.log"

    def is_running(self) -> bool:
        """Whether the broker process still runs (and is this broker, not a reused pid)."""
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid) and str(self.data_dir) in pid_cmdline(self.pid)

    def stop(self) -> None:
        """Stop with SIGTERM so the broker flushes and closes its logs cleanly; SIGKILL
        only if it has not exited after 30 s. Stopping a stopped broker does nothing."""
        if not self.is_running():
            self._reap()
            return
        clean = terminate(self.pid, _STOP_GRACE_SECONDS)
        self._reap()
        if not clean:
            raise KafkaServiceError(
                f"Kafka broker pid {self.pid} ({self.data_dir}) ignored SIGTERM for "
                f"{_STOP_GRACE_SECONDS:.0f} s and was killed; its data is intact but the "
                f"next start recovers its logs. Log tail:\n{log_tail(self.log_path)}"
            )

    def _reap(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - killed above
                pass


# --- jars -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _JarSet:
    """A set of jars fetched once into the cache: its folder prefix and its pom."""

    prefix: str
    pom: str
    what: str


_BROKER = _JarSet("kafka", "pom.xml", "Apache Kafka {version} jars")
# Kafka's command-line tools (kafka-consumer-groups, kafka-topics, ...), apart from the
# broker's jars so that fetching them never touches the folder a running broker uses.
_TOOLS = _JarSet("kafka-tools", "tools-pom.xml", "Apache Kafka {version} command-line tools")


def _jar_dir(version: str, cache: Path | None, jars: _JarSet = _BROKER) -> Path:
    return (cache or cache_dir()) / f"{jars.prefix}-{version}"


def jars_cached(
    version: str = KAFKA_VERSION, cache: Path | None = None, jars: _JarSet = _BROKER
) -> bool:
    """Whether a complete set of runtime jars for `version` is in the cache: the marker
    written after a successful copy exists and every jar it lists is present."""
    home = _jar_dir(version, cache, jars)
    marker = home / _MARKER
    if not marker.is_file():
        return False
    names = [line for line in marker.read_text().splitlines() if line.endswith(".jar")]
    return bool(names) and all((home / "libs" / name).is_file() for name in names)


def ensure_jars(
    version: str = KAFKA_VERSION,
    log4j_version: str = LOG4J_VERSION,
    cache: Path | None = None,
    progress: TextIO | None = None,
) -> Path:
    """The folder of the broker's runtime jars, copied from Maven Central on first use.

    Runs `mvn dependency:copy-dependencies` on `ops/kafka/pom.xml` into a scratch folder,
    moves it into place and only then writes the completion marker, so an interrupted
    download is redone rather than trusted. A file lock keeps two processes (tests and a
    developer's `ops/dev up`) from downloading into the same folder at once. Progress
    lines go to `progress` (default: stderr).
    """
    return _ensure(_BROKER, version, log4j_version, cache, progress)


def ensure_tools(
    version: str = KAFKA_VERSION,
    log4j_version: str = LOG4J_VERSION,
    cache: Path | None = None,
    progress: TextIO | None = None,
) -> Path:
    """The folder of Kafka's command-line tools' jars (`kafka-tools` and what it needs,
    `ops/kafka/tools-pom.xml`), fetched as `ensure_jars` fetches the broker's, into a
    folder of their own: the classpath of `recoveryctl kafka-tool`."""
    return _ensure(_TOOLS, version, log4j_version, cache, progress)


def _ensure(
    jars: _JarSet, version: str, log4j_version: str, cache: Path | None, progress: TextIO | None
) -> Path:
    out = progress or sys.stderr
    home = ensure_dir(_jar_dir(version, cache, jars))
    with file_lock(home / ".lock"):
        if jars_cached(version, cache, jars):
            return home / "libs"
        started = time.monotonic()
        what = jars.what.format(version=version)
        print(f"kafka: fetching {what} from Maven Central", file=out)
        print(f"kafka: into {home / 'libs'} (once per machine)", file=out, flush=True)
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(home / "libs", ignore_errors=True)
        (home / _MARKER).unlink(missing_ok=True)
        # Maven writes target/ beside the pom, so it runs on a copy in the cache folder.
        shutil.copyfile(_RESOURCES / jars.pom, home / "pom.xml")
        _run_maven(home, partial, version, log4j_version, out)
        os.replace(partial, home / "libs")
        names = sorted(p.name for p in (home / "libs").glob("*.jar"))
        (home / _MARKER).write_text("".join(f"{name}\n" for name in names))
        elapsed = time.monotonic() - started
        print(f"kafka: {len(names)} jars ready in {elapsed:.1f} s", file=out, flush=True)
        return home / "libs"


def _run_maven(home: Path, target: Path, version: str, log4j: str, out: TextIO) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaServiceError(
            "Maven (`mvn`) is not on PATH; it is needed once to fetch the Kafka jars. "
            "Install it (`apt-get install maven`) or run `ops/dev bootstrap`."
        )
    command = [
        mvn,
        "-B",
        "-f",
        str(home / "pom.xml"),
        f"-Dkafka.version={version}",
        f"-Dlog4j.version={log4j}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={target}",
        "-DincludeScope=runtime",
    ]
    recent: deque[str] = deque(maxlen=40)
    with subprocess.Popen(
        command,
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            recent.append(line)
            # One line per artifact fetched: progress without Maven's full chatter.
            if "Downloaded from" in line or "[ERROR]" in line or "BUILD" in line:
                print(f"  mvn: {line.strip()}", file=out, flush=True)
        code = proc.wait()
    if code != 0:
        raise KafkaServiceError(
            f"`mvn dependency:copy-dependencies` for Kafka {version} failed with exit "
            f"code {code}; check network access to Maven Central and retry. Last lines:\n"
            + "".join(recent)
        )


# --- broker -----------------------------------------------------------------------------


def start_kafka(
    data_dir: Path,
    *,
    bootstrap_port: int | None = None,
    controller_port: int | None = None,
    ready_timeout: float = 60.0,
    progress: TextIO | None = None,
    secured: bool = True,
) -> KafkaBroker:
    """Start a broker on `data_dir` and return once it answers a metadata request (as
    its admin principal when `secured`, the default; see the module docstring).

    The folder is formatted (`kafka.tools.StorageTool format`) only when it holds no
    formatted log yet, so a restart keeps every record. Ports default to the ones the
    folder used last time when they are still free (clients can reconnect to the same
    address), else fresh free ports. Raises `KafkaServiceError` with the broker's log
    tail when it exits or is not ready within `ready_timeout` seconds.
    """
    # The broker's log segments hold every record: readable by its owner alone, so no
    # other local user reads a topic from disk past the ACLs.
    data_dir = private_dir(data_dir.resolve())
    libs = ensure_jars(progress=progress)
    java = find_java()
    # Passwords exist in plaintext mode too, so that the storage is always formatted with
    # every SCRAM user and the same folder can later run secured.
    security = ensure_broker_security(data_dir)
    return retry_bind_clash(
        lambda: _launch(
            java,
            libs,
            data_dir,
            _choose_ports(data_dir, bootstrap_port, controller_port),
            ready_timeout,
            security,
            secured,
        ),
        KafkaServiceError,
        pinned=bootstrap_port is not None or controller_port is not None,
        remembered=data_dir / "ports.json",
    )


def _launch(
    java: str,
    libs: Path,
    data_dir: Path,
    ports: tuple[int, int],
    ready_timeout: float,
    security: BrokerSecurity,
    secured: bool,
) -> KafkaBroker:
    config = write_config(data_dir, *ports, security if secured else None)
    if not (data_dir / "logs" / "meta.properties").is_file():
        format_storage(java, libs, data_dir, config, security, new_cluster_id())
    elif secured:
        check_formatted_users(data_dir, security)
    process = spawn_node(java, libs, data_dir, config)
    broker = KafkaBroker(
        f"{LOOPBACK}:{ports[0]}", process.pid, data_dir, process, security if secured else None
    )
    try:
        wait_for_kafka(broker.bootstrap, ready_timeout, broker=broker, security=broker.admin)
    except BaseException:
        broker.stop()
        raise
    return broker


def spawn_node(
    java: str, libs: Path, data_dir: Path, config: Path, jvm_options: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Run `kafka.Kafka` on `config` in the background (console output appended to
    `data_dir/kafka.out`); `jvm_options` replace the default heap and GC flags."""
    command = [
        java,
        *(jvm_options or _JVM_OPTIONS),
        f"-Dkafka.logs.dir={data_dir}",
        f"-Dlog4j2.configurationFile={_RESOURCES / 'log4j2.xml'}",
        "-cp",
        f"{libs}/*",
        _MAIN_CLASS,
        str(config),
    ]
    with (data_dir / "kafka.out").open("ab") as console:
        # A new session: Ctrl-C in the terminal that ran `ops/dev up` must not reach it.
        return subprocess.Popen(
            command,
            cwd=data_dir,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_kafka(
    bootstrap: str,
    timeout: float = 30.0,
    *,
    broker: KafkaBroker | None = None,
    security: KafkaSecurity | None = None,
    brokers: int = 1,
) -> None:
    """Return once a metadata request to `bootstrap` (as `security`, else the
    environment's client settings) lists at least `brokers` live brokers. When `broker`
    is given, give up early if its process exits, and quote its log."""
    probe = BrokerProbe(bootstrap, security, brokers=brokers)
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if broker is not None and not broker.is_running():
            raise not_ready(bootstrap, broker, "the broker process exited")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise not_ready(bootstrap, broker, f"not ready after {timeout:.0f} s: {last_error}")
        problem = probe.problem(min(2.0, remaining))
        if problem is None:
            return
        last_error = problem
        time.sleep(0.1)


def not_ready(bootstrap: str, broker: KafkaBroker | None, why: str) -> KafkaServiceError:
    """The error saying that `broker` on `bootstrap` did not start, with its log tails."""
    if broker is None:
        return KafkaServiceError(
            f"Kafka at {bootstrap} did not answer a metadata request ({why}); check that "
            "the broker runs and the address is right."
        )
    console = log_tail(broker.data_dir / "kafka.out", 15)
    return KafkaServiceError(
        f"Kafka broker pid {broker.pid} on {bootstrap} ({broker.data_dir}) failed to "
        f"start: {why}.\n--- {broker.log_path} (tail) ---\n{log_tail(broker.log_path)}"
        f"\n--- {broker.data_dir / 'kafka.out'} (tail) ---\n{console}"
    )


def find_java() -> str:
    """The `java` of JAVA_HOME, else of PATH; `KafkaServiceError` when there is none."""
    java_home = StackSettings.load().java_home
    if java_home and (java_home / "bin" / "java").is_file():
        return str(java_home / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaServiceError(
            "No Java found (JAVA_HOME unset and `java` not on PATH); Kafka needs Java 17+. "
            "Install it (`apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME."
        )
    return java


def _choose_ports(
    data_dir: Path, bootstrap_port: int | None, controller_port: int | None
) -> tuple[int, int]:
    previous = _previous_ports(data_dir)
    if bootstrap_port is None and controller_port is None and previous is not None:
        if all(is_port_free(port) for port in previous):
            return previous
    fresh = iter(free_ports(2))
    return (bootstrap_port or next(fresh), controller_port or next(fresh))


def _previous_ports(data_dir: Path) -> tuple[int, int] | None:
    try:
        saved = json.loads((data_dir / "ports.json").read_text())
        return int(saved["bootstrap"]), int(saved["controller"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None


def render_server_properties(
    bootstrap_port: int,
    controller_port: int,
    log_dirs: Path,
    security: BrokerSecurity | None = None,
    seat: ClusterSeat | None = None,
) -> str:
    """The broker's `server.properties`: `ops/kafka/server.properties` followed by the
    listeners of `secured.properties` (when `security` is given) or
    `plaintext.properties`, and for a cluster node (`seat`) `cluster.properties`, with
    the loopback host, the ports, the log folder, the node id, voters and replication
    (a single voter and 1 without a seat) and the TLS and SCRAM settings filled in."""
    listeners = "plaintext.properties" if security is None else "secured.properties"
    parts = ["server.properties", listeners, *(["cluster.properties"] if seat else [])]
    template = Template("".join((_RESOURCES / part).read_text() for part in parts))
    seat = seat or ClusterSeat(1, f"1@{LOOPBACK}:{controller_port}", 1)
    values: dict[str, object] = {
        "host": LOOPBACK,
        "bootstrap_port": bootstrap_port,
        "controller_port": controller_port,
        "log_dirs": log_dirs,
        "node_id": seat.node_id,
        "voters": seat.voters,
        "replication": seat.replication,
        "min_insync": seat.min_insync,
    }
    if security is not None:
        broker = KAFKA_PRINCIPALS["broker"]
        values.update(
            broker_user=broker,
            broker_password=security.passwords[broker],
            admin_user=KAFKA_PRINCIPALS["admin"],
            keystore=security.keystore_path,
            truststore=security.ca_path,
        )
    return template.substitute(values)


def write_config(
    data_dir: Path,
    bootstrap_port: int,
    controller_port: int,
    security: BrokerSecurity | None,
    seat: ClusterSeat | None = None,
) -> Path:
    """Write `data_dir/server.properties` (0600: it holds the broker's own password) and
    `ports.json` (the ports, reused at the next start when free); returns the config."""
    config = data_dir / "server.properties"
    text = render_server_properties(
        bootstrap_port, controller_port, data_dir / "logs", security, seat
    )
    # It holds the broker's own SCRAM password: readable by its owner only.
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    config.chmod(0o600)
    (data_dir / "ports.json").write_text(
        json.dumps({"bootstrap": bootstrap_port, "controller": controller_port})
    )
    return config


def format_storage(
    java: str,
    libs: Path,
    data_dir: Path,
    config: Path,
    security: BrokerSecurity,
    cluster_id: str,
) -> None:
    """Format `data_dir/logs` for `cluster_id` with every principal as a SCRAM user
    (the nodes of one cluster share the id and the users)."""
    scram = [
        arg
        for user, password in sorted(security.passwords.items())
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]")
    ]
    command = [
        java,
        "-Xmx256m",
        f"-Dkafka.logs.dir={data_dir}",
        f"-Dlog4j2.configurationFile={_RESOURCES / 'log4j2.xml'}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(config),
        *scram,
    ]
    result = subprocess.run(
        command, cwd=data_dir, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise KafkaServiceError(
            f"formatting Kafka storage in {data_dir / 'logs'} failed (exit "
            f"{result.returncode}); remove the folder if it is a broken leftover.\n"
            f"{result.stdout}{result.stderr}"
        )
    (data_dir / _SCRAM_MARKER).write_text(json.dumps(sorted(security.passwords)))


def check_formatted_users(data_dir: Path, security: BrokerSecurity) -> None:
    """A folder formatted before it had SCRAM users, or without some, cannot run
    secured: SCRAM credentials are created when the storage is formatted."""
    try:
        formatted = set(json.loads((data_dir / _SCRAM_MARKER).read_text()))
    except (FileNotFoundError, ValueError):
        formatted = set()
    missing = sorted(set(security.passwords) - formatted)
    if missing:
        raise KafkaServiceError(
            f"the Kafka storage in {data_dir / 'logs'} was formatted without the SCRAM "
            f"users {', '.join(missing)}, so it cannot run secured; delete its data "
            "(`recoveryctl stack down --purge`) and start again, or run it plaintext "
            "(`recoveryctl stack up --plaintext`)"
        )


def new_cluster_id() -> str:
    """A cluster id as Kafka's `Uuid.randomUuid()` makes it: 16 random bytes in URL-safe
    base64 without padding, never starting with '-' (it would read as a CLI option)."""
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded
