"""`recoveryctl offsets show` and `recoveryctl offsets skip`: the controller's positions.

`show` prints, per partition of the events topic, the ledger's stored next offset (the
authoritative one, written with the decisions), Kafka's log start and end, the lag
(log end minus the ledger's offset) and the group's advisory offset in Kafka.

`skip --partition P --to OFFSET --reason TEXT` (or `--offset O` for the one record at
O) is the operator's tool of last resort for a partition that cannot move, never a hand
edit of `consumer_offsets`. It claims the partition in the ledger under a new epoch
(any controller's in-flight batch on it is then refused with `FencedError` and
dropped, so nothing it holds can be decided after the skip), reads the skipped records
from Kafka and, in one ledger transaction, dead-letters each readable one as
`record-skipped` (its bytes on `recovery.dlq`), writes an `offsets-skipped` audit record
on the partition's intake chain naming the operator, the reason and the range, and
stores the new offset. A fenced controller stops fetching that partition until the
next rebalance hands it back; restart that member (or let the group rebalance) to go
on. Exit status: 0 done, 1 refused (the range or the partition is not what was
expected: nothing written), 2 usage error or no database or broker.
"""

from __future__ import annotations

import argparse
import getpass
from datetime import UTC, datetime
from typing import Any, Final

from consumer import ControllerSettings, RawRecord, Refusal, RefusalCode, dead_letter
from ledger import Batch, DeadLetter, FencedError, Ledger, Position, intake_chain_id
from ops.commands.db import add_ledger_options
from ops.context import Context, register_command
from ops.errors import Refused, UsageError
from producers import PartitionExtent, StoredRecord, partition_extents, read_range
from schemas import KafkaSecurity, TopicNames

__all__ = ["SKIP_KIND", "register"]

SKIP_KIND: Final = "offsets-skipped"
_MAX_SKIP: Final = 10_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `offsets` subcommand and its `show` and `skip` actions."""
    parser = subparsers.add_parser(
        "offsets",
        help="show the controller's offsets per partition; skip records as a last resort",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="offsets_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="ledger offset, log end, lag, Kafka's advisory offset")
    _common(show)
    register_command(show, _show)
    skip = actions.add_parser("skip", help="move a partition's stored offset forward, audited")
    _common(skip)
    skip.add_argument("--partition", type=int, required=True, help="the partition")
    where = skip.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=int, metavar="OFFSET", help="the new next offset")
    where.add_argument("--offset", type=int, help="skip only the record at this offset")
    skip.add_argument("--reason", required=True, help="why (goes into the audit record)")
    skip.add_argument("--operator", help="who (default: the OS user)")
    skip.add_argument(
        "--max-records",
        type=int,
        default=_MAX_SKIP,
        help=f"refuse to skip more offsets than this (default {_MAX_SKIP})",
    )
    register_command(skip, _skip_command)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument(
        "--group",
        help="the controller's consumer group (default: the controller's "
        f"{ControllerSettings.variable('group_id')}, else "
        f"{ControllerSettings.model_fields['group_id'].default})",
    )
    parser.add_argument(
        "--topic", help="the events topic (default: $RECOVERY_TOPIC_EVENTS or recovery.events)"
    )
    add_ledger_options(parser)


class _Refused(Refused):
    """Nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(f"refused, nothing written: {message}")


def _topics(args: argparse.Namespace) -> TopicNames:
    topics = TopicNames.from_env()
    return topics.model_copy(update={"events": args.topic}) if args.topic else topics


def _group(ctx: Context) -> str:
    return str(ctx.args.group or ControllerSettings.value_of("group_id"))


