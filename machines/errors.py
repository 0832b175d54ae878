"""Coded problems and the single exception family of the `machines` package.

Every refusal of a machine, registry, lock file or signature is a `Problem`: a stable
code (documented in docs/machine-format.md), a message that names the ids involved, a
location (file, state, event, transition index, field) and a hint that says what to do.
Loading reports every problem at once, so the exceptions carry a tuple of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    """An error refuses the machine; a warning is reported but does not."""

    ERROR = "error"
    WARNING = "warning"


class Code(StrEnum):
    """Stable problem codes, kebab-case like every refusal, notice and dead-letter reason
    code the controller stores or publishes. Operators and tests key on the values, so
    never rename one."""

    # Reading the file (machines/yamlsafe.py)
    FILE_NOT_FOUND = "file-not-found"
    FILE_TOO_LARGE = "file-too-large"
    FILE_NOT_UTF8 = "file-not-utf8"
    YAML_SYNTAX = "yaml-syntax"
    YAML_EMPTY = "yaml-empty"
    YAML_MULTIPLE_DOCUMENTS = "yaml-multiple-documents"
    YAML_TAG = "yaml-tag"
    YAML_ANCHOR = "yaml-anchor"
    YAML_ALIAS = "yaml-alias"
    YAML_DUPLICATE_KEY = "yaml-duplicate-key"
    YAML_NON_STRING_KEY = "yaml-non-string-key"
    YAML_TOO_DEEP = "yaml-too-deep"
    YAML_TOO_MANY_NODES = "yaml-too-many-nodes"
    YAML_NOT_JSON = "yaml-not-json"
    # Version (SPEC §13)
    SPEC_VERSION_0_1 = "spec-version-0-1"
    SPEC_VERSION_UNSUPPORTED = "spec-version-unsupported"
    # JSON Schema (machines/recovery-machine.schema.json)
    SCHEMA_REQUIRED = "schema-required"
    SCHEMA_UNKNOWN_FIELD = "schema-unknown-field"
    SCHEMA_TYPE = "schema-type"
    SCHEMA_PATTERN = "schema-pattern"
    SCHEMA_ENUM = "schema-enum"
    SCHEMA_VIOLATION = "schema-violation"
    STATE_COMPOUND_RESERVED = "state-compound-reserved"
    # Structure
    INITIAL_NOT_A_STATE = "initial-not-a-state"
    TARGET_NOT_A_STATE = "target-not-a-state"
    PRODUCERS_EVENT_UNKNOWN = "producers-event-unknown"
    FINAL_STATE_ACTS = "final-state-acts"
    NO_FINAL_STATE = "no-final-state"
    UNGUARDED_NOT_LAST = "unguarded-not-last"
    MULTIPLE_UNGUARDED = "multiple-unguarded"
    UNREACHABLE_STATE = "unreachable-state"
    DEAD_END_STATE = "dead-end-state"
    PACKAGE_NAME_MISMATCH = "package-name-mismatch"
    # Executable content (SPEC §6.3-6.4, CONFORMANCE L1.4)
    EXEC_EXPRESSION = "exec-expression"
    EXEC_SHELL = "exec-shell"
    EXEC_SCRIPT = "exec-script"
    EXEC_TEMPLATE = "exec-template"
    EXEC_PROMPT = "exec-prompt"
    EXEC_CREDENTIAL = "exec-credential"
    DESTINATION_NOT_STATIC = "destination-not-static"
    # Registry resolution
    GUARD_UNKNOWN = "guard-unknown"
    ACTION_UNKNOWN = "action-unknown"
    ACTION_PARAMS_INVALID = "action-params-invalid"
    # Safety (CONFORMANCE L1.5)
    RETRY_WITHOUT_NOT_APPLIED_GUARD = "retry-without-not-applied-guard"
    RETRY_IN_ENTRY = "retry-in-entry"
    # Registry file
    REGISTRY_INVALID = "registry-invalid"
    # Selecting the machine of an operation (applies_to, SPEC §8 step 2)
    NO_MACHINE_APPLIES = "no-machine-applies"
    APPLIES_TO_OVERLAP = "applies-to-overlap"
    # Pinning and provenance (SPEC §8.1, §12)
    LOCK_INVALID = "lock-invalid"
    PIN_MISSING = "pin-missing"
    PIN_DIGEST_MISMATCH = "pin-digest-mismatch"
    SIGNATURE_MISSING = "signature-missing"
    SIGNATURE_INVALID = "signature-invalid"
    SIGNATURE_MALFORMED = "signature-malformed"
    PUBLISHER_MISMATCH = "publisher-mismatch"
    PUBLISHER_UNTRUSTED = "publisher-untrusted"
    TRUST_CONFIG_INVALID = "trust-config-invalid"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a problem is: the file, then as much of state/event/transition/field as applies.

    `path` is the dotted path into the document (`states.verifying.on.TOOL_TIMEOUT[1].guard`);
    `line` is 1-based when the parser knows it.
    """

    file: str = ""
    path: str = ""
    state: str | None = None
    event: str | None = None
    transition: int | None = None
    field: str | None = None
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form used by `recoveryctl validate --json` (absent parts omitted)."""
        out: dict[str, Any] = {"file": self.file, "path": self.path}
        for key in ("state", "event", "transition", "field", "line"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.path}" if self.path else where


@dataclass(frozen=True, slots=True)
class Problem:
    """One coded finding about a machine, registry, lock or signature."""

    code: Code
    message: str
    location: Location = field(default_factory=Location)
    hint: str = ""
    severity: Severity = Severity.ERROR

    def as_dict(self) -> dict[str, Any]:
        """The JSON form used by `recoveryctl validate --json`."""
        return {
            "code": str(self.code),
            "message": self.message,
            "location": self.location.as_dict(),
            "hint": self.hint,
        }

    def __str__(self) -> str:
        text = f"{self.location}: {self.code}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


class MachineError(Exception):
    """A recovery machine, registry, lock or signature was refused; fix each problem listed
    (each names its file and location)."""

    def __init__(self, problems: tuple[Problem, ...] | list[Problem], message: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        # The class docstring is the default message, on one line and without its full
        # stop, since the problems follow after a colon.
        head = message or " ".join((self.__doc__ or "").split()).rstrip(".")
        detail = "; ".join(str(p) for p in self.problems[:5])
        more = len(self.problems) - 5
        if more > 0:
            detail += f"; and {more} more (`recoveryctl validate PATH` lists every one)"
        super().__init__(f"{head}: {detail}" if detail else head)

    @property
    def codes(self) -> tuple[Code, ...]:
        """The codes of every problem, in the order they were found."""
        return tuple(p.code for p in self.problems)


class MachineInvalid(MachineError):
    """The recovery machine is invalid and was not loaded; fix each problem listed, then
    check it with `recoveryctl validate PATH`."""


class RegistryInvalid(MachineError):
    """The administrator registry is invalid and was not loaded; fix each problem listed,
    then check it with `recoveryctl validate --registry FILE PATH`."""


class ProvenanceError(MachineError):
    """The machine's pin or publisher signature could not be verified and it was not
    loaded; `recoveryctl machines verify PATH` names the failing check."""
