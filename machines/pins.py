"""The pinned machines a controller decides with, several versions of a machine at once.

A lock file may pin more than one version of a machine (a rollout: the new version
beside the old). `Pins` holds what `machines.provenance.load_locked_machines` loaded,
keyed `name@version` like the lock, and answers the three questions the controller asks:

- `current(name)`: the version a *new* operation opens on, the one the lock marks
  current (`LockFile.current`), or the only pinned version of the name;
- `by_digest(digest)`: the machine an *existing* operation is governed by. An operation
  stays on the version it opened under for its whole life (docs/machine-format.md,
  "Rollout"): its view names that version's digest, whatever version a later event
  names, until a signed migration moves it (`machines.migration`);
- `versions(name)`: every pinned version of a name, for intake (an event is admitted
  when any of them could govern it) and for operators (`recoveryctl machines rollout`).

A `Pins` is a read-only mapping of `name@version` to `Machine`, so code that only needs
the pinned set reads it as the dict it always was.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from machines.model import Machine

__all__ = ["Pins"]


class Pins(Mapping[str, Machine]):
    """The pinned machines by `name@version`, with the current version of each name
    (module docstring). `current` maps a name to the version new operations open on; a
    name pinned at one version needs no entry. Raises `ValueError` for a name pinned at
    several versions without a current one, or a current version that is not pinned."""

    __slots__ = ("_by_digest", "_current", "_machines", "_versions")

    def __init__(
        self, machines: Mapping[str, Machine], current: Mapping[str, str] | None = None
    ) -> None:
        self._machines = dict(machines)
        versions: dict[str, list[Machine]] = {}
        for machine in self._machines.values():
            versions.setdefault(machine.name, []).append(machine)
        self._versions = {name: tuple(found) for name, found in versions.items()}
        self._by_digest = {m.digest: m for m in self._machines.values()}
        chosen: dict[str, Machine] = {}
        for name, version in (current or {}).items():
            marked = self._machines.get(f"{name}@{version}")
            if marked is None:
                raise ValueError(
                    f"the current version of {name} is {version}, which is not pinned "
                    f"(pinned: {', '.join(self.refs(name)) or 'none'})"
                )
            chosen[name] = marked
        for name, found in self._versions.items():
            if name in chosen:
                continue
            if len(found) > 1:
                raise ValueError(
                    f"machine {name} is pinned at {len(found)} versions "
                    f"({', '.join(self.refs(name))}) and none is marked current; mark the one "
                    f"new operations open on (`recoveryctl machines promote {name}@VERSION`)"
                )
            chosen[name] = found[0]
        self._current = chosen

    def __getitem__(self, ref: str) -> Machine:
        return self._machines[ref]

    def __iter__(self) -> Iterator[str]:
        return iter(self._machines)

    def __len__(self) -> int:
        return len(self._machines)

    def __repr__(self) -> str:
        current = {n: m.version for n, m in self._current.items()}
        return f"Pins({sorted(self._machines)}, current={current})"

    @property
    def names(self) -> tuple[str, ...]:
        """Every pinned machine name, sorted."""
        return tuple(sorted(self._versions))

    def current(self, name: str) -> Machine | None:
        """The version of `name` new operations open on, or None if it is not pinned."""
        return self._current.get(name)

    def current_versions(self) -> dict[str, str]:
        """Each name's current version."""
        return {name: m.version for name, m in sorted(self._current.items())}

    def by_digest(self, digest: str) -> Machine | None:
        """The pinned machine with `digest`, or None (a version the lock no longer pins)."""
        return self._by_digest.get(digest)

    def versions(self, name: str) -> tuple[Machine, ...]:
        """Every pinned version of `name`, in lock order (empty: unknown name)."""
        return self._versions.get(name, ())

    def refs(self, name: str) -> tuple[str, ...]:
        """`name@version` of every pinned version of `name`, sorted."""
        return tuple(sorted(f"{m.name}@{m.version}" for m in self.versions(name)))

    def digests(self) -> frozenset[str]:
        """The digest of every pinned machine."""
        return frozenset(self._by_digest)
