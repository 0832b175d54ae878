"""`recoveryctl dlq list|show|redrive`: the records the controller refused.

Every refused input record leaves a dead letter, written in the ledger in the same
transaction as the offset that skips it (docs/controller.md): the reason code and
message, the source coordinates, and the original key, value and headers.

- `list` shows them, oldest first (`--reason CODE` filters);
- `show RECORD_ID` prints one, with its headers and the original value (as text when it
  is UTF-8, else base64);
- `redrive RECORD_ID` publishes the original key, value bytes and headers, unchanged,
  to the events topic through the client library (`EventPublisher.republish`), once the
  cause is fixed (a machine pinned, a producer registered). The controller validates
  the redriven record like any other: a record that fails the same way becomes a new
  dead letter with the same reason; one that passes is decided. The original dead
  letter stays in the ledger (append-only history).

Dead letters are read from the ledger (`ledger.LedgerInspector`), so they are listed
whether or not the relay has published them to `recovery.dlq` yet. Exit status: 0 done,
1 no dead letter with that id or the record could not be published, 2 no database or
broker.
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from ledger import DeadLetterEntry, LedgerError
from ops.commands.db import add_ledger_options
from ops.commands.output import (
    open_inspector,
    print_json,
    resolve_bootstrap,
    table,
    topics_with,
)
from producers import DeliveryFailed, EventPublisher, ProducersError
from schemas import TopicNames

__all__ = ["register", "run_list", "run_redrive", "run_show"]

_PREVIEW = 2000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `dlq` subcommand and its `list`, `show` and `redrive` actions."""
    parser = subparsers.add_parser(
        "dlq",
        help="list, show and redrive dead letters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every dead letter, oldest first")
    listing.add_argument("--reason", metavar="CODE", help="only this reason code")
    listing.set_defaults(handler=run_list)
    show = actions.add_parser("show", help="one dead letter with its original record")
    show.add_argument("record_id", metavar="RECORD_ID")
    show.set_defaults(handler=run_show)
    redrive = actions.add_parser("redrive", help="publish the original record to the events topic")
    redrive.add_argument("record_id", metavar="RECORD_ID")
    redrive.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    redrive.add_argument(
        "--events-topic",
        metavar="TOPIC",
        help="where to publish (default: the topic it was consumed from)",
    )
    redrive.set_defaults(handler=run_redrive)
    for child in (listing, show, redrive):
        child.add_argument(
            "--dlq-topic", metavar="TOPIC", help="the dead-letter topic (RECOVERY_TOPIC_DLQ)"
        )
        add_ledger_options(child)


def _dlq_topic(args: argparse.Namespace) -> str:
    return str(args.dlq_topic or TopicNames.from_env().dlq)


