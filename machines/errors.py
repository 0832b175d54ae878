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
    """Stable problem codes. Operators and tests key on these, so never rename one."""

    # Reading the file (machines/yamlsafe.py)
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    FILE_TOO_LARGE = "FILE_TOO_LARGE"
    FILE_NOT_UTF8 = "FILE_NOT_UTF8"
    YAML_SYNTAX = "YAML_SYNTAX"
    YAML_EMPTY = "YAML_EMPTY"
    YAML_MULTIPLE_DOCUMENTS = "YAML_MULTIPLE_DOCUMENTS"
    YAML_TAG = "YAML_TAG"
    YAML_ANCHOR = "YAML_ANCHOR"
    YAML_ALIAS = "YAML_ALIAS"
    YAML_DUPLICATE_KEY = "YAML_DUPLICATE_KEY"
    YAML_NON_STRING_KEY = "YAML_NON_STRING_KEY"
    YAML_TOO_DEEP = "YAML_TOO_DEEP"
    YAML_TOO_MANY_NODES = "YAML_TOO_MANY_NODES"
    YAML_NOT_JSON = "YAML_NOT_JSON"
    # Version (SPEC §13)
    SPEC_VERSION_0_1 = "SPEC_VERSION_0_1"
    SPEC_VERSION_UNSUPPORTED = "SPEC_VERSION_UNSUPPORTED"
    # JSON Schema (machines/recovery-machine.schema.json)
    SCHEMA_REQUIRED = "SCHEMA_REQUIRED"
    SCHEMA_UNKNOWN_FIELD = "SCHEMA_UNKNOWN_FIELD"
    SCHEMA_TYPE = "SCHEMA_TYPE"
    SCHEMA_PATTERN = "SCHEMA_PATTERN"
    SCHEMA_ENUM = "SCHEMA_ENUM"
    SCHEMA_VIOLATION = "SCHEMA_VIOLATION"
    STATE_COMPOUND_RESERVED = "STATE_COMPOUND_RESERVED"
    # Structure
    INITIAL_NOT_A_STATE = "INITIAL_NOT_A_STATE"
    TARGET_NOT_A_STATE = "TARGET_NOT_A_STATE"
    FINAL_STATE_ACTS = "FINAL_STATE_ACTS"
    NO_FINAL_STATE = "NO_FINAL_STATE"
    UNGUARDED_NOT_LAST = "UNGUARDED_NOT_LAST"
    MULTIPLE_UNGUARDED = "MULTIPLE_UNGUARDED"
    UNREACHABLE_STATE = "UNREACHABLE_STATE"
    DEAD_END_STATE = "DEAD_END_STATE"
    PACKAGE_NAME_MISMATCH = "PACKAGE_NAME_MISMATCH"
    # Executable content (SPEC §6.3-6.4, CONFORMANCE L1.4)
    EXEC_EXPRESSION = "EXEC_EXPRESSION"
    EXEC_SHELL = "EXEC_SHELL"
    EXEC_SCRIPT = "EXEC_SCRIPT"
    EXEC_TEMPLATE = "EXEC_TEMPLATE"
    EXEC_PROMPT = "EXEC_PROMPT"
    EXEC_CREDENTIAL = "EXEC_CREDENTIAL"
    DESTINATION_NOT_STATIC = "DESTINATION_NOT_STATIC"
    # Registry resolution
    GUARD_UNKNOWN = "GUARD_UNKNOWN"
    ACTION_UNKNOWN = "ACTION_UNKNOWN"
    ACTION_PARAMS_INVALID = "ACTION_PARAMS_INVALID"
    # Safety (CONFORMANCE L1.5)
    RETRY_WITHOUT_NOT_APPLIED_GUARD = "RETRY_WITHOUT_NOT_APPLIED_GUARD"
    RETRY_IN_ENTRY = "RETRY_IN_ENTRY"
    # Registry file
    REGISTRY_INVALID = "REGISTRY_INVALID"
    # Selecting the machine of an operation (applies_to, SPEC §8 step 2)
    NO_MACHINE_APPLIES = "NO_MACHINE_APPLIES"
    APPLIES_TO_OVERLAP = "APPLIES_TO_OVERLAP"
    # Pinning and provenance (SPEC §8.1, §12)
    LOCK_INVALID = "LOCK_INVALID"
    PIN_MISSING = "PIN_MISSING"
    PIN_DIGEST_MISMATCH = "PIN_DIGEST_MISMATCH"
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    SIGNATURE_MALFORMED = "SIGNATURE_MALFORMED"
    PUBLISHER_MISMATCH = "PUBLISHER_MISMATCH"
    PUBLISHER_UNTRUSTED = "PUBLISHER_UNTRUSTED"
    TRUST_CONFIG_INVALID = "TRUST_CONFIG_INVALID"


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
    """A recovery machine, registry, lock or signature was refused; see `problems`."""

    def __init__(self, problems: tuple[Problem, ...] | list[Problem], message: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        head = message or (self.__doc__ or "").strip()
        detail = "; ".join(str(p) for p in self.problems[:5])
        more = len(self.problems) - 5
        if more > 0:
            detail += f"; and {more} more"
        super().__init__(f"{head}: {detail}" if detail else head)

    @property
    def codes(self) -> tuple[Code, ...]:
        """The codes of every problem, in the order they were found."""
        return tuple(p.code for p in self.problems)


class MachineInvalid(MachineError):
    """The recovery machine is invalid and was not loaded."""


class RegistryInvalid(MachineError):
    """The administrator registry is invalid and was not loaded."""


class ProvenanceError(MachineError):
    """The machine's pin or publisher signature could not be verified; it was not loaded."""
