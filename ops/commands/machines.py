"""`recoveryctl machines lock|sign|verify|keygen|promote|rollout|retire`: pin and sign
machines (SPEC §8.1, §12), and roll a new version out beside the old one.

- `lock PATH... --lock FILE --publisher ID` validates each machine and pins
  `name@version` to its digest and publisher in the lock file (other pins are kept). A
  lock may pin several versions of a machine; the one new operations open on is its
  *current* version. Locking a new version of a pinned machine keeps the current one:
  new operations move to it only when it is promoted.
- `promote NAME@VERSION --lock FILE` makes a pinned version the one new operations open
  on. An operation stays on the version it opened under whatever version later events
  name (docs/operations.md, "Upgrading a machine").
- `rollout` lists, per pinned version (and per version the ledger still holds but the
  lock no longer pins), how many operations are in flight (in a state that is not final)
  and how many finished; it reads the ledger and the controller's lock.
- `retire NAME@VERSION --lock FILE` removes a version from the lock, refused while it is
  the current version or while any operation on it is in flight: migrate each first
  (`recoveryctl ops migrate OP --to VERSION`), or let it finish. A controller given a
  lock without a version its operations run is what strands them.
- `sign PATH... --key PEM --publisher ID` writes RECOVERY.sig, an Ed25519 signature by the
  publisher over the machine's name, version and digest.
- `verify PATH... --lock FILE --trust FILE` loads each machine as the controller does:
  valid, pinned by digest, signed by a trusted publisher; it names the failing check.
- `keygen --out PEM` creates a publisher key and prints the public half for operators.

Exit status: 0 success, 1 a machine failed a check or a retirement was refused, 2 usage
error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import MachineStateCount
from machines import (
    DEFAULT_REGISTRY,
    LockFile,
    MachineError,
    Pins,
    dump_model,
    key_id,
    load_lock,
    load_machine,
    load_pinned_machine,
    load_private_key,
    load_trusted_publishers,
    lock_entry,
    public_key_text,
    sign_machine,
    signature_path,
    write_private_key,
)
from ops.commands.db import add_ledger_options
from ops.commands.validate import load_registry
from ops.context import Context, add_rules_options, register_command, table
from ops.errors import CheckFailed, Refused, UsageError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `machines` subcommand group."""
    parser = subparsers.add_parser(
        "machines",
        help="pin (lock), sign and verify machine packages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="machines_command", metavar="ACTION", required=True)

    lock = sub.add_parser("lock", help="pin name@version to digest and publisher")
    lock.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    lock.add_argument("--lock", type=Path, required=True, metavar="FILE")
    lock.add_argument("--publisher", required=True, metavar="ID")
    register_command(lock, _lock)

    sign = sub.add_parser("sign", help="write RECOVERY.sig with a publisher's Ed25519 key")
    sign.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    sign.add_argument("--key", type=Path, required=True, metavar="PEM")
    sign.add_argument("--publisher", required=True, metavar="ID")
    register_command(sign, _sign)

    verify = sub.add_parser("verify", help="check validity, pin and signature like the controller")
    verify.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    verify.add_argument("--lock", type=Path, required=True, metavar="FILE")
    verify.add_argument("--trust", type=Path, required=True, metavar="FILE")
    register_command(verify, _verify)

    keygen = sub.add_parser("keygen", help="create an Ed25519 publisher key (PEM, mode 0600)")
    keygen.add_argument("--out", type=Path, required=True, metavar="PEM")
    register_command(keygen, _keygen)

    promote = sub.add_parser("promote", help="make a pinned version the one new operations open on")
    promote.add_argument("ref", metavar="NAME@VERSION")
    promote.add_argument("--lock", type=Path, required=True, metavar="FILE")
    register_command(promote, _promote)

    rollout = sub.add_parser("rollout", help="operations in flight per machine version")
    add_ledger_options(rollout, json_help="print the versions as JSON")
    add_rules_options(rollout)
    register_command(rollout, _rollout)

    retire = sub.add_parser("retire", help="unpin a version no operation is in flight on")
    retire.add_argument("ref", metavar="NAME@VERSION")
    add_ledger_options(retire, json_help="print the result as JSON")
    add_rules_options(retire)
    register_command(retire, _retire)

    for child in (lock, sign, verify):
        child.add_argument("--registry", type=Path, default=DEFAULT_REGISTRY, metavar="FILE")
    for child in (lock, sign, verify, keygen, promote):
        child.add_argument("--json", action="store_true", help="print JSON")


def _emit(ctx: Context, payload: object, text: str) -> None:
    if ctx.json:
        ctx.print_json(payload)
    else:
        ctx.say(text)


def _lock(ctx: Context) -> int:
    """Validate each machine and write its pin into the lock file (atomically)."""
    args = ctx.args
    registry = load_registry(args.registry)
    try:
        lock = load_lock(args.lock) if args.lock.exists() else LockFile(lock_version=1)
        entries = dict(lock.machines)
        for path in args.paths:
            machine = load_machine(path, registry)
            entry = lock_entry(machine, args.publisher, path, args.lock.parent)
            entries[f"{machine.name}@{machine.version}"] = entry
    except MachineError as exc:
        raise CheckFailed(str(exc)) from exc
    updated = LockFile(
        lock_version=1,
        machines=dict(sorted(entries.items())),
        current=_kept_current(lock, entries),
    )
    _write_lock(args.lock, updated)
    pins = {k: v.digest for k, v in updated.machines.items()}
    lines = [f"pinned {k} {v}" for k, v in pins.items()]
    lines += [f"current {n}@{v}" for n, v in sorted(updated.current.items())]
    _emit(ctx, pins, "\n".join(lines))
    return 0


def _kept_current(lock: LockFile, entries: dict[str, Any]) -> dict[str, str]:
    """The current versions after locking: each name keeps the version new operations
    opened on before (the only one it had, or its marked one); a name seen for the first
    time at several versions gets the first, until one is promoted."""
    current: dict[str, str] = {}
    for entry in entries.values():
        before = lock.current_version(entry.name)
        current.setdefault(entry.name, before or entry.version)
    # A name pinned at one version needs no mark: keep the file as it was before rollouts.
    counts: dict[str, int] = {}
    for entry in entries.values():
        counts[entry.name] = counts.get(entry.name, 0) + 1
    return {n: v for n, v in sorted(current.items()) if counts[n] > 1 or n in lock.current}


def _write_lock(path: Path, lock: LockFile) -> None:
    """Write `lock` to `path` atomically (a controller reading it sees old or new)."""
    problem = lock.problem()
    if problem is not None:
        raise UsageError(f"{path}: {problem}")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dump_model(lock), encoding="utf-8")
    tmp.replace(path)


