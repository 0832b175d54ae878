"""The controller's exceptions: one base, the docstring is the default message."""

from __future__ import annotations

from schemas import ConfigurationError

__all__ = ["ControllerError", "PolicyRefused", "SettingsError", "TelemetryError"]


class ControllerError(Exception):
    """The recovery controller cannot run; the message says what to fix."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class SettingsError(ControllerError, ConfigurationError):
    """The controller settings are invalid; fix the named setting or environment variable."""


class TelemetryError(ControllerError):
    """The configured telemetry exporter cannot be used; pick `console` or `none`, or
    install the exporter package."""


class PolicyRefused(ControllerError):
    """The controller will not run under this policy (none given, or it holds a key
    derived from a public name) outside demo mode; the message says which and what to do."""
