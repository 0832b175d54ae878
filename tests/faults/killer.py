"""A test build of the controller that dies uncatchably on a crafted record.

`python -m tests.faults.killer` runs exactly `python -m consumer`, except that intake,
before it looks at a record whose value holds the bytes of `$KILLER_MARKER`, sends the
process SIGKILL, as an out-of-memory kill or a segfault in a C extension would end it:
no `except`, no `finally`, no atexit handler runs, the batch transaction never commits.
The production code paths hold no such hook; this module exists only in the tests, for
the crash quarantine test (`test_quarantine.py`, docs/faults.md).
"""

from __future__ import annotations

import os
import signal
import sys

import consumer.intake
from consumer.__main__ import main

ENV_MARKER = "KILLER_MARKER"


def _arm(marker: bytes) -> None:
    examine = consumer.intake.Intake.examine

    def examine_or_die(
        self: consumer.intake.Intake, record: consumer.intake.RawRecord
    ) -> consumer.intake.IntakeResult:
        if record.value is not None and marker in record.value:
            print(f"killer: SIGKILL on {record.coordinates}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return examine(self, record)

    consumer.intake.Intake.examine = examine_or_die  # type: ignore[method-assign]


if __name__ == "__main__":
    _arm(os.environ[ENV_MARKER].encode())
    sys.exit(main())
