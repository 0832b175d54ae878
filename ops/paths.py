"""Where the local stack keeps jars, state and data.

Two places, on purpose apart: the jar cache lives outside the repository so a fresh
clone (or CI) reuses it, and the runtime state lives beside the checkout (`.stack/`,
gitignored) so that two checkouts never share a database by accident.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ops.settings import StackSettings

__all__ = [
    "PRIVATE",
    "TRAVERSABLE",
    "cache_dir",
    "ensure_dir",
    "others_can_traverse",
    "private_dir",
    "repo_root",
    "stack_dir",
]

# The modes of the stack's folders: data, logs and secrets are the owner's alone; a
# folder the unprivileged PostgreSQL user must pass through may be traversed, not listed.
PRIVATE = 0o700
TRAVERSABLE = 0o711

# The fallback for runtime state when root runs from a checkout that an unprivileged
# user cannot reach (e.g. under /root, mode 0700): PostgreSQL must run as that user.
_SHARED_RUNTIME_BASE = Path("/var/tmp")


def repo_root() -> Path:
    """The checkout this code runs from: the folder above `ops/` when it holds the
    project's `pyproject.toml`, otherwise the current working directory."""
    candidate = Path(__file__).resolve().parent.parent
    if (candidate / "pyproject.toml").is_file():
        return candidate
    return Path.cwd().resolve()


def cache_dir() -> Path:
    """The download cache shared by every checkout on this machine: `$RECOVERY_CACHE_DIR`,
    else `$XDG_CACHE_HOME/agent-recovery`, else `~/.cache/agent-recovery`."""
    settings = StackSettings.load()
    if settings.cache_dir is not None:
        return settings.cache_dir.expanduser().resolve()
    xdg = settings.xdg_cache_home
    base = xdg.expanduser() if xdg else Path.home() / ".cache"
    return (base / "agent-recovery").resolve()


def stack_dir(root: Path | None = None) -> Path:
    """Where the running stack keeps its state file and data: `$RECOVERY_STACK_DIR`, else
    `<checkout>/.stack` (the checkout is `root`, default `repo_root()`). When root runs
    from a checkout an unprivileged user cannot traverse, it is a per-checkout folder
    under /var/tmp instead, so that PostgreSQL (run as that user) can reach it."""
    explicit = StackSettings.load().stack_dir
    if explicit is not None:
        return explicit.expanduser().resolve()
    root = (root or repo_root()).resolve()
    if os.geteuid() == 0 and not others_can_traverse(root):
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
        return _SHARED_RUNTIME_BASE / f"agent-recovery-{digest}"
    return root / ".stack"


def others_can_traverse(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can reach `path`: every
    folder from / down to it must have the others-execute bit."""
    current = path.resolve()
    for folder in (current, *current.parents):
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            continue  # created later by ensure_dir with mode 0755
        if not mode & stat.S_IXOTH:
            return False
    return True


def ensure_dir(path: Path, mode: int = 0o755) -> Path:
    """Create `path` and any missing parents with `mode` (not filtered by the umask, so
    an unprivileged service user can traverse them); return it."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(mode)
    return path


def private_dir(path: Path, mode: int = PRIVATE) -> Path:
    """`path` created (with its parents) or kept, and set to `mode` whatever it was: a
    folder made readable by an older version is closed again."""
    ensure_dir(path, mode)
    path.chmod(mode)
    return path
