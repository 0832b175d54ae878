"""Free TCP ports on the loopback interface for local services."""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["LOOPBACK", "free_ports", "is_port_free"]

LOOPBACK = "127.0.0.1"


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
