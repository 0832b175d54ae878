"""The fault tests' TCP proxy on loopback: it forwards, delays, black-holes and refuses
when told, and heals (tests/faults/netproxy.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.netproxy import NetProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback echo server's port (one thread per connection)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


@pytest.fixture
def proxy(echo_port: int) -> Iterator[NetProxy]:
    with NetProxy("127.0.0.1", echo_port) as running:
        yield running


def _connect(proxy: NetProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.settimeout(5)
    return sock


def _round_trip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def _send_until_reset(sock: socket.socket) -> None:
    """Send until the connection turns out reset (the reset may surface on a later send
    or as an end of stream); returns normally if it never does."""
    for _ in range(20):
        sock.sendall(b"lost")
        if sock.recv(4096) == b"":
            raise ConnectionResetError
        time.sleep(0.05)


def test_passes_bytes_through_both_ways(proxy: NetProxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock, b"x" * 100_000) == b"x" * 100_000
    deadline = time.monotonic() + 5  # the count follows the last send by a moment
    while proxy.stats().bytes_forwarded < 200_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.stats().bytes_forwarded == 200_000
    assert proxy.stats().accepted == 1


def test_delay_applies_each_way_and_heal_removes_it(proxy: NetProxy) -> None:
    with _connect(proxy) as sock:
        proxy.delay(0.2)
        started = time.monotonic()
        assert _round_trip(sock) == b"ping"
        assert time.monotonic() - started >= 0.4  # 0.2 s there, 0.2 s back
        proxy.heal()
        started = time.monotonic()
        assert _round_trip(sock) == b"ping"
        assert time.monotonic() - started < 0.2


def test_black_hole_holds_bytes_until_healed(proxy: NetProxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock) == b"ping"
        proxy.partition("blackhole")
        sock.sendall(b"held")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        proxy.heal()
        sock.settimeout(5)
        assert sock.recv(4096) == b"held"


def test_refusal_resets_open_and_new_connections_until_healed(proxy: NetProxy) -> None:
    with _connect(proxy) as sock:
        assert _round_trip(sock) == b"ping"
        proxy.partition("refuse")
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            _send_until_reset(sock)
    try:
        with _connect(proxy) as refused:
            assert refused.recv(4096) == b""  # reset on accept
    except (ConnectionResetError, BrokenPipeError):
        pass  # or already while connecting
    proxy.heal()
    with _connect(proxy) as sock:
        assert _round_trip(sock) == b"ping"
    assert proxy.stats().reset == 2  # the open connection and the new one
