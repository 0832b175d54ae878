"""librdkafka's log lines as Python logging records, for every Kafka client a deployment
creates.

librdkafka writes its log lines (`%4|1764622403.101|GETPID|relay-1#producer-1| ...`)
straight to stderr unless the client has a logger. confluent-kafka's `logger` setting
takes any object with a `logging.Logger`-style `log(level, msg, *args)` method: it maps
the syslog level of each line to a logging level (emerg/alert/crit: CRITICAL, err:
ERROR, warning: WARNING, notice/info: INFO, debug: DEBUG) and calls
`log(level, "%s [%s] %s", facility, client_name, text)` from the thread that polls the
client. `KafkaLog` is that object, writing to the logger `librdkafka.<component>`, so
one logging configuration sets the level per component.

One adjustment: a warning librdkafka ends with "retrying" (it is handled and retried
inside the client, e.g. "Failed to acquire idempotence PID from broker ...: Coordinator
load in progress: retrying", which every idempotent producer logs while a fresh broker
loads its coordinator) is an INFO record. A failure that lasts shows up as a delivery
failure or a fatal error the clients report on their own.

Here, below `consumer` and `producers`, so that both use one bridge; the module does not
import confluent_kafka.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["LOGGER_PREFIX", "KafkaLog", "librdkafka_logger"]

LOGGER_PREFIX: Final = "librdkafka"
_RETRIED: Final = ("retrying", "retrying.")


class KafkaLog:
    """A logger for confluent-kafka's `logger` setting (see the module docstring)."""

    __slots__ = ("logger",)

    def __init__(self, component: str) -> None:
        self.logger = logging.getLogger(f"{LOGGER_PREFIX}.{component}")

    def log(self, level: int, msg: str, *args: object) -> None:
        """One librdkafka line: `args` are facility, client name and text."""
        if level == logging.WARNING and args and str(args[-1]).rstrip().endswith(_RETRIED):
            level = logging.INFO
        self.logger.log(level, msg, *args)


def librdkafka_logger(component: str) -> KafkaLog:
    """The bridge for one component's clients (`controller`, `relay`, `client`, ...)."""
    return KafkaLog(component)
