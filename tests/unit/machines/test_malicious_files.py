"""Hostile files are refused quickly and with bounded memory, before PyYAML builds anything
large: a 50 MB file, an alias bomb, deep nesting and a flood of nodes."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from machines import Registry, ValidationReport, load_registry, validate_path
from machines.errors import Code
from machines.loader import validate_text
from machines.yamlsafe import MAX_BYTES

FAST_SECONDS = 1.0
SMALL_PEAK_BYTES = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def _measure(call: Callable[[], ValidationReport]) -> tuple[ValidationReport, float, int]:
    """(report, CPU seconds, peak bytes); timed without tracemalloc, which slows Python down.
    CPU time, not wall time: the bound is on the work the reader does, and a loaded machine
    (other test processes, a broker starting) must not make a quick refusal look slow."""
    started = time.process_time()
    report = call()
    elapsed = time.process_time() - started
    tracemalloc.start()
    try:
        call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return report, elapsed, peak


def _alias_bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join(f"*a{i - 1}" for _ in range(9))
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_fifty_megabyte_file_is_refused_by_size_without_being_read(
    tmp_path: Path, registry: Registry
) -> None:
    path = tmp_path / "RECOVERY.yaml"
    with path.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)
    report, elapsed, peak = _measure(lambda: validate_path(path, registry))
    assert [p.code for p in report.errors] == [Code.FILE_TOO_LARGE]
    assert elapsed < FAST_SECONDS
    assert peak < 1024 * 1024


def test_fifty_megabytes_of_text_in_memory_is_refused_by_size_before_parsing(
    registry: Registry,
) -> None:
    text = b"a: b\n" * (10 * 1024 * 1024)
    report, elapsed, peak = _measure(lambda: validate_text(text, registry))
    assert [p.code for p in report.errors] == [Code.FILE_TOO_LARGE]
    assert elapsed < FAST_SECONDS
    assert peak < 1024 * 1024


def test_alias_bomb_is_refused_at_the_first_anchor(registry: Registry) -> None:
    report, elapsed, peak = _measure(lambda: validate_text(_alias_bomb(), registry))
    assert [p.code for p in report.errors] == [Code.YAML_ANCHOR]
    assert report.errors[0].location.line == 1
    assert elapsed < FAST_SECONDS
    assert peak < SMALL_PEAK_BYTES


@pytest.mark.parametrize(
    "document",
    [
        "[" * 200_000 + "]" * 40_000,
        "".join(f"{' ' * (2 * i)}k:\n" for i in range(300)),
        "a: " + "{b: " * 40_000 + "c" + "}" * 40_000,
    ],
    ids=["flow-sequences", "block-mappings", "flow-mappings"],
)
def test_deeply_nested_document_is_refused_as_too_deep(registry: Registry, document: str) -> None:
    assert len(document.encode()) <= MAX_BYTES
    report, elapsed, peak = _measure(lambda: validate_text(document, registry))
    assert [p.code for p in report.errors] == [Code.YAML_TOO_DEEP]
    assert elapsed < FAST_SECONDS
    assert peak < SMALL_PEAK_BYTES


def test_flood_of_nodes_is_refused_as_too_many_nodes(registry: Registry) -> None:
    document = "[" + ",".join(["1"] * 100_000) + "]"
    assert len(document) <= MAX_BYTES
    report, elapsed, peak = _measure(lambda: validate_text(document, registry))
    assert [p.code for p in report.errors] == [Code.YAML_TOO_MANY_NODES]
    assert elapsed < FAST_SECONDS
    assert peak < SMALL_PEAK_BYTES


def test_python_object_tag_is_refused_before_construction(registry: Registry) -> None:
    document = "name: !!python/object/apply:os.system ['touch /tmp/pwned-by-yaml']\n"
    report = validate_text(document, registry)
    assert [p.code for p in report.errors] == [Code.YAML_TAG]
    assert not Path("/tmp/pwned-by-yaml").exists()


def test_yaml_1_1_booleans_stay_strings_so_on_is_a_key(registry: Registry) -> None:
    document = "on: yes\noff: no\n"
    report = validate_text(document, registry)
    assert {p.location.path for p in report.errors} >= {"on", "off"}
    assert all(p.code is not Code.YAML_NON_STRING_KEY for p in report.errors)
