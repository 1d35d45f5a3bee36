"""The config schemas' error and range checks (:mod:`fli.config`, :mod:`fli.config.inference`)."""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A configuration value is out of its valid range; the message names the key."""


def _check(cond: bool, key: str, valid: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{key} must be {valid}, got {value!r}")


def _finite(*vals: float) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals)
