"""Configuration: how every role's settings are declared and read.

Each setting of every role (controller, relay, worker, client library, console,
`recoveryctl`, the local stack) is one field of a `Settings` class: its environment
variable, type, default and help are declared there once, and pydantic-settings reads
the environment for it. Nothing else in the project reads `os.environ`; a unit test
holds every package to that, and `docs/configuration.md` is generated from these
declarations (`recoveryctl config docs`), so the reference cannot drift from the code.

The settings every role shares live here (where the services are, how a Kafka client
authenticates, the topic names, who signs); each role's own are declared beside the role
(`consumer/settings.py`, `producers/settings.py`, `ops/settings.py`).

Values come from, in order: what the caller passes (command-line flags, a test), then
the environment; the local stack is the operator context's last resort (`ops.context`).
An empty variable counts as unset. A value that does not validate raises
`ConfigurationError` naming the variable and what is wrong with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Self, get_args

from pydantic import AliasChoices, Field, SecretStr, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

__all__ = [
    "DEFAULT_CONTROLLER_GROUP",
    "DEFAULT_CONTROLLER_ID",
    "DEFAULT_TOPICS",
    "ENV_CONTROLLER_ID",
    "ENV_CONTROLLER_SIGNING_KEY_FILE",
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_PRODUCER_ID",
    "ENV_PRODUCER_KEY_FILE",
    "ENV_ROSTER_FILE",
    "ConfigurationError",
    "Declaration",
    "IdentitySettings",
    "KafkaClientSettings",
    "ServiceSettings",
    "Settings",
    "TopicNames",
    "given",
]

# The variables naming what every component shares; the fields below are declared
# with them, and messages that tell an operator what to set use them.
ENV_KAFKA_BOOTSTRAP: Final = "RECOVERY_KAFKA_BOOTSTRAP"
ENV_DATABASE_URL: Final = "RECOVERY_DATABASE_URL"
ENV_PRODUCER_ID: Final = "RECOVERY_PRODUCER_ID"
ENV_PRODUCER_KEY_FILE: Final = "RECOVERY_PRODUCER_KEY_FILE"
ENV_ROSTER_FILE: Final = "RECOVERY_ROSTER_FILE"
ENV_CONTROLLER_ID: Final = "RECOVERY_CONTROLLER_ID"
ENV_CONTROLLER_SIGNING_KEY_FILE: Final = "RECOVERY_CONTROLLER_SIGNING_KEY_FILE"
# The controller's producer id in the roster: what it signs its records as and names in
# them (`RECOVERY_CONTROLLER_ID`). One concept, one name: the controller's consumer
# group, its telemetry service and its escalation queue have names of their own.
DEFAULT_CONTROLLER_ID: Final = "recovery-controller"
# The controllers' consumer group; the `controller` principal may use groups with this
# prefix (`producers.acl_bindings`), so `recovery-controller-demo` is one of its groups.
DEFAULT_CONTROLLER_GROUP: Final = "recovery-controller"
_TOPIC_NAME: Final = r"^[A-Za-z0-9._-]{1,249}$"

# Every `Settings` class by name, for `given` fields to find the class declaring them.
_DECLARED: dict[str, type[Settings]] = {}
# The environment a `Settings.load(environ=...)` reads instead of the process's.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("settings_environ", default=None)


class ConfigurationError(ValueError):
    """A setting is missing or invalid; the message names the variable (or the file and
    line) and what to do."""


class _EnvironSource(EnvSettingsSource):
    """The environment source of every `Settings`: the process environment, or the
    mapping `Settings.load` was given; fields declared `env=False` are never read."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        if environ is None:
            return super()._load_env_vars()
        return parse_env_vars(environ, self.case_sensitive, self.env_ignore_empty, None)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if not _reads_environment(field):
            return None, field_name, False
        return super().get_field_value(field, field_name)


