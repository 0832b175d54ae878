"""Property tests: machines generated from the format's grammar, and arbitrary text, either
validate or are refused with coded problems. The loader never raises anything else, and a
valid machine's digest does not depend on how its YAML is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from machines import Registry, ValidationReport, load_machine, load_registry
from machines.errors import Code, MachineInvalid
from machines.loader import validate_text

REGISTRY: Registry = load_registry()
GUARDS = sorted(REGISTRY.guards)
CAPABILITIES = sorted(REGISTRY.capabilities)
EVENTS = ["TOOL_TIMEOUT", "VERIFICATION_FOUND", "VERIFICATION_NOT_FOUND", "HUMAN_APPROVED"]
STATE_NAMES = ["start", "verifying", "retrying", "escalated", "resume-pending", "done"]

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=12),
    st.lists(st.text(max_size=4), max_size=2),
)
state_ref = st.one_of(st.sampled_from(STATE_NAMES), st.text(max_size=8))
guard_ref = st.one_of(
    st.sampled_from(GUARDS), st.sampled_from(["outcome == found", "x.y", "Bad Guard"]), junk
)
capability_ref = st.one_of(st.sampled_from(CAPABILITIES), st.text(max_size=10))
params = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "queue": st.sampled_from(["ops", "https://x.example", "{{q}}"]),
            "severity": st.sampled_from(["low", "high", "urgent"]),
        }
    ),
    st.dictionaries(st.text(max_size=6), junk, max_size=2),
)
action = st.one_of(
    capability_ref,
    st.fixed_dictionaries({"capability": capability_ref}, optional={"params": params}),
    junk,
)
transition = st.fixed_dictionaries(
    {"target": state_ref},
    optional={"guard": guard_ref, "actions": st.lists(action, max_size=3), "cond": junk},
)
state = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["final", "atomic", "parallel", "bogus"]),
        "entry": st.lists(action, max_size=2),
        "on": st.dictionaries(
            st.one_of(st.sampled_from(EVENTS), st.text(max_size=6)),
            st.one_of(transition, st.lists(transition, min_size=1, max_size=3), junk),
            max_size=3,
        ),
        "states": st.just({"inner": {"type": "final"}}),
    },
)
machine = st.fixed_dictionaries(
    {
        "name": st.one_of(st.just("generated-machine"), junk),
        "description": st.one_of(st.just("generated"), junk),
        "version": st.one_of(st.just("1.0.0"), junk),
        "spec_version": st.sampled_from(["agent-recovery/0.2", "agent-recovery/0.2", "0.1", 2]),
        "applies_to": st.one_of(
            st.just({"capabilities": ["procurement.create-request"]}),
            st.dictionaries(st.sampled_from(["capabilities", "tools", "x"]), junk, max_size=2),
        ),
        "initial": state_ref,
        "states": st.one_of(
            st.dictionaries(st.sampled_from(STATE_NAMES), state, min_size=1, max_size=6), junk
        ),
        "audit": st.one_of(st.just({"retention_days": 30}), junk),
    }
)
maybe_missing = machine.flatmap(
    lambda m: st.sets(st.sampled_from(sorted(m)), max_size=2).map(
        lambda drop: {k: v for k, v in m.items() if k not in drop}
    )
)

PARAMLESS = sorted(
    c.id
    for c in REGISTRY.capabilities.values()
    if Draft202012Validator(dict(c.params_schema)).is_valid({})
)


@st.composite
def grammatical_machine(draw: st.DrawFn) -> dict[str, Any]:
    """A machine that follows the grammar: real state names, registered ids, one final
    state. Many validate; some break semantic rules (retry guards, default order)."""
    names = draw(st.lists(st.sampled_from(STATE_NAMES[:-1]), min_size=1, max_size=5, unique=True))
    targets = [*names, "done"]

    def transition() -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries(
            {"target": st.sampled_from(targets)},
            optional={
                "guard": st.sampled_from(GUARDS),
                "actions": st.lists(st.sampled_from(PARAMLESS), max_size=2),
            },
        )

    states: dict[str, Any] = {"done": {"type": "final"}}
    for name in names:
        on = draw(
            st.dictionaries(
                st.sampled_from(EVENTS),
                st.one_of(transition(), st.lists(transition(), min_size=1, max_size=3)),
                min_size=1,
                max_size=3,
            )
        )
        states[name] = {"on": on}
    return {
        "name": "generated-machine",
        "description": "generated from the grammar",
        "version": "1.0.0",
        "spec_version": "agent-recovery/0.2",
        "applies_to": {"capabilities": ["procurement.create-request"]},
        "initial": names[0],
        "states": states,
        "audit": {"retention_days": 30},
    }


any_machine = st.one_of(grammatical_machine(), maybe_missing)


def _assert_coded(report: ValidationReport) -> None:
    if report.valid:
        assert report.machine is not None
        assert report.errors == ()
        assert report.digest == report.machine.digest
    else:
        assert report.machine is None
        assert report.errors
        assert all(isinstance(p.code, Code) and p.message for p in report.errors)
    json.dumps(report.as_dict())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=any_machine)
def test_generated_machine_validates_or_is_refused_with_coded_problems(
    document: dict[str, Any],
) -> None:
    text = yaml.safe_dump(document, sort_keys=False)
    _assert_coded(validate_text(text, REGISTRY))


@settings(max_examples=100, deadline=None)
@given(document=any_machine, flow=st.booleans())
def test_valid_machine_digest_does_not_depend_on_yaml_layout(
    document: dict[str, Any], flow: bool
) -> None:
    block = validate_text(yaml.safe_dump(document, sort_keys=True), REGISTRY)
    other = validate_text(
        yaml.safe_dump(document, sort_keys=False, default_flow_style=flow, width=60), REGISTRY
    )
    assert block.valid == other.valid
    assert block.digest == other.digest


yaml_tokens = st.sampled_from(
    ["a", ":", " ", "\n", "  ", "- ", "[", "]", "{", "}", ",", "&x ", "*x", "!!str ", "!t ",
     "---\n", "...\n", "'", '"', "#", "|\n", ">\n", "on", "yes", "1e999", "0x1F", "09",
     "2024-01-01", "<<: ", "~", "\t", "%YAML 1.1\n", "? ", "\\", "\x00", "\ufeff", "é"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(text=st.lists(yaml_tokens, max_size=40).map("".join))
def test_yaml_like_text_never_raises_anything_but_coded_problems(text: str) -> None:
    _assert_coded(validate_text(text, REGISTRY))


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    _assert_coded(validate_text(raw, REGISTRY))


@settings(max_examples=50, deadline=None)
@given(document=any_machine)
def test_load_machine_raises_only_machine_invalid(
    document: dict[str, Any], tmp_path_factory: Any
) -> None:
    folder: Path = tmp_path_factory.mktemp("generated-machine")
    (folder / "RECOVERY.yaml").write_text(yaml.safe_dump(document))
    expected = validate_text((folder / "RECOVERY.yaml").read_bytes(), REGISTRY)
    if expected.valid:
        assert load_machine(folder, REGISTRY).digest == expected.digest
    else:
        with pytest.raises(MachineInvalid) as caught:
            load_machine(folder, REGISTRY)
        assert {p.code for p in caught.value.problems} == {p.code for p in expected.errors}
