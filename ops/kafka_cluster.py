"""A three-node Apache Kafka cluster on this machine: `recoveryctl stack up --brokers 3`
and the fault suite's broker-kill test.

Each node runs in KRaft combined mode (broker and controller in one JVM) in
`<root>/node-<id>/`, started by the same pieces as the single broker (`ops.kafka`). The
nodes form a static quorum of three voters, so a controller is elected and writes are
accepted while any one node is down. Every partition, the internal topics included
(`__consumer_offsets`, `__transaction_state`), has three replicas and
`min.insync.replicas` 2 (`ops/kafka/server.properties`); a node that stops
heartbeating is fenced after 4 s (`ops/kafka/cluster.properties`), and no replica out
of sync is ever elected, so a record acknowledged with `acks=all` survives the loss of
any one node.

The nodes share one `BrokerSecurity` at `<root>` (`tls/`, `sasl-users.json`,
`clients/`): one CA, one broker certificate (CN=broker, 127.0.0.1) that each node
presents to clients and to the other nodes' controller listeners (mTLS), the same
SCRAM users formatted into every node's storage; ACLs live in the replicated metadata
log, so all nodes enforce the same ones.

`start_kafka_cluster` formats each node on first use with the cluster's id
(`<root>/cluster.json`), starts all nodes at once (a quorum needs two voters to elect a
leader, so none can become ready alone) and returns once each node answers and the
metadata lists every node. `KafkaCluster.kill` SIGKILLs one node (a crash), `restart`
starts it again on the same folder, node id and ports.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TextIO

from ops.kafka import (
    ClusterSeat,
    KafkaBroker,
    KafkaServiceError,
    check_formatted_users,
    ensure_jars,
    find_java,
    format_storage,
    new_cluster_id,
    spawn_node,
    wait_for_kafka,
    write_config,
)
from ops.kafka_security import BrokerSecurity, ensure_broker_security
from ops.paths import private_dir
from ops.ports import LOOPBACK, free_ports, is_port_free, retry_bind_clash
from ops.process import file_lock
from schemas import KafkaSecurity

__all__ = ["CLUSTER_NODES", "KafkaCluster", "node_dir", "start_kafka_cluster"]

CLUSTER_NODES: Final = 3
_LAYOUT_FILE: Final = "cluster.json"
_PORTS_FILE: Final = "ports.json"
# Three JVMs share the machine (two cores here): a smaller heap than the single
# broker's, the client compiler only (C1: a node is ready in about half the CPU time,
# and test traffic never needs C2's peak speed) and the serial collector (no GC threads
# competing with the other nodes). Measured in docs/faults.md, "Broker kill".
_NODE_JVM_OPTIONS: Final = (
    "-Xms128m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def node_dir(root: Path, node_id: int) -> Path:
    """The data folder of node `node_id` (1-based) of the cluster at `root`."""
    return root / f"node-{node_id}"


@dataclass(frozen=True, slots=True)
class _Layout:
    """The cluster's id and each node's (client port, controller port), node id 1..n."""

    cluster_id: str
    ports: tuple[tuple[int, int], ...]

    @property
    def voters(self) -> str:
        return ",".join(
            f"{node}@{LOOPBACK}:{controller}" for node, (_, controller) in self._numbered()
        )

    def seat(self, node_id: int) -> ClusterSeat:
        return ClusterSeat(node_id, self.voters, len(self.ports))

    def bootstrap(self, node_id: int) -> str:
        return f"{LOOPBACK}:{self.ports[node_id - 1][0]}"

    def _numbered(self) -> list[tuple[int, tuple[int, int]]]:
        return list(enumerate(self.ports, start=1))


@dataclass(frozen=True, slots=True)
class KafkaCluster:
    """A running local cluster: its nodes (node id i is `nodes[i - 1]`), where clients
    connect and how to stop it. Handles rebuilt from the stack's state file have no
    `process` and no `security`; they can be checked and stopped, not restarted."""

    root: Path
    nodes: tuple[KafkaBroker, ...]
    security: BrokerSecurity | None = field(default=None, compare=False, repr=False)

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated, so a client reaches the cluster
        whichever node is down."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def admin(self) -> KafkaSecurity:
        """Client settings of the cluster's admin principal (plaintext when unsecured)."""
        return KafkaSecurity() if self.security is None else self.security.client("admin")

    @property
    def data_dir(self) -> Path:
        """The cluster's folder (security material, `cluster.json`, one folder a node)."""
        return self.root

    def node(self, node_id: int) -> KafkaBroker:
        """Node `node_id` (1-based, as `node.id` in its config)."""
        if not 1 <= node_id <= len(self.nodes):
            raise KafkaServiceError(
                f"the cluster at {self.root} has nodes 1..{len(self.nodes)}, not {node_id}"
            )
        return self.nodes[node_id - 1]

    def is_running(self) -> bool:
        """Whether every node's process still runs."""
        return all(node.is_running() for node in self.nodes)

    def dead_nodes(self) -> list[int]:
        """The ids of the nodes whose process is gone."""
        return [i for i, node in enumerate(self.nodes, start=1) if not node.is_running()]

    def kill(self, node_id: int) -> None:
        """SIGKILL node `node_id`, as a crash: nothing flushed, no controlled shutdown;
        returns once the process is gone."""
        node = self.node(node_id)
        if node.is_running():
            os.kill(node.pid, signal.SIGKILL)
        node.stop()  # reaps it (and does nothing more: it is no longer running)

    def restart(self, node_id: int, ready_timeout: float = 60.0) -> KafkaCluster:
        """Start the stopped node `node_id` again on its folder, node id and ports, and
        return the cluster with its new handle once the metadata lists every node."""
        node = self.node(node_id)
        if node.is_running():
            raise KafkaServiceError(f"node {node_id} (pid {node.pid}) of {self.root} still runs")
        layout = _read_layout(self.root, len(self.nodes))
        if layout is None:
            raise KafkaServiceError(f"{self.root / _LAYOUT_FILE} is missing; cannot restart")
        java, libs = find_java(), ensure_jars()
        fresh = _spawn(java, libs, self.root, layout, node_id, self.security)
        nodes = tuple(fresh if i == node_id else n for i, n in enumerate(self.nodes, start=1))
        cluster = replace(self, nodes=nodes)
        cluster.wait_ready(ready_timeout, only=(node_id,))
        return cluster

    def stop(self) -> None:
        """Stop every node with SIGTERM, all at once (stopped one by one, the last two
        would wait for a quorum that is gone); nodes still running after 30 s are
        killed. Stopping a stopped cluster does nothing."""
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            for outcome in pool.map(_stop_quietly, self.nodes):
                if outcome:
                    errors.append(outcome)
        if errors:
            raise KafkaServiceError("\n".join(errors))

    def wait_ready(self, timeout: float, *, only: tuple[int, ...] | None = None) -> None:
        """Return once each node of `only` (default: all) answers a metadata request and
        the metadata lists every node; `KafkaServiceError` with the log tail of the
        node that exited or did not answer in time."""
        deadline = time.monotonic() + timeout
        for node_id in only or range(1, len(self.nodes) + 1):
            node = self.node(node_id)
            left = max(0.5, deadline - time.monotonic())
            wait_for_kafka(node.bootstrap, left, broker=node, security=self.admin)
        left = max(0.5, deadline - time.monotonic())
        wait_for_kafka(self.bootstrap, left, security=self.admin, brokers=len(self.nodes))

    @classmethod
    def rebuilt(cls, root: Path, nodes: list[tuple[str, int]]) -> KafkaCluster:
        """Handles for a cluster recorded by another process: (bootstrap, pid) a node."""
        return cls(
            root,
            tuple(
                KafkaBroker(bootstrap, pid, node_dir(root, i))
                for i, (bootstrap, pid) in enumerate(nodes, start=1)
            ),
        )


