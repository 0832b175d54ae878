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
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

import uvicorn

from ops.commands.db import resolved_url_or_report
from ops.commands.output import print_json, resolve_bootstrap, topics_with
from ops.commands.rules import add_rules_options, load_rules_or_report, parse_duration
from ops.console import ConsoleConfig, TokenError, TokenFile, console_app
from ops.paths import stack_dir

__all__ = ["ENV_TOKENS_FILE", "register", "run_serve", "run_token"]

ENV_TOKENS_FILE = "RECOVERY_CONSOLE_TOKENS"


def _tokens_file(flag: Path | None) -> Path:
    explicit = flag or os.environ.get(ENV_TOKENS_FILE)
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
    parser.set_defaults(handler=run_serve)
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
    token.set_defaults(handler=run_token)


def run_token(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Issue or revoke a token; 0 done, 1 no such approver, 2 rules or tokens file."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    tokens = TokenFile(_tokens_file(args.tokens_file))
    try:
        if args.revoke:
            removed = tokens.revoke(args.approver)
            if args.json:
                print_json({"approver": args.approver, "revoked": removed}, out)
            else:
                print(f"revoked {removed} console token(s) of {args.approver}", file=out)
            return 0
        loaded = load_rules_or_report("console token", args, err)
        if loaded is None:
            return 2
        policy = loaded.rules.policy
        if policy.approver(args.approver) is None:
            known = ", ".join(a.id for a in policy.approvers) or "none"
            print(
                f"recoveryctl console token: {args.approver} is not in policy {policy.id}'s "
                f"approver roster (approvers: {known}); add it first",
                file=err,
            )
            return 1
        issued = tokens.issue(args.approver, datetime.now(UTC), args.valid_for)
    except TokenError as exc:
        print(f"recoveryctl console token: {exc}", file=err)
        return 2
    if args.json:
        print_json(
            {
                "approver": issued.approver,
                "token": issued.token,
                "token_id": issued.token_id,
                "expires_at": issued.expires_at.isoformat(),
                "tokens_file": str(tokens.path),
            },
            out,
        )
    else:
        print(issued.token, file=out)
        print(
            f"console token {issued.token_id} for {issued.approver}, valid until "
            f"{issued.expires_at.isoformat()}; shown once, only its hash is kept in "
            f"{tokens.path}",
            file=err,
        )
    return 0


def run_serve(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Serve the console until interrupted; see the module doc for the exit status."""
    out, err = out or sys.stdout, err or sys.stderr  # resolved per call, not at import
    loaded = load_rules_or_report("console", args, err)
    if loaded is None:
        return 2
    url = resolved_url_or_report("console", args.database_url, err)
    bootstrap = resolve_bootstrap(args.bootstrap, err, "console")
    if url is None or bootstrap is None:
        return 2
    config = ConsoleConfig(
        rules=loaded,
        database_url=url,
        bootstrap=bootstrap,
        topics=topics_with(args.events_topic),
        tokens=TokenFile(_tokens_file(args.tokens_file)),
        decision_ttl=args.decision_ttl,
        session_ttl=args.session_ttl,
    )
    host, port = args.listen
    server = uvicorn.Server(
        uvicorn.Config(console_app(config), host=host, port=port, log_level="warning")
    )
    print(
        f"recoveryctl console: serving http://{host}:{port}/ (tokens {config.tokens.path}); "
        "Ctrl-C stops",
        file=out,
        flush=True,
    )
    server.run()
    # uvicorn exits its run loop without raising when startup fails (port in use,
    # ledger unreachable); it says why on stderr.
    return 0 if server.started else 2