class Settings(BaseSettings):
    """The base of every role's settings: frozen, strict about unknown names, read
    from the environment (never a `.env` file or a secrets folder)."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_ignore_empty=True,
        populate_by_name=True,
    )
    # The heading this class's section has in docs/configuration.md.
    section: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _DECLARED[cls.__name__] = cls

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvironSource(settings_cls), _GivenSource(settings_cls))

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """The settings from `overrides` (flags; `None` values count as not given) over
        the environment (`environ`, else the one an enclosing `load` reads, else the
        process's). Raises `ConfigurationError`
        naming each invalid variable."""
        given = {name: value for name, value in overrides.items() if value is not None}
        # Nested settings built while this one validates read the same environment.
        token = _ENVIRON.set(environ if environ is not None else _ENVIRON.get())
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigurationError(cls.explain(exc)) from exc
        finally:
            _ENVIRON.reset(token)

    @classmethod
    def value_of(cls, name: str, environ: Mapping[str, str] | None = None) -> Any:
        """One setting alone, validated as its field declares, without loading the
        others (a tool that needs only the controller's group id needs no broker)."""
        field = cls.model_fields[name]
        token = _ENVIRON.set(environ if environ is not None else _ENVIRON.get())
        try:
            raw, _, _ = _EnvironSource(cls).get_field_value(field, name)
        finally:
            _ENVIRON.reset(token)
        if raw is None:
            return field.get_default(call_default_factory=True)
        adapter: TypeAdapter[Any] = TypeAdapter(Annotated[field.annotation, field])  # type: ignore[arg-type]
        try:
            return adapter.validate_python(raw)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            raise ConfigurationError(f"{cls.variable(name)}={raw!r}: {problem}") from exc

    @classmethod
    def explain(cls, exc: ValidationError) -> str:
        """One line per problem: the setting, its variable and pydantic's message."""
        problems = []
        for error in exc.errors():
            loc = error["loc"]
            name = cls._field_named(str(loc[0])) if loc else None
            where = f"{name} ({cls.variable(name)})" if name else ".".join(map(str, loc))
            problems.append(f"{where}: {error['msg']}")
        label = cls.section or cls.__name__
        return f"invalid {label.lower()} settings: " + "; ".join(problems)

    @classmethod
    def _field_named(cls, key: str) -> str | None:
        for name, field in cls.model_fields.items():
            if key == name or key in _variables(cls, name, field):
                return name
        return None

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of field `name` (the first, when it has several)."""
        return _variables(cls, name, cls.model_fields[name])[0]

    @classmethod
    def declared_fields(cls) -> tuple[str, ...]:
        """The environment-read fields this class declares itself (not inherited ones)."""
        own = inspect.get_annotations(cls)
        return tuple(
            name
            for name, field in cls.model_fields.items()
            if name in own and _reads_environment(field)
        )

    @classmethod
    def declarations(cls) -> Iterator[Declaration]:
        """Each environment-read field this class declares (not those it inherits), as
        the reference page lists it."""
        for name in cls.declared_fields():
            field = cls.model_fields[name]
            yield Declaration(
                variables=_variables(cls, name, field),
                type=_type_name(field.annotation),
                default=_default_text(field),
                help=field.description or "",
            )


@dataclass(frozen=True, slots=True)
class Declaration:
    """One setting as docs/configuration.md shows it."""

    variables: tuple[str, ...]
    type: str
    default: str
    help: str


def given(source: type[Settings] | None = None, name: str = "", **field: Any) -> Any:
    """A field this class does not read from the environment itself: it takes the value
    of `source`'s field `name` (declared there once, e.g. `ServiceSettings.database_url`)
    unless the caller passes one; with no `source`, the caller fills it (a nested value
    such as the topic names). Error messages name `source`'s variable."""
    marker: dict[str, Any] = {"env": False}
    if source is not None:
        marker["variable"] = source.variable(name)
        marker["from"] = f"{source.__name__}.{name}"
    return Field(json_schema_extra=marker, **field)


class _GivenSource(PydanticBaseSettingsSource):
    """The values of `given` fields, from the classes that declare them (each loaded
    once, from the same environment)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        loaded: dict[str, Settings] = {}
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            extra = field.json_schema_extra
            origin = extra.get("from") if isinstance(extra, dict) else None
            if not isinstance(origin, str):
                continue
            class_name, _, source_field = origin.partition(".")
            if class_name not in loaded:
                loaded[class_name] = _DECLARED[class_name]()
            value = getattr(loaded[class_name], source_field)
            if value is not None:
                values[name] = value
        return values


def _reads_environment(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return not (isinstance(extra, dict) and extra.get("env") is False)


def _variables(cls: type[Settings], name: str, field: FieldInfo) -> tuple[str, ...]:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("variable"), str):
        return (str(extra["variable"]),)
    alias = field.validation_alias
    if isinstance(alias, str):
        return (alias,)
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (str(cls.model_config.get("env_prefix", "")) + name.upper(),)


def _type_name(annotation: Any) -> str:
    if annotation is None:
        return "-"
    text = getattr(annotation, "__name__", None)
    args = get_args(annotation)
    if text in {"Literal"} or (text is None and args and all(isinstance(a, str) for a in args)):
        return " \\| ".join(args)
    if args and text is None:  # a union such as `Path | None`
        return " \\| ".join(_type_name(a) for a in args if a is not type(None))
    if text == "SecretStr":
        return "secret"
    return str(text or annotation).replace("|", "\\|")


def _default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    factory = field.default_factory
    if factory in (dict, list):
        return "`{}`" if factory is dict else "`[]`"
    if factory is not None:
        return (factory.__doc__ or "computed").strip().splitlines()[0]
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Path):
        return f"`{value.name}` (shipped)"
    return f"`{value}`"


class ServiceSettings(Settings):
    """Where a deployment's services are. When set, `recoveryctl stack up` and the test
    fixtures use these instead of starting local ones."""

    section: ClassVar[str] = "Services"

    kafka_bootstrap: str | None = Field(
        default=None,
        validation_alias=ENV_KAFKA_BOOTSTRAP,
        description="Kafka bootstrap servers, e.g. `localhost:9092`.",
    )
    database_url: str | None = Field(
        default=None,
        validation_alias=ENV_DATABASE_URL,
        description="The ledger's PostgreSQL URL. Each component connects as its own "
        "login role (docs/ledger.md, Roles). A failover pair: list both nodes and add "
        "`target_session_attrs=read-write` (docs/ledger.md, Failover).",
    )
    database_wait_s: float = Field(
        default=300.0,
        ge=0,
        validation_alias="RECOVERY_DATABASE_WAIT_S",
        description="Seconds the controller, the relay and every `recoveryctl` command "
        "that opens the ledger wait, with backoff doubling from 0.2 s to 5 s, for a "
        "read-write ledger database at start before they exit (a failover takes seconds; "
        "/readyz says they wait, recoveryctl logs each attempt). 0: no wait.",
    )


class TopicNames(Settings):
    """Where each stream lives; several deployments, or tests, can share a broker with
    other names. Keys of every topic are operation ids."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_TOPIC_")
    section: ClassVar[str] = "Topics"

    events: str = Field(
        default="recovery.events", pattern=_TOPIC_NAME, description="Recovery events in."
    )
    commands: str = Field(
        default="recovery.commands",
        pattern=_TOPIC_NAME,
        description="Capability commands out, to workers.",
    )
    evidence: str = Field(
        default="recovery.evidence", pattern=_TOPIC_NAME, description="Evidence events out."
    )
    audit: str = Field(
        default="recovery.audit", pattern=_TOPIC_NAME, description="The audit stream (SIEM)."
    )
    dlq: str = Field(default="recovery.dlq", pattern=_TOPIC_NAME, description="Dead letters.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TopicNames:
        """The defaults, overridden by `RECOVERY_TOPIC_EVENTS`, `..._COMMANDS`,
        `..._EVIDENCE`, `..._AUDIT` and `..._DLQ` when set and not empty."""
        return cls.load(environ)

    def all(self) -> tuple[str, ...]:
        """Every topic name, in a fixed order."""
        return (self.events, self.commands, self.evidence, self.audit, self.dlq)


class KafkaClientSettings(Settings):
    """How a Kafka client authenticates (`schemas.KafkaSecurity` is what they resolve
    to). The variables override the properties file."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_KAFKA_")
    section: ClassVar[str] = "Kafka client"

    config_file: Path | None = Field(
        default=None,
        description="A librdkafka properties file (`key=value` lines), applied first; "
        "`recoveryctl stack up` writes one per component.",
    )
    security_protocol: str | None = Field(
        default=None,
        description="`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` (default: "
        "`SASL_SSL` when a SASL user is named, else `PLAINTEXT`).",
    )
    sasl_mechanism: str | None = Field(
        default=None, description="SASL mechanism (default `SCRAM-SHA-512`)."
    )
    sasl_username: str | None = Field(default=None, description="SASL user.")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    sasl_password_file: Path | None = Field(
        default=None, description="A file holding the SASL password (instead of the variable)."
    )
    ssl_ca_location: str | None = Field(
        default=None, description="PEM file of the CA that signed the broker's certificate."
    )


class IdentitySettings(Settings):
    """Who signs: a producer's roster id and Ed25519 key file (the client library, a
    worker, an approver's tools), the roster a verifier checks against, and the
    controller's id and key (`recoveryctl audit` and `purge` sign and verify as it)."""

    section: ClassVar[str] = "Identity and keys"

    producer_id: str | None = Field(
        default=None,
        validation_alias=ENV_PRODUCER_ID,
        description="This producer's id in the roster; every record it publishes is signed as it.",
    )
    producer_key_file: Path | None = Field(
        default=None,
        validation_alias=ENV_PRODUCER_KEY_FILE,
        description="This producer's Ed25519 key file (PEM PKCS#8 or the base64 raw seed; "
        "`recoveryctl keys generate`).",
    )
    roster_file: Path | None = Field(
        default=None,
        validation_alias=ENV_ROSTER_FILE,
        description="The roster records are verified against (a policy file or a "
        "`producers:`-only file); workers verify commands with it.",
    )
    controller_id: str = Field(
        default=DEFAULT_CONTROLLER_ID,
        min_length=1,
        validation_alias=ENV_CONTROLLER_ID,
        description="The controller's producer id in the roster: what it signs its "
        "records as and names in them.",
    )
    controller_key_file: Path | None = Field(
        default=None,
        validation_alias=ENV_CONTROLLER_SIGNING_KEY_FILE,
        description="The controller's Ed25519 key file (never in the database); the "
        "controller refuses to start without it.",
    )


DEFAULT_TOPICS: Final = TopicNames.model_construct()
"""The standard topic names, whatever the environment says: for defaults that must not
read the environment or build a model at each call."""
