"""librdkafka's log lines as Python logging records, for every Kafka client a deployment
creates, rate-limited per kind of line.

librdkafka writes its log lines (`%4|1764622403.101|GETPID|relay-1#producer-1| ...`)
straight to stderr unless the client has a logger. confluent-kafka's `logger` setting
takes any object with a `logging.Logger`-style `log(level, msg, *args)` method: it maps
the syslog level of each line to a logging level (emerg/alert/crit: CRITICAL, err:
ERROR, warning: WARNING, notice/info: INFO, debug: DEBUG) and calls
`log(level, "%s [%s] %s", facility, client_name, text)` from the thread that polls the
client. `KafkaLog` is that object, writing to the logger `librdkafka.<component>`, so
one logging configuration sets the level per component.

Two adjustments:

- A warning librdkafka ends with "retrying" (it is handled and retried inside the
  client, e.g. "Failed to acquire idempotence PID from broker ...: Coordinator load in
  progress: retrying", which every idempotent producer logs while a fresh broker loads
  its coordinator) is an INFO record. A failure that lasts shows up as a delivery
  failure or a fatal error the clients report on their own.
- Warnings and errors are **rate-limited per kind of line**, as journald limits a noisy
  unit: while a broker is down every client logs "Connect to ... failed" again and
  again (a 78 s outage gave 1,675 ERROR lines; now 9). A kind is the component, level,
  facility and text, with the text's numbers masked (ports, counts, timings) and a
  trailing parenthesised detail dropped. The first line of a kind is logged; repeats
  within the next `LOG_WINDOW_SECONDS` (30 s) are counted, not logged. The next line of
  any kind after the window, or `KafkaLog.flush` (each role calls it when it stops),
  logs one summary per kind that held lines back, at their level: `FAIL [summary] 577
  more line(s) like this in the last 30 s, last: <the last one>`. The state is shared
  by every client of one component and bounded (`_MAX_KINDS` kinds).

Here, below `consumer` and `producers`, so that both use one bridge; the module does not
import confluent_kafka.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["LOGGER_PREFIX", "LOG_WINDOW_SECONDS", "KafkaLog", "librdkafka_logger"]

LOGGER_PREFIX: Final = "librdkafka"
LOG_WINDOW_SECONDS: Final = 30.0
_RETRIED: Final = ("retrying", "retrying.")
# Kinds of line remembered per component; beyond it, the oldest expired are forgotten
# (and, if none has expired, the line is logged without counting: never unbounded).
_MAX_KINDS: Final = 256
_NUMBERS: Final = re.compile(r"\d+")
# librdkafka's trailing detail, "(after 0ms in state CONNECT, 4 identical error(s)
# suppressed)": present on some repeats of a line and not on others.
_DETAIL: Final = re.compile(r"\s*\((?:[^()]|\([^()]*\))*\)\s*$")


@dataclass(slots=True)
class _Kind:
    """One kind of line: when its window ends, how many were held back, the last one."""

    until: float
    suppressed: int
    level: int
    facility: str
    text: str


class _Limiter:
    """The rate limit shared by every client of one component (module docstring)."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float]) -> None:
        self.logger = logger
        self.clock = clock
        self.lock = threading.Lock()
        self.kinds: dict[tuple[int, str, str], _Kind] = {}

    def admit(self, level: int, facility: str, text: str) -> tuple[bool, list[_Kind]]:
        """Whether to log this line now, and the summaries of kinds whose window ended."""
        key = (level, facility, _NUMBERS.sub("#", _DETAIL.sub("", text)))
        now = self.clock()
        with self.lock:
            due = self._expired(now)
            kind = self.kinds.get(key)
            if kind is not None and now < kind.until:
                kind.suppressed += 1
                kind.text = text
                return False, due
            if kind is None and len(self.kinds) >= _MAX_KINDS:
                return True, due
            self.kinds[key] = _Kind(now + LOG_WINDOW_SECONDS, 0, level, facility, text)
            return True, due

    def _expired(self, now: float) -> list[_Kind]:
        """Take out every kind whose window ended: the ones that held lines back are
        returned to be summarised."""
        ended = [key for key, kind in self.kinds.items() if now >= kind.until]
        return [k for k in (self.kinds.pop(key) for key in ended) if k.suppressed]

    def flush(self) -> list[_Kind]:
        """Every kind holding lines back, now, whatever its window."""
        with self.lock:
            held = [k for k in self.kinds.values() if k.suppressed]
            self.kinds.clear()
        return held

    def summarise(self, kinds: list[_Kind]) -> None:
        for kind in kinds:
            self.logger.log(
                kind.level,
                "%s [summary] %d more line(s) like this in the last %.0f s, last: %s",
                kind.facility,
                kind.suppressed,
                LOG_WINDOW_SECONDS,
                kind.text,
            )


_LIMITERS: dict[str, _Limiter] = {}
_LIMITERS_LOCK: Final = threading.Lock()


def _limiter(component: str, clock: Callable[[], float] | None) -> _Limiter:
    logger = logging.getLogger(f"{LOGGER_PREFIX}.{component}")
    if clock is not None:  # a test's own clock: its own state
        return _Limiter(logger, clock)
    with _LIMITERS_LOCK:
        found = _LIMITERS.get(component)
        if found is None:
            found = _LIMITERS[component] = _Limiter(logger, time.monotonic)
        return found


class KafkaLog:
    """A logger for confluent-kafka's `logger` setting (see the module docstring)."""

    __slots__ = ("_limiter", "logger")

    def __init__(self, component: str, *, clock: Callable[[], float] | None = None) -> None:
        self._limiter = _limiter(component, clock)
        self.logger = self._limiter.logger

    def log(self, level: int, msg: str, *args: object) -> None:
        """One librdkafka line: `args` are facility, client name and text."""
        text = str(args[-1]) if args else ""
        if level == logging.WARNING and text.rstrip().endswith(_RETRIED):
            level = logging.INFO
        if level < logging.WARNING or not self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *args)
            return
        facility = str(args[0]) if len(args) == 3 else ""
        now, due = self._limiter.admit(level, facility, text)
        self._limiter.summarise(due)
        if now:
            self.logger.log(level, msg, *args)

    def flush(self) -> None:
        """Log the summary of every kind of line held back so far (at a role's stop)."""
        self._limiter.summarise(self._limiter.flush())


def librdkafka_logger(component: str) -> KafkaLog:
    """The bridge for one component's clients (`controller`, `relay`, `client`, ...)."""
    return KafkaLog(component)
