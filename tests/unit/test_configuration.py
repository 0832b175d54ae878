"""One configuration: every setting declared once, read only through the declarations,
documented from them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ops.configuration import SETTINGS, reference_page
from ops.paths import repo_root
from schemas import ConfigurationError, ServiceSettings, Settings

ROOT = repo_root()
# What ships (the wheel's packages) and the guides' examples a user copies.
PRODUCT = ("consumer", "producers", "schemas", "machines", "ledger", "ops", "docs/examples")
# Developer tooling beside the tests: it hands the environment on to the processes it
# starts, which read it through the declarations like everything else.
TOOLING = (ROOT / "ops" / "bench",)
# The npm package beside the Python producers: its node_modules holds other projects'
# Python scripts (librdkafka's tests), which are neither ours nor shipped.
NOT_PYTHON = (ROOT / "producers" / "typescript",)


def _environment_reads(path: Path) -> list[int]:
    """Lines of `path` that read the process environment directly."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "environb"}:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in {"environ", "getenv"} for alias in node.names):
                found.append(node.lineno)
    return found


def test_nothing_outside_the_declarations_reads_the_environment() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if not any(path.is_relative_to(skip) for skip in (*TOOLING, *NOT_PYTHON))
        for line in _environment_reads(path)
    ]
    assert offenders == [], "read the environment through a schemas.Settings class"


def test_the_scan_finds_a_direct_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nx = os.environ.get('A')\ny = os.getenv('B')\n")
    assert sorted(_environment_reads(sample)) == [2, 3]


def test_the_reference_page_is_what_the_declarations_render() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference_page(), (
        "docs/configuration.md is stale: run `recoveryctl config docs > docs/configuration.md`"
    )


def test_every_variable_is_declared_once_with_help() -> None:
    seen: dict[str, str] = {}
    for cls, _ in SETTINGS:
        for declared in cls.declarations():
            assert declared.help, f"{cls.__name__} {declared.variables}: no help text"
            for variable in declared.variables:
                assert variable not in seen, f"{variable} in {seen.get(variable)} and {cls}"
                seen[variable] = cls.__name__
    assert len(seen) > 60


def test_an_invalid_value_names_its_variable() -> None:
    from consumer import ControllerSettings

    with pytest.raises(ConfigurationError, match="RECOVERY_CONTROLLER_BATCH_MAX_RECORDS"):
        ControllerSettings.from_env(
            {
                "RECOVERY_KAFKA_BOOTSTRAP": "b:1",
                "RECOVERY_DATABASE_URL": "postgresql://x/y",
                "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": "zero",
            }
        )


def test_flags_win_over_the_environment_and_empty_counts_as_unset() -> None:
    env = {"RECOVERY_KAFKA_BOOTSTRAP": "env:1", "RECOVERY_DATABASE_URL": ""}
    services = ServiceSettings.load(env, kafka_bootstrap="flag:1")
    assert services.kafka_bootstrap == "flag:1"
    assert services.database_url is None
    assert ServiceSettings.load(env, kafka_bootstrap=None).kafka_bootstrap == "env:1"


def test_a_shared_setting_is_filled_from_the_class_that_declares_it() -> None:
    from consumer import ControllerSettings

    settings = ControllerSettings.from_env(
        {
            "RECOVERY_KAFKA_BOOTSTRAP": "b:1",
            "RECOVERY_DATABASE_URL": "postgresql://x/y",
            "RECOVERY_CONTROLLER_ID": "controller-b",
            "RECOVERY_TOPIC_EVENTS": "team.events",
        }
    )
    assert (settings.producer_id, settings.topics.events) == ("controller-b", "team.events")
    assert not issubclass(type(settings), ServiceSettings)
    assert all(issubclass(cls, Settings) for cls, _ in SETTINGS)
