"""The guides run as written (issue #31: both guides' run commands failed as written,
while CI passed with an extra variable).

For docs/tool-integration.md and docs/capability-worker.md, the test takes each guide's
`sh` blocks and runs them, as they are, with bash (`-euo pipefail`) from the repository
root, in the environment a new user's shell has: no `RECOVERY_*` or `OTEL_*` variable of
the test session, only `RECOVERY_STACK_DIR` naming a stack folder of the test's own (a
fresh clone's `.stack`, apart from the developer's stack and the session's services), so
the guide's `ops/dev up` starts a stack there and everything after uses it. The output
must match the guide's `text` block that follows, line by line in order, ids masked.

Python blocks are the integration's own code around the library: each is marked with an
HTML comment `<!-- fragment: NAMES ... -->` naming what the surrounding code defines. The
test compiles every fragment, runs its imports (each imported name must exist), and
checks that every name it uses is defined in it, imported, a builtin, or named in the
marker; an unmarked Python block is run as a script and must exit 0.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from schemas import ENV_KAFKA_BOOTSTRAP
from tests.support.services import service_root

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT: Final = Path(__file__).resolve().parents[2]
GUIDES: Final = ("tool-integration.md", "capability-worker.md")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!--\s*fragment:(.*)-->$", re.DOTALL)
# Ids that differ per run: hex of 8 or more digits (operations, events, keys).
_RUN_ID = re.compile(r"[0-9a-f]{8,}")


@dataclass(frozen=True)
class Block:
    """One fenced block of a guide: its language, text, the fragment marker right
    above it (the names it declares, or None), and its line."""

    language: str
    text: str
    declared: frozenset[str] | None
    line: int


def blocks(guide: str) -> list[Block]:
    """Every fenced block of docs/`guide`, in order."""
    source = (ROOT / "docs" / guide).read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(source):
        above = source[: match.start()].rstrip()
        marker = _MARKER.match(above[above.rfind("<!--") :]) if above.endswith("-->") else None
        declared = None
        if marker is not None:
            declared = frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", marker.group(1)))
        line = source.count("\n", 0, match.start()) + 1
        found.append(Block(match.group(1), match.group(2), declared, line))
    return found


def user_environment(stack: Path) -> dict[str, str]:
    """A new shell's environment: the session's RECOVERY_* and OTEL_* settings removed
    (the jar cache kept), the stack folder of this test's own named."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECOVERY_", "OTEL_")) or k == "RECOVERY_CACHE_DIR"
    }
    env["RECOVERY_STACK_DIR"] = str(stack)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def fresh_stack() -> Iterator[dict[str, str]]:
    """The environment the guides run in; stops and deletes their stack afterwards."""
    stack = service_root("guides")
    env = user_environment(stack)
    yield env
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "recoveryctl"), "stack", "down", "--purge"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    shutil.rmtree(stack, ignore_errors=True)


