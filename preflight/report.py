"""What a check found: one line each, with what to do when it is not ``ok``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"  # works, but probably not as meant
    FAIL = "FAIL"  # something SliMe needs is missing or wrong: slime-check exits 1
    SKIP = "skip"  # could not be checked from here (the line says why)


@dataclass(frozen=True, slots=True)
class Finding:
    status: Status
    # which check: release, api, bindings, slinky, key, conf-server, capm3, mapping, webhook, admission, slurmrestd
    check: str
    message: str  # what was found (never a key, a token or a Secret's value)
    fix: str = ""  # what to do about it (FAIL and WARN)

    def line(self) -> str:
        text = _one_line(self.message) + (f" -- fix: {_one_line(self.fix)}" if self.fix else "")
        return f"{self.status.value:<4}  {self.check:<11} {text}"


def _one_line(text: str) -> str:
    """One line, whatever an API server's message held."""
    return " ".join(text.split())


def ok(check: str, message: str) -> Finding:
    return Finding(Status.OK, check, message)


def warn(check: str, message: str, fix: str) -> Finding:
    return Finding(Status.WARN, check, message, fix)


def fail(check: str, message: str, fix: str) -> Finding:
    return Finding(Status.FAIL, check, message, fix)


def skip(check: str, message: str) -> Finding:
    return Finding(Status.SKIP, check, message)


def exit_code(findings: Iterable[Finding]) -> int:
    """1 when any check failed, else 0 (warnings and skips do not fail a run)."""
    return 1 if any(f.status is Status.FAIL for f in findings) else 0


def summary(findings: list[Finding]) -> str:
    counts = {status: sum(1 for f in findings if f.status is status) for status in Status}
    verdict = "FAILED" if counts[Status.FAIL] else "passed"
    return (
        f"slime-check {verdict}: {counts[Status.OK]} ok, {counts[Status.WARN]} warning(s), "
        f"{counts[Status.FAIL]} failed, {counts[Status.SKIP]} skipped"
    )
