"""Each machine of the invalid corpus has one defect and is refused with the expected code
at the expected location. The expectation is the file's comment header:

    # expect-code: guard-unknown
    # expect-path: states.escalated.on.HUMAN_APPROVED[0].guard
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from machines import Registry, load_machine, load_registry, validate_path
from machines.errors import Code, MachineInvalid

CORPUS = Path(__file__).parent / "invalid"
FILES = sorted(CORPUS.glob("*.yaml"))


def _expectation(path: Path) -> tuple[Code, str]:
    head = path.read_bytes()[:400].decode("ascii", errors="replace")
    code = re.search(r"^# expect-code: (\S+)$", head, re.MULTILINE)
    where = re.search(r"^# expect-path: ?(\S*)$", head, re.MULTILINE)
    assert code is not None, f"{path.name} has no expect-code header"
    assert where is not None, f"{path.name} has no expect-path header"
    return Code(code.group(1)), where.group(1)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def test_corpus_has_at_least_forty_machines_covering_many_codes() -> None:
    assert len(FILES) >= 40
    assert len({_expectation(f)[0] for f in FILES}) >= 35


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_invalid_machine_is_refused_with_expected_code_at_expected_location(
    path: Path, registry: Registry
) -> None:
    code, where = _expectation(path)
    report = validate_path(path, registry)
    assert not report.valid
    assert report.machine is None
    assert {p.code for p in report.errors} == {code}, [str(p) for p in report.errors]
    matching = [p for p in report.errors if p.code is code]
    assert where in [p.location.path for p in matching]
    for problem in matching:
        assert problem.hint, f"{code} has no hint"
        assert problem.location.file.endswith(path.name)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_load_machine_raises_machine_invalid_carrying_the_expected_code(
    path: Path, registry: Registry
) -> None:
    code, _ = _expectation(path)
    with pytest.raises(MachineInvalid) as caught:
        load_machine(path, registry)
    assert code in caught.value.codes
    assert code.value in str(caught.value)
