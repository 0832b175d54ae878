"""Read a YAML file as plain data, or refuse it with a coded problem.

Machines and registries are security-sensitive supply-chain artifacts (SPEC §12), so the
reader accepts only the subset of YAML that is plain JSON-like data:

- the size is checked before any parsing, so a 50 MB file costs one `stat`;
- tags (`!!python/object`, `!custom`), anchors and aliases are refused at the event level,
  before anything is constructed, so an alias bomb never expands;
- nesting depth and node count are bounded while composing, so deep nesting is refused
  before PyYAML's recursive composer can exhaust the stack;
- duplicate keys are refused (PyYAML silently keeps the last one);
- exactly one document; keys must be strings; only YAML 1.2 core booleans (`true`/`false`),
  so the `on:` key of a state stays the string "on" instead of becoming `True`;
- no timestamps, no merge keys, no NaN or infinity: the result must survive canonical JSON.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    NodeEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from machines.errors import Code, Location, Problem

MAX_BYTES = 256 * 1024
"""A machine is a few kilobytes; anything this large is a mistake or an attack."""
MAX_DEPTH = 24
MAX_NODES = 10_000

Paths = dict[str, int]


class _Refusal(Exception):
    """Internal: raised inside the loader to stop at the first disallowed construct."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _PlainResolver(BaseResolver):
    """YAML 1.2 core-schema-like implicit types: null, true/false, int, float; nothing else."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 - PyYAML's class-level table


_PlainResolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_PlainResolver.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]{0,17})$"), list("-+0123456789")
)
_PlainResolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$"
    ),
    list("-+0123456789."),
)
_PlainResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)


class _PlainLoader(Reader, Scanner, Parser, Composer, SafeConstructor, _PlainResolver):
    """A SafeLoader variant that refuses everything that is not plain data (see module doc)."""

    def __init__(self, text: str, file: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        _PlainResolver.__init__(self)
        self._file = file
        self._depth = 0
        self._nodes = 0

    def _refuse(self, code: Code, message: str, hint: str, event: Any) -> _Refusal:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        return _Refusal(Problem(code, message, Location(file=self._file, line=line), hint))

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        """Check each node event before PyYAML composes it: no alias, anchor or tag,
        bounded depth and count."""
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            raise self._refuse(
                Code.YAML_ALIAS,
                f"alias *{event.anchor} refused: machines must be plain data",
                "write the value out in full; anchors and aliases are not allowed",
                event,
            )
        if isinstance(event, NodeEvent) and event.anchor is not None:
            raise self._refuse(
                Code.YAML_ANCHOR,
                f"anchor &{event.anchor} refused: machines must be plain data",
                "remove the anchor and write each value out in full",
                event,
            )
        tag = getattr(event, "tag", None)
        if tag is not None:
            raise self._refuse(
                Code.YAML_TAG,
                f"YAML tag {tag} refused: machines must be plain data",
                "remove the tag; only untagged strings, numbers, booleans, lists and maps are "
                "allowed",
                event,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise self._refuse(
                Code.YAML_TOO_MANY_NODES,
                f"more than {MAX_NODES} YAML nodes",
                "a machine is small; split or simplify it",
                event,
            )
        if isinstance(event, CollectionStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise self._refuse(
                    Code.YAML_TOO_DEEP,
                    f"nesting deeper than {MAX_DEPTH} levels",
                    "flatten the document; the machine format never nests this deep",
                    event,
                )
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Build a dict, refusing non-string and duplicate keys (PyYAML keeps the last)."""
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                raise _Refusal(
                    Problem(
                        Code.YAML_NON_STRING_KEY,
                        f"mapping key {_short(key_node)} is not a string",
                        Location(file=self._file, line=line),
                        "quote the key; every key must be a string",
                    )
                )
            if key_node.value in seen:
                raise _Refusal(
                    Problem(
                        Code.YAML_DUPLICATE_KEY,
                        f"duplicate key {key_node.value!r} (first on line {seen[key_node.value]})",
                        Location(file=self._file, line=line),
                        "remove one of the two; YAML readers silently keep only the last",
                    )
                )
            seen[key_node.value] = line
        return super().construct_mapping(node, deep=True)