def _split(ref: str) -> tuple[str, str]:
    name, sep, version = ref.partition("@")
    if not sep or not name or not version:
        raise UsageError(f"{ref!r} is not NAME@VERSION")
    return name, version


def _promote(ctx: Context) -> int:
    """Mark a pinned version as the one new operations open on."""
    args = ctx.args
    name, version = _split(args.ref)
    lock = _load_lock(args.lock)
    if lock.entry(name, version) is None:
        raise UsageError(
            f"{args.lock}: {args.ref} is not pinned (pinned: "
            f"{', '.join(sorted(lock.machines)) or 'none'}); lock it first"
        )
    before = lock.current_version(name)
    _write_lock(args.lock, lock.model_copy(update={"current": {**lock.current, name: version}}))
    _emit(
        ctx,
        {"name": name, "current": version, "before": before},
        f"current {name}@{version} (was {before}); reload or restart the controllers to "
        "open new operations on it",
    )
    return 0


def _load_lock(path: Path) -> LockFile:
    try:
        return load_lock(path)
    except MachineError as exc:
        raise UsageError(str(exc)) from exc


def rollout_rows(pins: Pins, counts: Sequence[MachineStateCount]) -> list[dict[str, Any]]:
    """Per machine version, pinned or still held by operations in the ledger: whether it
    is pinned and current, how many operations are in flight (a state the version does
    not mark final; every operation of a version that is not pinned, whose final states
    this lock cannot tell) and how many finished, by state."""
    rows: dict[str, dict[str, Any]] = {}
    for ref in sorted(pins):
        machine = pins[ref]
        current = pins.current(machine.name)
        rows[machine.digest] = _row(
            machine.name,
            machine.version,
            machine.digest,
            pinned=True,
            current=current is not None and current.digest == machine.digest,
        )
    for count in counts:
        row = rows.get(count.machine_digest)
        if row is None:
            row = rows[count.machine_digest] = _row(
                count.machine_name,
                count.machine_version,
                count.machine_digest,
                pinned=False,
                current=False,
            )
        final = _is_final(pins, count.machine_digest, count.state)
        row["finished" if final else "in_flight"] += count.operations
        row["states"][count.state] = row["states"].get(count.state, 0) + count.operations
    return sorted(rows.values(), key=lambda r: (r["name"], r["version"], r["digest"]))


def _row(name: str, version: str, digest: str, *, pinned: bool, current: bool) -> dict[str, Any]:
    return {
        "name": name,
        "version": version,
        "digest": digest,
        "pinned": pinned,
        "current": current,
        "in_flight": 0,
        "finished": 0,
        "states": {},
    }


def _rollout(ctx: Context) -> int:
    """Print operations in flight per machine version; 0 printed. Reads no policy."""
    rows = rollout_rows(ctx.machines.machines, ctx.inspector().machine_states())
    if ctx.json:
        ctx.print_json({"versions": rows})
        return 0
    ctx.say(
        table(
            ("machine", "pinned", "in flight", "finished", "states", "digest"),
            [
                (
                    f"{r['name']}@{r['version']}",
                    ("current" if r["current"] else "yes") if r["pinned"] else "NO: stranded",
                    r["in_flight"],
                    r["finished"],
                    ", ".join(f"{s} {n}" for s, n in sorted(r["states"].items())) or None,
                    r["digest"],
                )
                for r in rows
            ],
        )
    )
    return 0


