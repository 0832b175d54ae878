"""The benchmark finds the real server's and broker's processes on this host, every
time, and reads their CPU."""

from __future__ import annotations

import pytest

from ops.bench.cpu import listening_pid, postmaster_pid, process_cpu, tree_cpu

pytestmark = pytest.mark.integration


def test_the_postmaster_is_found_on_every_connection(postgres_server: str) -> None:
    # Each call's backend exits with its session: the lookup must not race it.
    found = {postmaster_pid(postgres_server) for _ in range(20)}
    assert len(found) == 1
    (postmaster,) = found
    assert postmaster is not None
    server = tree_cpu(postmaster)
    own = process_cpu(postmaster)
    assert server is not None
    assert own is not None
    assert server >= own > 0


def test_the_broker_is_the_process_on_the_bootstrap_port(kafka_bootstrap: str) -> None:
    pid = listening_pid(int(kafka_bootstrap.split(",")[0].rsplit(":", 1)[1]))
    assert pid is not None
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        assert b"kafka.Kafka" in cmdline.read()
    cpu = process_cpu(pid)
    assert cpu is not None
    assert cpu > 0
