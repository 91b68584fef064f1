"""The one error type of the config tree: a user or config error naming the field, the value and the rule."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A user or config error: names the field, the value and the rule."""


def fail(field: str, value: Any, rule: str) -> None:
    """Raise `ConfigError` as `field=value: rule`."""
    raise ConfigError(f"{field}={value!r}: {rule}")
