"""`recoveryctl machines lock|sign|verify|keygen`: pin and sign machines (SPEC §8.1, §12).

- `lock PATH... --lock FILE --publisher ID` validates each machine and pins
  `name@version` to its digest and publisher in the lock file (other pins are kept).
- `sign PATH... --key PEM --publisher ID` writes RECOVERY.sig, an Ed25519 signature by the
  publisher over the machine's name, version and digest.
- `verify PATH... --lock FILE --trust FILE` loads each machine as the controller does:
  valid, pinned by digest, signed by a trusted publisher; it names the failing check.
- `keygen --out PEM` creates a publisher key and prints the public half for operators.

Exit status: 0 success, 1 a machine failed a check, 2 usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import (
    DEFAULT_REGISTRY,
    LockFile,
    MachineError,
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
from ops.commands.validate import load_registry
from ops.context import Context, register_command
from ops.errors import CheckFailed, UsageError

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

    for child in (lock, sign, verify):
        child.add_argument("--registry", type=Path, default=DEFAULT_REGISTRY, metavar="FILE")
    for child in (lock, sign, verify, keygen):
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
    updated = LockFile(lock_version=1, machines=dict(sorted(entries.items())))
    tmp = args.lock.with_name(args.lock.name + ".tmp")
    tmp.write_text(dump_model(updated), encoding="utf-8")
    tmp.replace(args.lock)
    pins = {k: v.digest for k, v in updated.machines.items()}
    _emit(ctx, pins, "\n".join(f"pinned {k} {v}" for k, v in pins.items()))
    return 0


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
