"""Wire contracts: JSON Schemas of RECOVERY.yaml and the administrator registry, and more.

Paths are exported so that loaders read the schema files shipped with the package rather
than a copy.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
RECOVERY_MACHINE_SCHEMA = SCHEMA_DIR / "recovery-machine.schema.json"
REGISTRY_SCHEMA = SCHEMA_DIR / "registry.schema.json"

__all__ = ["RECOVERY_MACHINE_SCHEMA", "REGISTRY_SCHEMA", "SCHEMA_DIR"]
