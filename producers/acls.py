"""Least-privilege Kafka ACLs for the recovery topics, provisioned through the AdminClient.

A secured broker (`StandardAuthorizer`, `allow.everyone.if.no.acl.found=false`) allows
nothing an ACL does not grant; its super users are the admin principal (who provisions)
and the broker itself. `acl_bindings` is what each component's principal
(`schemas.KAFKA_PRINCIPALS`) may do on a deployment's topics (`schemas.TopicNames`):

- `tool`: write `events` (idempotent producer: WRITE on the topic is what Kafka asks),
  and read `audit` in groups named `recovery-verdicts*`, for the controller's verdict on
  what it published (`producers.verdicts`; the readers never commit);
- `worker`: read `commands` in groups named `recovery-worker*`, write `events`, and read
  verdicts as a tool does;
- `controller`: read `events` in groups named `recovery-controller*` (the advisory
  offset commits after each ledger commit);
- `relay`: write every topic it publishes: `commands`, `audit`, `dlq`, `evidence` and
  `events` (cascade events);
- `siem`: read `audit` in groups named `recovery-siem*`, nothing else;
- `bench`: everything on topics and groups named `bench-*` (its scratch topics).

Group ACLs are prefixed and disjoint, so no principal can join, commit or reset the
offsets of another component's group. READ and WRITE imply DESCRIBE. Creating a binding
that exists is a no-op, so `provision_acls` is safe to run any number of times.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# The typed classes live in these private modules (the package re-exports them untyped).
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from producers.errors import ProvisionError
from producers.verdicts import VERDICT_GROUP_PREFIX
from schemas import (
    DEFAULT_CONTROLLER_GROUP,
    KAFKA_PRINCIPALS,
    KafkaSecurity,
    TopicNames,
    kafka_config,
    librdkafka_logger,
)

__all__ = [
    "DEFAULT_GROUP_PREFIXES",
    "AclEntry",
    "AclReport",
    "acl_bindings",
    "list_acls",
    "provision_acls",
]

# Component -> the prefix of the consumer groups its principal may use.
DEFAULT_GROUP_PREFIXES: Final[Mapping[str, str]] = {
    "controller": DEFAULT_CONTROLLER_GROUP,
    "worker": "recovery-worker",
    "siem": "recovery-siem",
    "bench": "bench-",
}
_BENCH_TOPICS: Final = "bench-"
_SECURITY_DISABLED: Final = frozenset({KafkaError.SECURITY_DISABLED})

_Grant = tuple[str, ResourceType, str, ResourcePatternType, AclOperation]


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ACL as operators read it: `User:tool` may WRITE topic recovery.events."""

    principal: str
    permission: str
    operation: str
    resource_type: str
    resource: str
    pattern: str
    host: str

    @classmethod
    def of(cls, binding: AclBinding) -> AclEntry:
        """The readable form of an AdminClient binding."""
        return cls(
            principal=str(binding.principal),
            permission=_name(binding.permission_type),
            operation=_name(binding.operation),
            resource_type=_name(binding.restype),
            resource=str(binding.name),
            pattern=_name(binding.resource_pattern_type),
            host=str(binding.host),
        )

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AclReport:
    """What `provision_acls` did: `enabled` is False when the broker has no authorizer
    (a plaintext broker: nothing to provision)."""

    enabled: bool
    entries: tuple[AclEntry, ...]


def _grants(
    names: TopicNames, principals: Mapping[str, str], groups: Mapping[str, str]
) -> list[_Grant]:
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    read, write, every = AclOperation.READ, AclOperation.WRITE, AclOperation.ALL
    grants: list[_Grant] = [
        ("tool", topic, names.events, literal, write),
        *(
            (who, resource, name, pattern, read)
            for who in ("tool", "worker")
            for resource, name, pattern in (
                (topic, names.audit, literal),
                (group, VERDICT_GROUP_PREFIX, prefixed),
            )
        ),
        ("worker", topic, names.commands, literal, read),
        ("worker", group, groups["worker"], prefixed, read),
        ("worker", topic, names.events, literal, write),
        ("controller", topic, names.events, literal, read),
        ("controller", group, groups["controller"], prefixed, read),
        *(
            ("relay", topic, name, literal, operation)
            for name in (names.commands, names.audit, names.dlq, names.evidence, names.events)
            # DescribeConfigs: the relay checks at start that each topic admits its
            # largest record (`producers.check_message_limits`).
            for operation in (write, AclOperation.DESCRIBE_CONFIGS)
        ),
        ("siem", topic, names.audit, literal, read),
        ("siem", group, groups["siem"], prefixed, read),
        ("bench", topic, _BENCH_TOPICS, prefixed, every),
        ("bench", group, groups["bench"], prefixed, every),
    ]
    return [(f"User:{principals[who]}", *rest) for who, *rest in grants]  # type: ignore[misc]


