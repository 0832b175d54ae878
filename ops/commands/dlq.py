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
from collections.abc import Mapping
from typing import Any

from ledger import DeadLetterEntry
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command, table
from ops.errors import Refused
from producers import DeliveryFailed, EventPublisher, ProducersError

__all__ = ["register"]

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
    register_command(listing, _list)
    show = actions.add_parser("show", help="one dead letter with its original record")
    show.add_argument("record_id", metavar="RECORD_ID")
    register_command(show, _show)
    redrive = actions.add_parser("redrive", help="publish the original record to the events topic")
    redrive.add_argument("record_id", metavar="RECORD_ID")
    redrive.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    redrive.add_argument(
        "--events-topic",
        metavar="TOPIC",
        help="where to publish (default: the topic it was consumed from)",
    )
    register_command(redrive, _redrive)
    for child in (listing, show, redrive):
        child.add_argument(
            "--dlq-topic", metavar="TOPIC", help="the dead-letter topic (RECOVERY_TOPIC_DLQ)"
        )
        add_ledger_options(child)


def _dlq_topic(ctx: Context) -> str:
    return str(ctx.args.dlq_topic or ctx.topics.dlq)


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


def _list(ctx: Context) -> int:
    """List dead letters; 0 listed (perhaps none)."""
    letters = ctx.inspector().dead_letters(_dlq_topic(ctx))
    rows = [_letter_json(letter, full=False) for letter in letters]
    if ctx.args.reason:
        rows = [r for r in rows if r["reason_code"] == ctx.args.reason]
    if ctx.json:
        ctx.print_json({"dead_letters": rows})
        return 0
    ctx.say(
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
        )
    )
    ctx.say(f"{len(rows)} dead letter(s)")
    return 0


def _find(ctx: Context) -> DeadLetterEntry:
    letter = ctx.inspector().dead_letter(_dlq_topic(ctx), ctx.args.record_id)
    if letter is None:
        raise Refused(f"no dead letter {ctx.args.record_id}; list them with `recoveryctl dlq list`")
    return letter


def _show(ctx: Context) -> int:
    """Print one dead letter; 0 shown, 1 unknown id."""
    data = _letter_json(_find(ctx), full=True)
    if ctx.json:
        ctx.print_json(data)
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
    ctx.say("\n".join(lines))
    return 0


def _redrive(ctx: Context) -> int:
    """Publish the dead letter's original record; 0 published, 1 unknown or failed."""
    letter = _find(ctx)
    bootstrap = ctx.bootstrap()
    body = letter.payload
    topic = ctx.args.events_topic or body.get("source_topic") or ctx.topics.events
    headers = [(h["key"], _decode(h["value"])) for h in body.get("original_headers", [])]
    try:
        # The original record goes out unchanged, its producer's signature with it: the
        # controller verifies it again; this publisher signs nothing of its own.
        with EventPublisher(
            bootstrap,
            signer=None,
            topics=ctx.topics.model_copy(update={"events": topic}),
            security=ctx.kafka("tool"),
        ) as publisher:
            publisher.republish(
                topic,
                key=_decode(body.get("original_key")),
                value=_decode(body.get("original_value")),
                headers=headers,
                tracking_id=letter.record_id,
            )
    except (DeliveryFailed, ProducersError) as exc:
        raise Refused(f"{letter.record_id}: could not publish: {exc}") from exc
    report = {
        "record_id": letter.record_id,
        "topic": topic,
        "reason_code": body.get("reason_code"),
        "value_bytes": len(_decode(body.get("original_value")) or b""),
    }
    if ctx.json:
        ctx.print_json({"redriven": report})
    else:
        ctx.say(
            f"redrove {letter.record_id} ({report['reason_code']}) to {topic}: "
            f"{report['value_bytes']} bytes, {len(headers)} header(s) as received; the "
            "controller validates it again (a repeat failure is a new dead letter)"
        )
    return 0