def _short(node: Node) -> str:
    value = node.value if isinstance(node, ScalarNode) else f"<{type(node).__name__}>"
    return repr(value)[:40]


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed YAML document: plain data plus the line of each path, for locations."""

    data: Any
    lines: Paths


def read_bytes(path: Path, file: str) -> bytes | Problem:
    """Read a file after checking its size, so that an oversize file is never read whole."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return Problem(
            Code.FILE_NOT_FOUND,
            f"cannot read {path}: {exc.strerror or exc}",
            Location(file=file),
            "check the path; give a package folder or its RECOVERY.yaml",
        )
    if size > MAX_BYTES:
        return _too_large(size, file)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        return Problem(
            Code.FILE_NOT_FOUND,
            f"cannot read {path}: {exc}",
            Location(file=file),
            "check the file's permissions",
        )
    return _too_large(len(raw), file) if len(raw) > MAX_BYTES else raw


def _too_large(size: int, file: str) -> Problem:
    return Problem(
        Code.FILE_TOO_LARGE,
        f"file is {size} bytes; the limit is {MAX_BYTES}",
        Location(file=file),
        "a machine is a few kilobytes; this is not a machine",
    )


def parse_yaml(raw: bytes | str, file: str) -> Document | Problem:
    """Parse one YAML document of plain data, or return the first problem that refuses it.

    Never raises: every failure of PyYAML is translated into a coded `Problem`.
    """
    # A str has at least one UTF-8 byte per character, so its length alone can refuse it
    # without encoding (and copying) a huge string.
    if len(raw) > MAX_BYTES:
        return _too_large(len(raw), file)
    if isinstance(raw, str) and len(raw.encode("utf-8")) > MAX_BYTES:
        return _too_large(len(raw.encode("utf-8")), file)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Problem(
                Code.FILE_NOT_UTF8,
                f"not UTF-8 at byte {exc.start}",
                Location(file=file),
                "save the file as UTF-8",
            )
    loader: _PlainLoader | None = None
    try:
        # The Reader checks for non-printable characters in its constructor, so the
        # constructor must be inside the translation of YAML errors too.
        loader = _PlainLoader(raw, file)
        return _parse_single(loader, file)
    except _Refusal as refusal:
        return refusal.problem
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        return Problem(
            Code.YAML_SYNTAX,
            f"YAML syntax error: {problem}",
            Location(file=file, line=line),
            "fix the YAML syntax at the given line",
        )
    finally:
        if loader is not None:
            loader.dispose()


def _parse_single(loader: _PlainLoader, file: str) -> Document | Problem:
    peek = loader.peek_event  # PyYAML's Parser is untyped
    loader.get_event()  # type: ignore[no-untyped-call]  # the StreamStartEvent
    if isinstance(peek(), StreamEndEvent):  # type: ignore[no-untyped-call]
        return Problem(
            Code.YAML_EMPTY,
            "the file holds no YAML document",
            Location(file=file),
            "write the machine as one YAML mapping (start from a catalogue machine)",
        )
    node = loader.compose_document()
    event = peek()  # type: ignore[no-untyped-call]
    if node is None:
        return Problem(
            Code.YAML_EMPTY,
            "the file holds no YAML document",
            Location(file=file),
            "write the machine as one YAML mapping (start from a catalogue machine)",
        )
    if not isinstance(event, StreamEndEvent):
        mark = event.start_mark if isinstance(event, DocumentStartEvent) else None
        line = mark.line + 1 if mark is not None else None
        return Problem(
            Code.YAML_MULTIPLE_DOCUMENTS,
            "more than one YAML document in the file",
            Location(file=file, line=line),
            "keep exactly one document; remove the second '---'",
        )
    data = loader.construct_document(node)
    lines: Paths = {}
    _index_lines(node, "", lines)
    bad = _first_non_json(data, "")
    if bad is not None:
        return Problem(
            Code.YAML_NOT_JSON,
            f"value at {bad or 'top level'} is not finite JSON data (NaN or infinity)",
            Location(file=file, path=bad, line=lines.get(bad)),
            "use a finite number or a string",
        )
    return Document(data, lines)


def _index_lines(node: Node, path: str, lines: Paths) -> None:
    """Remember the 1-based line of each dotted path, so later problems can cite it."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if isinstance(key, ScalarNode):
                child = f"{path}.{key.value}" if path else str(key.value)
                lines.setdefault(child, key.start_mark.line + 1)
                _index_lines(value, child, lines)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, f"{path}[{i}]", lines)


def _first_non_json(value: Any, path: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_non_json(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _first_non_json(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