def _stop_quietly(node: KafkaBroker) -> str:
    try:
        node.stop()
    except KafkaServiceError as exc:
        return str(exc)
    return ""


def start_kafka_cluster(
    root: Path,
    *,
    nodes: int = CLUSTER_NODES,
    ready_timeout: float = 120.0,
    progress: TextIO | None = None,
    secured: bool = True,
    keep: Mapping[int, KafkaBroker] | None = None,
) -> KafkaCluster:
    """Start a cluster of `nodes` nodes on `root` (see the module docstring) and return
    once every node is live; secured like the single broker unless `secured=False`.

    Each node folder is formatted only when it holds no formatted log yet, so a restart
    keeps every record. Ports are the ones `root` used last time when they are all
    still free, else fresh ones (then tried again, up to three times, if another
    process takes one first). `keep` (node id -> handle) names nodes that still run:
    only the others are started, on their recorded ports (`stack up` after one node
    died). If any node fails, every node this call started is stopped before
    `KafkaServiceError` is raised with that node's log tail.
    """
    if nodes < 1:
        raise KafkaServiceError(f"a cluster needs at least one node, not {nodes}")
    root = private_dir(root.resolve())  # the nodes' log segments: the owner's alone
    libs = ensure_jars(progress=progress)
    java = find_java()
    security = ensure_broker_security(root)
    kept = dict(keep or {})
    with file_lock(root / ".lock"):
        return retry_bind_clash(
            lambda: _start(java, libs, root, nodes, security, secured, ready_timeout, kept),
            KafkaServiceError,
            pinned=bool(kept),
            remembered=root / _PORTS_FILE,
        )