def _retire(ctx: Context) -> int:
    """Unpin NAME@VERSION when no operation on it is in flight; see the module doc."""
    args = ctx.args
    name, version = _split(args.ref)
    # The file is edited: name it, never a default (the shipped catalogue's lock).
    path: Path = ctx.require(args.lock, "retire edits a lock file: pass --lock FILE")
    lock = _load_lock(path)
    entry = lock.entry(name, version)
    if entry is None:
        raise UsageError(f"{path}: {args.ref} is not pinned")
    if lock.current_version(name) == version and len(lock.versions(name)) > 1:
        raise Refused(
            f"{args.ref} is the version new operations open on; promote another first "
            f"(`recoveryctl machines promote {name}@VERSION --lock {path}`)"
        )
    in_flight = [
        op.operation_id
        for op in ctx.inspector().operations(machine=name, machine_version=version, limit=100_000)
        if not _is_final(ctx.machines.machines, op.machine_digest, op.state)
    ]
    if in_flight:
        shown = ", ".join(in_flight[:10]) + (" ..." if len(in_flight) > 10 else "")
        raise Refused(
            f"{args.ref} still governs {len(in_flight)} operation(s) in flight ({shown}); "
            "retiring it would strand them: migrate each (`recoveryctl ops migrate OP --to "
            "VERSION --key-file KEY`) or let it finish, then retire again"
        )
    machines = {k: v for k, v in lock.machines.items() if k != f"{name}@{version}"}
    current = {n: v for n, v in lock.current.items() if n != name or v != version}
    remaining = [e.version for e in machines.values() if e.name == name]
    if len(remaining) == 1:
        current.pop(name, None)
    _write_lock(path, LockFile(lock_version=1, machines=machines, current=current))
    _emit(
        ctx,
        {"retired": args.ref, "digest": entry.digest},
        f"retired {args.ref} ({entry.digest}); reload or restart the controllers",
    )
    return 0


def _is_final(pins: Pins, digest: str, state: str) -> bool:
    """Whether `state` is final in the pinned machine `digest` (False when not pinned:
    this lock cannot tell, so the operation counts as in flight)."""
    machine = pins.by_digest(digest)
    return machine is not None and state in machine.states and machine.states[state].final


def _sign(ctx: Context) -> int:
    """Sign each valid machine with the publisher's private key; write RECOVERY.sig."""
    args = ctx.args
    registry = load_registry(args.registry)
    key = load_private_key(args.key)
    signed: dict[str, str] = {}
    try:
        for path in args.paths:
            machine = load_machine(path, registry)
            target = signature_path(path)
            target.write_text(dump_model(sign_machine(machine, args.publisher, key)), "utf-8")
            signed[f"{machine.name}@{machine.version}"] = str(target)
    except MachineError as exc:
        raise CheckFailed(str(exc)) from exc
    _emit(ctx, signed, "\n".join(f"signed {k} -> {v}" for k, v in signed.items()))
    return 0


def _verify(ctx: Context) -> int:
    """Load each machine exactly as the controller would and report the first failing check."""
    args = ctx.args
    registry = load_registry(args.registry)
    trust = load_trusted_publishers(args.trust)
    results: list[dict[str, Any]] = []
    for path in args.paths:
        try:
            machine = load_pinned_machine(path, registry, args.lock, trust)
            results.append({"path": str(path), "ok": True, "digest": machine.digest, "errors": []})
        except MachineError as exc:
            errors = [p.as_dict() for p in exc.problems]
            results.append({"path": str(path), "ok": False, "digest": None, "errors": errors})
    lines = []
    for result in results:
        if result["ok"]:
            lines.append(f"{result['path']}: verified {result['digest']}")
        else:
            details = "; ".join(f"{e['code']}: {e['message']}" for e in result["errors"])
            lines.append(f"{result['path']}: REFUSED {details}")
    _emit(ctx, results, "\n".join(lines))
    return 0 if all(r["ok"] for r in results) else 1


def _keygen(ctx: Context) -> int:
    """Create a new Ed25519 private key file (refusing to overwrite) and print its public key."""
    path: Path = ctx.args.out
    key = Ed25519PrivateKey.generate()
    try:
        write_private_key(path, key)  # PEM PKCS#8, mode 0600, never overwriting
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc}") from exc
    public = {"key_id": key_id(key.public_key()), "public_key": public_key_text(key.public_key())}
    text = f"{public['key_id']} {public['public_key']}\n(add the public key to trusted publishers)"
    _emit(ctx, public, text)
    return 0