def _decode(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _readable(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")
    return text if text.isprintable() or not text else repr(text)


def _letter_json(letter: DeadLetterEntry, *, full: bool) -> dict[str, Any]:
    body = letter.payload
    data: dict[str, Any] = {
        "record_id": letter.record_id,
        "reason_code": body.get("reason_code"),
        "reason": body.get("reason"),
        "source": {
            "topic": body.get("source_topic"),
            "partition": body.get("source_partition"),
            "offset": body.get("source_offset"),
        },
        "event_id": body.get("event_id"),
        "operation_id": body.get("operation_id"),
        "dead_lettered_at": body.get("dead_lettered_at"),
        "controller": body.get("controller"),
        "published_at": None if letter.published_at is None else letter.published_at.isoformat(),
    }
    if full:
        data["original"] = {
            "key": _readable(_decode(body.get("original_key"))),
            "value": (_readable(_decode(body.get("original_value"))) or "")[:_PREVIEW],
            "value_bytes": len(_decode(body.get("original_value")) or b""),
            "headers": {
                h["key"]: _readable(_decode(h["value"])) for h in body.get("original_headers", [])
            },
        }
    return data


def _source(body: Mapping[str, Any]) -> str:
    return f"{body['source']['topic']}[{body['source']['partition']}]@{body['source']['offset']}"


def run_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """List dead letters; 0 listed (perhaps none), 2 unusable database."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    inspector = open_inspector("dlq list", args.database_url, err)
    if inspector is None:
        return 2
    try:
        letters = inspector.dead_letters(_dlq_topic(args))
    except LedgerError as exc:
        print(f"recoveryctl dlq list: {exc}", file=err)
        return 2
    finally:
        inspector.close()
    rows = [_letter_json(letter, full=False) for letter in letters]
    if args.reason:
        rows = [r for r in rows if r["reason_code"] == args.reason]
    if args.json:
        print_json({"dead_letters": rows}, out)
        return 0
    print(
        table(
            ("record", "reason", "source", "operation", "event", "when", "published"),
            [
                (
                    r["record_id"],
                    r["reason_code"],
                    _source(r),
                    r["operation_id"],
                    r["event_id"],
                    r["dead_lettered_at"],
                    "yes" if r["published_at"] else "not yet",
                )
                for r in rows
            ],
        ),
        file=out,
    )
    print(f"{len(rows)} dead letter(s)", file=out)
    return 0


def _find(command: str, args: argparse.Namespace, err: TextIO) -> DeadLetterEntry | int:
    inspector = open_inspector(command, args.database_url, err)
    if inspector is None:
        return 2
    try:
        letter = inspector.dead_letter(_dlq_topic(args), args.record_id)
    except LedgerError as exc:
        print(f"recoveryctl {command}: {exc}", file=err)
        return 2
    finally:
        inspector.close()
    if letter is None:
        print(
            f"recoveryctl {command}: no dead letter {args.record_id}; list them with "
            "`recoveryctl dlq list`",
            file=err,
        )
        return 1
    return letter


def run_show(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print one dead letter; 0 shown, 1 unknown id, 2 unusable database."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    letter = _find("dlq show", args, err)
    if isinstance(letter, int):
        return letter
    data = _letter_json(letter, full=True)
    if args.json:
        print_json(data, out)
        return 0
    original = data["original"]
    lines = [
        f"dead letter {data['record_id']}",
        f"  reason     {data['reason_code']}: {data['reason']}",
        f"  source     {_source(data)}",
        f"  operation  {data['operation_id'] or '-'}   event {data['event_id'] or '-'}",
        f"  when       {data['dead_lettered_at']} by {data['controller']}",
        f"  published  {data['published_at'] or 'not yet'}",
        f"  key        {original['key']}",
        "  headers",
        *(f"    {k}: {v}" for k, v in sorted(original["headers"].items())),
        f"  value ({original['value_bytes']} bytes)",
        f"    {original['value']}",
    ]
    print("\n".join(lines), file=out)
    return 0


def run_redrive(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Publish the dead letter's original record; 0 published, 1 unknown or failed."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    letter = _find("dlq redrive", args, err)
    if isinstance(letter, int):
        return letter
    bootstrap = resolve_bootstrap(args.bootstrap, err, "dlq redrive")
    if bootstrap is None:
        return 2
    body = letter.payload
    topic = args.events_topic or body.get("source_topic") or topics_with(None).events
    headers = [(h["key"], _decode(h["value"])) for h in body.get("original_headers", [])]
    try:
        # The original record goes out unchanged, its producer's signature with it: the
        # controller verifies it again; this publisher signs nothing of its own.
        with EventPublisher(bootstrap, signer=None, topics=topics_with(topic)) as publisher:
            publisher.republish(
                topic,
                key=_decode(body.get("original_key")),
                value=_decode(body.get("original_value")),
                headers=headers,
                tracking_id=letter.record_id,
            )
    except (DeliveryFailed, ProducersError) as exc:
        print(f"recoveryctl dlq redrive: {letter.record_id}: could not publish: {exc}", file=err)
        return 1
    report = {
        "record_id": letter.record_id,
        "topic": topic,
        "reason_code": body.get("reason_code"),
        "value_bytes": len(_decode(body.get("original_value")) or b""),
    }
    if args.json:
        print_json({"redriven": report}, out)
    else:
        print(
            f"redrove {letter.record_id} ({report['reason_code']}) to {topic}: "
            f"{report['value_bytes']} bytes, {len(headers)} header(s) as received; the "
            "controller validates it again (a repeat failure is a new dead letter)",
            file=out,
        )
    return 0
