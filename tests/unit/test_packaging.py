"""The wheel holds what an operator deploys (the runtime packages, `recoveryctl`, the
console, the local stack and its data files) and not the developer's tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ops.paths import repo_root


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    # Built from a copy of the checkout's files (tracked or not, but not ignored), so
    # that no leftover build folder in the checkout can change what ships.
    root, source = repo_root(), tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    for name in filter(None, listed):
        if (root / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out),
         str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_ships_no_benchmark_code(wheel_files: set[str]) -> None:
    assert not [name for name in wheel_files if name.startswith("ops/bench")]


def test_the_wheel_ships_every_data_file_the_runtime_reads(wheel_files: set[str]) -> None:
    root = repo_root()
    wanted = [
        "machines/machines.lock",
        "machines/registry.yaml",
        "machines/trusted-publishers.yaml",
        "ops/kafka/server.properties",
        "ops/console/templates/review.html",
        "ops/grafana/recovery.json",
        "ledger/sql/queries.sql",
        "ledger/sql/schema.snapshot",
    ]
    wanted += [str(p.relative_to(root)) for p in (root / "ledger/sql/migrations").glob("*.sql")]
    wanted += [str(p.relative_to(root)) for p in (root / "schemas/avro").glob("*.avsc")]
    wanted += [str(p.relative_to(root)) for p in (root / "machines/catalogue").rglob("*.yaml")]
    wanted += [str(p.relative_to(root)) for p in (root / "machines/catalogue").rglob("*.sig")]
    assert sorted(set(wanted) - wheel_files) == []


def test_the_wheel_ships_the_operator_commands(wheel_files: set[str]) -> None:
    for module in ("ops/cli.py", "ops/context.py", "ops/usecases.py", "ops/stack.py",
                   "ops/demo.py", "consumer/__main__.py", "producers/relay.py"):  # fmt: skip
        assert module in wheel_files, module
    assert Path("ops/commands/config.py").as_posix() in wheel_files