def acl_bindings(
    names: TopicNames | None = None,
    *,
    principals: Mapping[str, str] = KAFKA_PRINCIPALS,
    groups: Mapping[str, str] = DEFAULT_GROUP_PREFIXES,
) -> list[AclBinding]:
    """The ALLOW bindings of the module docstring for the topics `names` (default: the
    environment's, `RECOVERY_TOPIC_*` honoured)."""
    chosen = names or TopicNames.from_env()
    return [
        AclBinding(restype, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)
        for principal, restype, name, pattern, operation in _grants(chosen, principals, groups)
    ]


def provision_acls(
    bootstrap: str,
    names: TopicNames | None = None,
    *,
    security: KafkaSecurity | None = None,
    groups: Mapping[str, str] = DEFAULT_GROUP_PREFIXES,
    timeout: float = 30.0,
) -> AclReport:
    """Create the bindings of `acl_bindings` (idempotent), connecting as `security`
    (else the environment's settings; it must be a principal allowed to alter ACLs: the
    admin). A broker without an authorizer is reported (`enabled` False), not an error.
    Returns once the broker lists every binding (it enforces them from then on).
    Raises `ProvisionError` naming the binding the broker refused."""
    bindings = acl_bindings(names, groups=groups)
    admin = _admin(bootstrap, security)
    try:
        futures = admin.create_acls(bindings, request_timeout=timeout)
    except KafkaException as exc:
        raise ProvisionError(f"creating ACLs on {bootstrap} failed: {exc}") from exc
    for binding, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if _code(exc) in _SECURITY_DISABLED:
                return AclReport(False, ())
            entry = AclEntry.of(binding)
            raise ProvisionError(
                f"ACL {entry.principal} {entry.operation} {entry.resource_type.lower()} "
                f"{entry.resource} on {bootstrap} was refused: {exc}; provision ACLs as the "
                "admin principal (RECOVERY_KAFKA_CONFIG_FILE=<stack>/kafka/clients/"
                "admin.properties)"
            ) from exc
    entries = tuple(AclEntry.of(b) for b in bindings)
    _wait_until_listed(bootstrap, security, entries, timeout)
    return AclReport(True, entries)


def _wait_until_listed(
    bootstrap: str, security: KafkaSecurity | None, wanted: tuple[AclEntry, ...], timeout: float
) -> None:
    # The controller commits new ACLs before the broker's authorizer has replayed them:
    # a client right after `create_acls` could still be refused. Wait (bounded) until
    # the broker lists them all.
    deadline = time.monotonic() + timeout
    while True:
        listed = list_acls(bootstrap, security=security, timeout=timeout).entries
        missing = set(wanted) - set(listed)
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise ProvisionError(
                f"{len(missing)} ACLs created on {bootstrap} are not listed by the broker "
                f"{timeout:.0f} s later (e.g. {sorted(missing, key=str)[0]}); check its log"
            )
        time.sleep(0.1)


def list_acls(
    bootstrap: str, *, security: KafkaSecurity | None = None, timeout: float = 30.0
) -> AclReport:
    """Every ACL on the broker, sorted by principal, resource and operation; `enabled`
    False when the broker has no authorizer. Raises `ProvisionError` when refused."""
    admin = _admin(bootstrap, security)
    anything: Any = None  # a filter's None matches any name, principal or host
    everything = AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    try:
        found: Any = admin.describe_acls(everything, request_timeout=timeout).result(
            timeout=timeout
        )
    except KafkaException as exc:
        if _code(exc) in _SECURITY_DISABLED:
            return AclReport(False, ())
        raise ProvisionError(
            f"listing ACLs on {bootstrap} failed: {exc}; describe ACLs as the admin principal"
        ) from exc
    entries = sorted(
        (AclEntry.of(b) for b in found),
        key=lambda e: (e.principal, e.resource_type, e.resource, e.operation),
    )
    return AclReport(True, tuple(entries))


def _admin(bootstrap: str, security: KafkaSecurity | None) -> AdminClient:
    config: dict[str, Any] = {
        **kafka_config(bootstrap, security),
        "logger": librdkafka_logger("admin"),
    }
    return AdminClient(config)


def _name(value: object) -> str:
    # The binding's constructor turns names and numbers into the enums.
    return str(getattr(value, "name", value))


def _code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None
