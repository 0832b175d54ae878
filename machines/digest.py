"""The canonical digest of a machine: the same machine always has the same digest.

Definition (also in docs/machine-format.md): parse RECOVERY.yaml with the plain-data reader
(`machines.yamlsafe`), serialise the resulting value as canonical JSON (keys sorted at every
level, no insignificant whitespace (`,` and `:` separators), non-ASCII characters written as
UTF-8 rather than escaped, no NaN or infinity), and take SHA-256 of those bytes. The digest
is written `sha256:` followed by 64 lowercase hex digits.

Comments, key order, quoting style and indentation of the YAML therefore do not change the
digest; any change of a value, key or list order does.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of a plain-data value (see module docstring)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def digest_of(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `value`."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
