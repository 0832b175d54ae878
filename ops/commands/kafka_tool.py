"""`recoveryctl kafka-tool TOOL [ARGS...]`: Kafka's own command-line tools against the
deployment's broker, e.g. `recoveryctl kafka-tool consumer-groups --describe --group
recovery-controller`.

TOOL is one of: consumer-groups, topics, acls, configs, console-consumer, get-offsets,
broker-api-versions (Kafka's `kafka-<TOOL>.sh`, from the `kafka-tools` jars the stack
fetches once into the cache, `ops/kafka/tools-pom.xml`). ARGS go to the tool as they
are, after `--bootstrap-server` (the broker: `--bootstrap`, else
RECOVERY_KAFKA_BOOTSTRAP, else the local stack's) and, on the local stack's secured
broker, `--command-config` naming the Java client file of the principal `--as`
(default admin: `<stack dir>/kafka/clients/admin.java.properties`, which the stack
writes beside each librdkafka file). Pass either yourself to replace it (an external
broker needs its own Java client file). The exit status is the tool's.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Final

from ops.context import Context, register_command
from ops.errors import UsageError
from ops.kafka import ensure_tools, find_java
from ops.kafka_security import java_client_file

__all__ = ["KAFKA_TOOLS", "register", "tool_command"]

# The tool's name (Kafka's `kafka-<name>.sh`) -> its main class in kafka-tools.
KAFKA_TOOLS: Final = {
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "configs": "org.apache.kafka.tools.ConfigCommand",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
}
_LOG_CONFIG: Final = Path(__file__).resolve().parents[1] / "kafka" / "tools-log4j2.xml"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `kafka-tool` subcommand."""
    parser = subparsers.add_parser(
        "kafka-tool",
        help="run one of Kafka's own tools (kafka-consumer-groups, ...) against the broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "tool", choices=list(KAFKA_TOOLS), metavar="TOOL", help=", ".join(KAFKA_TOOLS)
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers")
    parser.add_argument(
        "--as",
        dest="principal",
        default="admin",
        metavar="COMPONENT",
        help="the stack principal whose Java client file to use (default admin)",
    )
    parser.add_argument("tool_args", nargs=argparse.REMAINDER, metavar="ARGS")
    register_command(parser, _run)


def tool_command(
    java: str,
    tools: Path,
    tool: str,
    args: list[str],
    *,
    bootstrap: str,
    command_config: Path | None,
) -> list[str]:
    """The `java` command line running `tool` with `args`, the bootstrap servers and the
    client file added unless `args` names its own."""
    added: list[str] = []
    if "--bootstrap-server" not in args:
        added += ["--bootstrap-server", bootstrap]
    if command_config is not None and "--command-config" not in args:
        added += ["--command-config", str(command_config)]
    return [
        java,
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={_LOG_CONFIG}",
        "-cp",
        f"{tools}/*",
        KAFKA_TOOLS[tool],
        *added,
        *args,
    ]


def _command_config(ctx: Context) -> Path | None:
    """The Java client file of `--as` on the local stack's secured broker, else None."""
    if ctx.stack_home() is None or ctx.stack is None:
        return None
    files = ctx.stack.kafka.client_files
    if not files:
        return None  # a plaintext broker: nothing to authenticate
    found = files.get(ctx.args.principal)
    if found is None:
        raise UsageError(f"--as {ctx.args.principal}: the stack has {', '.join(sorted(files))}")
    return java_client_file(found)


def _run(ctx: Context) -> int:
    args = [a for a in ctx.args.tool_args if a != "--"]
    command = tool_command(
        find_java(),
        ensure_tools(progress=ctx.err),
        ctx.args.tool,
        args,
        bootstrap=ctx.bootstrap(),
        command_config=_command_config(ctx),
    )
    return subprocess.run(command, check=False).returncode