def _start(
    java: str,
    libs: Path,
    root: Path,
    count: int,
    security: BrokerSecurity,
    secured: bool,
    ready_timeout: float,
    kept: dict[int, KafkaBroker],
) -> KafkaCluster:
    layout = _layout(root, count, kept)
    shown = security if secured else None
    wanted = [node_id for node_id in range(1, count + 1) if node_id not in kept]
    # Formatting is a JVM start per node: in parallel, only on first use.
    with ThreadPoolExecutor(max_workers=count) as pool:
        list(
            pool.map(
                lambda node_id: _prepare(java, libs, root, layout, node_id, security, secured),
                wanted,
            )
        )
    started: dict[int, KafkaBroker] = {}
    try:
        for node_id in wanted:
            started[node_id] = _spawn(java, libs, root, layout, node_id, shown)
        handles = {**kept, **started}
        cluster = KafkaCluster(root, tuple(handles[i] for i in range(1, count + 1)), shown)
        cluster.wait_ready(ready_timeout, only=tuple(wanted) or None)
    except BaseException:
        KafkaCluster(root, tuple(started.values())).stop()
        raise
    return cluster


def _prepare(
    java: str,
    libs: Path,
    root: Path,
    layout: _Layout,
    node_id: int,
    security: BrokerSecurity,
    secured: bool,
) -> None:
    """Write node `node_id`'s config and format its storage if it is not yet."""
    data_dir = private_dir(node_dir(root, node_id))
    bootstrap, controller = layout.ports[node_id - 1]
    config = write_config(
        data_dir, bootstrap, controller, security if secured else None, layout.seat(node_id)
    )
    if not (data_dir / "logs" / "meta.properties").is_file():
        format_storage(java, libs, data_dir, config, security, layout.cluster_id)
    elif secured:
        check_formatted_users(data_dir, security)


def _spawn(
    java: str,
    libs: Path,
    root: Path,
    layout: _Layout,
    node_id: int,
    security: BrokerSecurity | None,
) -> KafkaBroker:
    data_dir = node_dir(root, node_id)
    process = spawn_node(java, libs, data_dir, data_dir / "server.properties", _NODE_JVM_OPTIONS)
    return KafkaBroker(layout.bootstrap(node_id), process.pid, data_dir, process, security)


def _layout(root: Path, count: int, kept: Mapping[int, KafkaBroker]) -> _Layout:
    """The recorded layout when its ports are all free (but the `kept` nodes'), else
    one with fresh ports (and the recorded cluster id, or a new one), written back to
    `root`; with `kept` nodes the recorded ports are the only choice."""
    recorded = _read_layout(root, count)
    complete = recorded is not None and len(recorded.ports) == count
    if recorded is not None and complete:
        free = [
            is_port_free(port)
            for node_id, pair in enumerate(recorded.ports, start=1)
            if node_id not in kept
            for port in pair
        ]
        if all(free):
            return recorded
    if kept:
        raise KafkaServiceError(
            f"cannot restart the stopped nodes of {root} beside the running ones "
            f"{sorted(kept)}: their recorded ports are missing or taken; stop the cluster "
            "(`recoveryctl stack down`) and start it again"
        )
    fresh = free_ports(2 * count)
    cluster_id = recorded.cluster_id if recorded is not None else new_cluster_id()
    layout = _Layout(cluster_id, tuple(zip(fresh[::2], fresh[1::2], strict=True)))
    (root / _LAYOUT_FILE).write_text(json.dumps({"cluster_id": cluster_id, "nodes": count}))
    (root / _PORTS_FILE).write_text(json.dumps([list(pair) for pair in layout.ports]))
    return layout


def _read_layout(root: Path, count: int) -> _Layout | None:
    try:
        meta = json.loads((root / _LAYOUT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if meta.get("nodes") != count:
        raise KafkaServiceError(
            f"the cluster at {root} has {meta.get('nodes')} nodes, not {count}; delete it "
            "(`recoveryctl stack down --purge`) to start one of another size"
        )
    try:
        ports = json.loads((root / _PORTS_FILE).read_text())
        pairs = tuple((int(b), int(c)) for b, c in ports)
    except (FileNotFoundError, ValueError, TypeError):
        pairs = ()
    if len(pairs) != count:
        # Forgotten after a bind clash: fresh ports, the same cluster id.
        return _Layout(str(meta["cluster_id"]), ())
    return _Layout(str(meta["cluster_id"]), pairs)