def _rows(extents: tuple[PartitionExtent, ...], stored: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for e in extents:
        ledger = stored.get(e.partition)
        position = ledger if ledger is not None else e.log_start
        rows.append(
            {
                "partition": e.partition,
                "ledger_offset": ledger,
                "log_start": e.log_start,
                "log_end": e.log_end,
                "lag": max(0, e.log_end - position),
                "kafka_offset": e.advisory,
            }
        )
    return rows


def _show(ctx: Context) -> int:
    """Print the offsets table (or `--json`); 0 shown."""
    group, topic = _group(ctx), _topics(ctx.args).events
    stored = ctx.ledger().offsets(group, topic)
    # An operator's read, as admin on the local stack (its groups are not the tool's).
    extents = partition_extents(ctx.bootstrap(), topic, group, security=ctx.kafka("admin"))
    rows = _rows(extents, stored)
    if ctx.json:
        ctx.print_json({"group": group, "topic": topic, "partitions": rows})
        return 0
    ctx.say(f"group {group}, topic {topic}")
    header = ("partition", "ledger", "log start", "log end", "lag", "kafka (advice)")
    ctx.say("  ".join(f"{h:>14}" for h in header))
    for r in rows:
        cells = [
            r["partition"],
            "-" if r["ledger_offset"] is None else r["ledger_offset"],
            r["log_start"],
            r["log_end"],
            r["lag"],
            "-" if r["kafka_offset"] is None else r["kafka_offset"],
        ]
        ctx.say("  ".join(f"{c:>14}" for c in cells))
    ctx.say(f"total lag {sum(r['lag'] for r in rows)}")
    return 0


def _skip_command(ctx: Context) -> int:
    """Skip records of one partition (module docstring); 0 done, 1 refused, 2 usage."""
    reason = (ctx.args.reason or "").strip()
    if not reason:
        raise UsageError(
            "--reason must say why the records are skipped; it goes into the audit record"
        )
    bootstrap, ledger = ctx.bootstrap(), ctx.ledger()
    operator = ctx.args.operator or getpass.getuser()
    admin = ctx.kafka("admin")
    report = _skip(ledger, bootstrap, admin, ctx.args, _group(ctx), operator, reason)
    if ctx.json:
        ctx.print_json(report)
        return 0
    ctx.say(
        f"skipped {report['topic']}[{report['partition']}] offsets {report['from_offset']}"
        f"..{report['to_offset'] - 1} for group {report['group']}: "
        f"{report['dead_lettered']} record(s) dead-lettered as record-skipped, "
        f"{report['unreadable']} no longer in the log; audited on {report['chain']} "
        f"(operator {operator}); the ledger's next offset is now {report['to_offset']}"
    )
    ctx.say(
        f"a controller that owned it is fenced on it (epoch {report['epoch']} is the "
        "tool's) until the next rebalance gives it back: restart that member to go on "
        "at once"
    )
    return 0


def _skip(
    ledger: Ledger,
    bootstrap: str,
    security: KafkaSecurity,
    args: argparse.Namespace,
    group: str,
    operator: str,
    reason: str,
) -> dict[str, Any]:
    topics = _topics(args)
    topic, partition = topics.events, args.partition
    extents = {
        e.partition: e for e in partition_extents(bootstrap, topic, group, security=security)
    }
    extent = extents.get(partition)
    if extent is None:
        raise UsageError(f"{topic} has no partition {partition} (it has {sorted(extents)})")
    stored = ledger.offsets(group, topic).get(partition)
    start = stored if stored is not None else extent.log_start
    to = args.to if args.to is not None else args.offset + 1
    if args.offset is not None and args.offset != start:
        raise _Refused(
            f"{topic}[{partition}] is at offset {start}, not {args.offset}: --offset skips "
            "only the record the partition is stuck on (use --to to skip a range)"
        )
    _check_range(topic, partition, start, to, extent, args.max_records)
    owner = f"recoveryctl offsets skip ({operator})"
    # The claim fences whoever owned the partition: an in-flight batch of theirs can no
    # longer commit, so nothing read before the skip is decided after it.
    (claim,) = ledger.claim(group, topic, [partition], owner)
    now_at = claim.next_offset if claim.next_offset is not None else extent.log_start
    if now_at != start:
        raise _Refused(
            f"{topic}[{partition}] moved from {start} to {now_at} while this ran (a controller "
            "committed); look again with `recoveryctl offsets show`"
        )
    found = read_range(bootstrap, topic, partition, start, to, security=security)
    now = datetime.now(UTC)
    letters = [
        dead_letter(group, owner, _raw(topic, r), _refusal(topic, r, operator, reason), now)
        for r in found.values()
    ]
    chain = intake_chain_id(group, topic, partition)
    summary = {
        "reason": reason,
        "operator": operator,
        "consumer_group": group,
        "source": {"topic": topic, "partition": partition},
        "from_offset": start,
        "to_offset": to,
        "records": to - start,
        "dead_lettered": len(letters),
        "unreadable": to - start - len(letters),
        "epoch": claim.epoch,
        "decided_at": now.isoformat(),  # the audit record's own time (OCSF `time`)
    }
    letters.append(
        DeadLetter(
            record_id=f"skip:{chain}:{start}-{to}",
            chain_id=chain,
            key=chain,
            reason_code=SKIP_KIND,
            payload={},
            headers={},
            audit=summary,
            kind=SKIP_KIND,
            publish=False,
        )
    )
    batch = Batch(
        group=group,
        positions=(Position(topic, partition, claim.epoch, to),),
        views={},
        dead_letters=tuple(letters),
        topics=topics,
    )
    try:
        ledger.commit(batch)
    except FencedError as exc:
        raise _Refused(
            f"a controller claimed {topic}[{partition}] while this ran ({exc}); run it again"
        ) from exc
    return {**summary, "group": group, "topic": topic, "partition": partition, "chain": chain}


def _check_range(
    topic: str, partition: int, start: int, to: int, extent: PartitionExtent, most: int
) -> None:
    if to <= start:
        raise _Refused(
            f"{topic}[{partition}] is already at offset {start}; --to {to} would move it back "
            "(skip only moves forward; a replay is a new consumer group)"
        )
    if to > extent.log_end:
        raise _Refused(
            f"{topic}[{partition}] ends at offset {extent.log_end}; --to {to} is past the "
            "last record"
        )
    if to - start > most:
        raise _Refused(
            f"that skips {to - start} offsets, more than --max-records {most}; raise it "
            "if you mean it"
        )


def _raw(topic: str, r: StoredRecord) -> RawRecord:
    return RawRecord(topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms)


def _refusal(topic: str, r: StoredRecord, operator: str, reason: str) -> Refusal:
    return Refusal(
        RefusalCode.RECORD_SKIPPED,
        f"record {topic}[{r.partition}]@{r.offset}: skipped by {operator} with "
        f"`recoveryctl offsets skip`: {reason}",
    )
