"""A loopback TCP proxy a fault test controls: pass-through, delay, partition.

`NetProxy` listens on 127.0.0.1 and forwards each accepted connection to one target
(the run's PostgreSQL server): a role whose database URL names the proxy's port talks to
the server only through it. The test changes what the network does at any moment:

- `delay(seconds)`: every chunk is delivered `seconds` after it arrived, in order, in
  both directions (latency, like `tc netem delay`, not a bandwidth cap: chunks in flight
  overlap).
- `partition("blackhole")`: nothing is delivered any more in either direction and new
  connections are accepted but not connected on; bytes wait in the proxy, as packets
  dropped and retransmitted would, and flow again at `heal()`. A client without its own
  timeout simply waits.
- `partition("refuse")`: every open connection is reset now and every new one is reset
  on accept, as a host that is down for the client; `heal()` lets new ones through.
- `heal()`: pass-through again (delay 0).

Threads, not asyncio: two per connection and direction pair, bounded by the pool sizes
of the roles behind it. Only loopback addresses are served or targeted.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["NetProxy", "ProxyStats"]

LOOPBACK: Final = "127.0.0.1"
_CHUNK: Final = 65536
_POLL: Final = 0.05  # how often a held delivery looks at the gate again


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """What the proxy carried so far."""

    accepted: int
    reset: int  # connections reset by a "refuse" partition (open ones and new ones)
    bytes_forwarded: int


class _Link:
    """One client connection and its upstream: a reader and a deliverer per direction."""

    def __init__(self, proxy: NetProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()

    def run(self) -> None:
        proxy = self.proxy
        while not proxy.flowing() and not self.closed.is_set():
            time.sleep(_POLL)  # black hole: the client is connected, nothing behind it
        if self.closed.is_set():
            return
        try:
            self.upstream = socket.create_connection(proxy.target, timeout=10)
        except OSError:
            self.close()
            return
        self.upstream.settimeout(None)
        for src, dst in ((self.client, self.upstream), (self.upstream, self.client)):
            pending: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=self._read, args=(src, pending), daemon=True).start()
            threading.Thread(target=self._deliver, args=(dst, pending), daemon=True).start()

    def _read(self, src: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while data := src.recv(_CHUNK):
                pending.put((time.monotonic(), data))
        except OSError:
            pass
        pending.put((time.monotonic(), b""))  # end of stream

    def _deliver(self, dst: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        proxy = self.proxy
        try:
            while True:
                arrived, data = pending.get()
                while not self.closed.is_set():
                    due = arrived + proxy.current_delay() - time.monotonic()
                    if proxy.flowing() and due <= 0:
                        break
                    time.sleep(min(_POLL, max(due, 0.001)))
                if self.closed.is_set() or not data:
                    break
                dst.sendall(data)
                proxy.count_bytes(len(data))
        except OSError:
            pass
        self.close()

    def close(self, *, reset: bool = False) -> None:
        """Close both sockets (with an RST when `reset`); idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                if reset:  # SO_LINGER 0: close sends RST, as a refusing host would
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class NetProxy:
    """The proxy (module docstring). Use as a context manager or call `start`/`stop`."""

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        if target_host not in (LOOPBACK, "localhost"):
            raise ValueError(f"the proxy only targets loopback, not {target_host!r}")
        self.target = (target_host, target_port)
        self._listener = socket.create_server((LOOPBACK, port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._delay = 0.0
        self._mode: Literal["open", "blackhole", "refuse"] = "open"
        self._accepted = self._reset = self._bytes = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="netproxy", daemon=True)

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> NetProxy:
        """Begin accepting; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self._take_links():
            link.close()

    # -- what the network does -----------------------------------------------------------

    def delay(self, seconds: float) -> None:
        """Deliver every chunk `seconds` after it arrived (0: no delay)."""
        with self._lock:
            self._delay = max(0.0, seconds)

    def partition(self, mode: Literal["blackhole", "refuse"]) -> None:
        """Cut the link (module docstring) until `heal()`."""
        with self._lock:
            self._mode = mode
        if mode == "refuse":
            links = self._take_links()
            with self._lock:
                self._reset += len(links)
            for link in links:
                link.close(reset=True)

    def heal(self) -> None:
        """Pass-through again: no partition, no delay."""
        with self._lock:
            self._mode, self._delay = "open", 0.0

    @property
    def mode(self) -> str:
        """ "open", "blackhole" or "refuse"."""
        return self._mode

    def stats(self) -> ProxyStats:
        """Connections and bytes so far."""
        with self._lock:
            return ProxyStats(self._accepted, self._reset, self._bytes)

    # -- used by the links -----------------------------------------------------------------

    def flowing(self) -> bool:
        """Whether bytes may move now (no black hole)."""
        return self._mode != "blackhole"

    def current_delay(self) -> float:
        """The delay in force now."""
        return self._delay

    def count_bytes(self, n: int) -> None:
        """Count `n` forwarded bytes."""
        with self._lock:
            self._bytes += n

    def _take_links(self) -> list[_Link]:
        with self._lock:
            links, self._links = self._links, []
        return links

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed by stop()
            link = _Link(self, client)
            with self._lock:
                self._accepted += 1
                refuse = self._mode == "refuse"
                if refuse:
                    self._reset += 1
                else:
                    self._links = [x for x in self._links if not x.closed.is_set()] + [link]
            if refuse:
                link.close(reset=True)
                continue
            threading.Thread(target=link.run, name="netproxy-link", daemon=True).start()
