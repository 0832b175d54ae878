"""`recoveryctl console [--listen HOST:PORT]`: the reviewer console in the browser.

Serves the escalation queue, operation timelines, review packets with both
consequences and their digests, the dead letters and the audit chain status
(`ops.console`, Starlette with server-rendered templates). It reads the ledger through
`--database-url`, which should name the read-only `recovery_reader` role, and publishes
the decisions reviewers sign in their browsers to `recovery.events` on `--bootstrap`.
It decides under the controller's machines and policy (`--lock`, `--policy`, ...).

Reviewers sign in with a per-approver token:

- `console token --approver ID [--valid-for 30d]` prints a new token for an approver of
  the policy roster, once; the tokens file (`--tokens-file`, default
  `<stack dir>/console-tokens.json`, mode 0600) keeps only its SHA-256;
- `console token --approver ID --revoke` removes that approver's tokens.

The console never holds a private key: each reviewer imports theirs into the browser
once (the "Signing key" page) and signs there. Exit status: 0 stopped cleanly / token
issued, 1 the roster has no such approver, 2 usage: no database, broker or rules, a
port that cannot be bound, an unusable tokens file.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn

from ops.console import ConsoleConfig, TokenFile, console_app
from ops.context import Context, add_rules_options, parse_duration, register_command
from ops.errors import Refused, UsageError
from ops.paths import stack_dir
from ops.settings import ConsoleSettings

__all__ = ["register"]


def _tokens_file(flag: Path | None) -> Path:
    explicit = flag or ConsoleSettings.load().tokens_file
    return Path(explicit) if explicit else stack_dir() / "console-tokens.json"


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen {text!r} is not HOST:PORT (127.0.0.1:8765)")
    return host.strip("[]"), int(port)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `console` subcommand (serve) and its `token` action."""
    parser = subparsers.add_parser(
        "console",
        help="serve the reviewer console (escalation queue, packets, signing in the browser)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 8765),
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:8765; put TLS in front beyond loopback)",
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument("--events-topic", metavar="TOPIC", help="default: RECOVERY_TOPIC_EVENTS")
    parser.add_argument(
        "--decision-ttl",
        type=parse_duration,
        default=timedelta(minutes=15),
        metavar="DURATION",
        help="how long a decision signed on a page stays valid (default 15m)",
    )
    parser.add_argument(
        "--session-ttl",
        type=parse_duration,
        default=timedelta(hours=8),
        metavar="DURATION",
        help="how long a sign-in lasts (default 8h)",
    )
    parser.add_argument("--tokens-file", type=Path, metavar="FILE", help="console tokens file")
    parser.add_argument(
        "--database-url", metavar="URL", help="ledger database URL (the recovery_reader role)"
    )
    add_rules_options(parser)
    register_command(parser, _serve)
    actions = parser.add_subparsers(dest="console_action", metavar="ACTION")
    token = actions.add_parser("token", help="issue (or revoke) an approver's console token")
    token.add_argument("--approver", required=True, metavar="ID", help="roster id")
    token.add_argument(
        "--valid-for",
        type=parse_duration,
        default=timedelta(days=30),
        metavar="DURATION",
        help="token lifetime (default 30d)",
    )
    token.add_argument("--revoke", action="store_true", help="remove the approver's tokens")
    token.add_argument("--tokens-file", type=Path, metavar="FILE", help="console tokens file")
    token.add_argument("--json", action="store_true", help="print a JSON object")
    add_rules_options(token)
    register_command(token, _token)


def _token(ctx: Context) -> int:
    """Issue or revoke a token; 0 done, 1 no such approver, 2 rules or tokens file."""
    args = ctx.args
    tokens = TokenFile(_tokens_file(args.tokens_file))
    if args.revoke:
        removed = tokens.revoke(args.approver)
        if ctx.json:
            ctx.print_json({"approver": args.approver, "revoked": removed})
        else:
            ctx.say(f"revoked {removed} console token(s) of {args.approver}")
        return 0
    policy = ctx.rules.rules.policy
    if policy.approver(args.approver) is None:
        known = ", ".join(a.id for a in policy.approvers) or "none"
        raise Refused(
            f"{args.approver} is not in policy {policy.id}'s approver roster (approvers: "
            f"{known}); add it first"
        )
    issued = tokens.issue(args.approver, datetime.now(UTC), args.valid_for)
    if ctx.json:
        ctx.print_json(
            {
                "approver": issued.approver,
                "token": issued.token,
                "token_id": issued.token_id,
                "expires_at": issued.expires_at.isoformat(),
                "tokens_file": str(tokens.path),
            }
        )
    else:
        ctx.say(issued.token)
        ctx.note(
            f"console token {issued.token_id} for {issued.approver}, valid until "
            f"{issued.expires_at.isoformat()}; shown once, only its hash is kept in "
            f"{tokens.path}"
        )
    return 0


def _serve(ctx: Context) -> int:
    """Serve the console until interrupted; see the module doc for the exit status."""
    args = ctx.args
    config = ConsoleConfig(
        rules=ctx.rules,
        database_url=ctx.database_url(),
        bootstrap=ctx.bootstrap(),
        topics=ctx.topics,
        tokens=TokenFile(_tokens_file(args.tokens_file)),
        security=ctx.kafka("tool"),
        decision_ttl=args.decision_ttl,
        session_ttl=args.session_ttl,
    )
    host, port = args.listen
    server = uvicorn.Server(
        uvicorn.Config(console_app(config), host=host, port=port, log_level="warning")
    )
    print(
        f"{ctx.command}: serving http://{host}:{port}/ (tokens {config.tokens.path}); Ctrl-C stops",
        file=ctx.out,
        flush=True,
    )
    server.run()
    # uvicorn exits its run loop without raising when startup fails (port in use,
    # ledger unreachable); it says why on stderr.
    if not server.started:
        raise UsageError(f"the console did not start on {host}:{port} (see above)")
    return 0
