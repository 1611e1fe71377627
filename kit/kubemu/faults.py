"""Fault injection: make matching requests fail, hang or drop their connection."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)  # identity, so remove() drops this very fault
class Fault:
    """What to do to requests matching `method`, `verb` (RBAC verb) and `path_regex`.

    `path_regex` is searched (re.search) in the URL path without the query string. After
    `delay_seconds`: drop the connection (`close_connection`), answer a Status with `status`,
    or, with neither, serve the request normally (a pure delay). `times` limits how many
    requests the fault hits (None: until removed).
    """

    method: str | None = None
    path_regex: str = ""
    status: int | None = None
    delay_seconds: float = 0.0
    times: int | None = None
    close_connection: bool = False
    message: str = ""
    verb: str | None = None
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path_regex)

    def matches(self, method: str, verb: str, path: str) -> bool:
        return (
            (self.method is None or self.method.upper() == method)
            and (self.verb is None or self.verb == verb)
            and self._pattern.search(path) is not None
        )


class FaultHandle:
    """Returned by Emulator.add_fault; `remove()` withdraws the fault."""

    def __init__(self, faults: FaultSet, fault: Fault):
        self._faults = faults
        self.fault = fault

    def remove(self) -> None:
        self._faults.remove(self.fault)


class FaultSet:
    """Active faults in insertion order; the first match wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> FaultHandle:
        with self._lock:
            self._faults.append(fault)
        return FaultHandle(self, fault)

    def remove(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, method: str, verb: str, path: str) -> Fault | None:
        """The first matching fault, consuming one of its `times`."""
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, verb, path):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None
