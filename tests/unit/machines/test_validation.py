"""Validation reports every problem at once, with state/event/transition/field locations,
recognises draft 0.1, warns without refusing, and digests canonically."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from machines import (
    CATALOGUE,
    Problem,
    Registry,
    RegistryInvalid,
    canonical_json,
    load_registry,
    validate_path,
)
from machines.digest import digest_of
from machines.errors import Code, Location, MachineInvalid, Severity
from machines.loader import validate_text
from machines.registry import parse_registry
from machines.yamlsafe import Document, parse_yaml

BASE = (Path(__file__).parent / "invalid" / "26-initial-not-a-state.yaml").read_text()
VALID = BASE.replace("initial: started", "initial: failure-reported")


def _plain(text: str) -> Any:
    # Not yaml.safe_load: YAML 1.1 would read the `on:` keys as the boolean True.
    document = parse_yaml(text, "<test>")
    assert isinstance(document, Document)
    return document.data


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def test_corpus_base_machine_is_valid(registry: Registry) -> None:
    assert validate_text(VALID, registry).valid


def test_every_problem_is_reported_at_once_not_just_the_first(registry: Registry) -> None:
    text = (
        VALID.replace("guard: approval.granted", "guard: approval.maybe")
        .replace("actions: [procurement.verify-request]", "actions: [procurement.nope]")
        .replace(
            "RETRY_SUCCEEDED:\n        target: completed", "RETRY_SUCCEEDED:\n        target: x"
        )
    )
    report = validate_text(text, registry)
    assert {p.code for p in report.errors} == {
        Code.GUARD_UNKNOWN,
        Code.ACTION_UNKNOWN,
        Code.TARGET_NOT_A_STATE,
    }


def test_location_names_state_event_transition_index_and_field(registry: Registry) -> None:
    report = validate_text(VALID.replace("guard: retry.permitted", "guard: retry.sure"), registry)
    (problem,) = report.errors
    assert problem.code is Code.GUARD_UNKNOWN
    assert problem.location.state == "verifying"
    assert problem.location.event == "VERIFICATION_NOT_FOUND"
    assert problem.location.transition == 0
    assert problem.location.field == "guard"
    assert problem.location.line is not None
    assert "retry.permitted" in problem.hint  # lists the registered guards


def test_unknown_action_hint_lists_registered_capabilities(registry: Registry) -> None:
    report = validate_text(VALID.replace("[procurement.verify-request]", "[x.y]"), registry)
    assert all(cap in report.errors[0].hint for cap in registry.capabilities)


def test_unreachable_state_is_a_warning_and_does_not_refuse(registry: Registry) -> None:
    text = VALID.replace("  completed:\n", "  orphan:\n    type: final\n  completed:\n")
    report = validate_text(text, registry)
    assert report.valid
    assert [(p.code, p.severity) for p in report.warnings] == [
        (Code.UNREACHABLE_STATE, Severity.WARNING)
    ]


def test_draft_0_1_frontmatter_package_is_recognised_and_refused(
    tmp_path: Path, registry: Registry
) -> None:
    (tmp_path / "RECOVERY.md").write_text(
        "---\nname: old-plan\nstates:\n  start: {}\n---\n# Old plan\n"
    )
    report = validate_path(tmp_path, registry)
    assert [p.code for p in report.errors] == [Code.SPEC_VERSION_0_1]
    assert "0.1" in report.errors[0].message


def test_frontmatter_beside_a_0_2_machine_is_refused_as_0_1(
    tmp_path: Path, registry: Registry
) -> None:
    package = tmp_path / "procurement-request"
    shutil.copytree(CATALOGUE / "procurement-request", package)
    guide = package / "RECOVERY.md"
    guide.write_text("---\nspec_version: '0.1'\n---\n" + guide.read_text())
    report = validate_path(package, registry)
    assert [p.code for p in report.errors] == [Code.SPEC_VERSION_0_1]


def test_package_folder_named_differently_from_machine_warns(
    tmp_path: Path, registry: Registry
) -> None:
    package = tmp_path / "renamed"
    shutil.copytree(CATALOGUE / "email-send", package)
    report = validate_path(package, registry)
    assert report.valid
    assert [p.code for p in report.warnings] == [Code.PACKAGE_NAME_MISMATCH]


def test_digest_is_sha256_of_canonical_json_of_the_parsed_document(registry: Registry) -> None:
    report = validate_text(VALID, registry)
    data = _plain(VALID)
    expected = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(data) == expected.encode("utf-8")
    assert report.digest == "sha256:" + hashlib.sha256(expected.encode("utf-8")).hexdigest()
    assert digest_of(data) == report.digest


def test_digest_ignores_comments_and_key_order_but_not_values(registry: Registry) -> None:
    data = _plain(VALID)
    reordered = yaml.safe_dump(dict(reversed(list(data.items()))), sort_keys=False)
    assert validate_text("# comment\n" + reordered, registry).digest == digest_of(data)
    changed = VALID.replace("retention_days: 30", "retention_days: 31")
    assert validate_text(changed, registry).digest != digest_of(data)


def test_registry_with_invalid_params_schema_is_refused() -> None:
    text = (
        "registry_version: 1\nguards: {}\ncapabilities:\n  a.b:\n    kind: verify\n"
        "    material: false\n    params_schema: {type: 12}\n"
    )
    with pytest.raises(RegistryInvalid) as caught:
        parse_registry(text)
    assert caught.value.codes == (Code.REGISTRY_INVALID,)
    assert caught.value.problems[0].location.path == "capabilities.a.b.params_schema"


def test_registry_with_unknown_capability_kind_is_refused() -> None:
    text = (
        "registry_version: 1\nguards: {}\ncapabilities:\n  a.b:\n    kind: teleport\n"
        "    material: false\n    params_schema: {}\n"
    )
    with pytest.raises(RegistryInvalid) as caught:
        parse_registry(text)
    assert caught.value.codes == (Code.REGISTRY_INVALID,)


def test_registry_marks_exactly_the_not_applied_guards(registry: Registry) -> None:
    marked = {g.id for g in registry.guards.values() if g.requires_not_applied}
    assert marked == {"evidence.not-applied", "retry.permitted"}
    assert registry.guards["resume.permitted"].implementation == "standard.resume_permitted"


def test_registry_problems_are_reported_alongside_schema_problems(registry: Registry) -> None:
    text = VALID.replace("guard: approval.granted", "guard: approval.maybe").replace(
        "retention_days: 30", "retention_days: thirty"
    )
    report = validate_text(text, registry)
    assert {p.code for p in report.errors} == {Code.GUARD_UNKNOWN, Code.SCHEMA_TYPE}


def test_semantic_finding_on_a_path_with_a_schema_error_is_not_repeated(
    registry: Registry,
) -> None:
    text = VALID.replace("guard: approval.granted", "guard: outcome == found")
    report = validate_text(text, registry)
    assert [p.code for p in report.errors] == [Code.EXEC_EXPRESSION]


def test_a_refusal_message_is_one_line_naming_the_file_the_code_and_what_to_do() -> None:
    problems = [
        Problem(Code.GUARD_UNKNOWN, f"guard g{i} is unknown", Location(file="m.yaml"), "fix it")
        for i in range(7)
    ]
    message = str(MachineInvalid(problems))
    assert "\n" not in message
    assert message.startswith(
        "The recovery machine is invalid and was not loaded; fix each problem listed, then "
        "check it with `recoveryctl validate PATH`: m.yaml: guard-unknown: guard g0 is unknown"
    )
    assert message.endswith("; and 2 more (`recoveryctl validate PATH` lists every one)")
