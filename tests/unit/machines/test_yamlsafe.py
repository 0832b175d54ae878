"""The plain-data reader: YAML 1.2 core scalars only, string keys, one document, and line
numbers for every path."""

from __future__ import annotations

import pytest

from machines import Problem
from machines.errors import Code
from machines.yamlsafe import Document, parse_yaml


def _data(text: str) -> object:
    document = parse_yaml(text, "<test>")
    assert isinstance(document, Document), document
    return document.data


def _code(text: str) -> Code:
    problem = parse_yaml(text, "<test>")
    assert isinstance(problem, Problem), problem
    return problem.code


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v: yes", "yes"),
        ("v: on", "on"),
        ("v: 0x1F", "0x1F"),
        ("v: 2024-01-01", "2024-01-01"),
        ("v: 09", "09"),
        ("v: .inf", ".inf"),
        ("v: 1_000", "1_000"),
        ("v: 1.0.0", "1.0.0"),
    ],
)
def test_yaml_1_1_implicit_types_stay_strings(text: str, expected: str) -> None:
    assert _data(text) == {"v": expected}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("v: true", True), ("v: false", False), ("v: ~", None), ("v: 12", 12), ("v: 1.5", 1.5)],
)
def test_core_scalars_are_typed(text: str, expected: object) -> None:
    assert _data(text) == {"v": expected}


def test_on_key_of_a_state_stays_the_string_on() -> None:
    assert _data("state:\n  on:\n    E: {target: x}\n") == {"state": {"on": {"E": {"target": "x"}}}}


def test_duplicate_key_in_a_nested_flow_mapping_is_refused() -> None:
    assert _code("a: {b: 1, b: 2}") is Code.YAML_DUPLICATE_KEY


def test_boolean_key_is_refused_as_non_string() -> None:
    assert _code("true: 1") is Code.YAML_NON_STRING_KEY


def test_complex_key_is_refused_as_non_string() -> None:
    assert _code("? [a, b]\n: 1\n") is Code.YAML_NON_STRING_KEY


def test_second_document_is_refused_even_when_empty() -> None:
    assert _code("a: 1\n---\n") is Code.YAML_MULTIPLE_DOCUMENTS


def test_non_specific_tag_is_refused() -> None:
    assert _code("a: ! b") is Code.YAML_TAG


def test_control_character_is_a_coded_syntax_problem() -> None:
    assert _code("a: \x07") is Code.YAML_SYNTAX


def test_lines_are_indexed_for_every_path() -> None:
    document = parse_yaml("a:\n  b:\n    - x\n    - y: 1\n", "<test>")
    assert isinstance(document, Document)
    assert document.lines["a"] == 1
    assert document.lines["a.b"] == 2
    assert document.lines["a.b[1].y"] == 4
