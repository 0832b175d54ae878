"""`python -m ops.bench` (`ops/dev bench`): the end-to-end benchmark (`ops/bench/command.py`)."""

from __future__ import annotations

import sys

from ops.bench.command import main

sys.exit(main())
