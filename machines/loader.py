"""Load a machine package (SPEC §4) into a frozen `Machine`, or report every problem.

`validate_path` never raises: it returns a `ValidationReport` with the digest, errors and
warnings, for `recoveryctl validate`. `load_machine` is the strict form used by the
controller and tests: it returns the `Machine` or raises `MachineInvalid`, and nothing else,
whatever the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machines.digest import digest_of
from machines.errors import Code, Location, MachineInvalid, Problem, Severity
from machines.model import Machine, Registry
from machines.validation import build_machine, check_document
from machines.yamlsafe import parse_yaml, read_bytes

MACHINE_FILE = "RECOVERY.yaml"
GUIDE_FILE = "RECOVERY.md"
CATALOGUE = Path(__file__).resolve().parent / "catalogue"
"""The example machine packages shipped with the controller."""


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """The outcome of validating one path: the machine when valid, every problem otherwise."""

    path: str
    machine: Machine | None
    name: str | None
    version: str | None
    digest: str | None
    errors: tuple[Problem, ...]
    warnings: tuple[Problem, ...]

    @property
    def valid(self) -> bool:
        """True when there is no error (warnings do not refuse a machine)."""
        return not self.errors and self.machine is not None

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of `recoveryctl validate --json`."""
        return {
            "path": self.path,
            "valid": self.valid,
            "name": self.name,
            "version": self.version,
            "digest": self.digest,
            "errors": [p.as_dict() for p in self.errors],
            "warnings": [p.as_dict() for p in self.warnings],
        }


def _refused(path: str, problems: list[Problem], data: Any = None) -> ValidationReport:
    name = version = None
    if isinstance(data, dict):
        name = data["name"] if isinstance(data.get("name"), str) else None
        version = data["version"] if isinstance(data.get("version"), str) else None
    return ValidationReport(
        path=path,
        machine=None,
        name=name,
        version=version,
        digest=None,
        errors=tuple(p for p in problems if p.severity is Severity.ERROR),
        warnings=tuple(p for p in problems if p.severity is Severity.WARNING),
    )


def validate_text(raw: bytes | str, registry: Registry, file: str = "<text>") -> ValidationReport:
    """Validate RECOVERY.yaml content given as bytes or text. Never raises."""
    document = parse_yaml(raw, file)
    if isinstance(document, Problem):
        return _refused(file, [document])
    problems = check_document(document.data, file, document.lines, registry)
    errors = tuple(p for p in problems if p.severity is Severity.ERROR)
    warnings = tuple(p for p in problems if p.severity is Severity.WARNING)
    if errors:
        return _refused(file, list(problems), document.data)
    digest = digest_of(document.data)
    machine = build_machine(document.data, digest)
    return ValidationReport(
        path=file,
        machine=machine,
        name=machine.name,
        version=machine.version,
        digest=digest,
        errors=(),
        warnings=warnings,
    )


def _has_frontmatter(path: Path) -> bool:
    """True when a RECOVERY.md starts with YAML frontmatter, the draft 0.1 contract."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff")
    except OSError:
        return False
    lines = head.splitlines()
    return (
        bool(lines)
        and lines[0].strip() == "---"
        and any(line.strip() in ("---", "...") for line in lines[1:])
    )


def _draft_0_1(guide: Path, has_yaml: bool) -> Problem:
    detail = (
        "the package also has RECOVERY.yaml, but a package must not carry both contracts"
        if has_yaml
        else "there is no RECOVERY.yaml"
    )
    return Problem(
        Code.SPEC_VERSION_0_1,
        f"{guide.name} starts with YAML frontmatter, the draft 0.1 plan format; it is refused, "
        f"never read as 0.2 ({detail})",
        Location(file=str(guide), line=1),
        "port the plan to RECOVERY.yaml with spec_version: agent-recovery/0.2 and remove the "
        "frontmatter from RECOVERY.md",
    )


def _package_files(path: Path) -> tuple[Path, Path | None]:
    """(RECOVERY.yaml path, RECOVERY.md path if this is a package) for a folder or file."""
    if path.is_dir():
        return path / MACHINE_FILE, path / GUIDE_FILE
    if path.name == GUIDE_FILE:
        return path.with_name(MACHINE_FILE), path
    if path.name == MACHINE_FILE:
        return path, path.with_name(GUIDE_FILE)
    return path, None


def validate_path(path: str | Path, registry: Registry) -> ValidationReport:
    """Validate a package folder, its RECOVERY.yaml, or any YAML file. Never raises."""
    path = Path(path)
    machine_file, guide = _package_files(path)
    shown = str(path)
    if guide is not None and guide.is_file() and _has_frontmatter(guide):
        return _refused(shown, [_draft_0_1(guide, machine_file.is_file())])
    raw = read_bytes(machine_file, str(machine_file))
    if isinstance(raw, Problem):
        return _refused(shown, [raw])
    report = validate_text(raw, registry, str(machine_file))
    package = machine_file.parent.name
    if report.valid and guide is not None and report.name != package:
        mismatch = Problem(
            Code.PACKAGE_NAME_MISMATCH,
            f"machine {report.name!r} is in package folder {package!r}",
            Location(file=str(machine_file), path="name"),
            "name the folder after the machine (SPEC §4)",
            Severity.WARNING,
        )
        report = _with_warning(report, mismatch)
    return ValidationReport(
        path=shown,
        machine=report.machine,
        name=report.name,
        version=report.version,
        digest=report.digest,
        errors=report.errors,
        warnings=report.warnings,
    )


def _with_warning(report: ValidationReport, warning: Problem) -> ValidationReport:
    return ValidationReport(
        path=report.path,
        machine=report.machine,
        name=report.name,
        version=report.version,
        digest=report.digest,
        errors=report.errors,
        warnings=(*report.warnings, warning),
    )


def load_machine(path: str | Path, registry: Registry) -> Machine:
    """Load and validate one machine package (folder or RECOVERY.yaml).

    Returns the frozen `Machine` (its `digest` set), or raises `MachineInvalid` carrying
    every error found. Raises nothing else, whatever the file holds.
    """
    report = validate_path(path, registry)
    if report.machine is None:
        raise MachineInvalid(report.errors, f"machine {path} was refused")
    return report.machine


def catalogue_packages(root: Path = CATALOGUE) -> Iterator[Path]:
    """The package folders of a catalogue (each holding a RECOVERY.yaml), sorted by name."""
    for child in sorted(root.iterdir()):
        if (child / MACHINE_FILE).is_file():
            yield child


def load_catalogue(registry: Registry, root: Path = CATALOGUE) -> dict[str, Machine]:
    """Every machine of a catalogue by name; raises `MachineInvalid` on the first bad one."""
    return {m.name: m for m in (load_machine(p, registry) for p in catalogue_packages(root))}
