"""The config's problems, collected: every field is checked and every problem kept, with
the path of its field, so that one reading reports them all (``ConfigError``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gateway.core.config import ConfigError


class _Validator:
    """Collects problems instead of stopping at the first one."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)

    def no_unknown(self, raw: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for key in raw:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                self.problem(f"{where}: unknown setting (allowed: {', '.join(sorted(allowed))})")

    def section(
        self, raw: Mapping[str, Any], key: str, required: bool = False
    ) -> Mapping[str, Any]:
        value = raw.get(key)
        if value is None:
            if required:
                self.problem(f"{key}: missing (required)")
            return {}
        if not isinstance(value, Mapping):
            self.problem(f"{key}: must be a mapping")
            return {}
        return value

    def string(self, raw: Mapping[str, Any], path: str, required: bool = False) -> str:
        value = raw.get(path.rsplit(".", 1)[-1])
        if value is None:
            if required:
                self.problem(f"{path}: missing (required)")
            return ""
        if not isinstance(value, str) or not value:
            self.problem(f"{path}: must be a non-empty string")
            return ""
        return value

    def number(
        self,
        raw: Mapping[str, Any],
        path: str,
        default: float | None,
        positive: bool = False,
        unit: bool = False,
    ) -> float | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(f"{path}: must be a number, got {type(value).__name__}")
            return default
        value = float(value)
        if not math.isfinite(value):
            self.problem(f"{path}: must be finite")
            return default
        if positive and value <= 0:
            self.problem(f"{path}: must be > 0")
            return default  # reported once: checks that use it see no follow-on error
        if unit and not 0 <= value < 1:
            self.problem(f"{path}: must be in [0, 1)")
            return default
        return value

    def integer(
        self, raw: Mapping[str, Any], path: str, default: int | None, low: int | None = None
    ) -> int | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(f"{path}: must be a whole number")
            return default
        if low is not None and value < low:
            self.problem(f"{path}: must be ≥ {low}")
        return value

    def choice(
        self, raw: Mapping[str, Any], path: str, options: tuple[str, ...], default: str | None
    ) -> str | None:
        value = raw.get(path.rsplit(".", 1)[-1], default)
        if value is False and "off" in options:
            value = "off"  # YAML 1.1 reads a bare `off` as false
        if value is None:
            self.problem(f"{path}: missing (one of {', '.join(options)})")
            return None
        if value not in options:
            self.problem(f"{path}: '{value}' is not one of {', '.join(options)}")
            return default
        return str(value)
