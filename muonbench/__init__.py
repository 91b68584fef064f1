"""The typed config tree: Hydra schemas, compose / validate / hash, as_dict and its inverse.

A leaf package: it imports the standard library, omegaconf / hydra and `optim` only, so `bench/` and `recipes/`
both build on it and never on each other.
"""

from muonbench.compose import (
    ALLOWED,
    CONF_DIR,
    ConfigError,
    as_dict,
    available_options,
    check_runnable,
    config_from_dict,
    config_hash,
    load,
    to_typed,
    validate,
)

__all__ = [
    "ALLOWED",
    "CONF_DIR",
    "ConfigError",
    "as_dict",
    "available_options",
    "check_runnable",
    "config_from_dict",
    "config_hash",
    "load",
    "to_typed",
    "validate",
]