def run_shell(text: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`text` run by bash as a user pastes it; whatever it left running is stopped.
    Output goes to files: a background job the block left (a failed block's `recoveryctl
    run &`) would hold pipes open long after bash exits."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", text],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # a background job the block left running
            except ProcessLookupError:
                pass
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def assert_prints(output: str, expected: str) -> None:
    """Every line of the guide's `text` block, its run ids masked, is a line of
    `output`, in the same order."""
    lines, at = output.splitlines(), 0
    for wanted in expected.splitlines():
        pattern = re.compile("^" + _RUN_ID.sub("[0-9a-f]+", re.escape(wanted)) + "$")
        found = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
        assert found is not None, f"the guide shows {wanted!r}; the run printed:\n{output}"
        at = found + 1


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_commands_run_as_written_and_print_what_it_shows(
    guide: str, fresh_stack: dict[str, str]
) -> None:
    found = blocks(guide)
    shells = [b for b in found if b.language == "sh"]
    assert shells, f"{guide} has no sh block to run"
    for block in shells:
        done = run_shell(block.text, fresh_stack, timeout=420)
        assert done.returncode == 0, (
            f"{guide} line {block.line}: the block exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-6000:]}"
        )
        shown = next((b for b in found if b.language == "text" and b.line > block.line), None)
        assert shown is not None, f"{guide}: no text block shows what line {block.line} prints"
        assert_prints(done.stdout, shown.text)


def test_the_demo_leaves_nothing_a_real_controller_would_dead_letter(
    fresh_stack: dict[str, str],
) -> None:
    # Issue #31: the first real `recoveryctl run` after the demo read the demo's events
    # and dead-lettered them as producer-unknown, which filled `dlq list` and the
    # console and made `replay --verify` exit 1. The README's command, then a real
    # controller on the same stack until it has read all it will ever read.
    demo = run_shell("ops/dev demo", fresh_stack, timeout=420)
    assert demo.returncode == 0, f"{demo.stdout}\n{demo.stderr[-6000:]}"
    assert "recovery-demo.events" in demo.stdout  # it says where it played
    run_real_controller(fresh_stack)
    letters = run_shell(".venv/bin/recoveryctl dlq list --json", fresh_stack, timeout=60)
    assert json.loads(letters.stdout)["dead_letters"] == [], letters.stdout
    replay = run_shell(
        ".venv/bin/recoveryctl replay --verify --policy docs/examples/policy.yaml",
        fresh_stack,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr


def run_real_controller(env: dict[str, str]) -> None:
    """`recoveryctl run` on the stack's own topics under the example policy, until it has
    decided everything on them (the ledger's offsets at each partition's end)."""
    done = run_shell(
        """
ops/dev up
.venv/bin/recoveryctl db migrate
.venv/bin/recoveryctl topics create
.venv/bin/recoveryctl run --policy docs/examples/policy.yaml &
for _ in $(seq 90); do
    sleep 1
    offsets=$(.venv/bin/recoveryctl offsets show --json 2>/dev/null) || continue
    python3 -c 'import json,sys; o=json.loads(sys.argv[1]); sys.exit(any(p["log_end"] and
        p["ledger_offset"] != p["log_end"] for p in o["partitions"]))' "$offsets" && break
done
kill %1
""",
        env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_kafka_consumer_groups_describes_the_controllers_group_as_documented(
    fresh_stack: dict[str, str],
) -> None:
    # Issue #31: the stack wrote librdkafka files only, and the cache lacked kafka-tools.
    # docs/controller.md, "Offsets in Kafka (advice only)": its one sh block, run as it
    # is while a controller is a member of the group (until it lists the group's topic).
    (documented,) = [b for b in blocks("controller.md") if b.language == "sh"]
    script = f"""
ops/dev up
.venv/bin/recoveryctl db migrate
.venv/bin/recoveryctl topics create
.venv/bin/recoveryctl run --policy docs/examples/policy.yaml &
for _ in $(seq 60); do
    sleep 1
    out=$({documented.text.strip()}) || continue
    case "$out" in *recovery.events*) break ;; esac
done
kill %1
printf '%s\\n' "$out"
"""
    done = run_shell(script, fresh_stack, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    mine = [r for r in rows if r[:2] == ["recovery-controller", "recovery.events"]]
    assert len(mine) == 6, done.stdout + done.stderr[-2000:]  # every partition, owned


def _free_names(tree: ast.Module) -> set[str]:
    """Names a module reads that it neither binds nor imports (approximate, enough for
    straight-line fragments: assignments, imports, defs, loops, with, comprehensions)."""
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("guide", GUIDES)
def test_the_guides_python_is_a_marked_fragment_whose_names_exist(guide: str) -> None:
    python = [b for b in blocks(guide) if b.language == "python"]
    assert python, f"{guide} shows no Python"
    for block in python:
        where = f"{guide} line {block.line}"
        if block.declared is None:
            done = subprocess.run(
                [sys.executable, "-c", block.text], cwd=ROOT, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"{where}: an unmarked block must run: {done.stderr}"
            continue
        tree = ast.parse(block.text, filename=where)
        imports = ast.Module(
            body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)],
            type_ignores=[],
        )
        exec(compile(imports, where, "exec"), {})  # every imported name must exist
        undeclared = _free_names(tree) - block.declared
        assert not undeclared, (
            f"{where}: the fragment uses {sorted(undeclared)}, neither defined nor imported "
            "in it nor named in its `<!-- fragment: ... -->` marker"
        )


@pytest.mark.parametrize("name", ["tool_timeout.py", "capability_worker.py"])
def test_an_example_without_a_broker_exits_2_naming_the_variable(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "docs" / "examples" / name)],
        cwd=ROOT,
        env=user_environment(tmp_path / "no-stack"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert ENV_KAFKA_BOOTSTRAP in done.stderr
    assert "recoveryctl stack env worker" in done.stderr
