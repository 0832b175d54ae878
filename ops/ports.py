"""Free TCP ports on the loopback interface for local services."""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

__all__ = ["LOOPBACK", "free_ports", "is_port_free", "retry_bind_clash"]

LOOPBACK = "127.0.0.1"
_BIND_ATTEMPTS = 3
_BIND_CLASH = "Address already in use"

T = TypeVar("T")


def free_ports(count: int, host: str = LOOPBACK) -> tuple[int, ...]:
    """`count` distinct ports that nothing listens on right now. All sockets are held open
    together until every port is chosen, so the kernel never hands out the same port twice
    in one call; another process may still take one before the service binds it."""
    if count < 1:
        raise ValueError(f"free_ports needs count >= 1, got {count}")
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return tuple(ports)


def is_port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether `port` can be bound on `host` now (used to reuse a previous run's port)."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as servers set it: a port in TIME_WAIT after a clean stop is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def retry_bind_clash(
    launch: Callable[[], T], error: type[Exception], *, pinned: bool, remembered: Path
) -> T:
    """Return `launch()`, which chooses its ports and starts a service. Another process
    may take a free port between the choice and the service's bind; when `launch` raises
    `error` saying the address is in use, forget the `remembered` ports file and try again
    with fresh ports, up to three attempts, but only when the caller did not pin them."""
    for attempt in range(1, _BIND_ATTEMPTS + 1):
        try:
            return launch()
        except error as exc:
            if pinned or attempt == _BIND_ATTEMPTS or _BIND_CLASH not in str(exc):
                raise
            remembered.unlink(missing_ok=True)
    raise AssertionError("unreachable: the last attempt returns or raises")
