"""docs/tool-integration-typescript.md runs as written: every ```sh block of the page, in
order, in one bash shell started at the repository root, as a reader pastes them. The
only thing the test sets is where the stack lives (`RECOVERY_STACK_DIR`, a folder of its
own, so the page's `ops/dev up` never touches a developer's `.stack`); every other
setting the blocks use, they make themselves. The shell's output must show what the page
says it shows, and the shell must end by itself (its last block stops what it started)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from ops.settings import ENV_STACK_DIR
from tests.support.services import service_root

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

ROOT: Final = Path(__file__).resolve().parents[2]
GUIDE: Final = ROOT / "docs" / "tool-integration-typescript.md"
BLOCK: Final = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def guide_blocks() -> list[str]:
    """The page's shell blocks, in order."""
    return BLOCK.findall(GUIDE.read_text(encoding="utf-8"))


@pytest.fixture
def stack_home() -> Iterator[Path]:
    home = service_root("ts-guide")
    yield home
    # Whatever the page left running (it stops its stack itself when all goes well).
    subprocess.run(
        [sys.executable, "-m", "ops.cli", "stack", "down", "--purge"],
        cwd=ROOT,
        env={**_clean_env(), ENV_STACK_DIR: str(home)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    shutil.rmtree(home, ignore_errors=True)


def _clean_env() -> dict[str, str]:
    """This process's environment without any RECOVERY_* setting of the test session."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_")}


def test_the_guide_has_the_blocks_this_test_runs() -> None:
    blocks = guide_blocks()
    assert len(blocks) == 4, blocks
    assert blocks[0].startswith("ops/dev bootstrap")
    assert "kill %1 %2" in blocks[-1]


def test_the_typescript_guide_runs_as_written(stack_home: Path) -> None:
    script = "set -euo pipefail\n" + "\n".join(guide_blocks())
    shell = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**_clean_env(), ENV_STACK_DIR: str(stack_home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = shell.communicate(timeout=360)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        output, _ = shell.communicate(timeout=30)
        pytest.fail("the guide's commands did not finish in 6 minutes:\n" + output[-6000:])
    finally:
        # The page's background jobs, if it failed before its last block stopped them.
        try:
            os.killpg(shell.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    tail = output[-6000:]
    assert shell.returncode == 0, tail
    for line in (
        "tool: reported TOOL_TIMEOUT evt-",
        "worker: verify op-ts-1:1:0: not_applied",
        "worker: executed op-ts-1:2:0 with idempotency key req-op-ts-1",
        "  state     completed  (",
        "runtime procurement-runtime-3",
    ):
        assert line in output, f"{line!r} not printed:\n{tail}"
    assert output.count("worker: executed") == 1, tail
