"""A mapping's ``slurmHealth`` block as a validated object (docs/scaling.md, "Slurm-aware machine health").

The ConfigMap parser (:mod:`scaling_webhook.mappings`) builds it with :func:`parse_duration` and
:func:`parse_max_unhealthy`; the judgments (:mod:`.judge`) and the service (:mod:`.service`) read
only it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from scaling_webhook.slurm.endpoint import SlurmEndpoint

DEFAULT_REGISTRATION_TIMEOUT = 15 * 60.0
DEFAULT_UNHEALTHY_TIMEOUT = 10 * 60.0
# Cluster API's MachineHealthCheck examples use 40%; the same default short-circuits a site-wide outage.
DEFAULT_MAX_UNHEALTHY = "40%"
DEFAULT_SLURM_USER = "slurm"  # Slinky's SlurmUser: a state slurmctld set names this user
# Go's time.ParseDuration units that make sense here (what MachineHealthCheck's timeouts take).
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PERCENT = re.compile(r"^(\d{1,3})%$")


@dataclass(frozen=True, slots=True)
class MaxUnhealthy:
    """MachineHealthCheck's ``maxUnhealthy``: a count, or a percentage of the pool's Machines (rounded down,
    as Cluster API scales it)."""

    count: int | None = None
    percent: int | None = None

    def limit(self, machines: int) -> int:
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return math.floor(machines * self.percent / 100)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.percent}%"


@dataclass(frozen=True, slots=True)
class SlurmHealthConfig(SlurmEndpoint):
    """One mapping's machine-health settings (validated)."""

    registration_timeout_seconds: float = DEFAULT_REGISTRATION_TIMEOUT
    unhealthy_timeout_seconds: float = DEFAULT_UNHEALTHY_TIMEOUT
    remediate: bool = False
    max_unhealthy: MaxUnhealthy = MaxUnhealthy(percent=40)
    # States and reasons set by this user are slurmctld's own; any other user's are an administrator's.
    slurm_user: str = DEFAULT_SLURM_USER


def parse_duration(value: Any, where: str) -> float:
    """``15m``, ``90s``, ``1h30m`` (Go durations, as MachineHealthCheck's timeouts) or a number of seconds;
    positive. ValueError naming ``where`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: must be a duration such as 15m or 900s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _DURATION.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise ValueError(f"{where}: {value!r} is not a duration such as 15m, 90s or 1h30m")
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    else:
        raise ValueError(f"{where}: must be a duration such as 15m or 900s, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{where}: must be longer than 0, got {value!r}")
    return seconds


def parse_max_unhealthy(value: Any, where: str) -> MaxUnhealthy:
    """A count (``2``) or a percentage (``"40%"``, 0 to 100); ValueError naming ``where`` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return MaxUnhealthy(count=value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return MaxUnhealthy(count=int(text))
        match = _PERCENT.match(text)
        if match and int(match.group(1)) <= 100:
            return MaxUnhealthy(percent=int(match.group(1)))
    raise ValueError(
        f"{where}: {value!r} is neither a count (0 or more) nor a percentage from 0% to 100% of the pool's Machines"
    )
